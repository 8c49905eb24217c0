"""Training checkpoints (one file per step) and the encoder export that loads into timm.

A checkpoint is a plain `torch.save` dict of tensors and JSON-able values, read back with
`torch.load(weights_only=True)` only (a file whose pickle names anything else is refused unread):
    model       full state dict of the MaskedAutoencoder (keys `encoder.*`, `decoder_*`, `mask_token`)
    optimizer   AdamW state (full, also under FSDP)
    scheduler   LambdaLR state
    step        optimiser steps done
    config      the PretrainConfig as a dict
    ranks       per rank: masking RNG, torch / numpy / python RNG (tensors and lists), data stream positions
Checkpoints written before the RNG states became tensors hold numpy's tuple state; they load with exactly
numpy's array-rebuilding globals allowed (`LEGACY_GLOBALS`). It is written to a temporary name and renamed, so a crash never leaves a file that looks whole.
"""
from __future__ import annotations

import json
import logging
import pickle
import random
import re
import zipfile
from pathlib import Path

import numpy as np
import torch

import catalog

log = logging.getLogger(__name__)

_NAME = re.compile(r"^step-(\d{8})\.pt$")


def checkpoint_dir(output) -> Path:
    return Path(output) / "checkpoints"


def checkpoint_path(output, step: int) -> Path:
    return checkpoint_dir(output) / f"step-{step:08d}.pt"


def list_checkpoints(output) -> list[Path]:
    folder = checkpoint_dir(output)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _NAME.match(p.name))


def step_of(path) -> int:
    """The step in a checkpoint's file name (step-00000042.pt -> 42); 0 for another name."""
    m = _NAME.match(Path(path).name)
    return int(m.group(1)) if m else 0


def latest_checkpoint(output) -> Path | None:
    found = list_checkpoints(output)
    return found[-1] if found else None


def rng_state(mask_generator: torch.Generator | None = None) -> dict:
    """Every RNG a step draws from, as tensors and plain lists (loadable with weights_only=True)."""
    version, words, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state = {"python": {"version": version, "state": list(words), "gauss": gauss},
             "numpy": {"bit_generator": np_state["bit_generator"],
                       "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                       "pos": int(np_state["state"]["pos"]), "has_gauss": int(np_state["has_gauss"]),
                       "gauss": float(np_state["gauss"])},
             "torch": torch.get_rng_state()}
    if mask_generator is not None:
        state["mask"] = mask_generator.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict, mask_generator: torch.Generator | None = None):
    """Restore `rng_state`'s output; also the tuple states of checkpoints from before it was tensors."""
    py, npy = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]) if isinstance(py, dict) else py)
    if isinstance(npy, dict):
        npy = {"bit_generator": npy["bit_generator"], "has_gauss": npy["has_gauss"], "gauss": npy["gauss"],
               "state": {"key": npy["key"].numpy().astype(np.uint32), "pos": npy["pos"]}}
    np.random.set_state(npy)
    torch.set_rng_state(state["torch"])
    if mask_generator is not None and "mask" in state:
        mask_generator.set_state(state["mask"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_checkpoint(output, step: int, payload: dict, keep: int = 3) -> Path:
    """Write `payload` as the checkpoint of `step`, then delete all but the newest `keep`."""
    path = checkpoint_path(output, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    with catalog.atomic_path(path) as tmp:
        torch.save(payload, tmp)
    for old in list_checkpoints(output)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    log.info("checkpoint: step %d -> %s", step, path)
    return path


# numpy's array rebuilding, which old checkpoints' numpy RNG tuples need; nothing here runs code
LEGACY_GLOBALS = [np._core.multiarray._reconstruct, (np._core.multiarray._reconstruct,
                                                    "numpy.core.multiarray._reconstruct"),
                  np.ndarray, np.dtype, np.dtypes.UInt32DType]


class UnsafeCheckpointError(ValueError):
    """A .pt file whose pickle names code to run or classes to build: refused, never executed."""


def safe_load(path, what: str = "checkpoint", mmap: bool = False):
    """`torch.load(path, weights_only=True)`: tensors, containers and plain values only.

    A file that needs any other global (a pickled object, a function call) is refused with an error that
    names it; its payload never runs. `mmap`: tensors stay on disk until read (a look at a large
    checkpoint's config costs no memory).
    """
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(2)
    if not zipfile.is_zipfile(path) and head[:1] != b"\x80":  # torch.save writes a zip; before 1.6 a pickle
        raise ValueError(f"{what} {path}: not a PyTorch file (torch.save writes a zip archive); pass a checkpoint "
                         "OUT/checkpoints/step-N.pt, an encoder export OUT/encoder.pth or a timm state dict")
    try:
        with torch.serialization.safe_globals(LEGACY_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and zipfile.is_zipfile(path))
    except pickle.UnpicklingError as exc:
        named = re.search(r"GLOBAL ([\w.]+)", str(exc))
        detail = f"its pickle calls {named.group(1)}" if named else str(exc).strip().splitlines()[-1]
        raise UnsafeCheckpointError(
            f"{what} {path}: refused to load: it is not a plain tensor file ({detail}). humanset only "
            f"loads tensors, lists and dicts (torch.load weights_only=True); re-save the weights as a plain "
            f"state dict (torch.save(model.state_dict(), PATH)) where you trust the file") from None


def checkpoint_of(path, what: str = "--checkpoint") -> Path:
    """A checkpoint file, or the newest checkpoint of a training run's folder OUT."""
    path = Path(path)
    if path.is_dir():
        found = latest_checkpoint(path)
        if found is None:
            raise FileNotFoundError(f"{what} {path}: a folder without checkpoints (OUT/checkpoints/step-N.pt); pass "
                                    "a training run's folder or one of its checkpoints")
        return found
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path}: no such file; pass a checkpoint OUT/checkpoints/step-N.pt or the run "
                                "folder OUT (its newest checkpoint)")
    return path


def load_checkpoint(path) -> dict:
    """A training checkpoint (a file, or a run folder's newest) as the dict `save_checkpoint` wrote."""
    path = checkpoint_of(path, "checkpoint")
    state = safe_load(path)
    if not isinstance(state, dict) or all(torch.is_tensor(v) for v in state.values()):
        raise ValueError(f"checkpoint {path}: weights only (an exported encoder or a plain state dict), not a "
                         "humanset training checkpoint; pass a run's OUT/checkpoints/step-N.pt, or its folder OUT")
    return state


def kind_of(state: dict) -> str:
    """Which training wrote a checkpoint: 'pretrain', 'finetune' (with its task) or 'filter'."""
    cfg = state.get("config") or {}
    if "task" in state:
        return f"finetune {state['task']}"
    if "filter" in cfg:
        return f"filter {cfg['filter']}"
    return "pretrain" if "mask_ratio" in cfg else "unknown"


def resolve_resume(resume, output) -> Path | None:
    """--resume: True / 'auto' means the newest checkpoint in OUT (None if there is none), a path means it."""
    if resume in (None, False, ""):
        return None
    if resume is True or resume == "auto":
        return latest_checkpoint(output)
    return Path(resume)


# --- export ------------------------------------------------------------------------------------
def encoder_state_dict(model_state: dict) -> dict:
    """The encoder part of an MAE state dict, with timm VisionTransformer keys (no prefix)."""
    out = {k[len("encoder."):]: v for k, v in model_state.items() if k.startswith("encoder.")}
    if not out:
        raise KeyError("no 'encoder.*' keys in this state dict; is it a humanset MAE checkpoint?")
    return out


def export_encoder(checkpoint, out_path) -> Path:
    """Write the encoder of a checkpoint (path or loaded dict) as a plain state dict for timm.

    Load it with `timm.models.vision_transformer.VisionTransformer(**json.load(open(OUT.json)))`
    and `load_state_dict(torch.load(OUT), strict=True)`.
    """
    ckpt = load_checkpoint(checkpoint) if not isinstance(checkpoint, dict) else checkpoint
    if "timm_kwargs" not in ckpt or "model" not in ckpt:
        raise ValueError(f"checkpoint {checkpoint}: holds no model with its timm arguments (a {kind_of(ckpt)} "
                         "checkpoint of an older humanset?); export from a checkpoint humanset pretrain wrote")
    state = {k: v.detach().cpu().contiguous() for k, v in encoder_state_dict(ckpt["model"]).items()}
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with catalog.atomic_path(out_path) as tmp:
        torch.save(state, tmp)
    catalog.write_json(out_path.with_suffix(".json"), ckpt["timm_kwargs"])
    log.info("encoder: %d tensors -> %s (timm VisionTransformer args in %s)", len(state), out_path,
             out_path.with_suffix(".json").name)
    return out_path


def timm_encoder(path):
    """Load an exported encoder into timm's VisionTransformer (strict), for users without humanset."""
    from timm.models.vision_transformer import VisionTransformer

    path = Path(path)
    kwargs = json.loads(path.with_suffix(".json").read_text())
    model = VisionTransformer(**kwargs)
    model.load_state_dict(safe_load(path, "encoder"), strict=True)
    return model
