"""Can a text box tell an overlaid caption from scene text? Measured on the quality bench's tune split. Not
used by the product.

The text stage rejects an image whose confirmed text covers more than `text.max_area_frac` (3 %); on eval it
loses three people beside scene text (a fuselage's lettering, a T-shirt, posters) at 3.3-4.1 %, and a one-line
caption 6 % high covers 4 % (docs/quality.md). Area cannot tell them apart; this script measures three
properties of a confirmed box (the text stage's OCR, its confirmation rule) that might:

  flat   how uniform the glyphs' colour is against the glyph/background contrast: 1 - std(glyph RGB) /
         |mean glyph luma - mean background luma| (Otsu split inside the box, glyphs the minority class).
         A rendered overlay is one colour; photographed lettering carries light, folds and perspective.
  band   the box's centre in the top or bottom fifth of the image (where captions sit)
  tilt   the angle of the box's top edge, degrees (overlays are level; lettering on a surface often is not)

Two sets: scene text, every confirmed box of the tune split's clean photos (person_clear, person_small,
no_person); captions, one generated caption on each tune person_clear photo (DejaVu fonts, the watermark
"tune" family's; four styles: white with a black stroke, white on a dark bar, yellow with a shadow, black on a
white band; height 4-8 % of the image, top or bottom; JPEG quality 40-95; seeded), every confirmed box that
reads a caption word. Prints one JSON object: per feature, the ROC AUC of caption against scene text per box,
and the two sets' quartiles; with --rows, each box. Tune only: eval is not read.

    python research/text/captions.py [--cache ~/.cache/humanset/quality] [--seed 0] [--rows FILE.csv]
"""
from __future__ import annotations

import io
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pipeline.inputs.images import load_rgb  # noqa: E402
from pipeline.settings import DEFAULTS  # noqa: E402
from pipeline.stages.ocr import OCR, TEXT_BOX_THRESH, crop_box  # noqa: E402
from pipeline.stages.text import confirmed  # noqa: E402
from pipeline.stages.watermark.marks import family_fonts, font  # noqa: E402
from research.bench_tune import parser, report, tune_images  # noqa: E402
from training.filters.thresholds import roc_auc  # noqa: E402

CAPTIONS = ["Champions league final tonight", "SUMMER SALE 50% OFF", "Meet the team behind the project",
            "Breaking news from the city centre", "When you finally fix the bug", "Happy birthday grandma",
            "Live concert this Saturday", "Best day ever at the beach"]
STYLES = ("stroke", "dark_bar", "shadow", "white_band")
CLEAN = ("person_clear", "person_small", "no_person")


def caption(im: Image.Image, rng: random.Random, fonts: list[str]) -> tuple[Image.Image, str]:
    """One overlaid caption, drawn as the seeded draw says; the text drawn."""
    im = im.convert("RGB").copy()
    d = ImageDraw.Draw(im, "RGBA")
    text, style = rng.choice(CAPTIONS), rng.choice(STYLES)
    size = max(12, int(im.height * rng.uniform(0.04, 0.08)))
    f = font(rng.choice(fonts), size)
    while d.textlength(text, font=f) > 0.92 * im.width and size > 12:  # fit the width
        size = int(size * 0.9)
        f = font(rng.choice(fonts), size)
    w = d.textlength(text, font=f)
    x = (im.width - w) / 2
    y = size * 0.6 if rng.random() < 0.5 else im.height - size * 1.8
    if style == "stroke":
        d.text((x, y), text, font=f, fill="white", stroke_width=max(1, size // 14), stroke_fill="black")
    elif style == "dark_bar":
        d.rectangle([0, y - size * 0.25, im.width, y + size * 1.35], fill=(0, 0, 0, 150))
        d.text((x, y), text, font=f, fill="white")
    elif style == "shadow":
        o = max(1, size // 16)
        d.text((x + o, y + o), text, font=f, fill=(0, 0, 0, 200))
        d.text((x, y), text, font=f, fill=(255, 230, 40))
    else:
        d.rectangle([0, y - size * 0.25, im.width, y + size * 1.35], fill=(255, 255, 255))
        d.text((x, y), text, font=f, fill="black")
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=rng.randint(40, 95))
    return Image.open(io.BytesIO(buf.getvalue())).convert("RGB"), text


def box_features(rgb: np.ndarray, box: np.ndarray) -> dict | None:
    """flat, band, tilt of one box of an RGB image (None: too small or flat to split)."""
    import cv2

    crop = crop_box(rgb, box)
    if crop.size < 3 * 64 or min(crop.shape[:2]) < 5:
        return None
    grey = cv2.cvtColor(crop, cv2.COLOR_RGB2GRAY).reshape(-1)
    t, _ = cv2.threshold(grey, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    hi = grey > t
    glyph = hi if hi.sum() < (~hi).sum() else ~hi
    if glyph.sum() < 8 or (~glyph).sum() < 8:
        return None
    pix = crop.reshape(-1, 3).astype(np.float64)
    contrast = abs(float(grey[glyph].mean()) - float(grey[~glyph].mean()))
    if contrast < 1:
        return None
    flat = 1.0 - min(1.0, float(pix[glyph].std(axis=0).mean()) / contrast)
    h = rgb.shape[0]
    cy = float(box[:, 1].mean()) / h
    (x0, y0), (x1, y1) = box[0], box[1]
    tilt = abs(float(np.degrees(np.arctan2(y1 - y0, x1 - x0))))
    return {"flat": round(flat, 4), "band": float(cy < 0.2 or cy > 0.8), "tilt": round(min(tilt, 180 - tilt), 2)}


def read_boxes(ocr: OCR, rgb: np.ndarray) -> list[tuple[np.ndarray, str]]:
    """The text stage's confirmed boxes of an RGB image (boxes in its pixels) with their strings."""
    boxes, scores, crops = ocr.detect(np.ascontiguousarray(rgb[..., ::-1]))
    keep = [k for k, s in enumerate(scores) if s >= TEXT_BOX_THRESH]
    if not keep:
        return []
    texts, rec = ocr.recognize([crops[k] for k in keep])
    ok = confirmed(texts, rec, DEFAULTS.text.min_rec_score, DEFAULTS.text.min_chars)
    return [(np.asarray(boxes[keep[k]], np.float64).reshape(4, 2), str(texts[k])) for k in ok]


def quartiles(values: list[float]) -> list[float] | None:
    return [round(float(x), 3) for x in np.percentile(values, [25, 50, 75])] if values else None


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    labels, files = tune_images(args.cache)
    ocr = OCR(DEFAULTS.text.max_side, 2, "text")
    rng = random.Random(args.seed)
    fonts = family_fonts("tune")
    rows = []
    t0 = time.time()
    for f in files:
        cat = labels[f.stem]["category"]
        if cat not in CLEAN:
            continue
        rgb, _ = load_rgb(f.read_bytes(), max_side=DEFAULTS.text.max_side)
        for box, text in read_boxes(ocr, rgb):
            ft = box_features(rgb, box)
            if ft:
                rows.append({"set": "scene", "id": f.stem, "text": text, **ft})
        if cat == "person_clear":
            im, drawn = caption(Image.fromarray(rgb), rng, fonts)
            cap = np.asarray(im)
            words = {w.lower() for w in drawn.split() if len(w) >= 3}
            for box, text in read_boxes(ocr, cap):
                if words & {w.lower().strip(".,!%") for w in text.split()}:  # a box of the caption, not the scene
                    ft = box_features(cap, box)
                    if ft:
                        rows.append({"set": "caption", "id": f.stem, "text": text, **ft})
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load": os.getloadavg(),
           "seconds": round(time.time() - t0, 1), "seed": args.seed,
           "boxes": {s: sum(r["set"] == s for r in rows) for s in ("caption", "scene")},
           "scene_images": len({r["id"] for r in rows if r["set"] == "scene"}), "features": {}}
    for k in ("flat", "band", "tilt"):
        cap = [r[k] for r in rows if r["set"] == "caption"]
        sc = [r[k] for r in rows if r["set"] == "scene"]
        auc = roc_auc(np.array(cap + sc, np.float64), np.arange(len(cap) + len(sc)) < len(cap))
        out["features"][k] = {"auc_caption_vs_scene": None if auc is None else round(auc, 3),
                              "caption_quartiles": quartiles(cap),
                              "scene_quartiles": quartiles(sc)}
    return report(out, rows, args.rows)


if __name__ == "__main__":
    raise SystemExit(main())
