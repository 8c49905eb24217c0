"""Training settings through the one config loader of every room (catalog.config).

Each command's settings, their defaults and their checks are its config dataclass (RunConfig's fields
for every run, training/run_config.py; PretrainConfig, FinetuneConfig, FilterConfig add theirs, each field a
`setting()`). training/pretrain.yaml, finetune.yaml and train_filter.yaml list them with their comments;
they are generated from the dataclasses (`python -m humanset.settings_files --write`; tests/test_config_files.py
fails when one is stale). A run's settings are built in this order, each step over the last:

    1. the command's defaults  (its dataclass; the YAML shows them)
    2. --config FILE          a YAML of some of those keys
    3. --set KEY=VALUE        repeatable, the value parsed as YAML (e.g. --set base_lr=1e-4)
    4. the command's flags    --steps, --model, --batch-size, ... (only those given)
    5. validation             types, ranges, finite numbers: one-line errors naming the key
    6. the typed object       PretrainConfig / FinetuneConfig / FilterConfig

The errors are catalog.config's, the same as curate's and render's. The effective settings are saved
in the run folder as OUT/config.json (and in every checkpoint).
"""
from __future__ import annotations

import functools
from importlib import resources

from catalog import config as loader
from catalog.config import UnknownKey

YAML = {"pretrain": "pretrain.yaml", "finetune": "finetune.yaml", "train-filter": "train_filter.yaml"}
HEADER = ("humanset {command}: every setting and its default (training/config.py loads it). Override with\n"
          "--config FILE (a YAML of some of these keys), then --set KEY=VALUE, then the command's flags.\n"
          "Generated from {source} (python -m humanset.settings_files --write): edit the dataclass there.")
SOURCES = {"pretrain": "training/pretrain.py PretrainConfig", "finetune": "training/tasks/finetune.py FinetuneConfig",
           "train-filter": "training/filters/train.py FilterConfig"}
YAML_COLUMN = 32  # where the YAMLs' comments start


def config_class(command: str):
    """The command's config dataclass (imports torch: only when a run is configured)."""
    if command == "pretrain":
        from training.pretrain import PretrainConfig as cls
    elif command == "finetune":
        from training.tasks.finetune import FinetuneConfig as cls
    elif command == "train-filter":
        from training.filters.train import FilterConfig as cls
    else:
        raise KeyError(f"no training command {command!r}; known: {', '.join(YAML)}")
    return cls


def header(command: str) -> str:
    return HEADER.format(command=command, source=SOURCES[command])


def default_config(command: str) -> dict:
    """The command's defaults as a dict (a fresh copy), from its dataclass."""
    return loader.defaults_of(config_class(command))


def checks(command: str) -> dict:
    """The command's checks, from its dataclass's field metadata."""
    return loader.checks_of(config_class(command))


@functools.lru_cache(maxsize=None)
def _shipped(command: str) -> dict:
    return loader.read_yaml(resources.files("training") / YAML[command], "training defaults")


def flag_help(command: str, key: str, text: str) -> str:
    """--help of a flag: `text` and the setting's default, read from the command's generated YAML (the
    dataclass's defaults, without importing torch to print --help)."""
    return f"{text} (default {loader.yaml_scalar(_shipped(command)[key])})"


def load_settings(command: str, path=None, sets: list[str] | None = None, flags: dict | None = None) -> dict:
    """Steps 1-5 above: the validated settings as a JSON-able dict."""
    defaults = default_config(command)
    try:
        cfg = loader.merge(defaults, loader.read_yaml(path), f"--config {path}") if path else defaults
        cfg = loader.apply_sets(cfg, sets)
    except UnknownKey as e:  # the same message, and the file that lists every setting
        raise UnknownKey(f"{e}; unknown settings are refused, training/{YAML[command]} lists them all") from None
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    cfg = loader.merge(cfg, given, "flags")
    return loader.validate(cfg, defaults, checks(command))


def load_config(command: str, path=None, sets: list[str] | None = None, flags: dict | None = None):
    """Steps 1-6: the command's typed config."""
    values = load_settings(command, path, sets, flags)
    if command == "pretrain":
        from training.pretrain import config_from
    elif command == "finetune":
        from training.tasks.finetune import config_from
    else:
        from training.filters.train import config_from
    return config_from(values)


__all__ = ["YAML", "checks", "config_class", "default_config", "flag_help", "load_config",
           "load_settings"]
