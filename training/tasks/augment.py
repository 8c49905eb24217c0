"""Sapiens-style augmentation for fine-tuning, each a pure function of its generator: random scale and
crop (affine), flips, photometric distortion, and pasting a person onto a non-human background from a
curation run (BackgroundPool)."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import cv2
import numpy as np

import catalog
from catalog.source_bytes import read_source

from training.image_decode import decode_image

log = logging.getLogger("training.tasks.data")

NEAREST, LINEAR = cv2.INTER_NEAREST, cv2.INTER_LINEAR


@dataclass
class Augment:
    train: bool = True
    scale: tuple = (0.7, 1.0)  # crop side as a fraction of the largest crop of the output aspect
    flip: float = 0.5
    background: float = 0.5  # probability of pasting onto a non-human photo (when a pool is given)
    photometric: bool = True
    rotate: float = 30.0  # pose only: max rotation in degrees (applied with probability 0.6)
    pose_scale: tuple = (0.75, 1.25)


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, index, 7])


def crop_affine(src_hw, out_hw, rng, aug: Augment) -> tuple[np.ndarray, bool]:
    """2x3 affine from source to output pixels: a crop of the output's aspect (random scale and position
    when training, the centred largest crop otherwise), and whether it mirrors horizontally."""
    sh, sw = src_hw
    oh, ow = out_hw
    full = min(sw / ow, sh / oh)  # source pixels per output pixel of the largest fitting crop
    s = full * (rng.uniform(*aug.scale) if aug.train else 1.0)
    cw, ch = ow * s, oh * s
    x0 = rng.uniform(0, sw - cw) if aug.train else (sw - cw) / 2
    y0 = rng.uniform(0, sh - ch) if aug.train else (sh - ch) / 2
    flip = aug.train and rng.random() < aug.flip
    m = np.array([[1 / s, 0, -x0 / s], [0, 1 / s, -y0 / s]])
    if flip:
        m = np.array([[-1, 0, ow - 1], [0, 1, 0]]) @ np.vstack([m, [0, 0, 1]])
    return m, flip


def box_affine(box, out_hw, rng, aug: Augment, padding: float = 1.25) -> tuple[np.ndarray, bool]:
    """Top-down person crop: the box (x, y, w, h) grown to the output aspect and padded by 1.25, with
    random scale, rotation and mirror when training. Returns the 2x3 source -> output affine."""
    x, y, w, h = box
    oh, ow = out_hw
    cx, cy = x + w / 2, y + h / 2
    if w / h > ow / oh:
        h = w * oh / ow
    else:
        w = h * ow / oh
    w, h = w * padding, h * padding
    rot, flip = 0.0, False
    if aug.train:
        f = rng.uniform(*aug.pose_scale)
        w, h = w * f, h * f
        if rng.random() < 0.6:
            rot = rng.uniform(-aug.rotate, aug.rotate)
        flip = rng.random() < aug.flip
    s = ow / w
    m = cv2.getRotationMatrix2D((cx, cy), rot, s)
    m[:, 2] += np.array([ow / 2 - cx, oh / 2 - cy])
    if flip:
        m = np.array([[-1, 0, ow - 1], [0, 1, 0]]) @ np.vstack([m, [0, 0, 1]])
    return m, flip


def warp(arr: np.ndarray, m: np.ndarray, out_hw, interp=LINEAR, border=0) -> np.ndarray:
    return cv2.warpAffine(arr, m, (out_hw[1], out_hw[0]), flags=interp, borderMode=cv2.BORDER_CONSTANT,
                          borderValue=border)


def photometric(img: np.ndarray, rng) -> np.ndarray:
    """Brightness, contrast and saturation jitter (each with probability 0.5)."""
    out = img.astype(np.float32)
    if rng.random() < 0.5:
        out += rng.uniform(-32, 32)
    if rng.random() < 0.5:
        out = (out - out.mean()) * rng.uniform(0.5, 1.5) + out.mean()
    if rng.random() < 0.5:
        grey = out.mean(axis=2, keepdims=True)
        out = grey + (out - grey) * rng.uniform(0.5, 1.5)
    return np.clip(out, 0, 255).astype(np.uint8)


def chw(img: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(img.transpose(2, 0, 1))


class BackgroundPool:
    """Photos without people, to paste persons onto. `from_run(RUN)` finds them in a curation catalog."""

    def __init__(self, sources: list[str]):
        self.sources = list(sources)

    def __len__(self):
        return len(self.sources)

    @classmethod
    def from_run(cls, run_dir, limit: int = 10_000) -> "BackgroundPool":
        """Samples the person stage measured and found nobody in (reject reason 'person:no_person', or
        any sample with n_persons = 0 that decoded). Raises if the run has none."""
        con = catalog.connect(run_dir)
        views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views()").fetchall()}
        if "samples" not in views:
            raise FileNotFoundError(f"background run {run_dir}: no catalog/samples/*.parquet; pass a curation run")
        rows = con.execute(
            "SELECT source_uri FROM samples WHERE (reject_reason = 'person:no_person' OR n_persons = 0) "
            "AND decode_error IS NULL AND source_uri IS NOT NULL ORDER BY sample_id LIMIT ?", [limit]).fetchall()
        if not rows:
            raise ValueError(f"background run {run_dir}: no sample without a person (reject_reason "
                             f"'person:no_person' or n_persons = 0); did the run have the person stage?")
        log.info("backgrounds: %d non-human photos from %s", len(rows), run_dir)
        return cls([r[0] for r in rows])

    def read(self, i: int) -> bytes:
        # catalog's reader: a '#' in a file name is not taken for a tar member separator
        return read_source(self.sources[i])

    def image(self, i: int) -> np.ndarray:
        return np.asarray(decode_image(self.read(i)))


def paste_background(img: np.ndarray, person: np.ndarray, bg: np.ndarray, rng) -> np.ndarray:
    """The person's pixels over a random crop of `bg`, resized to the image (cover, not stretch)."""
    h, w = img.shape[:2]
    m, _ = crop_affine(bg.shape[:2], (h, w), rng, Augment(train=True, flip=0.5))
    back = warp(bg, m, (h, w))
    return np.where(person[..., None], img, back)

