"""A horizontal-flip pass for the person stage, measured on the quality bench's tune split (issue 38: "a
horizontal-flip pass if it pays"). Not used by the product.

Every tune image is scored twice by the shipped person stage (yolo11n-pose, the shipped calibration, the
default config): as it is and mirrored left to right (decoded, flipped, re-encoded as PNG, so nothing but the
mirror changes). Three rules are compared against person_clear: the plain pass (the product), either pass
(a person passes when one of the two passes finds a box over 300 px at calibrated > 0.9), and the mean of
the two passes' calibrated image scores (> 0.9, with a box over 300 px in either). Prints one JSON object;
--rows writes each image's scores. Tune only: eval is not read.

    python research/person/flip.py [--cache ~/.cache/humanset/quality] [--rows FILE.csv]
"""
from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pipeline.inputs.images import load_rgb  # noqa: E402
from research.bench_tune import parser, report, shipped_person_stage, tune_images  # noqa: E402


def mirrored_png(data: bytes) -> tuple[bytes, int, int]:
    rgb, _ = load_rgb(data)
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgb[:, ::-1])).save(buf, "PNG")
    return buf.getvalue(), rgb.shape[1], rgb.shape[0]


def main(argv=None) -> int:
    ap = parser(__doc__)
    args = ap.parse_args(argv)

    labels, files = tune_images(args.cache)
    stage, cfg = shipped_person_stage()
    seconds = {"plain": 0.0, "mirrored": 0.0}
    rows = []
    for i in range(0, len(files), args.batch):
        part = files[i:i + args.batch]
        plain, mirrored, sizes = [], [], []
        for f in part:
            data = f.read_bytes()
            try:
                m, w, h = mirrored_png(data)
            except Exception:  # an image the decoder refuses: both passes record it as an error
                m, w, h = data, None, None
            plain.append(data)
            mirrored.append(m)
            sizes.append((w, h))
        out = {}
        for name, images in (("plain", plain), ("mirrored", mirrored)):
            t0 = time.process_time()
            out[name] = stage.measure({"image": images, "width": [s[0] for s in sizes],
                                       "height": [s[1] for s in sizes]})
            seconds[name] += time.process_time() - t0
        for j, f in enumerate(part):
            rows.append({"id": f.stem, "category": labels[f.stem]["category"],
                         **{f"{c}_{k}": out[k][c][j] for k in out
                            for c in ("person_score_calibrated", "person_n_pass", "person_box_max_px")}})
        print(f"{len(rows)}/{len(files)}", file=sys.stderr)

    def passes(r, rule):
        p = (r["person_n_pass_plain"] or 0) > 0
        m = (r["person_n_pass_mirrored"] or 0) > 0
        if rule == "plain":
            return p
        if rule == "either":
            return p or m
        mean = ((r["person_score_calibrated_plain"] or 0) + (r["person_score_calibrated_mirrored"] or 0)) / 2
        big = max(r["person_box_max_px_plain"] or 0, r["person_box_max_px_mirrored"] or 0) > float(cfg["min_box_px"])
        return mean > float(cfg["min_score"]) and big

    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load": os.getloadavg(),
              "images": len(rows), "cpu_seconds": {k: round(v, 1) for k, v in seconds.items()}, "rules": {}}
    cats = sorted({r["category"] for r in rows})
    for rule in ("plain", "either", "mean"):
        res = {c: f"{sum(passes(r, rule) for r in rows if r['category'] == c)}/"
                  f"{sum(r['category'] == c for r in rows)}" for c in cats}
        changed = [r["id"] for r in rows if passes(r, rule) != passes(r, "plain")]
        out["rules"][rule] = {"passing": res, "changed_vs_plain": changed}
    return report(out, rows, args.rows)


if __name__ == "__main__":
    raise SystemExit(main())
