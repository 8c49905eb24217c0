"""text: how much of the image is covered by readable text (captions, memes, posters, screenshots).

PP-OCR (the ONNX detection and recognition models that ship inside the `rapidocr` package) runs on
a draft-decoded copy whose longer side is at most `text.max_side`. A detected box counts only when
recognition confirms it: confidence >= `text.min_rec_score` and at least `text.min_chars` letters
or digits. That drops the detector's false boxes on texture (on scikit-image's coffee.png it puts
one box over 79% of the image and reads it as "8").

Score: text_area_frac = area of the union of confirmed boxes / image area (independent of the
resize). Reject when text_area_frac > `text.max_area_frac`; see default.yaml for the measurements
behind the default.
"""
from __future__ import annotations

import logging

import numpy as np

from catalog.rules import RULES

from ..imageio import load_rgb
from .base import Stage

log = logging.getLogger(__name__)


def confirmed(texts, scores, min_rec_score: float, min_chars: int) -> list[int]:
    """Indices of recognised boxes that count as text: confident and long enough."""
    keep = []
    for i, (t, s) in enumerate(zip(texts, scores)):
        if s is not None and float(s) >= min_rec_score and sum(ch.isalnum() for ch in str(t)) >= min_chars:
            keep.append(i)
    return keep


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
    writes = ("text_area_frac", "text_n_boxes", "text_strings", "text_error")
    stateful = True
    rules = RULES["text"]
    error_column = "text_error"
    default_batch_size = 8

    def __init__(self, cfg: dict | None = None):
        super().__init__(cfg)
        self.ocr = None

    @property
    def max_side(self) -> int:
        return int(self.cfg.get("max_side", 960))

    def setup(self) -> None:
        try:
            from rapidocr import RapidOCR
        except ImportError as e:
            raise RuntimeError("the text stage needs the 'rapidocr' and 'onnxruntime' packages "
                               "(pip install rapidocr onnxruntime)") from e
        # onnxruntime would otherwise start one thread per core on every actor of the pool
        threads = max(1, int(round(self.resources.num_cpus)))
        params = {
            "Global.use_cls": False,        # 180-degree text still detects; area is what we need
            "Global.log_level": "error",    # "detection result is empty" is the normal case here
            "Global.max_side_len": self.max_side,
            "Det.limit_type": "max",        # never upscale: the input size stays bounded
            "Det.limit_side_len": self.max_side,
            "EngineConfig.onnxruntime.intra_op_num_threads": threads,
            "EngineConfig.onnxruntime.inter_op_num_threads": 1,
        }
        try:
            self.ocr = RapidOCR(params=params)
            self.ocr(np.zeros((64, 64, 3), np.uint8))  # loads det (rec loads on first text)
        except Exception as e:
            raise RuntimeError(f"text: rapidocr could not load its shipped PP-OCR models ({e}); "
                               f"reinstall rapidocr") from e
        log.info("text: PP-OCR (rapidocr) det+rec, max side %d px, %d thread(s)", self.max_side, threads)

    def measure(self, batch: dict[str, list]) -> dict[str, list]:
        if self.ocr is None:
            self.setup()
        min_rec = float(self.cfg.get("min_rec_score", 0.7))
        min_chars = int(self.cfg.get("min_chars", 3))
        n = len(batch["image"])
        out: dict[str, list] = {c: [None] * n for c in self.writes}
        for i, data in enumerate(batch["image"]):
            try:
                rgb, _ = load_rgb(data, max_side=self.max_side)
            except Exception as e:
                out["text_error"][i] = f"decode: {e}"
                continue
            try:
                res = self.ocr(np.ascontiguousarray(rgb[..., ::-1]))  # rapidocr takes BGR arrays
            except Exception as e:
                out["text_error"][i] = f"inference: {e}"
                continue
            boxes = getattr(res, "boxes", None)
            texts = getattr(res, "txts", None)
            scores = getattr(res, "scores", None)
            if boxes is None or texts is None or len(texts) == 0:
                keep, boxes, texts = [], [], []
            else:
                keep = confirmed(texts, scores, min_rec, min_chars)
            out["text_area_frac"][i] = union_area_frac([boxes[k] for k in keep], *rgb.shape[:2])
            out["text_n_boxes"][i] = len(keep)
            out["text_strings"][i] = [str(texts[k]) for k in keep]
        return out
