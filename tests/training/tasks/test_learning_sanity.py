"""Can the heads learn at all? Each task's head overfits one small batch to a tight figure within a bounded
number of CPU steps, and the targets obey their geometric conventions (a broken flip or a twice-normalised
depth fails here). The frames are analytic sphere people in the renderer's exact shard format
(training_fixtures.write_sphere_renders(people=True): depth, normals, mask, parts.png, keypoints_coco17).
"""
import numpy as np
import pytest
import torch

from training.tasks.evaluate import evaluate
from training.tasks.finetune import FinetuneConfig, finetune
from training.tasks.losses import depth_loss, relative_depth
from training.tasks.render_pose import RenderKeypoints, mask_box
from training.tasks.augment import Augment
from training.tasks.data import RenderFrames
from training_fixtures import write_sphere_renders
from training.tasks.vocab import load

HW = (64, 48)


@pytest.fixture(scope="module")
def people(tmp_path_factory):
    return write_sphere_renders(tmp_path_factory.mktemp("people"), n_frames=4, hw=HW, per_shard=4, people=True)


# task: (steps, lr, input size, the figure, the bound it must beat); one batch = the 4 frames, no augmentation
OVERFIT = {"normal": (60, 3e-3, HW, "mean", ("<", 5.0)),
           "depth": (100, 3e-3, HW, "absrel", ("<", 0.01)),
           "seg": (200, 5e-3, HW, "mIoU", (">", 0.9)),
           "pose": (60, 3e-3, (128, 96), "PCK@0.05", (">", 0.9))}


@pytest.mark.parametrize("task", list(OVERFIT))
@pytest.mark.train
def test_a_head_overfits_one_batch(task, people, tmp_path):
    steps, lr, hw, key, (op, bound) = OVERFIT[task]
    cfg = FinetuneConfig(task=task, data=str(people), output=str(tmp_path), model="micro", image_size=hw,
                         head_width=32, batch_size=4, steps=steps, warmup_steps=max(1, steps // 10), lr=lr,
                         layer_decay=1.0, weight_decay=0.0, augment=False, loader_workers=0, cpu_threads=1,
                         log_every=steps, checkpoint_every=10 * steps, progress=False)
    result = evaluate(finetune(cfg)["checkpoint"], baselines=True)
    assert result["scored_on"] == "training data" and result["n"] == 4
    value = result[key]
    assert (value < bound) if op == "<" else (value > bound), (task, key, value, result)
    # and the fit is far better than anything a statistic of the targets gives
    best = result["baselines"][result["baselines"]["best"]][key]
    assert (value < 0.5 * best) if op == "<" else (1 - value < 0.5 * (1 - best)), (value, result["baselines"])


def x_slope_agreement(item) -> float:
    """Fraction of interior person pixels where the normal's x has the sign of the depth's slope along x:
    for a surface z(x, y) seen from the camera, n ~ (dz/dx, dz/dy, -1), so they agree wherever the surface
    is visibly slanted."""
    z, m, nx = item["depth"][0].astype(np.float64), item["mask"][0], item["normal"][0]
    dz = np.zeros_like(z)
    dz[:, 1:-1] = (z[:, 2:] - z[:, :-2]) / 2
    inner = m.copy()
    inner[:, 1:-1] &= m[:, 2:] & m[:, :-2]
    inner[:, [0, -1]] = False
    slanted = inner & (np.abs(dz) > 0.01) & (np.abs(nx) > 0.2)
    assert slanted.sum() > 50
    return float((np.sign(nx[slanted]) == np.sign(dz[slanted])).mean())


def test_normals_agree_with_the_depth_geometry_with_and_without_flip(people):
    plain = RenderFrames(people, HW, Augment(train=False))
    flipped = RenderFrames(people, HW, Augment(train=True, scale=(1.0, 1.0), flip=1.0, photometric=False))
    for i in range(len(plain)):
        a, b = plain[(i, 0)], flipped[(i, 0)]
        assert np.array_equal(b["image"], a["image"][:, :, ::-1])  # the flip did happen
        assert x_slope_agreement(a) > 0.95 and x_slope_agreement(b) > 0.95
    # the check fails on the broken conventions: x negated without mirroring, or mirrored without negating
    broken = dict(a, normal=a["normal"] * np.array([-1, 1, 1], np.float32)[:, None, None])
    assert x_slope_agreement(broken) < 0.05
    mirrored = {k: (v[..., ::-1] if k in ("depth", "mask", "normal") else v) for k, v in a.items()}
    assert x_slope_agreement(mirrored) < 0.05


def test_depth_target_is_metres_and_normalised_once(people):
    ds = RenderFrames(people, HW, Augment(train=False))
    for i in range(len(ds)):
        item, raw = ds[(i, 0)], ds.raw(i)
        m = item["mask"][0]
        np.testing.assert_array_equal(item["depth"][0][m], raw["depth"][m])  # metres as rendered, not rescaled
        assert 1.0 < item["depth"][0][m].min() and item["depth"][0][m].max() < 4.0
    depth, mask = torch.as_tensor(item["depth"][None]), torch.as_tensor(item["mask"][None])
    rel = relative_depth(depth, mask)
    assert rel[mask].max() == 1.0 and rel[mask].min() > 0.5  # divided by the person's far end, once
    assert float(depth_loss(rel, depth, mask)) < 1e-3  # the loss normalises the metric target itself
    # a target normalised a second way (min-max) is a different shape, and the loss sees it
    twice = (rel - rel[mask].min()) / (rel[mask].max() - rel[mask].min())
    assert float(depth_loss(twice.clamp_min(1e-3), depth, mask)) > 0.1


def test_render_pose_flip_keeps_the_person_left_on_its_side(people):
    """The sphere person faces the camera (its left at +x). A mirrored frontal person still has its left
    on the same side, so after a flip the left_* heatmaps must still lie right of the right_* ones."""
    vocab = load("coco17")
    base = dict(train=True, pose_scale=(1.0, 1.0), rotate=0.0, photometric=False)
    li, ri = vocab.names.index("left_shoulder"), vocab.names.index("right_shoulder")
    for flip in (0.0, 1.0):
        ds = RenderKeypoints(people, vocab, (128, 96), Augment(**base, flip=flip))
        for i in range(len(ds)):
            hm = ds[(i, 0)]["heatmaps"]
            col = [np.unravel_index(hm[k].argmax(), hm[k].shape)[1] for k in (li, ri)]
            assert col[0] > col[1], (flip, i, col)


def test_render_keypoints_read_the_frames_json_and_box_the_mask(people):
    import json

    import catalog
    ds = RenderKeypoints(people, load("coco17"), (128, 96))
    assert len(ds) == 4 and [a["id"] for a in ds.anns] == [0, 1, 2, 3]
    frames = RenderFrames(people, HW)
    for i, a in enumerate(ds.anns):
        raw = frames.raw(i)
        row = frames.row(i)
        member = next(m for m in row["members"] if m["name"].endswith(".json"))
        frame = json.loads(catalog.read_member(people / "shards" / row["shard"], member["offset"], member["size"]))
        assert a["keypoints"] == np.ravel(frame["keypoints_coco17"]).tolist()
        assert a["bbox"] == mask_box(raw["mask"]) and a["area"] == raw["mask"].sum()
        x, y, w, h = a["bbox"]
        ys, xs = np.nonzero(raw["mask"])
        assert (x, y, x + w - 1, y + h - 1) == (xs.min(), ys.min(), xs.max(), ys.max())
    assert mask_box(np.zeros((4, 4), bool)) is None


@pytest.mark.train
def test_cli_pose_from_a_render_run_and_evaluate_says_what_it_scores(people, tmp_path, capsys):
    import json
    import shutil

    from humanset.cli import main as humanset
    out = tmp_path / "pose"
    assert humanset(["finetune", "--task", "pose", "--data", str(people), "--output", str(out), "--model", "micro",
                     "--image-size", "64x48", "--steps", "2", "--batch-size", "2", "--set", "head_width=16",
                     "--set", "loader_workers=0", "--set", "progress=false"]) == 0
    ckpt = out / "checkpoints" / "step-00000002.pt"
    capsys.readouterr()
    assert humanset(["evaluate", "--checkpoint", str(ckpt)]) == 0
    captured = capsys.readouterr()
    assert "TRAINING data" in captured.err and '"scored_on": "training data"' in captured.out
    assert humanset(["evaluate", "--checkpoint", str(ckpt), "--data", str(people), "--baselines",
                     "--out", str(tmp_path / "m.json")]) == 0
    assert "--data names the training data" in capsys.readouterr().err  # --data naming the training run itself: said too
    result = json.loads((tmp_path / "m.json").read_text())
    assert result["scored_on"] == "training data"
    assert {"AP", "PCK@0.05", "PCK@0.1", "PCK@0.2"} <= set(result)
    assert result["baselines"]["best"] == "mean train pose in the box"
    held = tmp_path / "held"  # other data (a copy at another path): no note
    shutil.copytree(people, held)
    assert humanset(["evaluate", "--checkpoint", str(ckpt), "--data", str(held)]) == 0
    captured = capsys.readouterr()
    assert "TRAINING" not in captured.err and '"scored_on": "other data"' in captured.out
