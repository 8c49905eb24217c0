"""Does a fourth feature, the legs' keypoints, let the calibrated person score keep people seen from behind?
Measured on the quality bench's tune split. Not used by the product.

The shipped calibration (pipeline/stages/person_calibration.py) reads the raw score, the box size and the five
head keypoints; a person seen from behind, in a helmet or in a hug shows no face, and loses at raw 0.85-0.92
(docs/quality.md, "Known limit"). The apple it must keep out is a torso read at shoulders 0.95 with no head;
it has no legs. This script adds

  legs_conf   mean confidence of COCO keypoints 11-16 (hips, knees, ankles)

to the three shipped features and fits the shipped recipe (person_fit.fit_logistic, L2 by leave-one-out log
loss over person_fit.L2_GRID) on the tune rows the shipped fit is trained on: each labelled tune image with a
box over the size rule, its box with the highest raw score, person=1 for person_clear (painted_person left
out, `bench/quality.py`'s stage_labels). Each row's leave-one-out verdict at 0.9 is compared with the shipped
fit's verdict on it, and so is a refit of the three shipped features: wins, losses, the exact sign test.

    python bench/quality.py --split tune --run RUN --write-labels labels.csv
    python research/person/legs.py RUN labels.csv [--rows FILE.csv]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from research.bench_tune import bench_quality, report, run_labels_parser  # noqa: E402

LEGS = tuple(range(11, 17))  # COCO-17: hips, knees, ankles
CUT = 0.9


def rows_of(run: Path, labels: dict[str, int], box_ref_px: float):
    """(ids, X3, legs, y): the shipped fit's training rows of a curated run (bench ids), with the chosen box's
    legs_conf."""
    from catalog import connect
    from pipeline.select.calibrate import _run_config
    from pipeline.stages.person_calibration import box_features
    from research.bench_tune import person_training_rows

    bench = {sid: Path(str(uri)).stem for sid, uri in connect(run).execute(
        "SELECT sample_id, source_uri FROM samples").fetchall()}
    ids, X, legs, y = [], [], [], []
    for sid, score, box, k in person_training_rows(run, labels, _run_config(run)):
        ids.append(bench[sid])
        X.append(box_features(score, box, k, box_ref_px))
        legs.append(sum(float(k[3 * i + 2]) for i in LEGS) / len(LEGS))
        y.append(labels[sid])
    return ids, np.asarray(X, np.float64), np.asarray(legs, np.float64), np.asarray(y, np.int64)


def main() -> int:
    from pipeline.select.calibrate import read_labels
    from pipeline.select.person_fit import L2_GRID, fit_logistic, log_losses, loo_predictions
    from pipeline.stages.person_calibration import load_calibration

    a = run_labels_parser(__doc__).parse_args()
    labels = read_labels(a.labels)["person"]
    quality = bench_quality()
    shipped = load_calibration()
    ids, X3, legs, y = rows_of(a.run, labels, shipped.box_ref_px)
    ship = np.array([shipped.probability(list(x)) for x in X3])
    out = {"run": a.run.name, "rows": len(y), "positives": int(y.sum()), "cut": CUT,
           "shipped": {"positives_over": int((ship[y == 1] > CUT).sum()),
                       "negatives_over": int((ship[y == 0] > CUT).sum())}}
    rows = [{"id": i, "label": int(t), "legs_conf": round(float(g), 3), "shipped": round(float(s), 4)}
            for i, t, g, s in zip(ids, y, legs, ship)]
    for name, X in (("refit3", X3), ("legs4", np.c_[X3, legs])):
        preds = {l2: loo_predictions(X, y, l2) for l2 in L2_GRID}
        loss = {l2: log_losses(p, y).mean() for l2, p in preds.items()}
        l2 = min(loss, key=loss.get)
        held = preds[l2]
        right_new, right_old = (held > CUT) == (y == 1), (ship > CUT) == (y == 1)
        wins = [i for i, n, o in zip(ids, right_new, right_old) if n and not o]
        losses = [i for i, n, o in zip(ids, right_new, right_old) if o and not n]
        b, coef, mean, scale = fit_logistic(X, y, l2)
        out[name] = {"l2": l2, "loo_log_loss": round(float(loss[l2]), 4),
                     "loo_positives_over": int((held[y == 1] > CUT).sum()),
                     "loo_negatives_over": int((held[y == 0] > CUT).sum()),
                     "wins": wins, "losses": losses, "sign_test_p": round(quality.sign_test(len(wins), len(losses)), 4),
                     "coef": [round(float(c), 3) for c in coef]}
        for r, h in zip(rows, held):
            r[name] = round(float(h), 4)
    return report(out, rows, a.rows)


if __name__ == "__main__":
    sys.exit(main())
