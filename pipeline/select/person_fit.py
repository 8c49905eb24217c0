"""Fitting the calibrated person score, and its second look, to a user's labels (`humanset calibrate --fit-person`).

The rows are the labelled samples of a curated run with a box over the size rule, each by its box with the highest
raw score (where the score decides; training_boxes). fit_person fits pipeline/stages/person_calibration.FEATURES
of those boxes: a logistic model on standardised features, L2-regularised, the strength the one of L2_GRID with the
lowest leave-one-out log loss (Newton's method; small data, so exact leave-one-out is cheap). fit_look fits the
second look's `look` the same way where the look acts: on the labelled samples whose top box the run's second look
read (no box passed the run's cut), from that box's calibrated score under the new fit and the pose score the run
stored, and writes its coefficients back on the unstandardised logits the stage applies. Both refuse a fit that
would let a higher score lower the cut score.
"""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np


L2_GRID = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0)


def training_boxes(run: str | Path, labels: dict[str, int], cfg: dict) -> list[tuple]:
    """Per labelled sample with a box over the box rule: (sample_id, index, raw score, box in judged pixels,
    keypoints, pose score) of its box with the highest raw score; the pose score is the one the run's second look
    stored for that box, else None. One read of the catalog, for both fits."""
    from catalog.duck import sample_rows
    from pipeline.stages.person import box_passes, judged_boxes, thresholds

    _, min_box, rule = thresholds(cfg.get("person") or {})
    cols = ["sample_id", "person_boxes", "person_scores", "person_keypoints", "resolution_scale", "person_look_box",
            "person_look_score"]
    got, rows = sample_rows(run, cols, labels)
    out = []
    for row in rows:
        r = dict(zip(got, row))
        sid, boxes, scores, kpts = r["sample_id"], r.get("person_boxes"), r.get("person_scores"), r.get("person_keypoints")
        sc, look_box, look_score = r.get("resolution_scale"), r.get("person_look_box"), r.get("person_look_score")
        if not scores:
            continue
        boxes = judged_boxes(boxes, sc)
        big = [j for j, b in enumerate(boxes) if b is not None and box_passes(b, min_box, rule)]
        if not big:
            continue
        j = max(big, key=lambda k: scores[k])
        pose = look_score if look_box == j and look_score is not None else None
        out.append((sid, j, scores[j], boxes[j], kpts[j] if kpts else None, pose))
    return out


def person_training_set(boxes: list[tuple], labels: dict[str, int], run, box_ref_px: float = 300.0):
    """(X, y, sample_ids): the FEATURES of training_boxes' boxes (of `run`) and their labels."""
    from pipeline.stages.person_calibration import box_features

    X, y, ids = [], [], []
    for sid, _, score, box, kpts, _ in boxes:
        x = box_features(score, box, kpts, box_ref_px)
        if x is None:
            raise ValueError(f"{run}: sample {sid} has no person keypoints; the calibrated score needs a run "
                             f"curated with a pose model")
        X.append(x)
        y.append(labels[sid])
        ids.append(sid)
    return np.asarray(X, np.float64).reshape(-1, 3), np.asarray(y, np.int64), ids


def fit_logistic(X: np.ndarray, y: np.ndarray, l2: float, iters: int = 100):
    """L2-regularised logistic regression on standardised features (the intercept is not penalised),
    by Newton's method. Returns (intercept, coef, mean, scale)."""
    mean, scale = X.mean(0), X.std(0)
    scale = np.where(scale > 1e-9, scale, 1.0)
    Z = np.c_[np.ones(len(X)), (X - mean) / scale]
    pen = np.r_[0.0, np.ones(X.shape[1])] * l2
    w = np.zeros(Z.shape[1])
    for _ in range(iters):
        p = 1 / (1 + np.exp(-np.clip(Z @ w, -50, 50)))
        g = Z.T @ (p - y) + pen * w
        H = (Z * (p * (1 - p))[:, None]).T @ Z + np.diag(pen) + 1e-9 * np.eye(len(w))
        step = np.linalg.solve(H, g)
        w -= step
        if np.abs(step).max() < 1e-10:
            break
    return float(w[0]), w[1:], mean, scale


def _predict(model, X: np.ndarray) -> np.ndarray:
    b, coef, mean, scale = model
    return 1 / (1 + np.exp(-np.clip(b + ((X - mean) / scale) @ coef, -50, 50)))


def loo_predictions(X: np.ndarray, y: np.ndarray, l2: float) -> np.ndarray:
    """Each sample's probability from fit_logistic at strength l2 fitted without it (leave-one-out)."""
    out = np.empty(len(y))
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        out[i] = _predict(fit_logistic(X[keep], y[keep], l2), X[i:i + 1])[0]
    return out


def log_losses(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return -np.where(y == 1, np.log(p), np.log(1 - p))


def choose_l2(X: np.ndarray, y: np.ndarray, grid) -> tuple[float, dict, dict]:
    """The L2 strength of `grid` with the lowest leave-one-out log loss: (it, each strength's leave-one-out
    probabilities, each strength's per-sample log losses)."""
    held_out = {l2: loo_predictions(X, y, l2) for l2 in grid}
    loo = {l2: log_losses(p, y) for l2, p in held_out.items()}
    return min(loo, key=lambda k: loo[k].mean()), held_out, loo


def fit_person(X: np.ndarray, y: np.ndarray, fitted_on: dict, box_ref_px: float = 300.0, grid=L2_GRID):
    """The calibrated person score fitted to (X, y): the L2 strength (on standardised features) is the
    one of `grid` with the lowest leave-one-out log loss; the leave-one-out recall at 0.9 and the
    negatives over 0.9 are recorded with the fit, as its held-out estimate."""
    from pipeline.stages.person_calibration import Calibration

    n_pos = int(y.sum())
    if n_pos < 5 or len(y) - n_pos < 5:
        raise ValueError(f"person calibration needs at least 5 positive and 5 negative labelled samples with a "
                         f"box over the size rule; got {n_pos} and {len(y) - n_pos}")
    l2, held_out, loo = choose_l2(X, y, grid)
    b, coef, mean, scale = fit_logistic(X, y, l2)
    if coef[0] < 0:
        raise ValueError("person calibration: the fitted weight of the raw score is negative (a higher detector "
                         "score would lower the calibrated one); the labels are too few or contradict the detector")
    p = _predict((b, coef, mean, scale), X)
    info = {**fitted_on, "n": len(y), "positives": n_pos, "l2_grid": list(grid),
            "loo_log_loss": {str(k): round(float(v.mean()), 4) for k, v in loo.items()},
            "loo_recall_at_0.9": round(float((held_out[l2][y == 1] > 0.9).mean()), 4),
            "loo_negatives_over_0.9": int((held_out[l2][y == 0] > 0.9).sum()),
            "train_recall_at_0.9": round(float((p[y == 1] > 0.9).mean()), 4),
            "train_negatives_over_0.9": int((p[y == 0] > 0.9).sum())}
    return Calibration(coef=[round(float(c), 6) for c in coef], intercept=round(b, 6),
                       mean=[round(float(m), 6) for m in mean], scale=[round(float(s), 6) for s in scale],
                       box_ref_px=box_ref_px, l2=l2, fitted_on=info, date=dt.date.today().isoformat())


LOOK_RULE = ("labelled samples whose box with the highest raw score over the size rule the run's second look read "
             "(no box passed the run's cut); features: logit of that box's calibrated score under this fit, logit of "
             "its stored pose score")


def person_look_set(boxes: list[tuple], labels: dict[str, int], calibration):
    """(X, y, sample_ids) for the second look's fit: [logit(calibrated), logit(pose)] of each labelled sample
    whose top box (training_boxes') the run's second look read, the calibrated score under `calibration`."""
    from pipeline.stages.person_calibration import logit

    X, y, ids = [], [], []
    for sid, _, score, box, kpts, pose in boxes:
        if pose is None:
            continue
        c = calibration.box_scores([box], [score], [kpts])
        if not c:
            continue
        X.append([logit(c[0]), logit(pose)])
        y.append(labels[sid])
        ids.append(sid)
    return np.asarray(X, np.float64).reshape(-1, 2), np.asarray(y, np.int64), ids


def fit_look(X: np.ndarray, y: np.ndarray, fitted_on: dict, grid=L2_GRID) -> tuple[dict | None, str]:
    """The second look's fit (person_calibration's `look`) to (X, y) from person_look_set, the L2 strength by
    leave-one-out log loss as fit_person's; (None, why) when there are too few samples of a class or a fitted
    coefficient is negative (a higher score would lower the cut score)."""
    from pipeline.stages.person_calibration import LOOK_FEATURES
    from pipeline.stages.person_look import MODEL_FILE

    n_pos = int(y.sum())
    if not len(y):
        return None, "the run's second look read none of the labelled samples (curated with person.second_look=none?)"
    if n_pos < 5 or len(y) - n_pos < 5:
        return None, (f"it needs at least 5 positive and 5 negative labelled samples the run's second look read; "
                      f"got {n_pos} and {len(y) - n_pos}")
    l2, _, loo = choose_l2(X, y, grid)
    b, coef, mean, scale = fit_logistic(X, y, l2)
    raw = coef / scale  # back to the unstandardised features the stage applies
    if (raw < 0).any():
        return None, f"a fitted coefficient is negative ({[round(float(c), 4) for c in raw]})"
    return {"features": list(LOOK_FEATURES), "coef": [round(float(c), 6) for c in raw],
            "intercept": round(float(b - (raw * mean).sum()), 6), "l2": l2, "model": MODEL_FILE.name,
            "fitted_on": {**fitted_on, "n": len(y), "positives": n_pos, "l2_grid": list(grid),
                          "loo_log_loss": {str(k): round(float(v.mean()), 4) for k, v in loo.items()}},
            "date": dt.date.today().isoformat()}, ""
