"""The calibrated person score: the shipped fit, its monotonicity, the fit itself and the file format."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.select.person_fit import fit_person
from pipeline.stages.person_calibration import (DEFAULT_FILE, FEATURES, Calibration, box_features,
                                                load_calibration)


def _kpts(head: float, body: float = 0.5) -> list[float]:
    """17 COCO keypoints (x, y, conf): the five head ones at `head`, the rest at `body`."""
    return [v for k in range(17) for v in (10.0 * k, 5.0 * k, head if k < 5 else body)]


def test_shipped_calibration_loads_and_says_what_it_was_fitted_on():
    cal = load_calibration(None)
    doc = json.loads(DEFAULT_FILE.read_text())
    assert cal.features == list(FEATURES) and doc["date"] and doc["fitted_on"]["n"] >= 30
    assert "tune" in doc["fitted_on"]["data"] and "yolo11n-pose" in doc["fitted_on"]["weights"]
    assert cal.coef[0] > 0


@pytest.mark.parametrize("side,head,body", [(320, 0.1, 0.1), (320, 0.95, 0.3), (900, 0.5, 0.9), (2000, 0.0, 0.0)])
def test_calibrated_score_is_monotone_in_the_raw_score(side, head, body):
    cal = load_calibration(None)
    box = [0.0, 0.0, side * 0.6, float(side)]
    raw = np.linspace(0.26, 0.999, 60)
    got = [cal.box_scores([box], [float(s)], [_kpts(head, body)])[0] for s in raw]
    assert all(b >= a for a, b in zip(got, got[1:]))
    assert got[-1] > got[0]


def test_shipped_fit_lifts_a_close_up_and_holds_a_faceless_box():
    """The baseline's loss: a close-up at raw 0.88 with the face in view passes 0.9 once calibrated;
    a box with the same raw score but no head keypoints (an apple read as a torso) does not."""
    cal = load_calibration(None)
    box = [0.0, 0.0, 400.0, 560.0]
    face = cal.box_scores([box], [0.88], [_kpts(0.98, 0.4)])[0]
    faceless = cal.box_scores([box], [0.88], [_kpts(0.05, 0.6)])[0]
    assert face > 0.9 > faceless


def test_box_scores_without_keypoints_is_none_and_empty_is_empty():
    cal = load_calibration(None)
    assert cal.box_scores([[0, 0, 10, 400]], [0.9], None) is None
    assert cal.box_scores([], [], []) == []
    assert cal.box_scores(None, None, None) is None
    assert box_features(0.9, [0, 0, 10, 400], None, 300) is None


def test_fit_recovers_the_separation_and_the_file_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    n = 40
    y = np.r_[np.ones(n), np.zeros(n)].astype(int)
    raw = np.r_[rng.uniform(0.75, 0.95, n), rng.uniform(0.5, 0.9, n)]
    head = np.r_[rng.uniform(0.7, 1.0, n), rng.uniform(0.0, 0.4, n)]
    X = np.array([box_features(s, [0, 0, 300, 450], _kpts(h), 300) for s, h in zip(raw, head)])
    cal = fit_person(X, y, {"data": "synthetic"})
    assert cal.coef[2] > 0 and cal.coef[0] >= 0 and cal.l2 is not None
    p = np.array([cal.probability(list(x)) for x in X])
    assert (p[y == 1] > 0.5).mean() > 0.9 and (p[y == 0] > 0.5).mean() < 0.1
    assert 0 <= cal.fitted_on["loo_recall_at_0.9"] <= 1
    path = cal.save(tmp_path / "cal.json")
    back = load_calibration(path)
    assert back.coef == cal.coef and back.fitted_on["data"] == "synthetic"


def test_fit_refuses_too_few_labels():
    X = np.zeros((6, 3))
    with pytest.raises(ValueError, match="at least 5 positive"):
        fit_person(X, np.array([1, 1, 0, 0, 0, 0]), {})


def test_bad_calibration_files_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="person.calibration=.*no such file"):
        load_calibration(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "something else"}')
    with pytest.raises(ValueError, match="not a person calibration"):
        load_calibration(bad)
    doc = json.loads(DEFAULT_FILE.read_text())
    doc["coef"][0] = -1.0
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="raw score's coefficient is negative"):
        load_calibration(bad)
    with pytest.raises(ValueError, match="features"):
        Calibration(coef=[1, 1], intercept=0, mean=[0, 0], scale=[1, 1], features=["a", "b"])


# --- the second look's fit ---------------------------------------------------------------------------------------
def test_shipped_look_fit_is_monotone_and_only_raises_the_box_it_read():
    cal = load_calibration(None)
    assert cal.look is not None and min(cal.look["coef"]) > 0 and "tune" in cal.look["fitted_on"]["data"]
    grid = np.linspace(0.01, 0.99, 25)
    for c in (0.05, 0.5, 0.85):  # rises with the pose score ...
        got = [cal.look_probability(c, float(p)) for p in grid]
        assert all(b > a for a, b in zip(got, got[1:]))
    for p in (0.1, 0.4):  # ... and with the calibrated score
        got = [cal.look_probability(float(c), p) for c in grid]
        assert all(b > a for a, b in zip(got, got[1:]))
    boxes, scores, kpts = [[0, 0, 200, 400], [0, 0, 100, 350]], [0.6, 0.5], [_kpts(0.1), _kpts(0.1)]
    base = cal.box_scores(boxes, scores, kpts)
    looked = cal.box_scores(boxes, scores, kpts, (1, 0.6))
    assert looked[0] == base[0] and looked[1] == max(base[1], cal.look_probability(base[1], 0.6)) > base[1]
    assert cal.box_scores(boxes, scores, kpts, (1, 0.01))[1] < 0.01  # a faceless box with no pose stays out
    assert cal.box_scores(boxes, scores, kpts, (5, 0.9)) == base  # an index past the boxes reads nothing
    assert cal.box_scores(boxes, scores, kpts, (None, None)) == base  # a row no look ran on
    no_look = Calibration(**{k: v for k, v in json.loads(DEFAULT_FILE.read_text()).items() if k != "look"})
    assert no_look.box_scores(boxes, scores, kpts, (1, 0.99)) == base  # a fit without look ignores one


@pytest.mark.parametrize("look,match", [
    ({"coef": [0.4, -1.0], "intercept": 2.0}, "negative"),
    ({"coef": [0.4], "intercept": 2.0}, "two finite"),
    ({"coef": [0.4, 1.0]}, "intercept"),
    ({"coef": [0.4, float("nan")], "intercept": 2.0}, "finite"),
    ({"features": ["pose_logit"], "coef": [1.0, 1.0], "intercept": 0.0}, "features"),
    ([0.4, 1.0], "mapping"),
])
def test_a_bad_look_fit_is_refused_naming_the_problem(tmp_path, look, match):
    doc = json.loads(DEFAULT_FILE.read_text()) | {"look": look}
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=match):
        load_calibration(path)
