"""The person stage's ONNX Runtime path without torch: the model's facts from its ONNX file, and the
letterbox, non-maximum suppression and rescaling of ultralytics' predictor in numpy and OpenCV.

Importing torch and ultralytics costs a process ~1.3 s of CPU (2 cores, warm cache), paid by every
model actor and local worker at start; the ONNX path needs neither once the weights' export is in the
cache (pipeline/stages/person_model.py). The arithmetic follows ultralytics 8.4's (LetterBox,
utils.nms.non_max_suppression with torchvision's NMS, ops.scale_boxes / scale_coords) in float32,
step for step, so the detections are the same: tests/pipeline/stages/test_person_onnx.py compares
both paths on shipped photos, value for value.
"""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

MAX_WH = 7680  # ultralytics' per-class offset of boxes in class-aware NMS
PAD_VALUE = 114


def model_facts(session) -> dict | None:
    """task, names, stride, kpt_shape from the metadata ultralytics' export writes into the ONNX file;
    None if it lacks them (an export by other means: the stage then reads the .pt)."""
    meta = session.get_modelmeta().custom_metadata_map
    try:
        names = ast.literal_eval(meta["names"])  # a dict literal; literal_eval evaluates no code
        facts = {"task": str(meta["task"]), "names": {int(k): str(v) for k, v in names.items()},
                 "stride": int(meta["stride"])}
        if facts["task"] == "pose":
            facts["kpt_shape"] = tuple(int(v) for v in ast.literal_eval(meta["kpt_shape"]))
        return facts
    except (KeyError, ValueError, SyntaxError, TypeError, AttributeError):
        return None


def has_cuda_driver() -> bool:
    """Whether torch could see a GPU here, without importing torch: no NVIDIA or ROCm driver, no GPU."""
    return Path("/proc/driver/nvidia/version").exists() or Path("/dev/kfd").exists()


def letterbox(image: np.ndarray, size: int, stride: int, auto: bool) -> np.ndarray:
    """ultralytics' LetterBox(size, auto, stride) of an HWC uint8 image: resized (linear) to fit,
    centred, padded with 114 (to a multiple of stride when auto, else to size x size)."""
    import cv2

    h, w = image.shape[:2]
    r = min(size / h, size / w)
    new_w, new_h = max(round(w * r), 1), max(round(h * r), 1)
    dw, dh = size - new_w, size - new_h
    if auto:
        dw, dh = np.mod(dw, stride), np.mod(dh, stride)
    dw, dh = dw / 2, dh / 2
    top, bottom = round(dh - 0.1), round(dh + 0.1)
    left, right = round(dw - 0.1), round(dw + 0.1)
    if (w, h) != (new_w, new_h):
        image = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    return cv2.copyMakeBorder(image, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(PAD_VALUE,) * 3)


def _nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> np.ndarray:
    """Greedy NMS as torchvision's CPU kernel: by descending score, a box suppresses the later ones whose
    IoU with it (float32) exceeds `iou` (compared in double)."""
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    areas = (x2 - x1) * (y2 - y1)
    order = np.argsort(-scores, kind="stable")
    keep = []
    suppressed = np.zeros(len(scores), bool)
    for a, i in enumerate(order):
        if suppressed[i]:
            continue
        keep.append(i)
        rest = order[a + 1:]
        rest = rest[~suppressed[rest]]
        if not len(rest):
            continue
        w = np.maximum(np.float32(0), np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]))
        h = np.maximum(np.float32(0), np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]))
        inter = w * h
        over = inter / (areas[i] + areas[rest] - inter)
        suppressed[rest[over.astype(np.float64) > iou]] = True
    return np.asarray(keep, np.int64)


def non_max_suppression(pred: np.ndarray, conf: float, iou: float, person_class: int, max_det: int,
                        nc: int) -> list[np.ndarray]:
    """ultralytics' non_max_suppression(pred, conf, iou, classes=[person_class], max_det, nc) for a
    (B, 4 + nc + extra, anchors) float32 head output: per image (n, 6 + extra) rows of xyxy, score,
    class, extra (keypoints), by descending score."""
    out = []
    nc = nc or pred.shape[1] - 4
    for p in pred:
        x = np.ascontiguousarray(p.T)  # (anchors, channels)
        x = x[x[:, 4:4 + nc].max(1) > conf]
        if not len(x):
            out.append(np.zeros((0, x.shape[1] + 2 - nc), np.float32))
            continue
        box = np.empty_like(x[:, :4])
        half = x[:, 2:4] / np.float32(2)
        box[:, :2] = x[:, :2] - half
        box[:, 2:] = x[:, :2] + half
        cls = x[:, 4:4 + nc]
        best = cls.max(1)
        j = cls.argmax(1).astype(np.float32)
        rows = np.concatenate([box, best[:, None], j[:, None], x[:, 4 + nc:]], 1)
        rows = rows[best > conf]
        rows = rows[rows[:, 5] == person_class]
        if not len(rows):
            out.append(rows)
            continue
        offset = rows[:, 5:6] * np.float32(MAX_WH)
        keep = _nms(rows[:, :4] + offset, rows[:, 4], iou)[:max_det]
        out.append(rows[keep])
    return out


def _unpad(shape: tuple, orig: tuple) -> tuple[float, float, int, int]:
    """(gain_x, gain_y, pad_x, pad_y) of a letterbox from `orig` (h, w) into `shape` (h, w)."""
    gain = min(shape[0] / orig[0], shape[1] / orig[1])
    new_h, new_w = (max(round(v * gain), 1) for v in orig[:2])
    return (new_w / orig[1], new_h / orig[0], round((shape[1] - new_w) / 2 - 0.1),
            round((shape[0] - new_h) / 2 - 0.1))


def scale_boxes(shape: tuple, boxes: np.ndarray, orig: tuple) -> np.ndarray:
    """xyxy boxes from the letterboxed `shape` back to the image's `orig` (h, w), clipped to it."""
    gain_x, gain_y, pad_x, pad_y = _unpad(shape, orig)
    b = boxes.copy()
    b[:, [0, 2]] -= pad_x
    b[:, [1, 3]] -= pad_y
    b[:, [0, 2]] /= np.float32(gain_x)
    b[:, [1, 3]] /= np.float32(gain_y)
    b[:, [0, 2]] = b[:, [0, 2]].clip(0, orig[1])
    b[:, [1, 3]] = b[:, [1, 3]].clip(0, orig[0])
    return b


def scale_coords(shape: tuple, kpts: np.ndarray, orig: tuple) -> np.ndarray:
    """Keypoints (..., >= 2) from the letterboxed `shape` back to `orig` (h, w), x and y clipped."""
    gain_x, gain_y, pad_x, pad_y = _unpad(shape, orig)
    k = kpts.copy()
    k[..., 0] -= pad_x
    k[..., 1] -= pad_y
    k[..., 0] /= np.float32(gain_x)
    k[..., 1] /= np.float32(gain_y)
    k[..., 0] = k[..., 0].clip(0, orig[1])
    k[..., 1] = k[..., 1].clip(0, orig[0])
    return k
