"""The person stage's second look: which box it reads, its crop, and the shipped MoveNet Thunder on real photos."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import pytest

import catalog
from pipeline.inputs.images import ImageError, load_rgb, probe
from pipeline.config import default_config
from pipeline.stages import person as person_module
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


def _bench_fuzz():
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_fuzz", Path(__file__).resolve().parents[3] / "bench/fuzz.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_160_mutants_of_real_people_through_the_look_never_raise():
    """bench/fuzz.py --look: damaged copies of three real photos of people, where no box passes, so every copy that
    still decodes with a box over 300 px is read by MoveNet. Each ends with a decode error or a whole row."""
    r = _bench_fuzz().run_look(160, seed=0)
    assert r["aborts"] == 0 and r["bad_rows"] == 0, r["examples"]
    assert sum(r["outcomes"].values()) == 160
    assert r["outcomes"].get("look", 0) >= 40, r["outcomes"]  # the corpus reaches the look, not only the decoder
    assert any(k.startswith("decode: ") for k in r["outcomes"]), r["outcomes"]


def test_a_failed_second_decode_is_that_sample_s_error_and_the_batch_goes_on(monkeypatch):
    """The look decodes the image again at 1024 px; where that fails (injected here for one of three photos), the
    sample gets person_error "second look: ..." and the reason `error`, and the other two are read as usual."""
    fuzz = _bench_fuzz()
    seeds = fuzz.look_seeds()
    images = [seeds["jpeg_bus"], seeds["jpeg_zidane"], seeds["png_camera"]]
    real = person_module.load_rgb

    def second_decode_fails_for_zidane(data, max_side=None, max_pixels=None):
        if data is images[1] and max_side == person_module.DECODE_PX:
            raise ImageError("truncated or corrupt pixel data: injected")
        return real(data, max_side=max_side, max_pixels=max_pixels)

    monkeypatch.setattr(person_module, "load_rgb", second_decode_fails_for_zidane)
    stage = PersonStage(default_config()["person"] | {"min_score": 0.9999})
    stage.setup()
    batch = {"sample_id": ["a", "b", "c"], "image": images}
    for c in ("width", "height", "exif_orientation", "format"):
        batch[c] = [probe(d)[c] for d in images]
    out = stage.measure(batch)
    assert out["person_error"][1].startswith("second look: truncated or corrupt pixel data")
    assert out["person_look_box"][1] is None and out["person_boxes"][1]  # the first pass's boxes are kept
    assert [out["person_error"][i] for i in (0, 2)] == [None, None]
    assert all(out["person_look_score"][i] > 0.3 for i in (0, 2))
    table = catalog.conform([{k: v[i] for k, v in out.items()} for i in range(3)], catalog.SAMPLES)
    reasons = stage.reject(table)
    assert reasons[1] == "error" and reasons[0] is not None and reasons[2] is not None  # 0.9999: no box passes
