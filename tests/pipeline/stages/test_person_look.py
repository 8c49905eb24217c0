"""The person stage's second look: which box it reads, its crop, and the shipped MoveNet Thunder on real photos."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from pipeline.inputs.images import load_rgb
from pipeline.config import default_config
from pipeline.stages.person import PersonStage, candidate, second_look
from pipeline.stages.person_look import MODEL_FILE, PoseLook, region

SKIMAGE = Path(str(resources.files("skimage") / "data"))


def test_candidate_is_the_top_raw_box_over_the_size_rule_when_no_box_passes():
    boxes = [[0, 0, 100, 200], [0, 0, 200, 400], [0, 0, 150, 350]]  # longer sides 200, 400, 350
    raw = [0.95, 0.6, 0.7]
    assert candidate(boxes, raw, [0.5, 0.3, 0.4], 0.9, 300, "longer_side") == 2  # the small box is not looked at
    assert candidate(boxes, raw, [0.95, 0.3, 0.4], 0.9, 300, "longer_side") is None  # a confident small box
    assert candidate(boxes, raw, [0.5, 0.91, 0.4], 0.9, 300, "longer_side") is None  # the image passes
    assert candidate(boxes, raw, [0.5, 0.3, 0.4], 0.9, 500, "longer_side") is None  # no box over the rule
    assert candidate(boxes, raw, [0.5, 0.3, 0.4], 0.9, 300, "shorter_side") is None
    assert candidate([], [], [], 0.9, 300, "longer_side") is None
    assert candidate(boxes, raw, None, 0.9, 300, "longer_side") is None  # not measured
    assert candidate(boxes, [0.95, 0.7, 0.7], [0.5, 0.3, 0.4], 0.9, 300, "longer_side") == 1  # ties: the first


def test_region_is_a_square_around_the_box_zero_outside_the_image():
    rgb = np.full((100, 200, 3), 200, np.uint8)
    out = region(rgb, [150, 20, 250, 60], 1.0, side=64)  # 100 x 40 box, partly right of the image
    assert out.shape == (64, 64, 3) and out.dtype == np.uint8
    # the square is 125 px around x 200, y 40: the image's right half and the rows above y 0 are zero
    assert out[:, -10:].max() == 0 and out[:5].max() == 0 and out[32, 10].min() == 200
    half = region(rgb, [300, 40, 500, 120], 0.5, side=64)  # the same box in pixels twice as large
    assert np.array_equal(half, region(rgb, [150, 20, 250, 60], 1.0, side=64))


def test_shipped_model_reads_a_person_and_not_a_cup():
    look = PoseLook()
    astronaut, s = load_rgb((SKIMAGE / "astronaut.png").read_bytes(), max_side=1024)
    kp = look.keypoints(region(astronaut, [0, 0, astronaut.shape[1], astronaut.shape[0]], 1.0))
    assert kp.shape == (17, 3) and np.all((kp[:, :2] >= 0) & (kp[:, :2] <= 1))
    # her face: nose and eyes confident, in the upper part of the crop, the nose between the eyes
    assert kp[:3, 2].min() > 0.4 and kp[0, 0] < 0.45 and kp[2, 1] < kp[0, 1] < kp[1, 1]
    person = look.score(astronaut, [0, 0, astronaut.shape[1], astronaut.shape[0]], 1.0)
    coffee, _ = load_rgb((SKIMAGE / "coffee.png").read_bytes(), max_side=1024)
    cup = look.score(coffee, [0, 0, coffee.shape[1], coffee.shape[0]], 1.0)
    assert person > 0.3 > 0.1 > cup


def test_a_missing_model_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="person.second_look=none"):
        PoseLook(path=tmp_path / "gone.onnx")
    assert MODEL_FILE.is_file()
    notice = MODEL_FILE.with_suffix(".NOTICE").read_text()  # ships beside it: its licences and what was changed
    assert "Apache License, Version 2.0" in notice and "MIT License" in notice and "float16" in notice


def test_second_look_setting_is_checked_and_old_runs_keep_theirs():
    cfg = default_config()["person"]
    assert second_look(cfg) == "movenet" and second_look({}) == "movenet"
    old = {k: v for k, v in cfg.items() if k != "second_look"}  # a run's full config from before it existed
    assert second_look(old) == "none"
    with pytest.raises(ValueError, match="person.second_look='yes'"):
        PersonStage(cfg | {"second_look": "yes"})
    assert not PersonStage(cfg | {"score": "raw"}).look_on  # the raw cut has no calibrated score to look past
