"""The watermark stage's `ocr` method: PP-OCR boxes (shared with the text stage) -> evidence -> score.

Per batch: each image is draft-decoded (longer side <= watermark.max_side); its boxes come from the
text stage's `text_det_boxes` when the text stage saw the sample (one detection pass serves both
stages), else from this stage's own detection. The boxes that can be text (det score, size) are
recognised in one call across the batch, at most `watermark.max_boxes` per image (largest first),
then scored by pipeline/stages/wm_evidence.py.
"""
from __future__ import annotations

import logging

import numpy as np

from ..images import load_rgb
from . import wm_evidence
from .ocr import OCR, crop_box, from_column

log = logging.getLogger(__name__)

COLUMNS = ("watermark_score", "watermark_opacity", "watermark_repeat", "watermark_placement",
           "watermark_mark_text", "watermark_center_word", "watermark_n_boxes", "watermark_strings",
           "watermark_error")
SHARED = ("text_det_boxes", "text_det_scores")  # what the text stage stores for us


class OcrWatermark:
    def __init__(self, cfg: dict, threads: int):
        self.max_side = int(cfg.get("max_side", 960))
        self.min_det_score = float(cfg.get("min_det_score", 0.5))
        self.min_rec_score = float(cfg.get("min_rec_score", 0.5))
        self.max_boxes = int(cfg.get("max_boxes", 8))
        self.ocr = OCR(self.max_side, threads, "watermark")
        self.own_detections = 0  # images this stage detected itself (the text stage had not)

    def _boxes(self, bgr: np.ndarray, scale: float, shared_boxes, shared_scores):
        if shared_boxes is not None:
            return from_column(shared_boxes, scale), list(shared_scores or [1.0] * len(shared_boxes))
        self.own_detections += 1
        boxes, scores, _ = self.ocr.detect(bgr)
        return boxes, scores

    def _candidates(self, boxes, scores, h: int, w: int) -> list[int]:
        """Boxes worth reading: confident, at least 6 px high, not a texture box over half the image."""
        keep = []
        for k, (b, s) in enumerate(zip(boxes, scores)):
            bw, bh = float(np.ptp(b[:, 0])), float(np.ptp(b[:, 1]))
            if s is not None and s >= self.min_det_score and min(bw, bh) >= 6 and bw * bh <= 0.5 * h * w:
                keep.append(k)
        keep.sort(key=lambda k: -float(np.ptp(boxes[k][:, 0]) * np.ptp(boxes[k][:, 1])))
        return keep[: self.max_boxes]

    def measure(self, batch: dict[str, list]) -> dict[str, list]:
        import cv2

        n = len(batch["image"])
        out: dict[str, list] = {c: [None] * n for c in COLUMNS}
        shared = [batch.get(c) or [None] * n for c in SHARED]
        images: dict[int, tuple] = {}  # row -> (gray, boxes to read)
        crops: list[np.ndarray] = []
        owner: list[int] = []
        for i, data in enumerate(batch["image"]):
            try:
                rgb, scale = load_rgb(data, max_side=self.max_side)
            except Exception as e:
                out["watermark_error"][i] = f"decode: {e}"
                continue
            bgr = np.ascontiguousarray(rgb[..., ::-1])
            try:
                boxes, scores = self._boxes(bgr, scale, shared[0][i], shared[1][i])
            except Exception as e:
                out["watermark_error"][i] = f"inference: {e}"
                continue
            h, w = rgb.shape[:2]
            picked = [boxes[k] for k in self._candidates(boxes, scores, h, w)]
            gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
            images[i] = (gray, picked)
            for b in picked:
                crops.append(crop_box(bgr, b))
                owner.append(i)
        texts: dict[int, list] = {i: [] for i in images}
        try:
            got = zip(*self.ocr.recognize(crops)) if crops else []
            for i, (t, s) in zip(owner, got):
                texts[i].append((t, s))
        except Exception as e:  # a crop that breaks recognition costs only its own image
            log.warning("watermark: recognition of %d crops failed (%s); retrying image by image", len(crops), e)
            for i in images:
                mine = [c for c, o in zip(crops, owner) if o == i]
                try:
                    texts[i] = list(zip(*self.ocr.recognize(mine))) if mine else []
                except Exception as e1:
                    out["watermark_error"][i] = f"inference: {e1}"
        for i, (gray, picked) in images.items():
            if out["watermark_error"][i] is not None:
                continue
            strings = [t for t, _ in texts[i]]
            ev = wm_evidence.evidence(gray, picked, strings, [s for _, s in texts[i]], self.min_rec_score)
            for c in COLUMNS[1:-1]:
                out[c][i] = ev[c]
            out["watermark_score"][i] = wm_evidence.score(ev)
        return out
