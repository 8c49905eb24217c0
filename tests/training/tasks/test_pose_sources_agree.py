"""Pose ground truth from renders two ways: `humanset render export --format coco` (render/) and
`finetune --task pose --data RENDER_RUN` reading the frames directly (training/tasks/render_pose.py) give
the same annotations and the same training samples."""
import json

import numpy as np

from humanset.cli import main as humanset
from training.tasks.render_pose import RenderKeypoints
from training.tasks.data import CocoKeypoints
from training_fixtures import write_sphere_renders
from training.tasks.vocab import load


def test_coco_export_and_direct_reading_of_renders_agree(tmp_path):
    run = write_sphere_renders(tmp_path / "run", n_frames=6, per_shard=4, people=True)
    out = tmp_path / "pose.json"
    assert humanset(["render", "export", str(run), "--format", "coco", "--to", str(out), "--no-progress"]) == 0
    coco = json.loads(out.read_text())
    key_of = {im["id"]: im["humanset_key"] for im in coco["images"]}
    exported = {key_of[a["image_id"]]: a for a in coco["annotations"]}
    vocab = load("coco17")
    direct = RenderKeypoints(run, vocab)
    by_key = {a["key"]: a for a in direct.anns}
    assert set(exported) == set(by_key) and len(by_key) >= 4
    for key, a in by_key.items():
        e = exported[key]
        assert e["bbox"] == a["bbox"] and e["area"] == a["area"] and e["num_keypoints"] == a["num_keypoints"]
        kp = np.asarray(a["keypoints"]).reshape(-1, 3)
        kp[kp[:, 2] == 0] = 0  # COCO writes a joint outside the image as (0, 0, 0)
        np.testing.assert_array_equal(np.asarray(e["keypoints"]).reshape(-1, 3), kp)
    # the same person crops, heatmaps and weights from either source (no augmentation)
    from_coco = CocoKeypoints(out, out.parent, vocab, out_hw=(64, 48))
    from_run = RenderKeypoints(run, vocab, out_hw=(64, 48))
    coco_pos = {key_of[a["image_id"]]: i for i, a in enumerate(from_coco.anns)}
    for i, a in enumerate(from_run.anns):
        x, y = from_run[i], from_coco[coco_pos[a["key"]]]
        for name in ("image", "heatmaps", "weights"):
            np.testing.assert_allclose(np.asarray(x[name]), np.asarray(y[name]), atol=1e-6, err_msg=name)
