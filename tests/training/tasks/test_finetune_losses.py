"""The fine-tuning losses against values computed by hand."""
import math

import pytest
import torch

from training.tasks.losses import depth_loss, normal_loss, pose_heatmap_loss, relative_depth, seg_loss


def test_pose_mse_with_target_weights_and_ohkm():
    pred = torch.zeros(1, 2, 2, 2)
    target = torch.zeros(1, 2, 2, 2)
    target[0, 0] = 1.0  # keypoint 0: squared error 1 on every pixel -> 1
    target[0, 1, 0, 0] = 2.0  # keypoint 1: 4 on one of 4 pixels -> 1
    weights = torch.tensor([[1.0, 0.0]])  # keypoint 1 unlabelled
    assert pose_heatmap_loss(pred, target, weights).item() == pytest.approx(0.5)
    assert pose_heatmap_loss(pred, target, torch.tensor([[1.0, 1.0]])).item() == pytest.approx(1.0)
    target[0, 1, 0, 0] = 4.0  # keypoint 1 now 16 / 4 = 4: OHKM top-1 keeps only it
    assert pose_heatmap_loss(pred, target, torch.ones(1, 2), topk=1).item() == pytest.approx(4.0)


def test_class_weighted_cross_entropy():
    # pixel 1: uniform logits, label 0 -> -log(1/3); pixel 2: logits (0, ln 3, 0), label 1 -> -log(3/5)
    logits = torch.tensor([[0.0, 0.0, 0.0], [0.0, math.log(3), 0.0], [5.0, 0.0, 0.0]]).T.reshape(1, 3, 1, 3)
    labels = torch.tensor([[[0, 1, 255]]])  # the third pixel is ignored
    w = torch.tensor([0.5, 2.0, 1.0])
    expected = (0.5 * math.log(3) + 2.0 * -math.log(0.6)) / (0.5 + 2.0)
    assert seg_loss(logits, labels, w).item() == pytest.approx(expected, rel=1e-6)


def test_depth_scale_invariant_log_loss_over_person_pixels():
    depth = torch.tensor([[[[2.0, 4.0, 0.0, float("inf")]]]])  # background stored as 0 or inf
    mask = torch.tensor([[[[True, True, False, False]]]])
    pred = torch.tensor([[[[0.5, 0.5, 7.0, 9.0]]]])
    # relative gt = depth / max over the person = (0.5, 1); d = (0, log 2)
    assert relative_depth(depth[..., :2], mask[..., :2]).flatten().tolist() == [0.5, 1.0]
    expected = math.sqrt(math.log(2) ** 2 / 2 - 0.5 * (math.log(2) / 2) ** 2)
    assert depth_loss(pred, depth, mask).item() == pytest.approx(expected, rel=1e-6)
    # a mask pixel whose depth is inf or 0 does not count
    mask_all = torch.ones_like(mask)
    assert depth_loss(pred, depth, mask_all).item() == pytest.approx(expected, rel=1e-6)
    # scale invariance of the target: metres or millimetres give the same loss
    assert depth_loss(pred, depth * 1000, mask).item() == pytest.approx(expected, rel=1e-6)


def test_depth_loss_averages_images_and_skips_empty_ones():
    depth = torch.tensor([[[[2.0, 4.0]]], [[[3.0, 3.0]]], [[[0.0, 0.0]]]])
    mask = torch.ones(3, 1, 1, 2, dtype=torch.bool)
    pred = torch.tensor([[[[0.5, 0.5]]], [[[1.0, 1.0]]], [[[1.0, 1.0]]]])
    first = math.sqrt(math.log(2) ** 2 / 2 - 0.5 * (math.log(2) / 2) ** 2)
    assert depth_loss(pred, depth, mask).item() == pytest.approx((first + 0.0) / 2, abs=1e-5)


def test_normal_loss_cosine_plus_l1():
    gt = torch.tensor([[0.0, 0.0, -1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]).T.reshape(1, 3, 1, 3)
    pred = torch.tensor([[0.0, 0.0, -2.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]).T.reshape(1, 3, 1, 3)
    mask = torch.tensor([[[[True, True, False]]]])
    # pixel 1: same direction (cos 1, L1 0); pixel 2: perpendicular (cos 0, |diff| = 1, 1, 0)
    expected = (0 + 1) / 2 + (0 + 0 + 0 + 1 + 1 + 0) / 6
    assert normal_loss(pred, gt, mask).item() == pytest.approx(expected, rel=1e-6)


def test_losses_upsample_low_resolution_predictions_and_backpropagate():
    pred = torch.full((1, 1, 2, 2), 0.5, requires_grad=True)
    depth = torch.rand(1, 1, 8, 8) + 1
    loss = depth_loss(pred, depth, torch.ones(1, 1, 8, 8, dtype=torch.bool))
    loss.backward()
    assert pred.grad is not None and pred.grad.abs().sum() > 0


def test_seg_background_weight_replaces_only_class_0():
    import numpy as np

    from training.tasks.finetune import FinetuneConfig, seg_class_weights
    from training.tasks.vocab import load as load_vocab
    vocab = np.asarray(load_vocab("sapiens28").weights, np.float32)
    plain = seg_class_weights(FinetuneConfig(task="seg", data="x", output="y"))
    raised = seg_class_weights(FinetuneConfig(task="seg", data="x", output="y", background_weight=1.0))
    assert np.allclose(plain.numpy(), vocab) and plain[0] == np.float32(0.1)
    assert raised[0] == 1.0 and np.allclose(raised[1:].numpy(), vocab[1:])
    assert np.asarray(load_vocab("sapiens28").weights)[0] == np.float32(0.1)  # the vocabulary is not changed
