"""One way to configure every room: YAML defaults, then `--config FILE`, then dotted `--set`, then
validation, then the room's typed object.

    cfg = load(defaults, path, sets, checks)     # a validated, JSON-able dict (saved in manifests)

Each room owns its defaults and turns the validated dict into its typed object: pipeline builds its
stages from it (pipeline/config.py, pipeline/default.yaml), render its RenderConfig dataclasses,
training its run configs (training/config.py, training/pretrain.yaml, finetune.yaml, train_filter.yaml).
Validation covers every leaf: an explicit `Check` for a dotted key (the rules' thresholds come from
catalog/rules.py), else one inferred from the default's type (a number default wants a finite
number, a string a string, ...). Errors are ConfigError (a ValueError) in one line naming the key
("config size.min_short_side must be a finite number, got nan"); a key the defaults do not have, in
--config FILE or --set, is an UnknownKey (also a KeyError) naming the file or the --set item.
"""
from __future__ import annotations

import copy
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
        raise FileNotFoundError(f"{what} {p}: no such file")
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
