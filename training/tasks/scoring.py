"""Scoring predictions against a fine-tuning dataset's targets, one sample at a time.

`Scorer(task, dataset)` takes predictions in the targets' own space, so a model (training/tasks/evaluate.py)
and a trivial baseline (training/tasks/baselines.py) are scored by the same code:

    depth   (H, W) map at the target's resolution (any scale: aligned per image by scale and shift)
    normal  (3, H, W) vectors (normalised here)
    seg     (H, W) class indices
    pose    (K, 2) keypoints in the original image's pixels, plus a confidence (for AP)

`result()` gives the task's metrics (training/tasks/metrics.py): depth AbsRel / RMSE / delta1, normal angle
statistics, seg mIoU / mAcc, pose OKS AP and PCK@0.05 / 0.1 / 0.2 of the person box's longer side.
"""
from __future__ import annotations

import numpy as np

from training.tasks import metrics

# the figure each task is judged by, and whether lower is better
PRIMARY = {"depth": ("absrel", True), "normal": ("mean", True), "seg": ("mIoU", False), "pose": ("PCK@0.1", False)}


def error_of(task: str, result: dict) -> float:
    """The task's primary figure as an error (lower is better): AbsRel, mean angle, 1 - mIoU, 1 - PCK@0.1."""
    key, lower = PRIMARY[task]
    return float(result[key]) if lower else 1.0 - float(result[key])


class Scorer:
    def __init__(self, task: str, dataset, n_classes: int | None = None):
        self.task, self.dataset = task, dataset
        self.n_classes = n_classes or (len(dataset.vocab) if hasattr(dataset, "vocab") else None)
        self.depth_rows: list[dict] = []
        self.normal_errors: list[np.ndarray] = []
        self.conf = None
        self.pose_preds: dict = {}

    def add(self, pred: np.ndarray, item: dict, confidence: float = 1.0) -> None:
        """One sample: `item` is the dataset's item (its targets), `pred` as the module docstring says."""
        if self.task == "depth":
            g, m = item["depth"][0], item["mask"][0]
            if (m & (g > 0)).sum() >= 2:
                self.depth_rows.append(metrics.depth_scores(np.asarray(pred, np.float64), g, m))
        elif self.task == "normal":
            g = item["normal"]
            m = item["mask"][0] & (np.linalg.norm(g, axis=0) > 0.5)
            self.normal_errors.append(metrics.angular_errors(np.asarray(pred).transpose(1, 2, 0),
                                                             g.transpose(1, 2, 0), m))
        elif self.task == "seg":
            c = metrics.confusion(np.asarray(pred), item["labels"], self.n_classes)
            self.conf = c if self.conf is None else self.conf + c
        else:
            self.pose_preds[int(item["ann"])] = (np.asarray(pred, np.float64), float(confidence))

    def result(self) -> dict:
        if self.task == "depth":
            if not self.depth_rows:
                raise ValueError("no frame with person depth to evaluate")
            return metrics.mean_dicts(self.depth_rows)
        if self.task == "normal":
            return metrics.normal_scores(np.concatenate(self.normal_errors))
        if self.task == "seg":
            scores = metrics.seg_scores(self.conf)
            names = self.dataset.vocab.names
            scores["IoU"] = {name: v for name, v in zip(names, scores["IoU"]) if v == v}
            scores["Acc"] = {name: v for name, v in zip(names, scores["Acc"]) if v == v}
            return scores
        return {**pose_ap_from(self.dataset, self.pose_preds), **pose_pck_from(self.dataset, self.pose_preds)}


def pose_ap_from(dataset, preds: dict) -> dict:
    """Group per image: every annotation of an image is a ground truth, each evaluated crop a prediction."""
    by_image: dict = {}
    for i, a in enumerate(dataset.anns):
        entry = by_image.setdefault(a["image_id"], {"gt": [], "pred": []})
        area = a.get("area") or a["bbox"][2] * a["bbox"][3]
        entry["gt"].append((np.asarray(a["keypoints"], np.float64).reshape(-1, 3), float(area)))
        if i in preds:
            entry["pred"].append(preds[i])
    images = [v for v in by_image.values() if v["pred"]]
    return metrics.pose_ap(images, dataset.vocab.sigmas)


def pose_pck_from(dataset, preds: dict) -> dict:
    """PCK of each evaluated annotation's keypoints, normalised by its box's longer side."""
    idx = sorted(preds)
    gt = np.stack([np.asarray(dataset.anns[i]["keypoints"], np.float64).reshape(-1, 3) for i in idx])
    pred = np.stack([preds[i][0] for i in idx])
    sides = np.array([max(dataset.anns[i]["bbox"][2], dataset.anns[i]["bbox"][3]) for i in idx], np.float64)
    return metrics.pck(pred, gt, sides)
