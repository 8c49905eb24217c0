"""Keypoint decoding shared by evaluation and prediction: heatmap peaks to input pixels, affine maps."""
from __future__ import annotations

import numpy as np


def heatmap_keypoints(heatmaps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(K, h, w) -> keypoints (K, 2) in input pixels and their peak values. The argmax is moved a quarter
    pixel towards the higher neighbour (the standard sub-pixel refinement), then mapped from the 1/4 grid."""
    k, h, w = heatmaps.shape
    flat = heatmaps.reshape(k, -1)
    idx = flat.argmax(axis=1)
    peak = flat[np.arange(k), idx]
    ys, xs = (idx // w).astype(np.float64), (idx % w).astype(np.float64)
    for j in range(k):
        x, y = int(xs[j]), int(ys[j])
        hm = heatmaps[j]
        if 0 < x < w - 1:
            xs[j] += 0.25 * np.sign(hm[y, x + 1] - hm[y, x - 1])
        if 0 < y < h - 1:
            ys[j] += 0.25 * np.sign(hm[y + 1, x] - hm[y - 1, x])
    return np.stack([(xs + 0.5) * 4 - 0.5, (ys + 0.5) * 4 - 0.5], axis=1), peak


def apply_affine(xy: np.ndarray, m: np.ndarray) -> np.ndarray:
    return np.c_[xy, np.ones(len(xy))] @ np.asarray(m, np.float64).T
