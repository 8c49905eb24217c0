"""Does a second look by MediaPipe's BlazePose landmark model at the person box keep people the calibrated cut loses
(seen from behind, from above, under water), without keeping boxes that are not people? Measured on the quality
bench's tune split. Not used by the product.

The model is pose_landmark_full.tflite from the mediapipe wheel (Apache-2.0); mediapipe itself pins numpy < 2, so
the files are read from the wheel and run by ai-edge-litert (not a dependency of humanset) in a separate interpreter
(--litert-python: a Python with ai-edge-litert and Pillow). Its pose-presence output is the look: BlazePose's
tracker drops a person when it falls under 0.5.

The rows are research.bench_tune.person_look_rows (the shipped calibration's training rows; painted_person's rows
reported apart). Each box becomes BlazePose's own kind of region: a square of side 1.25 x max(w, h) around the box's
centre, zero-padded outside the image, from the image decoded at longer side 1024, resized to 256 x 256, RGB in
[0, 1]. Three second looks, each a rule written before its figures: a row the shipped cut rejects (calibrated
<= 0.9) passes if presence >= 0.5 ("presence"); if BlazePose's own detector (pose_detection.tflite, the region at
224 x 224 in [-1, 1], its best anchor's sigmoid) also gives >= 0.5 ("presence_and_detector"); if a logistic fit of
logit(calibrated) and logit(presence) on the main rows (C by leave-one-package-out log loss, every row held out by
package, painted rows too) gives >= 0.9 ("refit_with_presence"). Wins are person_clear rows newly passing, losses
label-0 rows; the exact sign test.

    python bench/quality.py --split tune --run RUN --write-labels labels.csv
    python research/person/blazepose_look.py RUN labels.csv --wheel mediapipe-0.10.18-...whl \\
        --litert-python VENV/bin/python [--rows FILE.csv]

Result (tune batches 1-12, 2026-12-06): presence 5 wins, 5 losses (a heron, a polar bear, a rhinoceros, two
constellation figures), p 1.0; with the detector 4 wins, 1 loss (a constellation figure), p 0.375; the refit
2 wins, 0 losses, p 0.5. With batches 13 and 14: with the detector 5 wins, 1 loss, p 0.22. Not taken.
docs/benchmarks.md, "a BlazePose second look at the person box" and "batch 13".
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CUT, LOOK, DECODE = 0.9, 0.5, 1024
LANDMARK = "mediapipe/modules/pose_landmark/pose_landmark_full.tflite"
DETECTOR = "mediapipe/modules/pose_detection/pose_detection.tflite"


def infer(regions_npz: str, folder: str, out_npy: str) -> None:
    """Run in the ai-edge-litert interpreter: each region's landmark presence, the detector's best score, and the
    landmark model's CPU seconds."""
    import time

    from ai_edge_litert.interpreter import Interpreter

    models = []
    for name in (LANDMARK, DETECTOR):
        it = Interpreter(model_path=str(Path(folder) / Path(name).name), num_threads=1)
        it.allocate_tensors()
        models.append((it, it.get_input_details()[0]["index"], {tuple(d["shape"]): d["index"]
                                                                  for d in it.get_output_details()}))
    (lm, lm_in, lm_out), (det, det_in, det_out) = models
    res = []
    for x in np.load(regions_npz)["x"]:
        t = time.process_time()
        lm.set_tensor(lm_in, (x[None] / np.float32(255)).astype(np.float32))
        lm.invoke()
        presence, seconds = float(lm.get_tensor(lm_out[(1, 1)])[0, 0]), time.process_time() - t
        det.set_tensor(det_in, (resize(x, 224)[None] / np.float32(127.5) - 1).astype(np.float32))
        det.invoke()
        logit = float(np.clip(det.get_tensor(det_out[(1, 2254, 1)]).max(), -100, 100))
        res.append((presence, 1 / (1 + np.exp(-logit)), seconds))
    np.save(out_npy, np.asarray(res))


def resize(x: np.ndarray, side: int) -> np.ndarray:
    """A uint8 RGB image resized (bilinear) to side x side."""
    from PIL import Image

    return np.asarray(Image.fromarray(x).resize((side, side), Image.BILINEAR))


def logit(v: np.ndarray) -> np.ndarray:
    """log(v / (1 - v)), v clipped to [1e-4, 1 - 1e-4]."""
    v = np.clip(v, 1e-4, 1 - 1e-4)
    return np.log(v / (1 - v))


def main() -> int:
    from research.bench_tune import (bench_quality, box_crops, held_out_logistic, person_look_rows, report,
                                     run_labels_parser)

    ap = run_labels_parser(__doc__)
    ap.add_argument("--wheel", type=Path, required=True, help="a mediapipe wheel (its pose_landmark_full.tflite)")
    ap.add_argument("--litert-python", type=Path, required=True, help="a Python with ai-edge-litert and Pillow installed")
    a = ap.parse_args()
    quality = bench_quality()
    rows, meta, bench, package = person_look_rows(a.run, a.labels)
    x = box_crops(rows, meta, DECODE)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(a.wheel) as z:
            for name in (LANDMARK, DETECTOR):
                (Path(tmp) / Path(name).name).write_bytes(z.read(name))
        np.savez(Path(tmp) / "x.npz", x=np.asarray(x))
        subprocess.run([str(a.litert_python), __file__, "--infer", str(Path(tmp) / "x.npz"), tmp,
                        str(Path(tmp) / "p.npy")], check=True)
        res = np.load(Path(tmp) / "p.npy")
    p, det, seconds = res[:, 0], res[:, 1], res[:, 2]
    is_row = np.array([r["role"] == "row" for r in rows])
    refit, c, loss = held_out_logistic(np.c_[logit(np.array([r["shipped"] for r in rows])), logit(p)],
                                       np.array([r["y"] for r in rows]),
                                       np.array([package[r["id"]] for r in rows]), is_row)
    out = {"run": a.run.name, "refit_C": c, "refit_lopo_log_loss": {str(k): round(v, 4) for k, v in loss.items()}}
    for rule, passes in (("presence", p >= LOOK), ("presence_and_detector", (p >= LOOK) & (det >= LOOK)),
                         ("refit_with_presence", refit >= CUT)):
        wins, losses, painted = [], [], []
        for r, q, d, ok in zip(rows, p, det, passes):
            if r["shipped"] <= CUT and ok:
                s = f'{r["id"]} ({bench[r["id"]]["category"]}, presence {q:.3f}, detector {d:.3f})'
                (painted if r["role"] == "painted" else wins if r["y"] == 1 else losses).append(s)
        out[rule] = {"wins": wins, "losses": losses,
                     "sign_test_p": round(quality.sign_test(len(wins), len(losses)), 4),
                     "no_person_newly_passing": [s for s in losses if "no_person" in s],
                     "painted_newly_passing": painted}
    main_rows = [(r, q) for r, q, m in zip(rows, p, is_row) if m]
    sweep = {str(t): [int(sum(r["shipped"] <= CUT and q >= t and r["y"] == y for r, q in main_rows)) for y in (1, 0)]
             for t in (0.1, 0.3, 0.7, 0.9)}
    out.update({"rows": len(main_rows), "positives": sum(r["y"] for r, _ in main_rows),
                "shipped_positives_under": sum(r["shipped"] <= CUT and r["y"] == 1 for r, _ in main_rows),
                "painted_rows": sum(r["role"] == "painted" for r in rows),
                "presence_sweep_not_a_verdict_wins_losses": sweep,
                "landmark_cpu_s_per_region_median": round(float(np.median(seconds)), 4)})
    return report(out, [{"id": r["id"], "role": r["role"], "label": r["y"], "category": bench[r["id"]]["category"],
                         "shipped": round(float(r["shipped"]), 4), "presence": round(float(q), 4),
                         "detector": round(float(d), 4), "refit": round(float(f), 4)}
                        for r, q, d, f in zip(rows, p, det, refit)], a.rows)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--infer"]:
        infer(*sys.argv[2:5])
        sys.exit(0)
    sys.exit(main())
