"""Validation figures of a filter: ROC AUC, precision / recall at a threshold, the threshold for a target
precision. Scores are reject scores (higher = reject), positives are the samples to reject."""
from __future__ import annotations

import numpy as np
import torch


def roc_auc(scores: np.ndarray, positive: np.ndarray) -> float | None:
    """Area under the ROC curve (Mann-Whitney U, ties counted half); None with a single class."""
    scores, positive = np.asarray(scores, np.float64), np.asarray(positive, bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if not n_pos or not n_neg:
        return None
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), np.float64)
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):  # average ranks over ties
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


CHANCE_Z = 2.33  # a filter's ROC AUC must beat chance by this many standard errors (one-sided 1%)


def beats_chance(scores, positive, z_min: float = CHANCE_Z) -> tuple[bool, float | None]:
    """Whether the scores rank positives above negatives better than chance: ROC AUC against 0.5 in units of
    its standard error when scores carry no information (Mann-Whitney), above `z_min` (one-sided 1%).
    Returns (verdict, z); z is None with a single class."""
    positive = np.asarray(positive, bool)
    auc = roc_auc(scores, positive)
    if auc is None:
        return False, None
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    z = (auc - 0.5) / np.sqrt((n_pos + n_neg + 1) / (12.0 * n_pos * n_neg))
    return bool(z > z_min), float(z)


def at_threshold(scores, positive, threshold: float) -> dict:
    """Precision and recall of 'reject when score > threshold'."""
    scores, positive = np.asarray(scores), np.asarray(positive, bool)
    pred = scores > threshold
    tp, fp = int((pred & positive).sum()), int((pred & ~positive).sum())
    fn = int((~pred & positive).sum())
    return {"precision": tp / (tp + fp) if tp + fp else None, "recall": tp / (tp + fn) if tp + fn else None,
            "tp": tp, "fp": fp, "fn": fn, "tn": int((~pred & ~positive).sum())}


def choose_threshold(scores, positive, target_precision: float) -> dict:
    """The lowest threshold whose precision reaches the target (most recall). If none does (`reached`
    False), the one of best F1 among those that beat chance (precision above the positives' share: a
    filter that rejects at random matches that share). If none beats chance either, 1.0, which rejects
    nothing (`rejects_nothing`): a filter no better than a coin must not delete data."""
    scores, positive = np.asarray(scores, np.float64), np.asarray(positive, bool)
    candidates = np.unique(np.concatenate([[0.0], scores]))[:-1] if len(scores) else np.array([0.5])
    chance = float(positive.mean()) if len(positive) else 0.0
    best, best_f1 = None, -1.0
    for t in np.sort(candidates):
        m = at_threshold(scores, positive, float(t))
        if m["precision"] is not None and m["precision"] >= target_precision:
            return {"score": float(t), "target_precision": target_precision, "reached": True}
        p, r = m["precision"] or 0.0, m["recall"] or 0.0
        f1 = 2 * p * r / (p + r) if p + r else 0.0
        if p > chance and f1 > best_f1:
            best, best_f1 = float(t), f1
    if best is None:
        return _rejects_nothing(target_precision)
    return {"score": best, "target_precision": target_precision, "reached": False}


def card_threshold(scores, positive, target_precision: float) -> dict:
    """A filter card's threshold: choose_threshold, unless the scores do not beat chance (beats_chance),
    when it is 1.0, which rejects nothing; `auc_z` records the test."""
    informative, z = beats_chance(scores, positive)
    threshold = choose_threshold(scores, positive, target_precision) if informative else \
        _rejects_nothing(target_precision)
    return threshold | {"auc_z": z}


def _rejects_nothing(target_precision: float) -> dict:
    # scores are 1 - P(keep class), never above 1: 'reject when score > 1.0' rejects nothing
    return {"score": 1.0, "target_precision": target_precision, "reached": False, "rejects_nothing": True}


def reject_scores(logits: torch.Tensor, keep_index: int) -> np.ndarray:
    """Higher = reject: 1 - P(keep class), as the stages compute it."""
    return (1.0 - torch.softmax(logits.float(), dim=1)[:, keep_index]).cpu().numpy()


def figures(scores, positive, families, threshold: float) -> dict:
    per_family = {}
    for fam in sorted(set(families)):
        sel = np.array([f == fam for f in families])
        s = scores[sel]
        per_family[fam] = {"n": int(sel.sum()), "reject_rate": float((s > threshold).mean()),
                           "mean_score": float(s.mean())}
    return {"n": int(len(scores)), "positives": int(np.sum(positive)), "roc_auc": roc_auc(scores, positive),
            "at_threshold": at_threshold(scores, positive, threshold), "families": per_family}
