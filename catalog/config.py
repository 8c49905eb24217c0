"""One way to configure every room: typed defaults, then `--config FILE`, then dotted `--set`, then
validation, then the room's typed object (docs/config.md).

    steps: int = setting(1000, "optimiser steps", low=1)     # a field of a room's config dataclass
    cfg = load(defaults_of(Cls), path, sets, checks_of(Cls))  # a validated, JSON-able dict

The dataclasses are the only source of defaults: each field's `setting()` holds its default, the
comment the shipped YAML shows for it and its check (low / high / choices / nullable / kinds). The
YAML files (pipeline/default.yaml, training/*.yaml) are written from them by `to_yaml` (`python -m
humanset.settings_files --write`; tests/test_config_files.py fails when one is stale), and the flags'
--help says the same default (`flag_help`). Validation covers every leaf: the field's check, else
one inferred from the default's type (a number default wants a finite number, ...). Errors are
ConfigError (a ValueError) in one line naming the key
("config size.min_short_side must be a finite number, got nan"); a key the defaults do not have, in
--config FILE or --set, is an UnknownKey (also a KeyError) naming the file or the --set item.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path

import yaml


class ConfigError(ValueError):
    """A config value or override that cannot be used; the message names the key and the fix."""


class UnknownKey(ConfigError, KeyError):
    """A key or section the defaults do not have (also a KeyError, for callers that look keys up)."""

    __str__ = BaseException.__str__  # the message as written, not KeyError's quoted repr


@dataclass(frozen=True)
class Check:
    """What a config value may be. kinds: any of "number", "int", "bool", "str", "list", "dict";
    `items`: the kind every element of a list value must be (numbers finite); `words`: strings
    allowed besides `kinds` (e.g. "auto" for a number)."""

    kinds: tuple[str, ...]
    nullable: bool = False
    low: float | None = None
    high: float | None = None
    choices: tuple | None = None
    items: str | None = None
    words: tuple[str, ...] = ()

    def problem(self, value) -> str | None:
        if value is None:
            return None if self.nullable else f"must be {self._what()} (null is not allowed here)"
        if self.choices is not None:
            return None if value in self.choices else \
                f"must be one of {', '.join(map(str, self.choices))}, got {value!r}"
        if isinstance(value, str) and value in self.words:
            return None
        if not any(_is(kind, value) for kind in self.kinds):
            return f"must be {self._what()}, got {value!r}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a finite number, got {value!r}"
        if isinstance(value, (list, tuple)) and self.items:
            bad = [v for v in value if not _is(self.items, v) or (isinstance(v, float) and not math.isfinite(v))]
            if bad:
                return f"must be a list of {'finite numbers' if self.items == 'number' else self.items}, got {value!r}"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if self.low is not None and value < self.low:
                return f"must be >= {self.low:g}, got {value!r}"
            if self.high is not None and value > self.high:
                return f"must be <= {self.high:g}, got {value!r}"
        return None

    def _what(self) -> str:
        names = {"number": "a number", "int": "an integer", "bool": "true or false", "str": "a string",
                 "list": "a list", "dict": "a mapping"}
        return " or ".join([names[k] for k in self.kinds] + [repr(w) for w in self.words])


def _is(kind: str, v) -> bool:
    if kind == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    return isinstance(v, {"bool": bool, "str": str, "list": (list, tuple), "dict": dict}[kind])


def inferred(default) -> Check | None:
    """The check a default value implies; None (anything goes) for a null default."""
    if default is None:
        return None
    if isinstance(default, bool):
        return Check(("bool",))
    if isinstance(default, int):
        return Check(("int",))
    if isinstance(default, float):
        return Check(("number",))
    if isinstance(default, str):
        return Check(("str",))
    if isinstance(default, (list, tuple)):
        numbers = bool(default) and all(_is("number", v) for v in default)
        return Check(("list",), items="number" if numbers else None)
    return None


# --- the steps ------------------------------------------------------------------------------------
class _Loader(yaml.SafeLoader):
    """yaml.safe_load, but `1e-4` is a number (YAML 1.2), not the string PyYAML's 1.1 rules make it."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*\.?[0-9_]*|\.[0-9_]+)[eE][-+]?[0-9]+$"), list("-+0123456789."))


def safe_load(text: str):
    return yaml.load(text, Loader=_Loader)


def read_yaml(path, what: str = "--config") -> dict:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} {p}: no such file; pass a YAML file of settings (the command's `config` "
                                f"subcommand or its *.yaml of defaults shows every key)")
    try:
        data = safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{what} {p}: not valid YAML ({str(e).splitlines()[0]})") from e
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{what} {p}: expected a mapping of sections, got {type(data).__name__}")
    return data or {}


def merge(base: dict, over: dict, where: str = "--config", _prefix: str = "") -> dict:
    """`over` on top of `base`; a key `base` does not have is an error (a typo must not pass)."""
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        key = f"{_prefix}{k}"
        if k not in out:
            known = ", ".join(sorted(map(str, out)))
            raise UnknownKey(f"{where}: unknown key {key!r} (known here: {known})")
        if isinstance(v, dict) and isinstance(out[k], dict):
            out[k] = merge(out[k], v, where, f"{key}.")
        else:
            out[k] = copy.deepcopy(v)
    return out


def parse_set(item: str) -> tuple[list[str], object]:
    """'person.min_score=0.95' -> (['person', 'min_score'], 0.95); values are parsed as YAML."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set person.min_score=0.95")
    key, value = item.split("=", 1)
    try:
        parsed = safe_load(value)
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {item!r}: the value is not valid YAML ({str(e).splitlines()[0]})") from e
    return key.strip().split("."), parsed


def apply_sets(cfg: dict, sets: list[str] | None) -> dict:
    """Dotted `--set key=value` overrides; a section or key the config does not have is an error."""
    cfg = copy.deepcopy(cfg)
    for item in sets or []:
        path, value = parse_set(item)
        node = cfg
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                raise UnknownKey(f"--set {item!r}: no config section {part!r} (known here: "
                                 f"{', '.join(sorted(map(str, node)))})")
            node = node[part]
        if path[-1] not in node:
            known = ", ".join(sorted(map(str, node)))
            raise UnknownKey(f"--set {item!r}: unknown key {path[-1]!r} (known here: {known})")
        node[path[-1]] = value
    return cfg


def validate(cfg: dict, defaults: dict, checks: dict[str, Check] | None = None) -> dict:
    """Raise ConfigError for the first value that its check refuses; returns cfg.

    `checks` maps dotted keys to Checks; a key `*.name` applies to `name` in every section."""
    checks = checks or {}

    def walk(node, default, prefix):
        for k, v in node.items():
            key = f"{prefix}{k}"
            d = default.get(k) if isinstance(default, dict) else None
            check = checks.get(key) or checks.get(f"*.{k}")
            if check is None and isinstance(v, dict) and (d is None or isinstance(d, dict)):
                walk(v, d or {}, f"{key}.")
                continue
            check = check or inferred(d)
            why = check.problem(v) if check else None
            if why:
                raise ConfigError(f"config {key} {why}")

    walk(cfg, defaults, "")
    return cfg


def load(defaults: dict, path=None, sets: list[str] | None = None,
         checks: dict[str, Check] | None = None) -> dict:
    """defaults -> --config FILE -> --set overrides -> validation. Returns a new dict."""
    cfg = copy.deepcopy(defaults)
    if path:
        cfg = merge(cfg, read_yaml(path), f"--config {path}")
    cfg = apply_sets(cfg, sets)
    return validate(cfg, defaults, checks)


# --- defaults, checks, YAML and --help from the rooms' dataclasses -----------------------------------
_CHECK_ARGS = ("kinds", "nullable", "low", "high", "choices", "items", "words")


def setting(default, doc: str = "", *, note: str = "", check: Check | None = None, keys: dict | None = None,
            **limits):
    """A config dataclass field: its default, its YAML comment (`doc`, lines split at newlines; `note`:
    comment lines above the key) and what a value may be (`check`, or Check's arguments as `limits`:
    kinds, nullable, low, high, choices, items, words; kinds default to the default's). `keys`: checks
    of the entries of a mapping default (e.g. resources' num_cpus). A field that repeats a base class's
    field with only a new default inherits its doc and check."""
    unknown = set(limits) - set(_CHECK_ARGS)
    if unknown:
        raise TypeError(f"setting(): unknown check arguments {sorted(unknown)}")
    meta = {k: v for k, v in (("doc", doc), ("note", note), ("keys", keys)) if v}
    if check is not None or limits:
        meta["check"] = check or Check(**{"kinds": limits.get("kinds") or _kinds(default), **limits})
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def section(cls, doc: str = "", note: str = ""):
    """A field holding a nested config dataclass (a YAML section)."""
    meta = {k: v for k, v in (("doc", doc), ("note", note)) if v}
    return dataclasses.field(default_factory=cls, metadata=meta)


def _kinds(default) -> tuple[str, ...]:
    check = inferred(default)
    if check is None:
        raise TypeError(f"setting({default!r}): a null default needs kinds=, e.g. kinds=('int',)")
    return check.kinds


def _meta(cls, name: str) -> dict:
    """The field's metadata, each item from the nearest class of the MRO that declares it."""
    out: dict = {}
    for base in cls.__mro__:
        f = getattr(base, "__dataclass_fields__", {}).get(name)
        if f is not None:
            out = {**dict(f.metadata), **out}
    return out


def _default(f):
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _plain(value):
    """A default as the loader's dicts hold it: dataclasses as mappings, tuples as lists."""
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def defaults_of(cls) -> dict:
    """The fields' defaults (not what __post_init__ derives from them) of a config dataclass, as the
    nested, JSON-able dict `load` starts from."""
    out = {}
    for f in dataclasses.fields(cls):
        default = _default(f)
        out[f.name] = defaults_of(type(default)) if dataclasses.is_dataclass(default) else _plain(default)
    return out


def checks_of(cls, _prefix: str = "") -> dict[str, Check]:
    """The dotted-key checks `validate` applies, from the fields' metadata (nested sections too)."""
    out: dict[str, Check] = {}
    for f in dataclasses.fields(cls):
        key, meta, default = f"{_prefix}{f.name}", _meta(cls, f.name), _default(f)
        if dataclasses.is_dataclass(default):
            out.update(checks_of(type(default), f"{key}."))
            continue
        if "check" in meta:
            out[key] = meta["check"]
        for k, check in (meta.get("keys") or {}).items():
            out[f"{key}.{k}"] = check
    return out


def build(cls, values: dict | None, what: str = ""):
    """A config dataclass from a (validated) dict; nested sections are built too, a list is a tuple
    where the default is one. A key the dataclass does not have is an UnknownKey naming the known."""
    values = dict(values or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise UnknownKey(f"unknown {what or cls.__name__} settings {unknown}; known: {', '.join(fields)}")
    kw = {}
    for name, v in values.items():
        default = _default(fields[name])
        if dataclasses.is_dataclass(default) and (v is None or isinstance(v, dict)):
            v = build(type(default), v, f"{what or cls.__name__}.{name}")
        elif isinstance(default, tuple) and isinstance(v, list):
            v = tuple(v)
        kw[name] = v
    return cls(**kw)


def flag_help(cls, name: str, text: str = "") -> str:
    """--help text of a flag that sets `name`: `text` (else the field's doc) and the default."""
    text = text or _meta(cls, name).get("doc", "").split("\n")[0]
    default = _plain(_default(next(f for f in dataclasses.fields(cls) if f.name == name)))
    return f"{text} (default {yaml_scalar(default)})" if text else f"default {yaml_scalar(default)}"


def yaml_scalar(value) -> str:
    """A value as YAML flow text: 1.5e-4 as 1.5e-4, '' as '', None as null, lists as [a, b]."""
    if isinstance(value, float) and value and abs(value) < 1e-3:
        mantissa, exponent = f"{value:e}".split("e")
        mantissa = mantissa.rstrip("0")
        return f"{mantissa}0e{int(exponent)}" if mantissa.endswith(".") else f"{mantissa}e{int(exponent)}"
    if isinstance(value, list):
        return f"[{', '.join(yaml_scalar(v) for v in value)}]"
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip()
    return text[:-4].strip() if text.endswith("\n...") else text.removesuffix("...").strip()


def to_yaml(cls, header: str = "", column: int = 30) -> str:
    """The YAML file of a config dataclass: every key with its default, its doc as the comment beside
    it (at `column`; later lines of the doc below, at the same column) and its note above it."""
    lines = [f"# {h}" if h else "#" for h in header.splitlines()] + [""] if header else []

    def comment_block(text, indent):
        return [f"{indent}# {t}" if t else f"{indent}#" for t in text.splitlines()]

    def walk(c, indent):
        for f in dataclasses.fields(c):
            meta, default = _meta(c, f.name), _default(f)
            if lines and lines[-1] and not indent and (meta.get("note") or dataclasses.is_dataclass(default)):
                lines.append("")  # a blank line before each top-level section or note
            if dataclasses.is_dataclass(default):
                lines.extend(comment_block(meta.get("note", ""), indent))
                lines.append(f"{indent}{f.name}:")
                walk(type(default), indent + "  ")
                continue
            lines.extend(comment_block(meta.get("note", ""), indent))
            text = f"{indent}{f.name}: {yaml_scalar(_plain(default))}"
            doc = meta.get("doc", "").splitlines()
            if doc:
                text = f"{text:<{column}}# {doc[0]}" if len(text) + 2 <= column else f"{text}  # {doc[0]}"
            lines.append(text)
            lines.extend(f"{'':<{column}}# {d}" for d in doc[1:])

    walk(cls, "")
    return "\n".join(lines) + "\n"
