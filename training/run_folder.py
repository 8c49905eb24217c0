"""A training run's folder (--output of pretrain, finetune and train-filter): one owner, one kind.

- Paths are recorded resolved (`resolved`): config.json and every checkpoint name the data, the encoder
  and the output absolutely (URIs as they are), so a run and its checkpoints work from any directory.
- `owned(cfg, kind)` holds the folder for the run: a folder of another kind, or of this kind started
  with other settings, is refused; one with checkpoints is refused without --resume (a second run
  would start again from step 0 beside the first one's checkpoints); then the folder's lock is taken
  (catalog/io.py: removed when the run ends) and its kind marker written (catalog/run_kind.py).
"""
from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from pathlib import Path

import catalog
from catalog import run_kind
from catalog.storage.paths import absolute

from training import checkpoint as ckpt

# settings a resumed run may change: how it runs, not what it learns
RUN_KNOBS = frozenset({"output", "steps", "resume", "progress", "progress_every_s", "workers", "gpus_per_worker",
                       "loader_workers", "cpu_threads", "checkpoint_every", "keep_checkpoints", "log_every",
                       "loader", "strategy", "precision", "compile", "grad_checkpointing", "storage"})
PATH_KEYS = ("data", "output", "encoder", "images", "renders", "backgrounds")
RESUME = "resume it (--resume)"


def resolved(cfg):
    """cfg with its paths absolute (URIs and empty values as they are); a --resume path too."""
    paths = {k: absolute(getattr(cfg, k)) for k in PATH_KEYS if getattr(cfg, k, "")}
    if cfg.resume not in (None, False, "", "auto"):
        paths["resume"] = absolute(cfg.resume)
    return dataclasses.replace(cfg, **paths)


def identity(cfg) -> dict:
    """What a resume must keep: every setting but the run knobs."""
    return {k: v for k, v in cfg.to_dict().items() if k not in RUN_KNOBS}


def check(cfg, kind: str) -> None:
    """Refuse the output folder (nothing written): another kind, other settings, or a used folder
    without --resume. `cfg.output` is local (training writes checkpoints with torch.save)."""
    out = Path(cfg.output)
    run_kind.check(out, kind, identity(cfg), resume=RESUME)
    done = ckpt.list_checkpoints(out)
    if done and cfg.resume in (None, False, ""):
        raise run_kind.RunKindError(
            f"{cfg.output}: holds {run_kind.describe(kind)} with checkpoints up to step {ckpt.step_of(done[-1])}; "
            f"pass --resume to continue it, or another --output")


@contextmanager
def owned(cfg, kind: str):
    """The output folder held for a run: checked, locked (the lock removed at the end), marked."""
    check(cfg, kind)
    out = Path(cfg.output)
    try:
        with catalog.run_lock(out):
            run_kind.claim(out, kind, identity(cfg), resume=RESUME)
            yield out
    except catalog.RunLocked as e:
        raise run_kind.RunKindError(str(e)) from None
