"""Learning-rate rules as pure functions and AdamW parameter groups: MAE / Sapiens pretraining (linear
scaling, warmup + cosine), fine-tuning (layer-wise lr decay, warmup + linear or step decay)."""
from __future__ import annotations

import math

import torch
from torch import nn


def scaled_lr(base_lr: float, global_batch: int) -> float:
    """Linear scaling rule: lr = base_lr * batch / 256 (MAE, Sapiens)."""
    return base_lr * global_batch / 256


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, min_ratio: float = 0.0) -> float:
    """Multiplier of the peak lr at `step` (0-based): linear warmup to 1, then a half cosine to min_ratio."""
    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive, got {total_steps}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def no_weight_decay(name: str, param: nn.Parameter) -> bool:
    """Norm weights, biases, position embeddings and learned tokens are not decayed (MAE, Sapiens)."""
    return param.ndim <= 1 or name.endswith(("pos_embed", "cls_token", "mask_token"))


def adamw(groups: list[dict], lr: float, betas, fused: bool = True) -> torch.optim.AdamW:
    """AdamW with the fused kernel (one pass over each tensor instead of a dozen foreach passes: on a CPU
    the step of a ViT-B falls from seconds to a fraction); the same update up to rounding."""
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused or None)


def clip_and_step(model: nn.Module, opt: torch.optim.Optimizer, max_norm: float) -> torch.Tensor:
    """Clip the gradients' global L2 norm to `max_norm`, then take the optimiser step; returns the norm.

    The update is `clip_grad_norm_` + `opt.step()`'s, with one pass over the gradients fewer:
    `clip_grad_norm_` multiplies every gradient by min(1, max_norm / norm) even when that is 1. Here a norm
    within bounds scales nothing, and with the fused AdamW the clip factor goes into the kernel as its
    gradient scale (the kernel divides each gradient by 1 / factor as it reads it; the same value up to one
    rounding). Other optimisers (the foreach AdamW that FSDP's sharded parameters take) clip as before."""
    if not opt.defaults.get("fused"):
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        return norm
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)
    factor = max_norm / (float(norm) + 1e-6)  # clip_grad_norm_'s formula
    if factor < 1.0:
        opt.grad_scale = torch.tensor(1.0 / factor, dtype=torch.float32, device=norm.device)
        try:
            opt.step()
        finally:
            del opt.grad_scale
    else:
        opt.step()
    return norm


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue  # the fixed sin-cos tables
        (no_decay if no_weight_decay(name, p) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# --- fine-tuning ---------------------------------------------------------------------------------
def layer_id(name: str, depth: int) -> int:
    """0 for the embeddings, i + 1 for block i, depth + 1 for the final norm and the decoder."""
    if name.startswith("encoder."):
        rest = name[len("encoder."):]
        if rest.startswith(("cls_token", "pos_embed", "patch_embed")):
            return 0
        if rest.startswith("blocks."):
            return int(rest.split(".")[1]) + 1
    return depth + 1


def layer_decay_groups(model: nn.Module, weight_decay: float, layer_decay: float) -> list[dict]:
    """One AdamW group per (layer, decayed or not), with `lr_scale` = layer_decay^(depth + 1 - layer)."""
    depth = model.encoder.depth
    groups: dict = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        lid = layer_id(name, depth)
        nd = no_weight_decay(name, p)
        key = (lid, nd)
        if key not in groups:
            groups[key] = {"params": [], "names": [], "weight_decay": 0.0 if nd else weight_decay,
                           "lr_scale": layer_decay ** (depth + 1 - lid)}
        groups[key]["params"].append(p)
        groups[key]["names"].append(name)
    return [groups[k] for k in sorted(groups)]


def warmup_linear(step: int, total: int, warmup: int) -> float:
    """Multiplier of the peak lr at `step`: linear warmup to 1, then linear decay to 0 at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def warmup_step(step: int, total: int, warmup: int, milestones=(0.67, 0.89), gamma: float = 0.1) -> float:
    """Pose schedule: linear warmup, then x0.1 at 67 % and 89 % of the run (mmpose's 170 / 200 epochs)."""
    if step < warmup:
        return (step + 1) / warmup
    return gamma ** sum(step >= m * total for m in milestones)
