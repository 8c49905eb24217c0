"""One YAML config with documented defaults (pipeline/default.yaml), overridden by --config and --set."""
from __future__ import annotations

import copy
from importlib import resources
from pathlib import Path

import yaml

DEFAULT_PATH = resources.files("pipeline") / "default.yaml"


def default_config() -> dict:
    return yaml.safe_load(DEFAULT_PATH.read_text())


def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def parse_set(item: str) -> tuple[list[str], object]:
    """'person.min_score=0.95' -> (['person', 'min_score'], 0.95); values are parsed as YAML."""
    if "=" not in item:
        raise ValueError(f"--set {item!r}: expected key=value, e.g. --set person.min_score=0.95")
    key, value = item.split("=", 1)
    return key.strip().split("."), yaml.safe_load(value)


def apply_sets(cfg: dict, sets: list[str] | None) -> dict:
    cfg = copy.deepcopy(cfg)
    for item in sets or []:
        path, value = parse_set(item)
        node = cfg
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                raise KeyError(f"--set {item!r}: no config section {part!r}")
            node = node[part]
        if path[-1] not in node:
            known = ", ".join(sorted(node))
            raise KeyError(f"--set {item!r}: unknown key {path[-1]!r} (known here: {known})")
        node[path[-1]] = value
    return cfg


def load_config(path: str | Path | None = None, sets: list[str] | None = None) -> dict:
    cfg = default_config()
    if path:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"--config {p}: no such file")
        cfg = merge(cfg, yaml.safe_load(p.read_text()) or {})
    return apply_sets(cfg, sets)
