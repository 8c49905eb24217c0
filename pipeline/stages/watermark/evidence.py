"""Watermark evidence from OCR boxes: pure functions of pixels, boxes and recognised strings.

The watermark stage's `ocr` method (pipeline/stages/watermark/stage.py) reads PP-OCR's detected boxes,
recognises them, and scores five kinds of evidence, each stored in its own column so `select` and
`calibrate` can re-cut:

  watermark_opacity    estimated opacity of the text (median over read boxes): a box's ink and
                       background are split by Otsu; a mark drawn in white (black) at opacity a over
                       background B moves a pixel by a * (255 - B) (a * B), so a = contrast / headroom
  watermark_repeat     the largest group of same or near-same strings (tiling)
  watermark_placement  1 when a small read box sits in a corner band or the bottom-centre band, or a
                       box is centred; 0 otherwise
  watermark_mark_text  1 when a string looks like a mark (©, (c), copyright, a domain or URL, stock,
                       preview, sample, ...), a single word is repeated at least three times (an
                       agency's name), or a string in a corner band holds a year (a copyright line)
  watermark_center_word  1 when a large word (at most three words, >= 7 % of the image height) is
                       centred and its estimated opacity is <= 0.6
  watermark_corner_text  with watermark.corner_read: 1 when a string read from the five corner crops
                       (corner_crops: no detected box needed) looks like a mark or names a year; null
                       when the corner crops were not read

watermark_score is a documented formula, a noisy-OR of the evidence (each kind alone can make the
case, weaker kinds need company):

    score = 1 - prod_k (1 - WEIGHTS[k] * e_k)        e_k in [0, 1], from features()

    mark_text   0.9   e = watermark_mark_text
    repeat      0.9   e = min(1, (watermark_repeat - 1) / 3): 4 near-same strings count fully
    center_word 0.85  e = watermark_center_word
    translucent 0.5   e = clip((0.7 - watermark_opacity) / 0.5, 0, 1): opacity 0.2 counts fully
    placement   0.5   e = watermark_placement
    corner_text 0.9   e = watermark_corner_text

So a mark-like string, four repeats or a large translucent centred word alone pass watermark.max_score
= 0.8; three repeats of a translucent string, or translucent text in a corner with a mark-like word,
pass; translucent text in a corner band alone (0.75) does not; scene text (opaque, not repeated, no
mark words) scores near 0. A logistic model fitted on the generated marks was tried first and
learnt "any text is a mark": the shipped photos hold too little scene text to teach it otherwise.
The weights were set by hand and the cut checked on the "tune" family (bench/watermark.py --family
tune prints the sweep); docs/watermark.md's figures are from the "eval" family, which shares no
photo, font, string or seed with it (pipeline/stages/watermark/marks.py).
"""
from __future__ import annotations

import re
import unicodedata
from difflib import SequenceMatcher

import numpy as np

MARK_SIGNS = re.compile(
    r"(©|\(c\)|\b(?:www|https?)\b|[a-z0-9-]{2,}\.(?:com|net|org|io|co|uk|de|fr|info|biz|me|photo|pics|ru|cn)\b)",
    re.IGNORECASE)
YEAR = re.compile(r"\b(?:19[5-9]|20[0-4])\d\b")
# words of marks, matched fuzzily (OCR of a translucent mark misreads a letter or two)
MARK_WORDS = ("copyright", "stock", "preview", "sample", "proof", "watermark", "photography", "rights",
              "reserved", "licensed", "comp")
# the noisy-OR's weight of each kind of evidence (module docstring)
WEIGHTS = {"mark_text": 0.9, "repeat": 0.9, "center_word": 0.85, "translucent": 0.5, "placement": 0.5,
           "corner_text": 0.9}
# corner crops read without a detected box (watermark.corner_read), as fractions of the image: height of
# the band, width of a corner crop (the bottom-centre crop is as wide, centred)
CORNER_BAND, CORNER_WIDTH = 0.08, 0.55


def fold(s: str) -> str:
    """Lower case without accents: OCR reads 'Copýright' as often as 'Copyright'."""
    return "".join(ch for ch in unicodedata.normalize("NFKD", str(s).lower()) if not unicodedata.combining(ch))


def norm(s: str) -> str:
    return "".join(ch for ch in fold(s) if ch.isalnum())


def looks_like_mark(s: str) -> bool:
    """©, (c), a domain or URL, or a word of marks (also inside a longer token: 'istockimage')."""
    if MARK_SIGNS.search(fold(s)):
        return True
    for tok in re.split(r"[^a-z0-9]+", fold(s)):
        for word in MARK_WORDS:
            if len(tok) < len(word) - 1:
                continue
            if word in tok and (len(word) >= 5 or tok == word):
                return True
            if len(word) >= 5 and SequenceMatcher(None, tok[:len(word) + 1], word).ratio() >= 0.8:
                return True
    return False


def near_same(a: str, b: str) -> bool:
    """Same or near-same fragments of one string: equal, one inside the other, or >= 0.7 alike."""
    a, b = norm(a), norm(b)
    if len(a) < 3 or len(b) < 3:
        return False
    if a in b or b in a:
        return True
    return SequenceMatcher(None, a, b).ratio() >= 0.7


def repeat_count(strings: list[str]) -> int:
    """Size of the largest group of near-same strings (1 for a single string, 0 for none)."""
    best = 0
    for i, s in enumerate(strings):
        if len(norm(s)) < 3:
            continue
        best = max(best, 1 + sum(near_same(s, t) for j, t in enumerate(strings) if j != i))
    return best


def box_opacity(gray: np.ndarray, box: np.ndarray) -> float | None:
    """Estimated opacity of the text in a 4x2 box of a grayscale uint8 image (None: too small/flat)."""
    import cv2

    from pipeline.stages.ocr import crop_box

    crop = crop_box(gray, box)
    if crop.size < 64 or min(crop.shape[:2]) < 5:
        return None
    px = crop.reshape(-1).astype(np.uint8)
    t, _ = cv2.threshold(px, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    hi, lo = px[px > t].astype(np.float64), px[px <= t].astype(np.float64)
    if len(hi) < 4 or len(lo) < 4:
        return None
    # ink is the minority class: strokes cover less of a text box than the background between them
    bright_ink = len(hi) < len(lo)
    ink, bg = (hi, lo) if bright_ink else (lo, hi)
    # the ink's far end: thin strokes are mostly anti-aliased edge pixels, which the median would be
    m_ink, m_bg = float(np.percentile(ink, 80 if bright_ink else 20)), float(np.median(bg))
    headroom = (255.0 - m_bg) if bright_ink else m_bg
    if headroom < 24:  # white on white (black on black): no room to see opacity
        return None
    return float(min(1.0, abs(m_ink - m_bg) / headroom))


def placement(box: np.ndarray, h: int, w: int) -> tuple[bool, bool]:
    """(in a corner band or bottom-centre band and small, centred) for a 4x2 box in an h x w image."""
    xs, ys = box[:, 0], box[:, 1]
    bw, bh = float(xs.max() - xs.min()), float(ys.max() - ys.min())
    cx, cy = float(xs.mean()) / w, float(ys.mean()) / h
    small = bh <= 0.08 * h and bw <= 0.6 * w
    band = 0.12
    top, bottom = ys.min() <= band * h, ys.max() >= (1 - band) * h
    left, right = xs.min() <= band * w, xs.max() >= (1 - band) * w
    corner = small and (top or bottom) and (left or right or (bottom and abs(cx - 0.5) < 0.15))
    # centred: the box's centre near the image's, or the box across the image's centre (a box on part of
    # a large centred word, e.g. 'Dreams' of 'Dreamstock', sits off centre)
    centred = (abs(cx - 0.5) < 0.12 and abs(cy - 0.5) < 0.12) or _covers(box, 0.5 * w, 0.5 * h)
    return bool(corner), bool(centred)


def _covers(box: np.ndarray, x: float, y: float) -> bool:
    """The 4x2 box's polygon holds the point (x, y)."""
    import cv2

    return cv2.pointPolygonTest(np.asarray(box, np.float32).reshape(-1, 1, 2), (float(x), float(y)), False) >= 0


def evidence(gray: np.ndarray, boxes: list[np.ndarray], strings: list[str], rec_scores: list[float],
             min_rec_score: float = 0.5) -> dict:
    """The evidence columns (without the score) for one image's read boxes."""
    h, w = gray.shape[:2]
    read = [(b, s) for b, s, r in zip(boxes, strings, rec_scores)
            if r is not None and r >= min_rec_score and len(norm(s)) >= 2]
    texts = [s for _, s in read]
    opac = [o for o in (box_opacity(gray, b) for b, _ in read) if o is not None]
    opacity = float(np.median(opac)) if opac else None
    corner = centred = center_word = False
    for b, s in read:
        c, m = placement(b, h, w)
        corner |= c
        centred |= m
        bh = float(b[:, 1].max() - b[:, 1].min())
        if m and bh >= 0.07 * h and len(str(s).split()) <= 3:
            o = box_opacity(gray, b)
            center_word |= o is not None and o <= 0.6
    # a copyright line whose © the OCR lost still names a year, and sits in a corner band
    dated = any(YEAR.search(s) and placement(b, h, w)[0] for b, s in read)
    rep = repeat_count(texts)
    words = [norm(s) for s in texts if len(norm(s)) >= 4 and " " not in s.strip()]
    agency = rep >= 3 and len(words) >= 3
    return {
        "watermark_opacity": opacity,
        "watermark_repeat": rep,
        "watermark_placement": float(corner or centred),
        "watermark_mark_text": float(any(looks_like_mark(s) for s in texts) or agency or dated),
        "watermark_center_word": float(center_word),
        "watermark_strings": texts,
        "watermark_n_boxes": len(read),
    }


def corner_crops(img: np.ndarray) -> list[np.ndarray]:
    """The five places a corner line sits (top-left, top-right, bottom-left, bottom-right, bottom-centre)
    as crops for the recogniser, read without a detected box: the detector puts no box on many small or
    low-contrast corner lines that the recogniser reads (docs/watermark.md)."""
    h, w = img.shape[:2]
    m, ch, cw = int(0.01 * max(h, w)), max(8, int(CORNER_BAND * h)), max(8, int(CORNER_WIDTH * w))
    top, bottom = img[m // 2:ch + m], img[max(0, h - ch - m):h - m // 2]
    return [top[:, :cw], top[:, w - cw:], bottom[:, :cw], bottom[:, w - cw:], bottom[:, (w - cw) // 2:(w + cw) // 2]]


def corner_text(strings: list[str], rec_scores: list[float], min_rec_score: float = 0.5) -> float:
    """1 when a string read from corner_crops looks like a mark or names a year (a copyright line)."""
    return float(any(r is not None and r >= min_rec_score and (looks_like_mark(s) or YEAR.search(str(s)) is not None)
                     for s, r in zip(strings, rec_scores)))


def features(ev: dict) -> dict[str, float]:
    """Each kind of evidence in [0, 1], from the stored columns (so the score can be recomputed from them)."""
    op = ev.get("watermark_opacity")
    rep = ev.get("watermark_repeat") or 0
    return {
        "mark_text": float(ev.get("watermark_mark_text") or 0.0),
        "repeat": min(1.0, max(rep - 1, 0) / 3.0),
        "center_word": float(ev.get("watermark_center_word") or 0.0),
        "translucent": 0.0 if op is None else min(1.0, max(0.0, (0.7 - float(op)) / 0.5)),
        "placement": float(ev.get("watermark_placement") or 0.0),
        "corner_text": float(ev.get("watermark_corner_text") or 0.0),
    }


def score(ev: dict, weights: dict | None = None) -> float:
    """watermark_score in [0, 1]: the noisy-OR of features(ev); 0 when nothing was read (no box, no
    mark-like corner read)."""
    wts = {**WEIGHTS, **(weights or {})}
    if not ev.get("watermark_n_boxes") and not ev.get("watermark_corner_text"):
        return 0.0
    keep = 1.0
    for k, e in features(ev).items():
        keep *= 1.0 - wts[k] * e
    return float(1.0 - keep)
