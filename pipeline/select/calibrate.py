"""What does a threshold cost? Precision / recall of each stage score against hand labels.

Labels are a CSV of `sample_id,label` rows with label `STAGE=0|1`, one row per sample and stage:

    sample_id,label
    3f2a...,person=1      # a person that Sapiens would want is in the image
    3f2a...,text=0        # no overlaid text
    91bc...,watermark=1

For every stage the positive class is label 1 and a sample is predicted positive when its score
is ABOVE the threshold, which is exactly how the stage's rule (catalog.rules.CALIBRATED, the one
declaration the stages' reject() apply) reads its config:

    stage      score (from the catalog)                               config key it calibrates
    person     best score among boxes large enough under the box rule  person.min_score (keep if >)
    text       text_area_frac                                         text.max_area_frac (reject if >)
    watermark  watermark_score                                        watermark.max_score (reject if >)
    art        art_score                                              art.max_score (reject if >)

So for person, precision is "of the kept images, how many really show a person"; for the filters it
is "of the rejected images, how many really have text / a watermark / are not photos". The
threshold printed for a target precision is the one with the highest recall among those reaching it.

For person the score is the one `person.score` names: the calibrated score (default) or the raw one.
`--fit-person OUT` also fits the calibrated score itself to the person labels (fit_person below: a
logistic model of pipeline/stages/person_calibration.FEATURES, L2-regularised, the strength chosen by
leave-one-out log loss) and writes the file `person.calibration: OUT` reads; `humanset select RUN
--set person.calibration=OUT` re-cuts a run with it, without the model.

Two scores are exact only near the configured cut by default: with `text.recognize: needed` and
`watermark.recognize: needed` (the defaults) the stages stop reading boxes once the verdict at the
configured cut is settled. The stored score then lies on the right side of that cut, but it can be a
bound (text_area_frac: either side; watermark_score of a rejected row: the score of the boxes read so
far). Sweeps far from the configured cut want a run curated with `recognize: all` for that stage.
"""
from __future__ import annotations

import csv
import datetime as dt
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from catalog.rules import CALIBRATED

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Point:
    threshold: float
    precision: float  # nan when nothing is predicted positive
    recall: float
    tp: int
    fp: int
    fn: int
    tn: int


# --- the math: pure functions -----------------------------------------------------------------------
def pr_curve(scores: list[float], labels: list[int]) -> list[Point]:
    """Precision and recall of `score > t` for every threshold where the prediction changes.

    Thresholds are the distinct scores (a sample scoring exactly t is predicted negative) plus one
    below the smallest score (everything positive). Sorted by increasing threshold.
    """
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} scores but {len(labels)} labels")
    pairs = sorted(zip((float(s) for s in scores), (int(y) for y in labels)), key=lambda p: p[0])
    pos = sum(y for _, y in pairs)
    neg = len(pairs) - pos
    if not pairs:
        return []
    below = pairs[0][0] - max(1e-6, abs(pairs[0][0]) * 1e-6)
    points = [_point(below, pos, neg, pos, neg)]
    # walk thresholds upwards: samples at or below t become predicted negative
    tp, fp = pos, neg
    i = 0
    while i < len(pairs):
        t = pairs[i][0]
        while i < len(pairs) and pairs[i][0] == t:
            if pairs[i][1]:
                tp -= 1
            else:
                fp -= 1
            i += 1
        points.append(_point(t, tp, fp, pos, neg))
    return points


def _point(t: float, tp: int, fp: int, pos: int, neg: int) -> Point:
    precision = tp / (tp + fp) if tp + fp else math.nan
    recall = tp / pos if pos else math.nan
    return Point(t, precision, recall, tp, fp, pos - tp, neg - fp)


def threshold_for_precision(curve: list[Point], target: float) -> Point | None:
    """The point with precision >= target and the highest recall (ties: the higher threshold)."""
    ok = [p for p in curve if not math.isnan(p.precision) and p.precision >= target and p.tp > 0]
    if not ok:
        return None
    return max(ok, key=lambda p: (p.recall, p.threshold))


def at_threshold(curve: list[Point], t: float) -> Point | None:
    """The curve's point for `score > t` (the largest curve threshold <= t)."""
    below = [p for p in curve if p.threshold <= t]
    return below[-1] if below else (curve[0] if curve else None)


# --- inputs -----------------------------------------------------------------------------------------
def read_labels(path: str | Path) -> dict[str, dict[str, int]]:
    """labels.csv -> {stage: {sample_id: 0|1}}. A header row `sample_id,label` is optional."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--labels {path}: no such file; pass a CSV of sample_id,STAGE=0|1 rows")
    out: dict[str, dict[str, int]] = {}
    try:
        rows = list(csv.reader(path.read_text().splitlines()))
    except UnicodeDecodeError:
        raise ValueError(f"--labels {path}: not a text file; pass a CSV of sample_id,STAGE=0|1 rows") from None
    for n, row in enumerate(rows, start=1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if n == 1 and row[0].strip().lower() == "sample_id":
            continue
        if len(row) != 2 or "=" not in row[1]:
            raise ValueError(f"{path}:{n}: expected 'sample_id,STAGE=0|1' (e.g. 'ab12..,person=1'), "
                             f"got {','.join(row)!r}")
        stage, value = (x.strip() for x in row[1].split("=", 1))
        if stage not in CALIBRATED:
            raise ValueError(f"{path}:{n}: unknown stage {stage!r}; label one of {', '.join(CALIBRATED)}")
        if value not in ("0", "1"):
            raise ValueError(f"{path}:{n}: label value must be 0 or 1, got {value!r}")
        out.setdefault(stage, {})[row[0].strip()] = int(value)
    if not out:
        raise ValueError(f"{path}: no labels")
    return out


def stage_scores(run: str | Path, cfg: dict) -> dict[str, dict[str, float | None]]:
    """{stage: {sample_id: score or None}} read from the run's catalog with DuckDB."""
    from catalog import connect

    from pipeline.stages.person import best_passing_score, cut_scores, judged_boxes, thresholds

    con = connect(run)
    cols = ["sample_id", "person_boxes", "person_scores", "person_keypoints", "person_look_box", "person_look_score",
            "resolution_scale", "text_area_frac", "watermark_score", "art_score"]
    have = {r[0] for r in con.execute("DESCRIBE samples").fetchall()}
    got = [c for c in cols if c in have]
    rows = con.execute(f"SELECT {', '.join(got)} FROM samples").fetchall()
    table = pa.table({c: [r[i] for r in rows] for i, c in enumerate(got)})
    person = cfg.get("person") or {}
    _, min_box, rule = thresholds(person)
    person_scores = cut_scores(table, person)
    col = {c: table.column(c).to_pylist() if c in have else [None] * table.num_rows for c in cols}
    out: dict[str, dict[str, float | None]] = {s: {} for s in CALIBRATED}
    for i, sid in enumerate(col["sample_id"]):
        boxes = judged_boxes(col["person_boxes"][i], col["resolution_scale"][i])
        out["person"][sid] = best_passing_score(boxes, person_scores[i], min_box, rule)
        text, wm, art = col["text_area_frac"][i], col["watermark_score"][i], col["art_score"][i]
        out["text"][sid], out["watermark"][sid], out["art"][sid] = text, wm, art
    return out


def _run_config(run: Path) -> dict:
    from pipeline.config import default_config

    manifest = run / "manifest.json"
    if manifest.is_file():
        import json

        return json.loads(manifest.read_text()).get("config") or default_config()
    return default_config()


# --- fitting the calibrated person score --------------------------------------------------------------
L2_GRID = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0)


def person_training_rows(run: str | Path, labels: dict[str, int], cfg: dict) -> list[tuple]:
    """(sample_id, raw score, box in judged pixels, keypoints) of each labelled sample's box with the highest raw
    score among those passing the box rule (where the score decides). Samples with no such box are left out:
    the box rule rejects them whatever the score."""
    from catalog import connect

    from pipeline.stages.person import box_passes, judged_boxes, thresholds

    _, min_box, rule = thresholds(cfg.get("person") or {})
    con = connect(run)
    have = {r[0] for r in con.execute("DESCRIBE samples").fetchall()}
    scale = "resolution_scale" if "resolution_scale" in have else "NULL"
    rows = con.execute(f"SELECT sample_id, person_boxes, person_scores, person_keypoints, {scale} FROM samples "
                       f"WHERE person_scores IS NOT NULL").fetchall()
    out = []
    for sid, boxes, scores, kpts, sc in rows:
        if sid not in labels or not scores:
            continue
        boxes = judged_boxes(boxes, sc)
        big = [j for j, b in enumerate(boxes) if b is not None and box_passes(b, min_box, rule)]
        if not big:
            continue
        j = max(big, key=lambda k: scores[k])
        out.append((sid, scores[j], boxes[j], kpts[j] if kpts else None))
    return out


def person_training_set(run: str | Path, labels: dict[str, int], cfg: dict, box_ref_px: float = 300.0):
    """(X, y, sample_ids): the FEATURES of person_training_rows' boxes and their labels."""
    from pipeline.stages.person_calibration import box_features

    X, y, ids = [], [], []
    for sid, score, box, kpts in person_training_rows(run, labels, cfg):
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


def fit_person(X: np.ndarray, y: np.ndarray, fitted_on: dict, box_ref_px: float = 300.0, grid=L2_GRID):
    """The calibrated person score fitted to (X, y): the L2 strength (on standardised features) is the
    one of `grid` with the lowest leave-one-out log loss; the leave-one-out recall at 0.9 and the
    negatives over 0.9 are recorded with the fit, as its held-out estimate."""
    from pipeline.stages.person_calibration import Calibration

    n_pos = int(y.sum())
    if n_pos < 5 or len(y) - n_pos < 5:
        raise ValueError(f"person calibration needs at least 5 positive and 5 negative labelled samples with a "
                         f"box over the size rule; got {n_pos} and {len(y) - n_pos}")
    held_out = {l2: loo_predictions(X, y, l2) for l2 in grid}
    loo = {l2: log_losses(p, y) for l2, p in held_out.items()}
    l2 = min(loo, key=lambda k: loo[k].mean())
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


# --- the command ------------------------------------------------------------------------------------
def calibrate(run: str | Path, labels_csv: str | Path, target_precision: float = 0.95,
              out_png: str | Path | None = None, print_fn=print, fit_person_to: str | Path | None = None) -> dict:
    """Print precision/recall per threshold per labelled stage; write the curves to out_png."""
    run = Path(run)
    cfg = _run_config(run)
    labels = read_labels(labels_csv)
    if fit_person_to:
        if "person" not in labels:
            raise ValueError(f"--fit-person: {labels_csv} holds no person labels")
        X, y, _ = person_training_set(run, labels["person"], cfg)
        fitted = fit_person(X, y, {"run": run.name, "labels": Path(labels_csv).name,
                                   "rule": "labelled samples with a box over the size rule; the box with the "
                                           "highest raw score"})
        fitted.save(fit_person_to)
        print_fn(f"person calibration ({len(y)} samples, {int(y.sum())} positive, l2={fitted.l2:g}): {fit_person_to}\n"
                 f"  use it: --set person.calibration={fit_person_to} (humanset select re-cuts a run with it)")
        cfg = {**cfg, "person": {**(cfg.get("person") or {}), "score": "calibrated",
                                 "calibration": str(fit_person_to)}}
    scores = stage_scores(run, cfg)
    report: dict[str, dict] = {}
    for stage, lab in labels.items():
        known = scores[stage]
        missing = [s for s in lab if s not in known]
        unscored = [s for s in lab if s in known and known[s] is None]
        use = [s for s in lab if known.get(s) is not None]
        if missing:
            log.warning("%s: %d labelled sample ids are not in %s (first: %s)", stage, len(missing), run, missing[0])
        curve = pr_curve([known[s] for s in use], [lab[s] for s in use])
        rule = CALIBRATED[stage]
        t = rule.threshold(cfg.get(stage))
        current = math.nan if t is None else float(t)
        best = threshold_for_precision(curve, target_precision)
        report[stage] = {"n": len(use), "positives": sum(lab[s] for s in use), "unscored": len(unscored),
                         "missing": len(missing), "curve": curve, "config_key": rule.config_key,
                         "config_threshold": current, "at_config": at_threshold(curve, current),
                         "target_precision": target_precision, "best": best}
        _print_stage(stage, report[stage], print_fn)
    if out_png:
        plot_curves(report, out_png)
        print_fn(f"curves: {out_png}")
    return report


def _fmt(x: float) -> str:
    return "  -  " if math.isnan(x) else f"{x:.3f}"


def _print_stage(stage: str, r: dict, print_fn) -> None:
    print_fn(f"\n{stage}: {r['n']} labelled samples with a score ({r['positives']} positive), "
             f"{r['unscored']} not scored by the stage, {r['missing']} not in the run")
    curve = r["curve"]
    if not curve:
        print_fn("  nothing to calibrate")
        return
    shown = curve if len(curve) <= 25 else [curve[round(i * (len(curve) - 1) / 24)] for i in range(25)]
    print_fn(f"  {'score >':>10} {'precision':>9} {'recall':>7} {'tp':>5} {'fp':>5} {'fn':>5}")
    for p in shown:
        t = "(all)" if p is curve[0] else f"{p.threshold:.4f}"  # below every score: all positive
        print_fn(f"  {t:>10} {_fmt(p.precision):>9} {_fmt(p.recall):>7} {p.tp:>5} {p.fp:>5} {p.fn:>5}")
    at = r["at_config"]
    if at is not None and not math.isnan(r["config_threshold"]):
        print_fn(f"  config {r['config_key']}={r['config_threshold']:g}: precision {_fmt(at.precision)}, "
                 f"recall {_fmt(at.recall)}")
    best = r["best"]
    if best is None:
        print_fn(f"  no threshold reaches precision {r['target_precision']:g}")
    else:
        print_fn(f"  precision >= {r['target_precision']:g}: --set {r['config_key']}={best.threshold:.4g} "
                 f"(precision {_fmt(best.precision)}, recall {_fmt(best.recall)})")


def plot_curves(report: dict, out_png: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = [s for s in report if report[s]["curve"]]
    fig, axes = plt.subplots(1, max(1, len(stages)), figsize=(4.5 * max(1, len(stages)), 3.6), squeeze=False)
    for ax, stage in zip(axes[0], stages):
        r = report[stage]
        t = [p.threshold for p in r["curve"]]
        ax.step(t, [p.precision for p in r["curve"]], where="post", label="precision")
        ax.step(t, [p.recall for p in r["curve"]], where="post", label="recall")
        if not math.isnan(r["config_threshold"]):
            ax.axvline(r["config_threshold"], color="grey", ls="--", lw=1, label=f"config {r['config_threshold']:g}")
        if r["best"] is not None:
            ax.axvline(r["best"].threshold, color="green", ls=":", lw=1.5,
                       label=f"precision>={r['target_precision']:g}: {r['best'].threshold:.3g}")
        ax.axhline(r["target_precision"], color="green", lw=0.5, alpha=0.5)
        ax.set(title=f"{stage} (n={r['n']})", xlabel=f"threshold ({r['config_key']})", ylim=(-0.02, 1.02))
        ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
