"""The art probe's second view at the person box instead of the image's centre, with the shipped probe's weights.
Measured on the quality bench's tune split. Not used by the product.

The probe (pipeline/stages/art_probe.py) reads two views: the whole image, and its centre window of at most crop_px a
side at the decoded resolution, where brush strokes and paper grain are still in the pixels. The art stage runs
after the person stage, so it could read that window where the person is: a painted face or a photographed one,
rather than whatever sits in the middle (research/notes/art-texture.md named it, not tried).

Rule (written 2026-12-07 before this script was run): the box view is the crop view's window, of the same size,
centred on the box with the highest raw score of the image (the person stage's stored boxes, mapped to the decoded
image), shifted to lie inside the image; an image without a box keeps the centre window. The probe's weights and cut
(art.max_score 0.84) are the shipped ones, not refitted. Compared on the tune images the art stage sees in a run
(those that pass the person stage): wins are photos (person_clear, person_small, no_person) the centre view rejects
and the box view passes, and non-photos (painted_person, non_photo) the centre view passes and the box view
rejects; losses are the reverse. The lead is worth a refit with the box view in the probe's training only if the
wins are at least 5 and beat the losses by the bench's sign test (p <= 0.1). Tune batches 1-10 trained the probe
on their centre windows, so their centre-view scores are in sample and flatter the shipped view: a win of the box
view there is the harder to get.

    python research/art/box_view.py RUN [--rows FILE.csv]      # RUN: a bench/quality.py tune run (--score-all)

Result (2026-12-07, runs/tune-batch15, 125 tune images pass the person stage: 91 person_clear, 34 painted people): the
box view rejects the same 2 person_clear as the centre view and passes two painted people the centre view rejects
(freecol's Bolivar 0.95 -> 0.80, GCompris' Pere Tanguy 0.93 -> 0.74): 0 wins, 2 losses, p 0.5. Not worth a refit.
The centre view's scores match the run's art_score within 5e-5. docs/benchmarks.md, "batch 15".
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PHOTOS = ("person_clear", "person_small", "no_person")
ART = ("painted_person", "non_photo")


def box_window(rgb: np.ndarray, box, scale: float, crop_px: int) -> np.ndarray:
    """The crop view's window (as art_probe.crop_input sizes it) centred on a box given in original pixels."""
    from pipeline.stages.art_probe import STRIDE

    h, w = rgb.shape[:2]
    ch = max(STRIDE, min(h, crop_px) // STRIDE * STRIDE)
    cw = max(STRIDE, min(w, crop_px) // STRIDE * STRIDE)
    cx, cy = 0.5 * (box[0] + box[2]) * scale, 0.5 * (box[1] + box[3]) * scale
    x0 = int(min(max(0, round(cx - cw / 2)), w - cw))
    y0 = int(min(max(0, round(cy - ch / 2)), h - ch))
    c = rgb[y0:y0 + ch, x0:x0 + cw]
    return (np.asarray(c, np.float32) / 255.0).transpose(2, 0, 1).copy()


def main() -> int:
    import argparse
    import csv

    import duckdb

    from catalog.rules import ART as ART_RULE
    from pipeline.config import load_config
    from pipeline.inputs.images import load_rgb
    from pipeline.stages.art import ArtStage
    from pipeline.stages.art_probe import view_inputs
    from research.bench_tune import bench_quality, report

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--rows", type=Path)
    a = ap.parse_args()
    labels = {r["id"]: r for r in csv.DictReader(open(ROOT / "bench/quality/labels.csv", newline=""))}
    cfg = load_config()
    stage = ArtStage(cfg["art"])
    stage.setup()
    cut = float(ART_RULE.threshold(cfg["art"]))
    rows = duckdb.connect().execute(
        f"select source_uri, person_boxes, person_scores, person_n_pass "
        f"from read_parquet('{a.run}/catalog/compact/samples/*.parquet')").fetchall()
    out_rows = []
    for uri, boxes, scores, n_pass in rows:
        i = Path(uri).stem
        lab = labels.get(i)
        if lab is None or lab["split"] != "tune" or lab["category"] not in PHOTOS + ART:
            continue
        if not n_pass:  # the art stage sees only what passes the person stage
            continue
        data = Path(uri).read_bytes()
        rgb, scale = load_rgb(data, max_side=2 * stage.input_px)
        whole, centre = view_inputs(rgb, stage.input_px, stage.probe.crop_px, stage.probe.views)
        if boxes:
            best = boxes[int(np.argmax(scores))]
            boxed = box_window(rgb, best, scale, stage.probe.crop_px)
        else:
            boxed = centre
        photo = stage.groups.index("photo")
        p_centre, p_box = stage._each_probe([[whole, centre], [whole, boxed]])
        out_rows.append({"id": i, "category": lab["category"], "centre": round(float(1 - p_centre[photo]), 4),
                         "box": round(float(1 - p_box[photo]), 4)})
    wins, losses = [], []
    for r in out_rows:
        c_rej, b_rej = r["centre"] > cut, r["box"] > cut
        if c_rej == b_rej:
            continue
        good = (not b_rej) if r["category"] in PHOTOS else b_rej
        (wins if good else losses).append(f"{r['id']} ({r['category']} {r['centre']} -> {r['box']})")
    q = bench_quality()
    by_cat = {}
    for r in out_rows:
        d = by_cat.setdefault(r["category"], {"n": 0, "centre_rejects": 0, "box_rejects": 0})
        d["n"] += 1
        d["centre_rejects"] += r["centre"] > cut
        d["box_rejects"] += r["box"] > cut
    out = {"run": str(a.run.name), "cut": cut, "images": len(out_rows), "by_category": by_cat,
           "wins": wins, "losses": losses, "sign_test_p": round(q.sign_test(len(wins), len(losses)), 4)}
    return report(out, out_rows, a.rows)


if __name__ == "__main__":
    sys.exit(main())
