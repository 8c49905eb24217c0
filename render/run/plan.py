"""Which frames a shard holds, in which order: scan-major plans (pure, no Blender).

A frame's parameters come from (seed, frame index) alone (render.sampling); the plan only decides
order and grouping. Frames are cut into plan windows of W = n_scans x frames_per_scan_visit frames
(rounded up to whole shards). Inside a window the frames are sorted by (scan, frame index) and cut into
shards, so a worker renders runs of about `frames_per_scan_visit` frames of one scan back to back and
keeps that scan loaded between them. Every frame of the run is in exactly one shard; the scan each
frame shows is still its own uniform draw, so the library is covered uniformly.

frames_per_scan_visit <= 1 keeps the per-frame order: shard k holds frames [k*F, (k+1)*F).
Memory and time per shard grow with W (the window's scan draws, ~20 us each), not with the run.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from render.sampling import scan_draw


def window_frames(n_scans: int, frames_per_scan_visit: int, frames_per_shard: int) -> int:
    if frames_per_scan_visit <= 1 or n_scans <= 1:
        return frames_per_shard
    return frames_per_shard * math.ceil(n_scans * frames_per_scan_visit / frames_per_shard)


def n_shards(frames: int, frames_per_shard: int) -> int:
    return (frames + frames_per_shard - 1) // frames_per_shard


def shard_frames(seed: int, shard: int, frames: int, n_scans: int, frames_per_scan_visit: int,
                 frames_per_shard: int) -> list[int]:
    """Frame indices of `shard`, in render order."""
    w_size = window_frames(n_scans, frames_per_scan_visit, frames_per_shard)
    window, j = divmod(shard, w_size // frames_per_shard)
    lo, hi = window * w_size, min(frames, (window + 1) * w_size)
    if frames_per_scan_visit <= 1 or n_scans <= 1:
        return list(range(lo, hi))
    order = _window_order(seed, lo, hi, n_scans)
    return order[j * frames_per_shard:(j + 1) * frames_per_shard].tolist()


@lru_cache(maxsize=4)
def _window_order(seed: int, lo: int, hi: int, n_scans: int) -> np.ndarray:
    idx = np.arange(lo, hi, dtype=np.int64)
    scans = np.fromiter((scan_draw(seed, i, n_scans) for i in idx), dtype=np.int64, count=len(idx))
    return idx[np.lexsort((idx, scans))]
