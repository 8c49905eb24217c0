"""Metrics on inputs whose answers are known."""
import math

import numpy as np
import pytest

from training.tasks.metrics import (angular_errors, confusion, depth_scores, interpolated_ap, normal_scores, oks,
                                    pose_ap, seg_scores)


def test_oks_by_hand():
    gt = np.array([[10.0, 10.0, 2.0], [50.0, 50.0, 0.0]])  # the second keypoint is unlabelled
    pred = np.array([[13.0, 14.0], [0.0, 0.0]])
    # e = d^2 / (2 * area * (2 sigma)^2) = 25 / (2 * 100 * 0.04)
    assert oks(gt, pred, 100.0, np.array([0.1, 0.1])) == pytest.approx(math.exp(-25 / 8))


def one_kpt(x, y):
    return np.array([[x, y, 2.0]])


def test_pose_ap_perfect_and_partial():
    sig = np.array([0.1])
    perfect = [{"gt": [(one_kpt(10, 10), 100.0)], "pred": [(np.array([[10.0, 10.0]]), 0.9)]}]
    assert pose_ap(perfect, sig)["AP"] == pytest.approx(1.0)
    # second image: a prediction with OKS exactly 0.72 -> matched at thresholds 0.50 .. 0.70 (5 of 10)
    d = math.sqrt(-math.log(0.72) * 2 * 100 * 0.04)
    images = perfect + [{"gt": [(one_kpt(20, 20), 100.0)], "pred": [(np.array([[20.0 + d, 20.0]]), 0.8)]}]
    # at the 5 strict thresholds: precision 1 up to recall 0.5, nothing after -> 51 of 101 recall points
    expected = (5 * 1.0 + 5 * 51 / 101) / 10
    result = pose_ap(images, sig)
    assert result["AP"] == pytest.approx(expected)
    assert result["AP50"] == pytest.approx(1.0) and result["AP75"] == pytest.approx(51 / 101)
    # an annotation nobody predicted halves the recall at every threshold
    missed = perfect + [{"gt": [(one_kpt(5, 5), 100.0)], "pred": []}]
    assert pose_ap(missed, sig)["AP"] == pytest.approx(51 / 101)


def test_pose_ap_ranks_by_score():
    sig = np.array([0.1])
    # one annotation, two predictions: the wrong one has the higher score -> precision 1/2 at recall 1
    images = [{"gt": [(one_kpt(10, 10), 100.0)],
               "pred": [(np.array([[80.0, 80.0]]), 0.9), (np.array([[10.0, 10.0]]), 0.5)]}]
    assert pose_ap(images, sig)["AP"] == pytest.approx(0.5)


def test_interpolated_ap_is_monotone_envelope():
    assert interpolated_ap(np.array([0.5, 0.5, 1.0]), np.array([1.0, 0.5, 2 / 3])) == pytest.approx(
        (51 * 1.0 + 50 * 2 / 3) / 101)


def test_segmentation_miou_macc():
    label = np.array([[0, 0, 1, 1, 255]])
    pred = np.array([[0, 1, 1, 1, 2]])  # the last pixel is ignored
    conf = confusion(pred, label, 3)
    assert conf.tolist() == [[1, 1, 0], [0, 2, 0], [0, 0, 0]]
    s = seg_scores(conf)
    assert s["mIoU"] == pytest.approx((1 / 2 + 2 / 3) / 2)  # class 2 never occurs: not averaged
    assert s["mAcc"] == pytest.approx((1 / 2 + 1) / 2)
    assert s["aAcc"] == pytest.approx(3 / 4)


def test_depth_scores_after_scale_and_shift():
    gt = np.array([[1.0, 1.0, 2.0, 2.0]])
    mask = np.ones_like(gt, bool)
    exact = depth_scores(2 * gt + 3, gt, mask)  # any affine copy of the truth is perfect
    assert exact["rmse"] == pytest.approx(0, abs=1e-9) and exact["delta1"] == 1.0
    # a prediction uncorrelated with the truth aligns to its mean 1.5
    s = depth_scores(np.array([[0.0, 1.0, 0.0, 1.0]]), np.array([[1.0, 2.0, 2.0, 1.0]]), mask)
    assert s["rmse"] == pytest.approx(0.5)
    assert s["absrel"] == pytest.approx((0.5 + 0.25 + 0.25 + 0.5) / 4)
    assert s["delta1"] == pytest.approx(0.0)  # ratios 1.5 and 4/3


def test_depth_scores_ignore_background():
    gt = np.array([[1.0, 2.0, 0.0, np.inf]])
    pred = np.array([[1.0, 2.0, 50.0, -9.0]])
    s = depth_scores(pred, gt, np.array([[True, True, True, True]]))
    assert s["rmse"] == pytest.approx(0, abs=1e-9)


def test_normal_angle_statistics():
    angles = np.radians([0, 10, 20, 40, 90])
    gt = np.tile([0.0, 0.0, -1.0], (1, 5, 1))
    pred = np.stack([np.sin(angles), np.zeros(5), -np.cos(angles)], axis=-1)[None] * 3  # unnormalised
    err = angular_errors(pred, gt, np.ones((1, 5), bool))
    assert err == pytest.approx([0, 10, 20, 40, 90], abs=1e-6)
    s = normal_scores(err)
    assert s["mean"] == pytest.approx(32) and s["median"] == pytest.approx(20)
    assert (s["within_11.25"], s["within_22.5"], s["within_30"]) == pytest.approx((40, 60, 60))


def test_pck_by_hand():
    from training.tasks.metrics import pck
    gt = np.array([[[0.0, 0.0, 2], [10.0, 0.0, 2], [5.0, 5.0, 0]]])  # the third keypoint is unlabelled
    pred = np.array([[[0.0, 4.0], [10.0, 12.0], [99.0, 99.0]]])
    # distances 4 and 12 over a box side of 100: within 0.05 one of two, within 0.2 both
    assert pck(pred, gt, np.array([100.0])) == {"PCK@0.05": 0.5, "PCK@0.1": 0.5, "PCK@0.2": 1.0}
    with pytest.raises(ValueError, match="no labelled keypoint"):
        pck(pred, gt * [1, 1, 0], np.array([100.0]))
