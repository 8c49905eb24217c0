"""A zoom pass for the person stage, measured on the quality bench's tune split: a second look, at the
detector's input size, at the best box of an image the plain pass did not pass. Not used by the product.

The nano pose model sees every image resized to 640 px; a person who fills a third of a large photo is seen at
~200 px, and the calibrated score reads his head keypoints. For each tune image whose plain pass (the shipped
person stage, default config) passes no box but holds a box over `person.min_box_px` with raw score >=
--min-raw, the box grown by --margin on every side is cropped (decoded pixels, re-encoded as PNG) and
measured again by the same stage. Box sizes are in the crop's own pixels, which are the image's: the size
rule reads the same quantity. Rule "zoom": an image passes when the plain pass or the crop's pass does.
Prints one JSON object (per category: passing the person stage, plain and zoom; the images the zoom pass
changes; wins (person_clear gained) and losses (anything else gained) with the exact sign test; CPU seconds of
each pass). Tune only: eval is not read.

    python research/person/zoom.py [--cache ~/.cache/humanset/quality] [--rows FILE.csv]
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
from research.bench_tune import bench_quality, parser, report, shipped_person_stage, tune_images  # noqa: E402

quality = bench_quality()


def crop_png(data: bytes, box, margin: float) -> bytes:
    """The box (x1, y1, x2, y2 in the image's pixels) grown by margin x its size on every side, as PNG."""
    rgb, _ = load_rgb(data)
    h, w = rgb.shape[:2]
    x1, y1, x2, y2 = (float(v) for v in box[:4])
    mx, my = margin * (x2 - x1), margin * (y2 - y1)
    x1, y1 = max(0, int(x1 - mx)), max(0, int(y1 - my))
    x2, y2 = min(w, int(np.ceil(x2 + mx))), min(h, int(np.ceil(y2 + my)))
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgb[y1:y2, x1:x2])).save(buf, "PNG")
    return buf.getvalue()


def best_box(out: dict, j: int, min_px: float, min_raw: float):
    """The highest-scoring box of image j over min_px on its longer side with raw >= min_raw, or None."""
    best = None
    for b, s in zip(out["person_boxes"][j] or [], out["person_scores"][j] or []):
        side = max(float(b[2]) - float(b[0]), float(b[3]) - float(b[1]))
        if side > min_px and float(s) >= min_raw and (best is None or float(s) > best[1]):
            best = (b, float(s))
    return None if best is None else best[0]


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--margin", type=float, default=0.15)
    ap.add_argument("--min-raw", type=float, default=0.25)
    args = ap.parse_args(argv)

    labels, files = tune_images(args.cache)
    stage, cfg = shipped_person_stage()
    min_px = float(cfg["min_box_px"])
    seconds = {"plain": 0.0, "zoom": 0.0}
    rows = []
    for i in range(0, len(files), args.batch):
        part = files[i:i + args.batch]
        data = [f.read_bytes() for f in part]
        t0 = time.process_time()
        plain = stage.measure({"image": data, "width": [None] * len(data), "height": [None] * len(data)})
        seconds["plain"] += time.process_time() - t0
        todo = {}
        for j in range(len(part)):
            if (plain["person_n_pass"][j] or 0) > 0 or plain["person_error"][j]:
                continue
            box = best_box(plain, j, min_px, args.min_raw)
            if box is not None:
                todo[j] = crop_png(data[j], box, args.margin)
        zoom = None
        if todo:
            t0 = time.process_time()
            zoom = stage.measure({"image": list(todo.values()), "width": [None] * len(todo),
                                  "height": [None] * len(todo)})
            seconds["zoom"] += time.process_time() - t0
        position = {j: k for k, j in enumerate(todo)}  # image j's row in the zoom pass
        for j, f in enumerate(part):
            k = position.get(j)
            rows.append({"id": f.stem, "category": labels[f.stem]["category"],
                         "plain_pass": (plain["person_n_pass"][j] or 0) > 0,
                         "plain_calibrated": plain["person_score_calibrated"][j],
                         "zoomed": k is not None,
                         "zoom_pass": k is not None and (zoom["person_n_pass"][k] or 0) > 0,
                         "zoom_calibrated": None if k is None else zoom["person_score_calibrated"][k]})
        print(f"{len(rows)}/{len(files)}", file=sys.stderr)

    cats = sorted({r["category"] for r in rows})
    gained = [r for r in rows if r["zoom_pass"] and not r["plain_pass"]]
    wins = sum(r["category"] == "person_clear" for r in gained)
    out = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load": os.getloadavg(), "images": len(rows),
        "margin": args.margin, "min_raw": args.min_raw, "zoomed": sum(r["zoomed"] for r in rows),
        "cpu_seconds": {k: round(v, 1) for k, v in seconds.items()},
        "passing": {rule: {c: f"{sum(r['plain_pass'] or (rule == 'zoom' and r['zoom_pass']) for r in rows if r['category'] == c)}"
                              f"/{sum(r['category'] == c for r in rows)}" for c in cats} for rule in ("plain", "zoom")},
        "gained": {r["id"]: [r["category"], r["plain_calibrated"], r["zoom_calibrated"]] for r in gained},
        "wins": wins, "losses": len(gained) - wins,
        "losses_not_painted": sum(r["category"] not in ("person_clear", "painted_person") for r in gained),
        "sign_test_p": round(quality.sign_test(wins, len(gained) - wins), 4),
    }
    return report(out, rows, args.rows)


if __name__ == "__main__":
    raise SystemExit(main())
