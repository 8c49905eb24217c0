"""Learning-rate rules of MAE / Sapiens pretraining as pure functions, and AdamW parameter groups."""
from __future__ import annotations

import math

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


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue  # the fixed sin-cos tables
        (no_decay if no_weight_decay(name, p) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
