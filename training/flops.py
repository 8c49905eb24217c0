"""Analytic FLOPs of MAE pretraining (multiply-add = 2 FLOPs), for benchmarks and MFU.

Counts every matmul: linear layers, the patch projection, and attention's QK^T and AV. The Sapiens
model cards quote `encoder_linear_macs` at 1024 px (4096 tokens, no masking): 1.242T for 0.3B.
"""
from __future__ import annotations

from training.vit import preset


def block_macs(tokens: int, width: int, mlp: int, attention: bool = True) -> int:
    linear = tokens * (4 * width * width + 2 * width * mlp)  # qkv + proj + fc1 + fc2
    return linear + (2 * tokens * tokens * width if attention else 0)  # QK^T and AV


def encoder_linear_macs(name: str, image_size: int, patch: int = 16) -> int:
    """Linear-layer multiply-adds of the encoder on the whole image (the model-card 'FLOPs')."""
    p = preset(name)
    n = (image_size // patch) ** 2
    return n * 3 * patch * patch * p.width + p.depth * block_macs(n, p.width, p.mlp, attention=False)


def mae_forward_flops(name: str, image_size: int, mask_ratio: float = 0.75, patch: int = 16,
                      batch_size: int | None = None) -> int:
    """FLOPs of one MAE forward pass for one image: patch embedding of the visible patches, the encoder
    on the visible tokens + cls, the decoder on all tokens + cls.

    With `batch_size`, as `MaskedAutoencoder` executes it: the first decoder block's qkv projection runs on
    the mask token once per position for the whole batch (N / batch_size rows per image, not N * mask_ratio).
    Without, every token's (the reference implementation's count)."""
    p = preset(name)
    n = (image_size // patch) ** 2
    visible = int(n * (1 - mask_ratio)) + 1
    macs = (visible - 1) * 3 * patch * patch * p.width  # patch embedding of the kept patches only
    macs += p.depth * block_macs(visible, p.width, p.mlp)
    macs += visible * p.width * p.decoder_width  # decoder_embed
    macs += p.decoder_depth * block_macs(n + 1, p.decoder_width, 4 * p.decoder_width)
    macs += n * p.decoder_width * patch * patch * 3  # decoder_pred
    if batch_size and p.decoder_depth:
        shared = max(n - (visible - 1) - n / batch_size, 0.0)  # mask-token rows per image not projected
        macs -= round(shared * 3 * p.decoder_width ** 2)
    return 2 * macs


def mae_train_flops(name: str, image_size: int, mask_ratio: float = 0.75, grad_checkpointing: bool = False,
                    batch_size: int | None = None, patch: int = 16) -> int:
    """Forward + backward (backward ~ 2x forward); activation checkpointing adds one more forward.

    With `batch_size`, as executed (see mae_forward_flops); also, the backward skips the cls and kept
    tokens' rows of the last decoder block after its qkv projection, and their prediction head: no loss
    reads them."""
    total = (4 if grad_checkpointing else 3) * mae_forward_flops(name, image_size, mask_ratio, patch, batch_size)
    p = preset(name)
    n = (image_size // patch) ** 2
    kept = int(n * (1 - mask_ratio))
    if batch_size and p.decoder_depth and kept < n:
        w = p.decoder_width
        row = w * w + 2 * w * 4 * w + 2 * (n + 1) * w  # proj, fc1 + fc2, this row's QK^T and AV
        total -= 2 * 2 * ((kept + 1) * row + kept * w * patch * patch * 3)  # backward = 2x their forward
    return total
