"""Pretrained encoder weights into a fine-tuning ViT: humanset MAE checkpoints, exported encoders, timm
and Sapiens state dicts, with the position table resized to the new grid. Loading is weights-only."""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from training import checkpoint as ckpt
from training.vit import PRESETS, VisionTransformer

log = logging.getLogger(__name__)


def resize_pos_embed(pos: torch.Tensor, grid_hw, src_hw=None) -> torch.Tensor:
    """(1, 1 + gh0*gw0, D) -> (1, 1 + gh*gw, D): the patch part resized bicubically, the cls row kept.
    The source grid is square unless `src_hw` says otherwise."""
    cls, patches = pos[:, :1], pos[:, 1:]
    n, d = patches.shape[1], patches.shape[2]
    if src_hw is None:
        side = int(round(math.sqrt(n)))
        if side * side != n:
            raise ValueError(f"position table of {n} patches is not square; pass its grid")
        src_hw = (side, side)
    if tuple(src_hw) == tuple(grid_hw):
        return pos.clone()
    grid = patches.reshape(1, src_hw[0], src_hw[1], d).permute(0, 3, 1, 2).float()
    grid = F.interpolate(grid, size=tuple(grid_hw), mode="bicubic", align_corners=False)
    return torch.cat([cls.float(), grid.permute(0, 2, 3, 1).reshape(1, -1, d)], dim=1).to(pos.dtype)


ENCODER_PREFIXES = ("encoder.", "backbone.", "module.", "model.")


def encoder_weights(path) -> tuple[dict, tuple | None]:
    """A state dict of encoder weights (timm names) from a humanset MAE or fine-tuning checkpoint, an
    exported encoder.pth, or a timm ViT state dict; plus the source grid if the file says it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--encoder {path}: no such file (an MAE checkpoint OUT/checkpoints/step-N.pt, "
                                f"OUT/encoder.pth, or a timm ViT state dict)")
    obj = ckpt.safe_load(path, "--encoder")
    src_hw = None
    if isinstance(obj, dict) and "model" in obj and isinstance(obj["model"], dict):
        src_hw = _grid_from_kwargs(obj.get("timm_kwargs"))
        obj = obj["model"]
    elif isinstance(obj, dict) and "state_dict" in obj:
        obj = obj["state_dict"]
    side = path.with_suffix(".json")
    if src_hw is None and side.is_file():
        src_hw = _grid_from_kwargs(json.loads(side.read_text()))
    state = {}
    for k, v in obj.items():
        if not torch.is_tensor(v):
            continue
        for p in ENCODER_PREFIXES:  # Sapiens' own checkpoints use 'backbone.'
            if k.startswith(p):
                k = k[len(p):]
                break
        else:
            if k.startswith(("decoder", "mask_token", "head.")):
                continue  # MAE decoder or a task head: not encoder weights
        state[k] = v
    if "pos_embed" not in state or "patch_embed.proj.weight" not in state:
        raise KeyError(f"{path}: no ViT encoder weights found (need pos_embed and patch_embed.proj.weight)")
    return state, src_hw


def encoder_preset(path) -> str | None:
    """The preset an encoder file was trained with: from the timm arguments beside it (OUT/encoder.json,
    what `humanset pretrain` exports and train-filter reads) or inside a humanset checkpoint; None when
    the file does not say (a bare timm or Sapiens state dict). A shape no preset has is refused."""
    path = Path(path)
    side = path.with_suffix(".json")
    state = ckpt.safe_load(path, "--encoder", mmap=True)  # a file that is no checkpoint is refused here, early
    kw = None
    if side.is_file():
        try:
            kw = json.loads(side.read_text())
        except ValueError as e:
            raise ValueError(f"{side}: not the encoder's timm arguments ({e})") from None
    elif isinstance(state, dict) and "model" in state:  # a humanset checkpoint names its preset in its config
        if isinstance(state.get("config"), dict) and state["config"].get("model"):
            return state["config"]["model"]
        kw = state.get("timm_kwargs")
    if not isinstance(kw, dict) or not {"embed_dim", "depth", "num_heads"} <= set(kw):
        return None
    shape = (kw["embed_dim"], kw["depth"], kw["num_heads"])
    for name, p in PRESETS.items():
        if (p.width, p.depth, p.heads) == shape:
            return name
    raise ValueError(f"--encoder {path}: a ViT of width {shape[0]}, depth {shape[1]}, {shape[2]} heads, which no "
                     f"preset has ({', '.join(PRESETS)})")


def _grid_from_kwargs(kw) -> tuple | None:
    if not kw:
        return None
    size, patch = kw.get("img_size"), kw.get("patch_size", 16)
    if size is None:
        return None
    h, w = (size, size) if isinstance(size, int) else size
    return h // patch, w // patch


def load_encoder(encoder: VisionTransformer, path) -> dict:
    """Load pretrained weights into `encoder`, resizing the position table. Returns what was skipped."""
    state, src_hw = encoder_weights(path)
    pos = state["pos_embed"]
    if pos.shape[1] == encoder.grid_hw[0] * encoder.grid_hw[1]:  # a table without a cls row
        pos = torch.cat([torch.zeros_like(pos[:, :1]), pos], dim=1)
    state["pos_embed"] = resize_pos_embed(pos, encoder.grid_hw, src_hw)
    own = encoder.state_dict()
    bad = [k for k in state if k in own and own[k].shape != state[k].shape]
    if bad:
        raise ValueError(f"encoder weights {path}: shapes differ for {bad[:4]} "
                         f"(e.g. {tuple(state[bad[0]].shape)} vs {tuple(own[bad[0]].shape)}); "
                         f"is --model the preset it was trained with?")
    result = encoder.load_state_dict(state, strict=False)
    if result.missing_keys:
        raise KeyError(f"encoder weights {path}: missing {result.missing_keys[:6]}")
    log.info("encoder weights from %s (position grid %s -> %s)%s", path, src_hw or "square",
             encoder.grid_hw, f"; ignored {len(result.unexpected_keys)} extra tensors" if result.unexpected_keys else "")
    return {"unexpected": list(result.unexpected_keys), "src_grid": src_hw}
