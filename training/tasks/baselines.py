"""Trivial baselines from training-set statistics, scored on held-out data by the evaluator's own code.

    trivial_baselines("depth", train_dataset, test_dataset)
      -> {"train-mean depth map": {"absrel": ..., ...}, "constant depth": {...}, "best": "train-mean depth map"}

A model that does not beat these has learned nothing about the image in front of it:

    depth   train-mean depth map (per-pixel mean of the person depth); a constant map
    normal  mean train normal (one vector); per-pixel mean train normal map
    seg     per-pixel majority class of the training label maps; the most frequent class everywhere
    pose    mean train pose in the box (keypoints in box coordinates, averaged over the training people,
            placed in each test person's box, as a top-down model given the same box)

The datasets are the evaluation datasets (no augmentation, training/finetune.build_dataset(train=False)),
so statistics and scoring see the same crop and resolution. `best` names the baseline with the lowest
error (training/scoring.error_of: AbsRel, mean angle, 1 - mIoU, 1 - PCK@0.1).
"""
from __future__ import annotations

import numpy as np

from training.tasks.scoring import Scorer, error_of


def trivial_baselines(task: str, train, test, limit: int | None = None) -> dict:
    stats = {"depth": depth_stats, "normal": normal_stats, "seg": seg_stats, "pose": pose_stats}[task](train)
    n = len(test) if limit is None else min(limit, len(test))
    scorers = {name: Scorer(task, test) for name in stats}
    for i in range(n):
        item = test[(i, 0)]
        for name, predict in stats.items():
            scorers[name].add(predict(item, test), item)
    out = {name: s.result() for name, s in scorers.items()}
    out["best"] = min(stats, key=lambda name: error_of(task, out[name]))
    return out


def items(ds):
    return (ds[(i, 0)] for i in range(len(ds)))


def depth_stats(train) -> dict:
    total = count = None
    for it in items(train):
        d, m = it["depth"][0].astype(np.float64), it["mask"][0] & (it["depth"][0] > 0)
        total = np.where(m, d, 0.0) if total is None else total + np.where(m, d, 0.0)
        count = m.astype(np.int64) if count is None else count + m
    if total is None or not count.any():
        raise ValueError("depth baselines: no training frame with person depth")
    overall = total.sum() / count.sum()
    mean_map = np.where(count > 0, total / np.maximum(count, 1), overall)
    return {"train-mean depth map": lambda item, ds: fit_to(mean_map, item["depth"].shape[-2:]),
            "constant depth": lambda item, ds: np.full(item["depth"].shape[-2:], overall)}


def normal_stats(train) -> dict:
    total, vec = None, np.zeros(3)
    for it in items(train):
        g = it["normal"].astype(np.float64)
        m = it["mask"][0] & (np.linalg.norm(g, axis=0) > 0.5)
        part = np.where(m[None], g, 0.0)
        total = part if total is None else total + part
        vec += part.reshape(3, -1).sum(axis=1)
    if not np.linalg.norm(vec):
        raise ValueError("normal baselines: no training person pixel with a normal")
    vec /= np.linalg.norm(vec)
    norm = np.linalg.norm(total, axis=0, keepdims=True)
    mean_map = np.where(norm > 0, total / np.maximum(norm, 1e-12), vec[:, None, None])

    def constant(item, ds):
        return np.broadcast_to(vec[:, None, None], item["normal"].shape).copy()
    return {"mean train normal": constant,
            "mean train normal map": lambda item, ds: fit_to(mean_map, item["normal"].shape[-2:])}


def seg_stats(train) -> dict:
    counts = None
    n_classes = len(train.vocab)
    for it in items(train):
        lab = it["labels"]
        onehot = np.zeros((n_classes + 1,) + lab.shape, np.int64)  # the last plane collects ignored pixels
        np.put_along_axis(onehot, np.where(lab == 255, n_classes, lab)[None], 1, axis=0)
        counts = onehot[:n_classes] if counts is None else counts + onehot[:n_classes]
    if counts is None:
        raise ValueError("seg baselines: no training frame")
    majority_map = counts.argmax(axis=0)
    majority = int(counts.sum(axis=(1, 2)).argmax())
    return {"per-pixel majority class": lambda item, ds: fit_to(majority_map, item["labels"].shape, nearest=True),
            "majority class": lambda item, ds: np.full(item["labels"].shape, majority)}


def pose_stats(train) -> dict:
    """The mean pose in box coordinates: u = (x - box x) / box w, v = (y - box y) / box h."""
    k = len(train.vocab)
    total, count = np.zeros((k, 2)), np.zeros(k)
    for a in train.anns:
        kp = np.asarray(a["keypoints"], np.float64).reshape(-1, 3)
        x, y, w, h = a["bbox"]
        vis = kp[:, 2] > 0
        total[vis] += (kp[vis, :2] - [x, y]) / [w, h]
        count[vis] += 1
    if not count.any():
        raise ValueError("pose baselines: no labelled training keypoint")
    mean = np.where(count[:, None] > 0, total / np.maximum(count, 1)[:, None], 0.5)

    def in_box(item, ds):
        x, y, w, h = ds.anns[int(item["ann"])]["bbox"]
        return mean * [w, h] + [x, y]
    return {"mean train pose in the box": in_box}


def fit_to(arr: np.ndarray, hw, nearest: bool = False) -> np.ndarray:
    """A statistics map at another target size (test frames cropped to another shape) resized to `hw`."""
    if arr.shape[-2:] == tuple(hw):
        return arr
    import cv2
    interp = cv2.INTER_NEAREST if nearest else cv2.INTER_LINEAR
    if arr.ndim == 3:
        return np.stack([cv2.resize(a, (hw[1], hw[0]), interpolation=interp) for a in arr])
    out = cv2.resize(arr.astype(np.uint8 if nearest else np.float32), (hw[1], hw[0]), interpolation=interp)
    return out.astype(np.int64) if nearest else out
