"""The curation config: pipeline/default.yaml, loaded through catalog.config (the one loader of every
room: defaults, --config, --set, validation). This module only names pipeline's defaults and checks.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml

from catalog import config as loader
from catalog.config import Check, ConfigError
from catalog.rules import CHECKS as RULE_CHECKS

from .stages.watermark import METHODS as WATERMARK_METHODS

DEFAULT_PATH = resources.files("pipeline") / "default.yaml"

# beyond the rules' thresholds and what each YAML default's type implies
CHECKS: dict[str, Check] = {
    **RULE_CHECKS,
    "input.files_per_unit": Check(("int",), low=1),
    "size.use_original": Check(("bool",)),
    "dedup.max_distance": Check(("int",), nullable=True, low=0, high=64),
    "dedup.components_memory": Check(("int",), low=0),
    "dedup.partitioned": Check(("bool",), words=("auto",)),
    "dedup.task_memory": Check(("int",), low=1 << 20),
    "decode.max_pixels": Check(("int",), nullable=True, low=1),
    "person.weights": Check(("str",), nullable=True),
    "person.min_store_score": Check(("number",), low=0, high=1),
    "person.imgsz": Check(("int",), low=32),
    "text.max_side": Check(("int",), low=32),
    "text.min_rec_score": Check(("number",), low=0, high=1),
    "text.min_chars": Check(("int",), low=0),
    "watermark.weights": Check(("str",), nullable=True),
    "watermark.method": Check(("str",), choices=WATERMARK_METHODS),
    "watermark.max_side": Check(("int",), low=32),
    "watermark.min_det_score": Check(("number",), low=0, high=1),
    "watermark.min_rec_score": Check(("number",), low=0, high=1),
    "watermark.max_boxes": Check(("int",), low=1),
    "watermark.corner_read": Check(("bool",)),
    "art.weights": Check(("str",), nullable=True),
    "output.shard_max_count": Check(("int",), low=1),
    "output.shard_max_bytes": Check(("int",), low=1),
    "engine.start_actors_early": Check(("bool",), words=("auto",)),
    "engine.early_min_units": Check(("int",), low=0),
    "engine.task_poll_s": Check(("number",), low=0.001, high=1),
    "engine.max_batch_bytes": Check(("int",), low=1 << 16),
    "engine.window_units": Check(("int",), low=1),
    "engine.bundle_bytes": Check(("int",), low=0),
    "engine.bundle_units": Check(("int",), low=1),
    "ray.address": Check(("str",), nullable=True),
    "ray.num_cpus": Check(("int",), nullable=True, low=1),
    "*.batch_size": Check(("int",), low=1),
    "*.concurrency": Check(("int", "list"), nullable=True, low=1, words=("auto",)),
    "*.num_cpus": Check(("number",), low=0),
    "*.num_gpus": Check(("number",), low=0),
}


def default_config() -> dict:
    return yaml.safe_load(DEFAULT_PATH.read_text())


def validate(cfg: dict) -> dict:
    return loader.validate(cfg, default_config(), CHECKS)


def apply_sets(cfg: dict, sets: list[str] | None) -> dict:
    """`--set` overrides on a config (e.g. a finished run's, for `humanset select`), validated."""
    return validate(loader.apply_sets(cfg, sets))


def load_config(path: str | Path | None = None, sets: list[str] | None = None) -> dict:
    return loader.load(default_config(), path, sets, CHECKS)


__all__ = ["CHECKS", "ConfigError", "apply_sets", "default_config", "load_config", "validate"]
