"""The settings every training run has (RunConfig); PretrainConfig, FinetuneConfig and FilterConfig add
theirs. Each field is a `setting()`: its default, the comment training/*.yaml shows and its check
(catalog/config.py, docs/config.md).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from catalog.config import section, setting
from catalog.storage.retry import StorageSettings
@dataclass
class RunConfig:
    """The engine's knobs; PretrainConfig and FinetuneConfig add the model's, data's and loss's."""
    # setting(): the default, the comment training/*.yaml shows, the check (catalog/config.py)
    output: str = setting("", "run folder: checkpoints/, log.jsonl, config.json")
    steps: int = setting(1000, "optimiser steps", low=1)
    accum_steps: int = setting(1, "micro-batches per optimiser step (gradient accumulation)", low=1)
    clip_grad: float = setting(1.0, low=0)
    seed: int = setting(0, low=0)
    loader_workers: int = setting(2, "DataLoader processes per training process (torch loader)", low=0)
    cpu_threads: int = setting(0, "torch intra-op threads on CPU; 0 = torch's default (all cores)", low=0)
    loader: str = setting("auto", "torch | ray | auto (ray under Ray Train, torch otherwise)",
                          choices=("auto", "torch", "ray"))
    checkpoint_every: int = setting(1000, low=1)
    keep_checkpoints: int = setting(3, low=0)  # 0 keeps every checkpoint
    log_every: int = setting(10, low=1)
    precision: str = setting("auto", "auto (bf16 autocast on GPU, fp32 on CPU) | bf16 | fp32",
                             choices=("auto", "bf16", "fp32"))
    workers: int = setting(0, "Ray Train workers; 0 runs in this process", low=0)
    gpus_per_worker: float = setting(0.0, low=0)
    strategy: str = setting("ddp", "ddp | fsdp (shards parameters and optimiser state: for sapiens-1b / 2b)",
                            choices=("ddp", "fsdp"))
    resume: str | None = setting(None, "'auto' = newest checkpoint in output, or a checkpoint path",
                                 kinds=("str",), nullable=True)
    progress: bool = setting(True, "a progress bar on a terminal (log lines otherwise)")
    progress_every_s: float = setting(30.0, "without a terminal: a progress line at most this often (0 = each "
                                            "logged step)", low=0)
    storage: StorageSettings = section(StorageSettings, note="how requests to an object store (--data s3://...) "
                                                             "are retried (docs/storage.md)")

    def __post_init__(self):
        if self.strategy not in ("ddp", "fsdp"):
            raise ValueError(f"strategy {self.strategy!r}: use 'ddp' or 'fsdp'")
        if self.loader not in ("auto", "torch", "ray"):
            raise ValueError(f"loader {self.loader!r}: use 'torch', 'ray' or 'auto'")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision {self.precision!r}: use 'auto', 'bf16' or 'fp32'")
        if self.accum_steps < 1:
            raise ValueError(f"accum_steps {self.accum_steps}: must be at least 1")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def config_from(cls, values: dict, what: str):
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise KeyError(f"unknown {what} settings {unknown}; known: {', '.join(sorted(known))}")
    if isinstance(values.get("storage"), dict):  # the section typed as the dataclass declares it
        values = {**values, "storage": StorageSettings(**values["storage"])}
    return cls(**values)
