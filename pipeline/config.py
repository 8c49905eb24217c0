"""The curation config through catalog.config (the one loader of every room: defaults, --config, --set,
validation). The defaults and checks are pipeline/settings.py's dataclasses; pipeline/default.yaml is
generated from them (the file a newcomer reads; tests/test_config_files.py keeps it in step).
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from catalog import config as loader
from catalog.config import Check
from catalog.storage.paths import absolute, is_uri

from pipeline.settings import CurateSettings

DEFAULT_PATH = resources.files("pipeline") / "default.yaml"

# dotted key -> check, from the settings' field metadata (the rules' thresholds from catalog/rules.py)
CHECKS: dict[str, Check] = loader.checks_of(CurateSettings)


def default_config() -> dict:
    return loader.defaults_of(CurateSettings)


def _fill(given: dict, defaults: dict) -> dict:
    """`given` with the keys it lacks taken from `defaults`, at every depth."""
    out = dict(given)
    for k, v in defaults.items():
        if k not in out:
            out[k] = v
        elif isinstance(v, dict) and isinstance(out[k], dict):
            out[k] = _fill(out[k], v)
    return out


def with_defaults(cfg):
    """A whole config completed with the defaults: a manifest written before a setting existed reads as
    the config that reproduces it (resume compares this to the new run's). Not a dict: as it is."""
    return _fill(cfg, default_config()) if isinstance(cfg, dict) else cfg


def with_local_weights(cfg: dict) -> dict:
    """cfg with each stage's `weights` that names a local file or folder made absolute: the manifest records
    it resolved and every worker, whatever its working directory, opens the same file."""
    out = dict(cfg)
    for name, sec in cfg.items():
        w = sec.get("weights") if isinstance(sec, dict) else None
        if isinstance(w, str) and w and not is_uri(w) and not os.path.isabs(w) and os.path.exists(w):
            out[name] = {**sec, "weights": absolute(w)}
    return out


def section(cfg: dict | None, name: str) -> dict:
    """Section `name` of a whole config, completed with its defaults: code given a partial config (tests,
    an old manifest) reads every key, the missing ones from the dataclass, never from a fallback in code."""
    return _fill((cfg or {}).get(name) or {}, default_config()[name])


def validate(cfg: dict) -> dict:
    return loader.validate(cfg, default_config(), CHECKS)


def apply_sets(cfg: dict, sets: list[str] | None) -> dict:
    """`--set` overrides on a config (e.g. a finished run's, for `humanset select`), validated."""
    return validate(loader.apply_sets(cfg, sets))


def load_config(path: str | Path | None = None, sets: list[str] | None = None) -> dict:
    return loader.load(default_config(), path, sets, CHECKS)


__all__ = ["CHECKS", "apply_sets", "default_config", "load_config", "section", "validate", "with_defaults",
           "with_local_weights"]
