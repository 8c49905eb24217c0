"""The calibrated person score: P(a clearly visible person) from the evidence the person stage stores.

The raw detector score of a small pose model is low on the people a human-centric dataset wants
most: close-ups and group photos cut by the frame, where few of the body's keypoints are in view
(yolo11n-pose scores them 0.77-0.89; the paper's cut is > 0.9 with a much stronger detector). The
stage stores every box with its score and its 17 keypoints, so a small logistic model on per-box
evidence turns the raw score into a calibrated one without running anything again:

    raw_logit   log(s / (1 - s)) of the detector score s (clipped to [1e-4, 1 - 1e-4])
    box_log2    log2(longer box side, judged pixels / box_ref_px), clipped to [-2, 3]
    head_conf   mean confidence of the five head keypoints (COCO nose, eyes, ears)

    calibrated = sigmoid(intercept + sum_j coef_j * (x_j - mean_j) / scale_j)

coef of raw_logit is >= 0 (checked when a file is read or fitted), so the calibrated score never
falls when the raw score rises with the other evidence fixed. The file (JSON) holds the features, the
standardisation, the coefficients, what it was fitted on and the date; the shipped one
(person_calibration.json next to this module) was fitted on the tune split of the real-image quality
bench (docs/quality.md) for yolo11n-pose. `humanset calibrate --fit-person OUT` fits one to a user's
labels (pipeline/select/person_fit.py) and `person.calibration: OUT` points the stage at it.
A detection model without keypoints has no head_conf: person.score=calibrated then needs a pose model.

The second look (person_look.py) adds an optional `look` fit: where no box passes the cut, MoveNet's pose score
of the box it looked at and that box's calibrated score c give

    look = sigmoid(intercept + coef_0 * logit(c) + coef_1 * logit(pose))    (logits clipped as raw_logit's)

and that box's cut score is max(c, look). Both coefficients are >= 0 (checked), so neither score can lower it. The
shipped file's look was fitted on the same tune split. `humanset calibrate --fit-person` fits one too, on the labelled
samples whose box the run's second look read, with c under the new fit; a file without one turns the look off.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from catalog.rules import box_side

FEATURES = ("raw_logit", "box_log2", "head_conf")
HEAD_KEYPOINTS = (0, 1, 2, 3, 4)  # COCO-17: nose, left eye, right eye, left ear, right ear
KIND = "humanset.person_calibration"
LOOK_FEATURES = ("calibrated_logit", "pose_logit")
DEFAULT_FILE = Path(__file__).with_name("person_calibration.json")


def logit(v: float) -> float:
    v = min(max(float(v), 1e-4), 1 - 1e-4)
    return math.log(v / (1 - v))


def box_features(score: float, box, keypoints, box_ref_px: float) -> list[float] | None:
    """FEATURES of one box (xyxy in judged pixels, keypoints flat x,y,conf * 17); None without keypoints."""
    if keypoints is None or len(keypoints) < 3 * (max(HEAD_KEYPOINTS) + 1):
        return None
    side = max(box_side(box), 1e-6)
    head = sum(float(keypoints[3 * k + 2]) for k in HEAD_KEYPOINTS) / len(HEAD_KEYPOINTS)
    return [logit(score), min(max(math.log2(side / box_ref_px), -2.0), 3.0), head]


@dataclass(frozen=True)
class Calibration:
    coef: list[float]
    intercept: float
    mean: list[float]
    scale: list[float]
    box_ref_px: float = 300.0
    features: list[str] = field(default_factory=lambda: list(FEATURES))
    l2: float | None = None
    fitted_on: dict = field(default_factory=dict)
    date: str = ""
    kind: str = KIND
    version: int = 1
    look: dict | None = None  # the second look's fit: coef (LOOK_FEATURES), intercept, fitted_on, date

    def __post_init__(self):
        if list(self.features) != list(FEATURES):
            raise ValueError(f"person calibration: features {self.features} are not this version's {list(FEATURES)}")
        if not (len(self.coef) == len(self.mean) == len(self.scale) == len(FEATURES)):
            raise ValueError(f"person calibration: coef, mean and scale must each hold {len(FEATURES)} numbers")
        if any(not math.isfinite(float(v)) for v in [*self.coef, *self.mean, *self.scale, self.intercept]):
            raise ValueError("person calibration: a coefficient is not a finite number")
        if any(float(s) <= 0 for s in self.scale) or self.box_ref_px <= 0:
            raise ValueError("person calibration: scale and box_ref_px must be positive")
        if float(self.coef[0]) < 0:
            raise ValueError("person calibration: the raw score's coefficient is negative, so a higher raw "
                             "score would lower the calibrated one; refit with more labels")
        if self.look is not None:
            look = self.look
            if not isinstance(look, dict) or list(look.get("features", LOOK_FEATURES)) != list(LOOK_FEATURES):
                raise ValueError(f"person calibration: look must be a mapping with features {list(LOOK_FEATURES)}")
            try:
                values = [float(v) for v in [*look["coef"], look["intercept"]]]
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"person calibration: look needs coef (two numbers) and intercept ({e})") from e
            if len(look["coef"]) != len(LOOK_FEATURES) or not all(math.isfinite(v) for v in values):
                raise ValueError("person calibration: look's coef must be two finite numbers, its intercept finite")
            if min(values[:2]) < 0:
                raise ValueError("person calibration: a coefficient of look is negative, so a higher score would "
                                 "lower the cut score")

    def probability(self, x: list[float]) -> float:
        z = float(self.intercept) + sum(c * (v - m) / s for c, v, m, s in zip(self.coef, x, self.mean, self.scale))
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0

    def look_probability(self, calibrated: float, pose: float) -> float:
        """The second look's P(a clearly visible person) of a box from its calibrated and pose scores."""
        z = float(self.look["intercept"]) + sum(float(c) * logit(v) for c, v in zip(self.look["coef"],
                                                                                   (calibrated, pose)))
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0

    def box_scores(self, boxes, scores, keypoints, look=None) -> list[float] | None:
        """Calibrated score of every box (boxes in judged pixels); None when the row was not measured
        or has no keypoints (a detection model). look: (box index, pose score) of the row's second look, or
        None; with this calibration's look fit, that box's score is max(calibrated, look_probability)."""
        if boxes is None or scores is None:
            return None
        if not scores:
            return []
        if keypoints is None or len(keypoints) != len(scores):
            return None
        out = []
        for b, s, k in zip(boxes, scores, keypoints):
            x = None if b is None else box_features(s, b, k, self.box_ref_px)
            if x is None:
                return None
            out.append(self.probability(x))
        return self.with_look(out, look)

    def with_look(self, scores: list[float], look) -> list[float]:
        """Calibrated box scores with a row's second look: (box index, pose score) or None; with this
        calibration's look fit, that box's score becomes max(calibrated, look_probability)."""
        if look is not None and self.look is not None and look[0] is not None and look[1] is not None:
            j = int(look[0])
            if 0 <= j < len(scores):
                scores = list(scores)
                scores[j] = max(scores[j], self.look_probability(scores[j], float(look[1])))
        return scores

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)
        return path


def load_calibration(path: str | Path | None = None) -> Calibration:
    """A calibration file (None: the shipped one); a clear error naming the file when it is not one."""
    p = DEFAULT_FILE if path in (None, "") else Path(str(path)).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"person.calibration={p}: no such file; write one with "
                                f"`humanset calibrate RUN --labels CSV --fit-person {p}`, or unset it for the shipped fit")
    try:
        doc = json.loads(p.read_text())
    except ValueError as e:
        raise ValueError(f"person.calibration={p}: not JSON ({e})") from e
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ValueError(f"person.calibration={p}: not a person calibration (kind must be {KIND!r})")
    known = set(Calibration.__dataclass_fields__)
    try:
        return Calibration(**{k: v for k, v in doc.items() if k in known})
    except (TypeError, ValueError) as e:
        raise ValueError(f"person.calibration={p}: {e}") from e
