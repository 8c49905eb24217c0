"""The Sapiens fine-tuning losses, exactly (tests/training/tasks/test_finetune_losses.py checks hand-computed values).

Masks are boolean (B, 1, H, W), True on person pixels. Predictions at a lower resolution than their
targets (seg, depth, normals) are upsampled bilinearly first (`match_size`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

SEG_IGNORE = 255  # label of pixels that carry no class (padding after augmentation)


def match_size(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if pred.shape[-2:] == target.shape[-2:]:
        return pred
    return F.interpolate(pred, size=target.shape[-2:], mode="bilinear", align_corners=False)


def pose_heatmap_loss(pred: torch.Tensor, target: torch.Tensor, weights: torch.Tensor,
                      topk: int | None = None) -> torch.Tensor:
    """MSE between predicted and target heatmaps (B, K, h, w), each keypoint weighted (B, K).

    loss = mean over b, k of w_bk * mean over pixels of (pred - target)^2. With `topk` (OHKM, Sapiens
    uses 128 for the 308-keypoint set) only the k largest weighted keypoint losses of each sample count.
    """
    per_kpt = ((pred.float() - target.float()) ** 2).mean(dim=(2, 3)) * weights.float()  # (B, K)
    if topk is not None and topk < per_kpt.shape[1]:
        return per_kpt.topk(topk, dim=1).values.mean()
    return per_kpt.mean()


def seg_loss(logits: torch.Tensor, labels: torch.Tensor, class_weights: torch.Tensor) -> torch.Tensor:
    """Class-weighted cross-entropy: sum_i w[y_i] * -log p_i(y_i) / sum_i w[y_i] (pixels labelled 255 skipped)."""
    logits = match_size(logits, labels.unsqueeze(1))
    return F.cross_entropy(logits.float(), labels.long(), weight=class_weights.to(logits.device).float(),
                           ignore_index=SEG_IGNORE)


def relative_depth(depth: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Foreground depth divided by its per-image maximum over person pixels: relative depth in (0, 1].

    (Min-max scaling would send the nearest pixel to 0, whose log is only the clamp; dividing by the
    maximum keeps every target positive. The loss is partly scale-invariant either way.)
    """
    fg = torch.where(mask, depth, torch.zeros_like(depth))
    top = fg.flatten(1).amax(dim=1).clamp_min(1e-6).view(-1, 1, 1, 1)
    return torch.where(mask, depth / top, torch.zeros_like(depth))


def depth_valid(depth: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Person pixels with a usable depth (renders store 0 or inf on the background)."""
    return mask & torch.isfinite(depth) & (depth > 0)


def depth_loss(pred: torch.Tensor, depth: torch.Tensor, mask: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Scale-invariant log loss over person pixels, per image, averaged over the batch:

        d = log(gt) - log(pred)   (both clamped at 1e-6),  gt = relative_depth(depth)
        L = sqrt(mean(d^2) - 0.5 * mean(d)^2)
    Images without a valid person pixel contribute nothing.
    """
    pred = match_size(pred, depth).float()
    valid = depth_valid(depth, mask)
    gt = relative_depth(torch.where(valid, depth, torch.zeros_like(depth)), valid)
    d = torch.log(gt.clamp_min(eps)) - torch.log(pred.clamp_min(eps))
    d = torch.where(valid, d, torch.zeros_like(d))
    n = valid.flatten(1).sum(dim=1)
    has = n > 0
    if not has.any():
        return pred.sum() * 0.0  # keeps the graph: a batch without people is a zero step, not an error
    mean_d = d.flatten(1).sum(dim=1)[has] / n[has]
    mean_d2 = (d ** 2).flatten(1).sum(dim=1)[has] / n[has]
    # the clamp only guards the rounding of mean(d^2) - 0.5 mean(d)^2 >= 0.5 mean(d^2) >= 0
    return torch.sqrt((mean_d2 - 0.5 * mean_d ** 2).clamp_min(1e-12)).mean()


def normal_loss(pred: torch.Tensor, normal: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(1 - cos) + L1 between unit-normalised predicted and true normals, averaged over person pixels.

    L1 is the mean absolute difference per component (mean over pixels and the 3 channels).
    """
    pred = match_size(pred, normal).float()
    p = F.normalize(pred, dim=1, eps=1e-6)
    g = F.normalize(normal.float(), dim=1, eps=1e-6)
    m = mask[:, 0] & (normal.float().norm(dim=1) > 0.5)  # person pixels with a real normal
    if not m.any():
        return pred.sum() * 0.0
    cos = (p * g).sum(dim=1)[m]
    l1 = (p - g).abs().permute(0, 2, 3, 1)[m]
    return (1 - cos).mean() + l1.mean()
