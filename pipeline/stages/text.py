"""text: how much of the image is covered by readable text (captions, memes, posters, screenshots).

PP-OCR (the ONNX detection and recognition models that ship inside the `rapidocr` package) runs on
a draft-decoded copy whose longer side is at most `text.max_side`. A detected box counts only when
recognition confirms it: confidence >= `text.min_rec_score` and at least `text.min_chars` letters
or digits. That drops the detector's false boxes on texture (on scikit-image's coffee.png it puts
one box over 79% of the image and reads it as "8").

Boxes count from rapidocr's detector score 0.5 (TEXT_BOX_THRESH). Every detected box, confirmed or
not, and the weaker ones kept for the watermark rule (pipeline/stages/ocr.py), is stored with its detector score (text_det_boxes,
text_det_scores, original pixels) and, where it was recognised, its string and recognition score
(text_det_strings, text_det_rec_scores; null where not read): the watermark stage reads them instead
of detecting (and reading) again (pipeline/stages/ocr.py, one detection pass for both stages).

Score: text_area_frac = area of the union of confirmed boxes / image area (independent of the
resize). Reject when text_area_frac > `text.max_area_frac`; see default.yaml for the measurements
behind the default.

Recognition is the expensive half, and most boxes cannot change the verdict. With
`text.recognize: needed` (default) a box is recognised only while it still can:
  - no recognition at all when the union of every detected box covers <= max_area_frac (the
    confirmed area can only be smaller): the stored text_area_frac is that union, an upper bound;
  - boxes are recognised largest first, batched across the images of the batch, and an image
    stops as soon as its confirmed area exceeds max_area_frac (stored: the confirmed area so far,
    a lower bound) or the confirmed area plus every box not yet read can no longer exceed it
    (stored: that union, an upper bound).
So the verdict at max_area_frac is the full computation's (recognition scores can move slightly
with the batch: rapidocr pads the crops of a batch to one width), and the stored value lies on the
same side of max_area_frac as the exact one; text_n_boxes / text_strings list the confirmed boxes among
those read. `humanset calibrate` sweeps of text.max_area_frac far from the configured value want
exact areas: run with `text.recognize: all` (every box recognised, as before).
"""
from __future__ import annotations

import logging

import numpy as np

from catalog.rules import RULES, TEXT_AREA

from pipeline.inputs.images import load_rgb
from pipeline.settings import DEFAULTS
from pipeline.stages.base import Stage
from pipeline.stages.ocr import OCR, TEXT_BOX_THRESH, to_column

log = logging.getLogger(__name__)


def confirmed(texts, scores, min_rec_score: float, min_chars: int) -> list[int]:
    """Indices of recognised boxes that count as text: confident and long enough."""
    keep = []
    for i, (t, s) in enumerate(zip(texts, scores)):
        if s is not None and float(s) >= min_rec_score and sum(ch.isalnum() for ch in str(t)) >= min_chars:
            keep.append(i)
    return keep


def polygon_area(p) -> float:
    import cv2

    return float(abs(cv2.contourArea(np.asarray(p, dtype=np.float32).reshape(-1, 2))))


def union_area_frac(polygons: list[np.ndarray], height: int, width: int) -> float:
    """Fraction of a height x width image covered by the union of polygons (overlaps count once)."""
    if not polygons or height <= 0 or width <= 0:
        return 0.0
    import cv2

    mask = np.zeros((height, width), np.uint8)
    for p in polygons:  # one call per polygon: a single fillPoly call cuts overlaps out (even-odd)
        cv2.fillPoly(mask, [np.round(np.asarray(p, dtype=np.float64)).astype(np.int32).reshape(-1, 2)], 1)
    return float(mask.mean())


class TextStage(Stage):
    name = "text"
    phase = "score"
    reads = ("image",)
    writes = ("text_area_frac", "text_n_boxes", "text_strings", "text_det_boxes", "text_det_scores",
              "text_det_strings", "text_det_rec_scores", "text_error")
    stateful = True
    rules = RULES["text"]
    error_column = "text_error"
    default_batch_size = DEFAULTS.text.batch_size

    def __init__(self, cfg: dict | None = None):
        super().__init__(cfg)
        _ = self.recognize  # a bad value fails when the config is read
        self.ocr = None
        self.rec_calls = self.rec_crops = 0  # recognition calls / crops read (tests, bench)

    @property
    def max_side(self) -> int:
        return int(self.cfg.get("max_side", DEFAULTS.text.max_side))

    def setup(self) -> None:
        self.ocr = OCR(self.max_side, round(self.resources.num_cpus), "text")

    @property
    def recognize(self) -> str:
        r = str(self.cfg.get("recognize", DEFAULTS.text.recognize))
        if r not in ("needed", "all"):
            raise ValueError(f"text.recognize={r!r}: expected 'needed' or 'all'")
        return r

    def _detect(self, bgr: np.ndarray):
        """PP-OCR detection -> (boxes in `bgr` pixels, det scores, crops for recognition)."""
        return self.ocr.detect(bgr)

    def _recognize(self, crops: list[np.ndarray]) -> tuple[list[str], list[float]]:
        """One recognition call over crops of any images (rapidocr batches them by width)."""
        self.rec_calls += 1
        self.rec_crops += len(crops)
        return self.ocr.recognize(crops)

    def measure(self, batch: dict[str, list]) -> dict[str, list]:
        if self.ocr is None:
            self.setup()
        min_rec = float(self.cfg.get("min_rec_score", DEFAULTS.text.min_rec_score))
        min_chars = int(self.cfg.get("min_chars", DEFAULTS.text.min_chars))
        limit = float(TEXT_AREA.threshold(self.cfg))
        needed = self.recognize == "needed"
        n = len(batch["image"])
        out: dict[str, list] = {c: [None] * n for c in self.writes}
        todo: dict[int, dict] = {}  # image -> its boxes, crops, what is read and confirmed so far
        index: dict[int, list[int]] = {}  # image -> position in text_det_* of each box it counts
        for i, data in enumerate(batch["image"]):
            try:
                rgb, scale = load_rgb(data, max_side=self.max_side)
            except Exception as e:
                out["text_error"][i] = f"decode: {e}"
                continue
            try:
                boxes, det_scores, crops = self._detect(np.ascontiguousarray(rgb[..., ::-1]))  # BGR
            except Exception as e:
                out["text_error"][i] = f"inference: {e}"
                continue
            h, w = rgb.shape[:2]
            out["text_area_frac"][i], out["text_n_boxes"][i], out["text_strings"][i] = 0.0, 0, []
            out["text_det_boxes"][i], out["text_det_scores"][i] = to_column(boxes, scale), det_scores
            out["text_det_strings"][i], out["text_det_rec_scores"][i] = [None] * len(boxes), [None] * len(boxes)
            # every box is stored (the watermark rule reads the weak ones); text counts rapidocr's own
            strong = [k for k, sc in enumerate(det_scores) if sc >= TEXT_BOX_THRESH]
            index[i] = strong
            boxes, crops = [boxes[k] for k in strong], [crops[k] for k in strong]
            if not boxes:
                continue
            if needed:
                upper = union_area_frac(boxes, h, w)
                if upper <= limit:  # even if every box were text, the image passes
                    out["text_area_frac"][i] = upper
                    continue
            areas = [polygon_area(b) / (h * w) for b in boxes]
            todo[i] = {"hw": (h, w), "boxes": boxes, "crops": crops, "left": sorted(
                range(len(boxes)), key=lambda k: -areas[k]), "areas": areas, "keep": [], "texts": {}}
        while todo:
            # each image offers its largest unread boxes, as many as could push it over the limit
            # (all of them with recognize=all); one recognition call reads the offers of all images
            offers: list[tuple[int, int]] = []
            for i, t in todo.items():
                if not needed:
                    take = list(t["left"])
                else:
                    have = union_area_frac([t["boxes"][k] for k in t["keep"]], *t["hw"])
                    take = []
                    for k in t["left"]:
                        take.append(k)
                        have += t["areas"][k]
                        if have > limit:
                            break
                t["left"] = [k for k in t["left"] if k not in take]
                offers += [(i, k) for k in take]
            read: dict[tuple[int, int], tuple[str, float]] = {}
            try:
                texts, scores = self._recognize([todo[i]["crops"][k] for i, k in offers])
                read = dict(zip(offers, zip(texts, scores)))
            except Exception as e:  # a crop that breaks recognition costs only its own image
                log.warning("text: recognition of %d crops failed (%s); retrying image by image", len(offers), e)
                for i in dict.fromkeys(i for i, _ in offers):
                    mine = [(j, k) for j, k in offers if j == i]
                    try:
                        texts, scores = self._recognize([todo[i]["crops"][k] for _, k in mine])
                        read.update(zip(mine, zip(texts, scores)))
                    except Exception as e1:
                        out["text_error"][i] = f"inference: {e1}"
                        for c in self.writes[:-1]:
                            out[c][i] = None
            for (i, k), (tx, sc) in read.items():
                todo[i]["texts"][k] = str(tx)
                out["text_det_strings"][i][index[i][k]] = str(tx)
                out["text_det_rec_scores"][i][index[i][k]] = float(sc)
                if confirmed([tx], [sc], min_rec, min_chars):
                    todo[i]["keep"].append(k)
            for i in list(dict.fromkeys(i for i, _ in offers)):
                t = todo[i]
                if out["text_error"][i] is not None:
                    del todo[i]
                    continue
                keep = sorted(t["keep"])
                frac = union_area_frac([t["boxes"][k] for k in keep], *t["hw"])
                done = not t["left"] or (needed and frac > limit)
                if not done and needed:
                    upper = union_area_frac([t["boxes"][k] for k in keep + t["left"]], *t["hw"])
                    if upper <= limit:  # the unread boxes can no longer change the verdict
                        frac, done = upper, True
                if done:
                    out["text_area_frac"][i] = frac
                    out["text_n_boxes"][i] = len(keep)
                    out["text_strings"][i] = [t["texts"][k] for k in keep]
                    del todo[i]
        return out
