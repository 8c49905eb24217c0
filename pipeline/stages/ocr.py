"""PP-OCR as the text and watermark stages run it: the ONNX detector and recogniser shipped in `rapidocr`.

One detection pass serves both stages: the text stage stores every detected box in the catalog
(`text_det_boxes`, `text_det_scores`, in original pixels) and the watermark stage reads them back
instead of detecting again; it detects itself only where the text stage did not see the sample.
Boxes are 4-point polygons, flattened to 8 floats (x0, y0, ..., x3, y3).

The detector keeps boxes down to a box score of WEAK_BOX_THRESH (rapidocr's default is 0.5): the
same binarised map and contours, so the boxes scoring >= TEXT_BOX_THRESH are exactly rapidocr's
default output, and the text stage counts only those; the weaker ones (0.3-0.5: translucent or
low-contrast marks) are stored for the watermark rule. Measured on the tune family (docs/watermark.md):
marks at opacity >= 0.2 with a box on them 0.60 -> 0.66, at no extra network cost.
"""
from __future__ import annotations

import logging

import numpy as np

from pipeline.stages import rapidocr_compat as rc

log = logging.getLogger(__name__)

TEXT_BOX_THRESH = 0.5  # rapidocr's Det.box_thresh: the boxes the text stage counts
WEAK_BOX_THRESH = 0.3  # boxes kept (and stored) for the watermark rule
# rapidocr's recogniser input: crops resized to height 48, padded to >= 320 px, in batches of 6
REC_HEIGHT, REC_MIN_WIDTH, REC_BATCH = 48, 320, 6


class OCR:
    """A loaded PP-OCR detector + recogniser; counts its calls (tests and bench read them)."""

    def __init__(self, max_side: int, threads: int, who: str, rec_min_width: int = REC_MIN_WIDTH,
                 rec_batch: int = REC_BATCH):
        try:
            from rapidocr import RapidOCR
        except ImportError as e:
            raise RuntimeError(f"the {who} stage needs the 'rapidocr' and 'onnxruntime' packages "
                               "(pip install rapidocr onnxruntime)") from e
        self.max_side = int(max_side)
        params = {
            "Global.use_cls": False,        # 180-degree text still detects; area is what we need
            "Global.log_level": "error",    # "detection result is empty" is the normal case here
            "Global.max_side_len": self.max_side,
            "Det.limit_type": "max",        # never upscale: the input size stays bounded
            "Det.limit_side_len": self.max_side,
            "Det.box_thresh": WEAK_BOX_THRESH,  # see the module docstring
            # onnxruntime would otherwise start one thread per core on every actor of the pool
            "EngineConfig.onnxruntime.intra_op_num_threads": max(1, int(threads)),
            "EngineConfig.onnxruntime.inter_op_num_threads": 1,
            "EngineConfig.onnxruntime.enable_cpu_mem_arena": True,  # reuse buffers between images
            # recognition resizes crops to a height of 48 and pads every crop of a batch (rec_batch crops, sorted
            # by width) to the batch's widest, and at least to rec_min_width
            "Rec.rec_img_shape": [3, REC_HEIGHT, int(rec_min_width)],
            "Rec.rec_batch_num": max(1, int(rec_batch)),
        }
        try:
            self.engine = RapidOCR(params=params)
            self.engine(np.zeros((64, 64, 3), np.uint8))  # loads det (rec loads on first text)
        except Exception as e:
            raise RuntimeError(f"{who}: rapidocr could not load its shipped PP-OCR models ({e}); "
                               f"reinstall rapidocr") from e
        self.det_calls = self.rec_calls = self.rec_crops = 0
        log.info("%s: PP-OCR (rapidocr) det+rec, max side %d px, %d thread(s)", who, self.max_side, threads)

    def det_input(self, bgr: np.ndarray):
        """rapidocr's steps up to the detector -> (the loaded image, the resized one, its op record, the
        detector's input tensor, None where rapidocr finds nothing to detect)."""
        ocr = self.engine
        ori = ocr.load_img(bgr)
        img, op = ocr.preprocess_img(ori)
        if ocr.cfg.Global.use_vertical_padding:
            img, op = rc.apply_vertical_padding(img, op, ocr.width_height_ratio, ocr.min_height)
        else:
            op["padding_1"] = {"top": 0, "left": 0}
        return ori, img, op, rc.det_model(ocr).get_preprocess()(img)

    def detect(self, bgr: np.ndarray) -> tuple[list[np.ndarray], list[float], list[np.ndarray]]:
        """PP-OCR detection as rapidocr runs it -> (4x2 boxes in `bgr` pixels, det scores, crops for
        recognition). The scores stay aligned with the boxes (rapidocr's own sort reorders boxes only)."""
        self.det_calls += 1
        ocr = self.engine
        ori, img, op, pre = self.det_input(bgr)
        if pre is None:
            return [], [], []
        det = rc.det_model(ocr)
        boxes, scores = det.postprocess_op(det.session(pre), img.shape[:2])
        if boxes is None or len(boxes) == 0:
            return [], [], []
        boxes = np.asarray(boxes, dtype=np.float32)
        # rapidocr's reading order (lines top to bottom, left to right), the scores carried along
        order = [int(np.all(boxes == b, axis=(1, 2)).argmax()) for b in det.sorted_boxes(boxes.copy())]
        boxes = boxes[order]
        scores = [float(scores[k]) for k in order]
        crops = ocr.crop_text_regions(img, boxes)
        mapped = rc.map_boxes_to_original(boxes, op, *ori.shape[:2])
        return [np.asarray(b, np.float32).reshape(4, 2) for b in mapped], scores, crops

    def recognize(self, crops: list[np.ndarray]) -> tuple[list[str], list[float]]:
        """One recognition call over crops of any images (rapidocr batches them by width)."""
        self.rec_calls += 1
        self.rec_crops += len(crops)
        if not crops:
            return [], []
        res = rc.rec_model(self.engine)(rc.rec_input(crops))
        return [str(t) for t in res.txts], [float(x) for x in res.scores]


def crop_box(bgr: np.ndarray, box: np.ndarray) -> np.ndarray:
    """The perspective-rectified crop of a 4-point box, as rapidocr crops for recognition."""
    return rc.rotate_crop(bgr, np.asarray(box, np.float32).reshape(4, 2))


def to_column(boxes: list[np.ndarray], scale: float) -> list[list[float]]:
    """Boxes in decoded pixels -> flat 8-float polygons in original pixels (scale = decoded / original)."""
    return [[float(v) / scale for v in np.asarray(b, np.float64).reshape(-1)] for b in boxes]


def from_column(polys, scale: float) -> list[np.ndarray]:
    """Stored polygons (original pixels) -> 4x2 float32 boxes in pixels of an image decoded at `scale`."""
    return [np.asarray(p, np.float32).reshape(4, 2) * np.float32(scale) for p in (polys or [])]
