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
Each precision and recall comes with its 95 % Wilson interval: a few hundred labels pin a cut's
precision to a few points, a few dozen do not, and the command says how many kept samples would.

For person the score is the one `person.score` names: the calibrated score (default) or the raw one.
`--fit-person OUT` also fits the calibrated score itself, and its second look, to the person labels
(person_fit.py) and writes the file `person.calibration: OUT` reads; `humanset select RUN --set
person.calibration=OUT` re-cuts a run with it, without the model.

Two scores are exact only near the configured cut by default: with `text.recognize: needed` and
`watermark.recognize: needed` (the defaults) the stages stop reading boxes once the verdict at the
configured cut is settled. The stored score then lies on the right side of that cut, but it can be a
bound (text_area_frac: either side; watermark_score of a rejected row: the score of the boxes read so
far). Sweeps far from the configured cut want a run curated with `recognize: all` for that stage.
"""
from __future__ import annotations

import csv
import dataclasses
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

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


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a proportion k/n (95 % at the default z): where the rate the labelled
    samples were drawn from could lie. Unlike k/n +- z*se it stays inside [0, 1] and is not empty at 0/n or n/n."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"wilson needs 0 <= k <= n and n > 0, got {k}/{n}")
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return (0.0 if k == 0 else centre - half), (1.0 if k == n else centre + half)


def samples_to_settle(precision: float, target: float, limit: int = 1_000_000) -> int | None:
    """How many samples predicted positive, at this precision, put the Wilson interval's lower end at the
    target or above (None: the precision does not exceed the target, or it takes more than `limit`)."""
    if math.isnan(precision) or precision <= target:
        return None
    lo, hi = 1, limit
    if wilson(round(precision * hi), hi)[0] < target:
        return None
    while lo < hi:  # the lower end grows with n at a fixed precision (up to rounding of k)
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if wilson(round(precision * mid), mid)[0] < target else (lo, mid)
    return lo


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
        raise FileNotFoundError(f"--labels {path}: no such file; pass a CSV of sample_id,STAGE=0|1 rows, or write one "
                                f"by labelling samples in `humanset browse RUN --labels {path}`")
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


def stage_scores(run: str | Path, cfg: dict, ids=None) -> dict[str, dict[str, float | None]]:
    """{stage: {sample_id: score or None}} of the labelled samples (`ids`; None: all) from the run's catalog."""
    from catalog.duck import sample_rows
    from pipeline.stages.person import best_passing_score, cut_scores, judged_boxes, thresholds

    cols = ["sample_id", "person_boxes", "person_scores", "person_keypoints", "person_look_box", "person_look_score",
            "resolution_scale", "text_area_frac", "watermark_score", "art_score"]
    got, rows = sample_rows(run, cols, ids)
    table = pa.table({c: [r[i] for r in rows] for i, c in enumerate(got)})
    person = cfg.get("person") or {}
    _, min_box, rule = thresholds(person)
    person_scores = cut_scores(table, person)
    col = {c: table.column(c).to_pylist() if c in got else [None] * table.num_rows for c in cols}
    out: dict[str, dict[str, float | None]] = {s: {} for s in CALIBRATED}
    for i, sid in enumerate(col["sample_id"]):
        boxes = judged_boxes(col["person_boxes"][i], col["resolution_scale"][i])
        out["person"][sid] = best_passing_score(boxes, person_scores[i], min_box, rule)
        text, wm, art = col["text_area_frac"][i], col["watermark_score"][i], col["art_score"][i]
        out["text"][sid], out["watermark"][sid], out["art"][sid] = text, wm, art
    return out


def _run_config(run) -> dict:
    """The config the run was curated with, from its manifest (a local folder or a URI on an object store); the
    defaults for a run without one."""
    from catalog.storage import storage_for
    from pipeline.config import default_config

    store = storage_for(run)
    manifest = store.read_json("manifest.json") if store.exists("manifest.json") else {}
    return manifest.get("config") or default_config()


def run_name(run) -> str:
    """The last part of a run's folder or URI (what a fitted file records as its run)."""
    return PurePosixPath(os.fspath(run).rstrip("/")).name


# --- the command ------------------------------------------------------------------------------------
def calibrate(run: str | Path, labels_csv: str | Path, target_precision: float = 0.95,
              out_png: str | Path | None = None, print_fn=print, fit_person_to: str | Path | None = None) -> dict:
    """Print precision/recall per threshold per labelled stage; write the curves to out_png."""
    from catalog.duck import run_location

    run = run_location(run)  # a local folder as a Path, a run on an object store as its URI
    cfg = _run_config(run)
    labels = read_labels(labels_csv)
    if fit_person_to:
        from pipeline.select.person_fit import (LOOK_RULE, fit_look, fit_person, person_look_set,
                                                person_training_set, training_boxes)

        if "person" not in labels:
            raise ValueError(f"--fit-person: {labels_csv} holds no person labels")
        boxes = training_boxes(run, labels["person"], cfg)
        X, y, _ = person_training_set(boxes, labels["person"], run)
        fitted = fit_person(X, y, {"run": run_name(run), "labels": Path(labels_csv).name,
                                   "rule": "labelled samples with a box over the size rule; the box with the "
                                           "highest raw score"})
        LX, ly, _ = person_look_set(boxes, labels["person"], fitted)
        look, why = fit_look(LX, ly, {"run": run_name(run), "labels": Path(labels_csv).name, "rule": LOOK_RULE})
        fitted = dataclasses.replace(fitted, look=look)
        fitted.save(fit_person_to)
        print_fn(f"person calibration ({len(y)} samples, {int(y.sum())} positive, l2={fitted.l2:g}): {fit_person_to}")
        if look:
            print_fn(f"  second look ({len(ly)} samples it read, {int(ly.sum())} positive, l2={look['l2']:g}): "
                     f"coef {look['coef']}, intercept {look['intercept']}")
        else:
            print_fn(f"  no second look fit ({why}): the second look is off with this file")
        print_fn(f"  use it: --set person.calibration={fit_person_to} (humanset select re-cuts a run with it)")
        cfg = {**cfg, "person": {**(cfg.get("person") or {}), "score": "calibrated",
                                 "calibration": str(fit_person_to)}}
    scores = stage_scores(run, cfg, {sid for lab in labels.values() for sid in lab})
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
                 f"recall {_fmt(at.recall)}{_intervals(at)}")
    best, target = r["best"], r["target_precision"]
    if best is None:
        print_fn(f"  no threshold reaches precision {target:g}")
        return
    print_fn(f"  precision >= {target:g}: --set {r['config_key']}={best.threshold:.4g} "
             f"(precision {_fmt(best.precision)}, recall {_fmt(best.recall)}){_intervals(best)}")
    predicted = best.tp + best.fp
    low = wilson(best.tp, predicted)[0]
    if low < target:
        need = samples_to_settle(best.precision, target)
        more = f"; about {need} at this precision would" if need else ""
        print_fn(f"  {predicted} labelled samples pass: precision could be {low:.3f} (95 % interval), so "
                 f">= {target:g} is not settled{more}")


def _interval(k: int, n: int) -> str:
    return "-" if n == 0 else "{:.3f}-{:.3f}".format(*wilson(k, n))


def _intervals(p: Point) -> str:
    """'; 95 % intervals a-b, c-d': the Wilson intervals of the point's precision and recall."""
    return f"; 95 % intervals {_interval(p.tp, p.tp + p.fp)}, {_interval(p.tp, p.tp + p.fn)}"


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
