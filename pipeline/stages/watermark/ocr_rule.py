"""The watermark stage's `ocr` method: PP-OCR boxes (shared with the text stage) -> evidence -> score.

Per batch: each image is draft-decoded (longer side <= watermark.max_side); its boxes come from the
text stage's `text_det_boxes` when the text stage saw the sample (one detection pass serves both
stages), else from this stage's own detection. The boxes that can be text (det score, size) are
recognised, at most `watermark.max_boxes` per image (boxes in a corner band or centred first, then
largest first; boxes down to `watermark.min_det_score`, below the text stage's 0.5:
pipeline/stages/ocr.py keeps weak boxes for this rule; boxes the text stage read are not read again),
and scored by pipeline/stages/watermark/evidence.py.

With `watermark.recognize: needed` (default) the boxes are read in rounds: each round, every image
still open offers its next ROUND_BOXES unread boxes in that order, one recognition call reads the
offers of the whole batch, and an image closes once its score passes the cut or its boxes are all
read. So an image ends with the score of all its boxes unless it passed the cut earlier; the rows
rejected are then a superset of `recognize: all`'s, and the stored evidence of a row closed early is
that of the boxes read so far (still above the cut: a lower cut re-cuts it the same way; `humanset
calibrate` sweeps above the cut want `recognize: all`). Crops are recognised one at a time at their
own width (REC_MIN_WIDTH, REC_BATCH: no padding to the batch's widest or to 320 px).

With `watermark.corner_read: true` the images still at or below the cut (watermark.max_score) are read
once more, without boxes: the five corner crops (evidence.corner_crops) in one recognition call
across the batch. It finds corner lines the detector puts no box on, at about one detection pass of
cost per image read (docs/watermark.md), so it is off by default.
"""
from __future__ import annotations

import logging

import numpy as np

from catalog.rules import WATERMARK

from pipeline.inputs.images import load_rgb
from pipeline.settings import DEFAULTS
from pipeline.stages.watermark import evidence as wm_evidence
from pipeline.stages.ocr import OCR, crop_box, from_column

log = logging.getLogger(__name__)

COLUMNS = ("watermark_score", "watermark_opacity", "watermark_repeat", "watermark_placement",
           "watermark_mark_text", "watermark_center_word", "watermark_corner_text", "watermark_n_boxes",
           "watermark_strings", "watermark_error")
# recognition one crop at a time at its own width: rapidocr pads every crop of a batch to the batch's
# widest and to at least 320 px (at height 48), and 96 % of the boxes this stage reads are narrower;
# unpadded, the same reads cost ~0.6x (research/notes/watermark.md: This stop, Speed)
REC_MIN_WIDTH, REC_BATCH = 48, 1
ROUND_BOXES = 1  # recognize: needed reads this many more boxes of each image per round (docs/watermark.md)
SHARED = ("text_det_boxes", "text_det_scores", "text_det_strings", "text_det_rec_scores")  # from the text stage


class OcrWatermark:
    def __init__(self, cfg: dict, threads: int):
        self.max_side = int(cfg.get("max_side", DEFAULTS.watermark.max_side))
        self.min_det_score = float(cfg.get("min_det_score", DEFAULTS.watermark.min_det_score))
        self.min_rec_score = float(cfg.get("min_rec_score", DEFAULTS.watermark.min_rec_score))
        self.max_boxes = int(cfg.get("max_boxes", DEFAULTS.watermark.max_boxes))
        self.corner_read = bool(cfg.get("corner_read", DEFAULTS.watermark.corner_read))
        self.recognize = str(cfg.get("recognize", DEFAULTS.watermark.recognize))
        self.round_boxes = ROUND_BOXES
        self.cut = float(WATERMARK.threshold(cfg))
        self.ocr = OCR(self.max_side, threads, "watermark", rec_min_width=REC_MIN_WIDTH, rec_batch=REC_BATCH)
        self.own_detections = 0  # images this stage detected itself (the text stage had not)
        self.corner_reads = 0  # images whose corner crops were read (watermark.corner_read)
        self.boxes_read = 0  # picked boxes whose reads the evidence rests on (the text stage's reads included)

    def _boxes(self, bgr: np.ndarray, scale: float, shared: list):
        """(boxes, det scores, [(string, rec score) or None per box]): the text stage's where it saw the
        sample (its reads reused), else this stage's own detection."""
        boxes, scores, texts, rec = shared
        if boxes is not None:
            n = len(boxes)
            read = [None if t is None or r is None else (t, r) for t, r in zip(texts or [None] * n, rec or [None] * n)]
            return from_column(boxes, scale), list(scores or [1.0] * n), read
        self.own_detections += 1
        boxes, scores, _ = self.ocr.detect(bgr)
        return boxes, scores, [None] * len(boxes)

    def _candidates(self, boxes, scores, h: int, w: int) -> list[int]:
        """Boxes worth reading: confident, at least 6 px high, not a texture box over half the image."""
        import cv2

        keep = []
        for k, (b, s) in enumerate(zip(boxes, scores)):
            bw, bh = float(np.ptp(b[:, 0])), float(np.ptp(b[:, 1]))
            # the polygon's own area: a large word at 25 degrees spans more than half the image's bounding box
            area = abs(float(cv2.contourArea(np.asarray(b, np.float32).reshape(-1, 2))))
            if s is not None and s >= self.min_det_score and min(bw, bh) >= 6 and area <= 0.5 * h * w:
                keep.append(k)
        # where marks sit (corner bands, the centre) first, then largest first: a photographer's small
        # corner line must not lose its place to a bus's large ads
        keep.sort(key=lambda k: (not any(wm_evidence.placement(boxes[k], h, w)),
                                 -float(np.ptp(boxes[k][:, 0]) * np.ptp(boxes[k][:, 1]))))
        return keep[: self.max_boxes]

    def measure(self, batch: dict[str, list]) -> dict[str, list]:
        import cv2

        n = len(batch["image"])
        out: dict[str, list] = {c: [None] * n for c in COLUMNS}
        shared = [batch.get(c) or [None] * n for c in SHARED]
        todo: dict[int, dict] = {}  # row -> its gray image, BGR, picked boxes, (string, rec score) or None per box
        pixels: dict[int, object] = {}  # row -> decoded BGR (or its bytes, not decoded yet): corner_read
        for i, data in enumerate(batch["image"]):
            if shared[0][i] is not None and len(shared[0][i]) == 0:  # the text stage saw no text: nothing to decode
                ev = wm_evidence.evidence(np.zeros((1, 1), np.uint8), [], [], [])
                for c in COLUMNS[1:-1]:
                    out[c][i] = ev.get(c)
                out["watermark_score"][i] = 0.0
                if self.corner_read:
                    pixels[i] = data
                continue
            try:
                rgb, scale = load_rgb(data, max_side=self.max_side)
            except Exception as e:
                out["watermark_error"][i] = f"decode: {e}"
                continue
            bgr = np.ascontiguousarray(rgb[..., ::-1])
            pixels[i] = bgr
            try:
                boxes, scores, read = self._boxes(bgr, scale, [col[i] for col in shared])
            except Exception as e:
                out["watermark_error"][i] = f"inference: {e}"
                continue
            h, w = rgb.shape[:2]
            ks = self._candidates(boxes, scores, h, w)
            todo[i] = {"gray": cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY), "bgr": bgr, "boxes": [boxes[k] for k in ks],
                       "texts": [read[k] for k in ks]}  # the text stage's reads are reused, not read again
        # reading in rounds (recognize: needed): each image offers its next unread boxes in priority order, one
        # recognition call reads the offers of all images, and an image stops once its score passes the cut
        # (reading more can only matter for the rows at or below it); recognize: all reads every box at once
        per_round = self.max_boxes if self.recognize == "all" else self.round_boxes
        while todo:
            offers = []  # (row, index among its picked boxes)
            for i, t in todo.items():
                offers += [(i, j) for j, x in enumerate(t["texts"]) if x is None][:per_round]
            self._read(todo, offers, out)
            for i in list(todo):
                t = todo[i]
                if out["watermark_error"][i] is not None:
                    del todo[i]
                    continue
                known = [j for j, x in enumerate(t["texts"]) if x is not None]
                ev = wm_evidence.evidence(t["gray"], [t["boxes"][j] for j in known], [t["texts"][j][0] for j in known],
                                          [t["texts"][j][1] for j in known], self.min_rec_score)
                sc = wm_evidence.score(ev)
                if len(known) == len(t["texts"]) or sc > self.cut:
                    for c in COLUMNS[1:-1]:
                        out[c][i] = ev.get(c)
                    out["watermark_score"][i] = sc
                    self.boxes_read += len(known)
                    del todo[i]
        if self.corner_read:
            self._read_corners(out, pixels)
        return out

    def _read(self, todo: dict[int, dict], offers: list[tuple[int, int]], out: dict[str, list]) -> None:
        """Recognise the offered boxes in one call across the batch; a crop that breaks recognition costs only
        its own image (the call is retried image by image)."""
        if not offers:
            return
        crops = [crop_box(todo[i]["bgr"], todo[i]["boxes"][j]) for i, j in offers]
        try:
            got = list(zip(*self.ocr.recognize(crops)))
            if len(got) != len(crops):
                raise RuntimeError(f"recognition returned {len(got)} results for {len(crops)} crops")
            for (i, j), g in zip(offers, got):
                todo[i]["texts"][j] = g
            return
        except Exception as e:
            log.warning("watermark: recognition of %d crops failed (%s); retrying image by image", len(crops), e)
        for i in dict.fromkeys(i for i, _ in offers):
            mine = [(o, c) for o, c in zip(offers, crops) if o[0] == i]
            try:
                got = list(zip(*self.ocr.recognize([c for _, c in mine])))
                if len(got) != len(mine):
                    raise RuntimeError("recognition returned too few results")
                for ((_, j), _), g in zip(mine, got):
                    todo[i]["texts"][j] = g
            except Exception as e1:
                out["watermark_error"][i] = f"inference: {e1}"

    def _read_corners(self, out: dict[str, list], pixels: dict[int, object]) -> None:
        """watermark_corner_text for the rows still at or below the cut: their five corner crops, read
        in one recognition call, then the score again with that evidence."""
        rows, crops = [], []
        for i, px in pixels.items():
            if out["watermark_error"][i] is not None or (out["watermark_score"][i] or 0.0) > self.cut:
                continue  # already rejected: reading more cannot change the verdict
            if isinstance(px, (bytes, bytearray, memoryview)):
                try:
                    rgb, _ = load_rgb(px, max_side=self.max_side)
                except Exception as e:
                    out["watermark_error"][i] = f"decode: {e}"
                    continue
                px = np.ascontiguousarray(rgb[..., ::-1])
            mine = wm_evidence.corner_crops(px)
            rows.append((i, len(crops), len(crops) + len(mine)))
            crops += mine
        if not rows:
            return
        try:
            strings, scores = self.ocr.recognize(crops)
        except Exception as e:
            log.warning("watermark: corner reads of %d images failed (%s); left null", len(rows), e)
            return
        self.corner_reads += len(rows)
        for i, a, b in rows:
            got = [(t, r) for t, r in zip(strings[a:b], scores[a:b]) if r >= self.min_rec_score and len(wm_evidence.norm(t)) >= 2]
            out["watermark_corner_text"][i] = wm_evidence.corner_text([t for t, _ in got], [r for _, r in got],
                                                                      self.min_rec_score)
            out["watermark_strings"][i] = list(out["watermark_strings"][i] or []) + [t for t, _ in got]
            ev = {c: out[c][i] for c in COLUMNS[1:-1]}
            out["watermark_score"][i] = wm_evidence.score(ev)
