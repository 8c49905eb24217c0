"""Evaluation metrics of the four tasks, in numpy (tests/training/tasks/test_finetune_metrics.py checks known inputs).

pose    COCO OKS-based AP (mean over OKS thresholds 0.50:0.05:0.95, 101-point interpolated precision);
        PCK@t: labelled keypoints within t x the person box's longer side
seg     mIoU and mAcc from a confusion matrix accumulated over images
depth   RMSE, AbsRel, delta < 1.25 over person pixels after least-squares scale-and-shift alignment
normal  mean / median angular error and % of pixels within 11.25, 22.5, 30 degrees
"""
from __future__ import annotations

import numpy as np

OKS_THRESHOLDS = np.linspace(0.5, 0.95, 10)


# --- pose ---------------------------------------------------------------------------------------
def oks(gt: np.ndarray, pred: np.ndarray, area: float, sigmas: np.ndarray) -> float:
    """Object keypoint similarity of one prediction (K, 2+) with one annotation (K, 3: x, y, v).

    OKS = mean over labelled keypoints (v > 0) of exp(-d^2 / (2 * area * (2 sigma)^2)), as cocoapi.
    """
    vis = gt[:, 2] > 0
    if not vis.any():
        return 0.0
    d2 = ((gt[:, :2] - pred[:, :2]) ** 2).sum(axis=1)
    e = d2 / (2 * (2 * sigmas) ** 2 * (area + np.spacing(1)))
    return float(np.exp(-e[vis]).mean())


def pose_ap(images: list[dict], sigmas: np.ndarray) -> dict:
    """COCO keypoint AP. images: [{"gt": [(kpts (K,3), area)], "pred": [(kpts (K,2), score)]}, ...].

    Annotations without a labelled keypoint are ignored (as cocoapi). Predictions are matched greedily
    by descending score to the unmatched annotation of highest OKS, per image and per threshold.
    Returns AP, AP50, AP75 and AR (recall averaged over thresholds).
    """
    sigmas = np.asarray(sigmas, np.float64)
    records = []  # (score, image index, oks row)
    n_gt = 0
    for i, img in enumerate(images):
        gts = [(np.asarray(k, np.float64), a) for k, a in img["gt"] if (np.asarray(k)[:, 2] > 0).any()]
        n_gt += len(gts)
        for kp, score in img["pred"]:
            row = np.array([oks(g, np.asarray(kp, np.float64), a, sigmas) for g, a in gts])
            records.append((float(score), i, row))
    if n_gt == 0:
        raise ValueError("pose AP: no annotation with a labelled keypoint")
    records.sort(key=lambda r: -r[0])
    aps, recalls = [], []
    for t in OKS_THRESHOLDS:
        matched: dict[int, set] = {}
        tp = np.zeros(len(records))
        for j, (_, i, row) in enumerate(records):
            taken = matched.setdefault(i, set())
            best, best_oks = -1, t - 1e-10
            for g, o in enumerate(row):
                if g not in taken and o >= best_oks:
                    best, best_oks = g, o
            if best >= 0:
                taken.add(best)
                tp[j] = 1
        ctp = np.cumsum(tp)
        recall = ctp / n_gt
        precision = ctp / np.arange(1, len(records) + 1)
        aps.append(interpolated_ap(recall, precision))
        recalls.append(recall[-1] if len(recall) else 0.0)
    return {"AP": float(np.mean(aps)), "AP50": float(aps[0]), "AP75": float(aps[5]), "AR": float(np.mean(recalls))}


def interpolated_ap(recall: np.ndarray, precision: np.ndarray) -> float:
    """cocoapi's 101-point interpolated AP: precision made monotone, sampled at recall 0, 0.01, ..., 1."""
    if len(recall) == 0:
        return 0.0
    p = np.maximum.accumulate(precision[::-1])[::-1]
    points = np.linspace(0, 1, 101)
    idx = np.searchsorted(recall, points, side="left")
    return float(np.where(idx < len(p), p[np.minimum(idx, len(p) - 1)], 0.0).mean())


PCK_THRESHOLDS = (0.05, 0.1, 0.2)


def pck(pred: np.ndarray, gt: np.ndarray, box_sides: np.ndarray, thresholds=PCK_THRESHOLDS) -> dict:
    """Percentage of correct keypoints: pred (N, K, 2+), gt (N, K, 3: x, y, v), box_sides (N,) the longer
    side of each person box. A labelled keypoint (v > 0) is correct within t * its box side; returns
    {"PCK@t": fraction of labelled keypoints} (unlike OKS AP, it still separates models on tiny people).
    """
    pred, gt = np.asarray(pred, np.float64), np.asarray(gt, np.float64)
    vis = gt[..., 2] > 0
    if not vis.any():
        raise ValueError("PCK: no labelled keypoint")
    dist = np.linalg.norm(pred[..., :2] - gt[..., :2], axis=-1) / np.asarray(box_sides, np.float64)[:, None]
    return {f"PCK@{t:g}": float((dist[vis] < t).mean()) for t in thresholds}


# --- segmentation -------------------------------------------------------------------------------
def confusion(pred: np.ndarray, label: np.ndarray, n_classes: int, ignore: int = 255) -> np.ndarray:
    """(n_classes, n_classes) counts, rows = true class, columns = predicted class."""
    keep = label != ignore
    idx = label[keep].astype(np.int64) * n_classes + pred[keep].astype(np.int64)
    return np.bincount(idx, minlength=n_classes ** 2).reshape(n_classes, n_classes)


def seg_scores(conf: np.ndarray) -> dict:
    """mIoU over classes that occur (in truth or prediction), mAcc over classes present in the truth."""
    tp = np.diag(conf).astype(np.float64)
    gt = conf.sum(axis=1)
    union = gt + conf.sum(axis=0) - tp
    iou = np.where(union > 0, tp / np.maximum(union, 1), np.nan)
    acc = np.where(gt > 0, tp / np.maximum(gt, 1), np.nan)
    return {"mIoU": float(np.nanmean(iou)), "mAcc": float(np.nanmean(acc)),
            "aAcc": float(tp.sum() / max(conf.sum(), 1)), "IoU": iou.tolist(), "Acc": acc.tolist()}


# --- depth --------------------------------------------------------------------------------------
def align_scale_shift(pred: np.ndarray, gt: np.ndarray) -> tuple[float, float]:
    """s, t minimising sum (s * pred + t - gt)^2 (least squares over the given pixels)."""
    a = np.stack([pred, np.ones_like(pred)], axis=1)
    (s, t), *_ = np.linalg.lstsq(a, gt, rcond=None)
    return float(s), float(t)


def depth_scores(pred: np.ndarray, gt: np.ndarray, mask: np.ndarray) -> dict:
    """One image: RMSE (gt units), AbsRel and delta < 1.25 over person pixels with valid depth,
    after aligning the prediction to the truth with a least-squares scale and shift."""
    valid = mask & np.isfinite(gt) & (gt > 0)
    if valid.sum() < 2:
        raise ValueError("depth metrics need at least two person pixels with valid depth")
    p, g = pred[valid].astype(np.float64), gt[valid].astype(np.float64)
    s, t = align_scale_shift(p, g)
    a = s * p + t
    ratio = np.maximum(a / g, g / np.maximum(a, 1e-9))
    ratio = np.where(a > 0, ratio, np.inf)
    return {"rmse": float(np.sqrt(((a - g) ** 2).mean())), "absrel": float((np.abs(a - g) / g).mean()),
            "delta1": float((ratio < 1.25).mean())}


# --- normals ------------------------------------------------------------------------------------
def angular_errors(pred: np.ndarray, gt: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Angles in degrees between unit-normalised (H, W, 3) normals on the masked pixels."""
    p, g = pred[mask].astype(np.float64), gt[mask].astype(np.float64)
    p /= np.maximum(np.linalg.norm(p, axis=1, keepdims=True), 1e-9)
    g /= np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-9)
    return np.degrees(np.arccos(np.clip((p * g).sum(axis=1), -1.0, 1.0)))


def normal_scores(errors_deg: np.ndarray) -> dict:
    e = np.asarray(errors_deg, np.float64)
    if e.size == 0:
        raise ValueError("normal metrics need at least one person pixel")
    return {"mean": float(e.mean()), "median": float(np.median(e)), "within_11.25": float((e < 11.25).mean() * 100),
            "within_22.5": float((e < 22.5).mean() * 100), "within_30": float((e < 30).mean() * 100)}


def mean_dicts(rows: list[dict]) -> dict:
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]} if rows else {}
