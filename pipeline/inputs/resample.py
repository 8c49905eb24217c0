"""Pillow's LANCZOS downscale of a grey image, value for value, as a few BLAS products.

The pHash's thumbnail is `Image.resize((32, 32), Image.LANCZOS)` of the grey image (as imagehash.phash
does it), and that resize was 0.40 of the cheap path's ~1.1 ms per image. Pillow computes it in fixed
point (libImaging/Resample.c): per output pixel a sum of input pixels times integer coefficients
(the filter's weights normalised and scaled by 2**22), rounded, shifted and clipped to 0..255, one axis
after the other with an 8-bit image in between. Every such sum is an integer below 2**31, so a float64
matrix product computes it exactly, whatever the order of its additions; the coefficient matrix is
banded, so it is applied in blocks of 8 output columns, each against the input columns it reads.
The coefficients are Pillow's to the bit (`_coefficients` follows precompute_coeffs and
normalize_coeffs_8bpc operation for operation), and so is the order of the two passes.
tests/pipeline/inputs/test_resample.py checks the output against Pillow's on every size from 1 to 1,100
and on photos; if a Pillow release changes its resampling, that test fails.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

PRECISION_BITS = 32 - 8 - 2   # Resample.c's fixed point for 8-bit images
SUPPORT = 3.0                 # LANCZOS' support
BLOCK = 8                     # output columns per product: a band's block against the columns it reads
MAX_SIDE = 2048               # larger inputs go to Pillow (the float64 copy would be > 32 MB)


def _coefficients(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Resample.c's integer LANCZOS coefficients: (k, xmin, xmax), where output j reads input pixels
    xmin[j] .. xmin[j] + xmax[j] - 1 with the weights k[j, :xmax[j]] (k's other entries are 0)."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = SUPPORT * filterscale
    inv = 1.0 / filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    center = (np.arange(out_size) + 0.5) * scale
    xmin = np.maximum((center - support + 0.5).astype(np.int64), 0)  # C's (int) truncates, as astype
    xmax = np.minimum((center + support + 0.5).astype(np.int64), in_size) - xmin
    x = np.arange(ksize)
    used = x[None, :] < xmax[:, None]
    t = ((x[None, :] + xmin[:, None]) - center[:, None] + 0.5) * inv
    with np.errstate(divide="ignore", invalid="ignore"):
        a, b = t * math.pi, (t / 3) * math.pi
        sinc = np.where(t == 0.0, 1.0, np.sin(a) / a) * np.where(t == 0.0, 1.0, np.sin(b) / b)
    w = np.where(used & (t >= -SUPPORT) & (t < SUPPORT), sinc, 0.0)
    ww = np.cumsum(w, axis=1)[:, -1:]          # summed left to right, as the C loop does
    w = np.where(ww != 0.0, w / np.where(ww == 0.0, 1.0, ww), w)
    k = np.trunc(np.where(w < 0, -0.5 + w * (1 << PRECISION_BITS), 0.5 + w * (1 << PRECISION_BITS)))
    return np.where(used, k, 0.0), xmin, xmax


@lru_cache(maxsize=256)  # per input size: a block list is ~40 KB at 320 px, ~110 KB at 1,024
def _blocks(in_size: int, out_size: int) -> tuple[tuple[int, int, int, int, np.ndarray], ...]:
    """(out_lo, out_hi, in_lo, in_hi, float64 coefficients) per block of BLOCK output columns: the
    block's rows are the input pixels its outputs read (xmin grows with the output index)."""
    k, xmin, xmax = _coefficients(in_size, out_size)
    ksize = k.shape[1]
    out = []
    for j0 in range(0, out_size, BLOCK):
        j1 = min(j0 + BLOCK, out_size)
        lo = int(xmin[j0])
        hi = max(int((xmin[j0:j1] + xmax[j0:j1]).max()), lo + 1)
        m = np.zeros((hi - lo + ksize, j1 - j0))  # room for k's zero tail past xmax
        for j in range(j0, j1):
            m[xmin[j] - lo:xmin[j] - lo + ksize, j - j0] = k[j]
        out.append((j0, j1, lo, hi, np.ascontiguousarray(m[:hi - lo])))
    return tuple(out)


def _pass(a: np.ndarray, out_size: int) -> np.ndarray:
    """Resample the last axis of a 2-D float64 array of 0..255 integers: one of Pillow's passes."""
    s = np.empty((a.shape[0], out_size))
    for j0, j1, lo, hi, m in _blocks(a.shape[1], out_size):
        np.matmul(a[:, lo:hi], m, out=s[:, j0:j1])
    # (s + 2**21) >> 22, then clip8: exact in float64 (integers below 2**53, a power-of-two scale)
    return np.clip(np.floor((s + float(1 << (PRECISION_BITS - 1))) * 2.0 ** -PRECISION_BITS), 0, 255)


def lanczos_grey(grey: np.ndarray, width: int, height: int) -> np.ndarray:
    """`Image.fromarray(grey).resize((width, height), Image.LANCZOS)` of a 2-D uint8 array, as uint8."""
    h, w = grey.shape
    if max(h, w) > MAX_SIDE:
        from PIL import Image
        return np.asarray(Image.fromarray(grey).resize((width, height), Image.LANCZOS))
    a = grey.astype(np.float64)
    # Resample.c: the vertical pass goes first when the height shrinks by more than twice the width's
    horizontal_first = not (h - height > 0 and h - height > (w - width) * 2)
    for axis in ((1, 0) if horizontal_first else (0, 1)):
        size = width if axis == 1 else height
        if a.shape[axis] == size:       # Pillow skips a pass whose size does not change
            continue
        a = _pass(a, size) if axis == 1 else np.ascontiguousarray(_pass(np.ascontiguousarray(a.T), size).T)
    return a.astype(np.uint8)
