"""Training settings through the one config loader of every room (catalog.config).

Each command's settings and their defaults are a flat YAML shipped here: pretrain.yaml,
finetune.yaml, train_filter.yaml. A run's settings are built in this order, each step over the last:

    1. the command's YAML defaults
    2. --config FILE          a YAML of some of those keys
    3. --set KEY=VALUE        repeatable, the value parsed as YAML (e.g. --set base_lr=1e-4)
    4. the command's flags    --steps, --model, --batch-size, ... (only those given)
    5. validation             types, ranges, finite numbers: one-line errors naming the key
    6. the typed object       PretrainConfig / FinetuneConfig / FilterConfig

The errors are catalog.config's, the same as curate's and render's. The effective settings are saved
in the run folder as OUT/config.json (and in every checkpoint). The dataclasses keep their defaults
for code that builds a config directly; tests/training/test_settings.py checks they equal the YAMLs.
"""
from __future__ import annotations

from importlib import resources

from catalog import config as loader
from catalog.config import Check, ConfigError, UnknownKey

YAML = {"pretrain": "pretrain.yaml", "finetune": "finetune.yaml", "train-filter": "train_filter.yaml"}

_NUM, _INT, _STR = ("number",), ("int",), ("str",)

# every training run (training/engine.py RunConfig)
COMMON: dict[str, Check] = {
    "output": Check(_STR),
    "steps": Check(_INT, low=1),
    "accum_steps": Check(_INT, low=1),
    "clip_grad": Check(_NUM, low=0),
    "seed": Check(_INT, low=0),
    "loader_workers": Check(_INT, low=0),
    "cpu_threads": Check(_INT, low=0),
    "loader": Check(_STR, choices=("auto", "torch", "ray")),
    "checkpoint_every": Check(_INT, low=1),
    "keep_checkpoints": Check(_INT, low=0),  # 0 keeps every checkpoint
    "log_every": Check(_INT, low=1),
    "progress_every_s": Check(_NUM, low=0),
    "precision": Check(_STR, choices=("auto", "bf16", "fp32")),
    "workers": Check(_INT, low=0),
    "gpus_per_worker": Check(_NUM, low=0),
    "strategy": Check(_STR, choices=("ddp", "fsdp")),
    "resume": Check(_STR, nullable=True),
    "batch_size": Check(_INT, low=1),
    "warmup_steps": Check(_INT, nullable=True, low=0),
    "weight_decay": Check(_NUM, low=0),
    "betas": Check(("list",), items="number"),
}

CHECKS: dict[str, dict[str, Check]] = {
    "pretrain": {
        "image_size": Check(_INT, low=16),
        "base_lr": Check(_NUM, low=0),
        "min_lr_ratio": Check(_NUM, low=0, high=1),
        "mask_ratio": Check(_NUM, low=0, high=0.99),
        "crop_scale": Check(("list",), items="number"),
    },
    "finetune": {
        "task": Check(_STR, choices=("pose", "seg", "depth", "normal")),
        "image_size": Check(("int", "list", "str")),  # 1024, [1024, 768] or "1024x768"
        "head_width": Check(_INT, nullable=True, low=1),
        "head_deconvs": Check(_INT, nullable=True, low=0),
        "head_convs": Check(_INT, nullable=True, low=0),
        "lr": Check(_NUM, low=0),
        "layer_decay": Check(_NUM, low=0, high=1),
        "schedule": Check(_STR, choices=("auto", "linear", "step")),
        "heatmap_sigma": Check(_NUM, low=0),
        "ohkm_topk": Check(_INT, nullable=True, low=1),
        "background_prob": Check(_NUM, low=0, high=1),
    },
    "train-filter": {
        "filter": Check(_STR, choices=("watermark", "art")),
        "loader": Check(_STR, choices=("torch",)),  # samples are generated in DataLoader workers
        "input_px": Check(_INT, low=16),
        "gen_px": Check(_INT, low=0),
        "holdout": Check(("list",), nullable=True, items="str"),
        "opacity": Check(("list",), items="number"),
        "max_images": Check(_INT, low=1),
        "html_pages": Check(_INT, low=0),  # FilterConfig also refuses 1 (a pool of one page)
        "val_samples": Check(_INT, low=1),
        "target_precision": Check(_NUM, low=0, high=1),
        "lr": Check(_NUM, low=0),
        "layer_decay": Check(_NUM, low=0, high=1),
    },
}


def default_config(command: str) -> dict:
    """The command's YAML defaults as a dict (a fresh copy)."""
    return loader.read_yaml(resources.files("training") / YAML[command], "training defaults")


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
    return loader.validate(cfg, defaults, {**COMMON, **CHECKS[command]})


def load_config(command: str, path=None, sets: list[str] | None = None, flags: dict | None = None):
    """Steps 1-6: the command's typed config."""
    values = load_settings(command, path, sets, flags)
    if command == "pretrain":
        from .pretrain import config_from
    elif command == "finetune":
        from .finetune import config_from
    else:
        from .filters.train import config_from
    return config_from(values)


__all__ = ["CHECKS", "COMMON", "ConfigError", "YAML", "default_config", "load_config", "load_settings"]
