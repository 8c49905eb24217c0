"""`humanset render export`: a small real render in Sapiens' fine-tuning folders and as COCO keypoints.

The Sapiens side is loaded the way Sapiens' own datasets list and read it (a minimal re-implementation of
seg/mmseg/datasets/depth_general.py / normal_general.py / pointmap_render_people.py: names matched across
folders, only .png images, the mask's channel 0 > 0 as the person); the COCO side is trained on with
`humanset finetune --task pose` as it reads COCO today.
"""
import json
import os
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.blender

pytest.importorskip("bpy", reason="render tests need the Blender wheel: pip install -r deps/render.pip.txt")
pytest.importorskip("anny", reason="render tests need anny: pip install -r deps/render.pip.txt")

import cv2  # noqa: E402

import catalog  # noqa: E402
from humanset.cli import main as humanset  # noqa: E402
from render.run.output import load_npy, load_png  # noqa: E402

H, W = 96, 72
TINY = [f"sampling.camera.height={H}", f"sampling.camera.width={W}", "cycles.samples=2", "cycles.device=cpu",
        "cycles.denoiser=null", "output.frames_per_shard=1", "sampling.camera.fill=[0.8,0.9]"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two rendered anny frames in two shards, and their members as the shards hold them."""
    out = tmp_path_factory.mktemp("export") / "run"
    sets = [a for s in TINY for a in ("--set", s)]
    assert humanset(["render", "--frames", "2", "--output", str(out), "--seed", "4", "--no-progress", *sets]) == 0
    frames = {}
    for shard in catalog.list_shards(out / "shards"):
        for rec in catalog.iter_tar(shard):
            frames[rec.key] = rec.files
    assert len(frames) == 2
    return out, frames


def export(run_dir, *args) -> int:
    return humanset(["render", "export", str(run_dir), "--no-progress", *args])


def sapiens_listing(root: Path, folders=("depths", "normals")) -> list[str]:
    """Sapiens' rule: images/*.png and masks/*.png matched by name with {folder}/*.npy, nothing else."""
    names = {x for x in os.listdir(root / "images") if x.endswith(".png")}
    names &= {x for x in os.listdir(root / "masks") if x.endswith(".png")}
    for folder in folders:
        names &= {x.replace(".npy", ".png") for x in os.listdir(root / folder) if x.endswith(".npy")}
    return sorted(names)


def sapiens_read(root: Path, name: str) -> dict:
    """One sample as Sapiens reads it: cv2 BGR image, mask channel 0, the raw npy arrays."""
    stem = name[:-len(".png")]
    return {"img": cv2.imread(str(root / "images" / name)), "mask": cv2.imread(str(root / "masks" / name))[:, :, 0],
            "depth": np.load(root / "depths" / f"{stem}.npy"), "normal": np.load(root / "normals" / f"{stem}.npy"),
            "K": np.loadtxt(root / "camera_intrinsics" / f"{stem}.txt"),
            "M": np.loadtxt(root / "camera_extrinsics" / f"{stem}.txt")}


@pytest.fixture(scope="module")
def sapiens(run, tmp_path_factory):
    out, _ = run
    root = tmp_path_factory.mktemp("sapiens")
    assert export(out, "--format", "sapiens", "--to", str(root / "gl")) == 0  # the default frame
    assert export(out, "--format", "sapiens", "--to", str(root / "cv"), "--normal-frame", "opencv") == 0
    return root / "gl", root / "cv"


def test_sapiens_export_loads_with_sapiens_listing_rules(run, sapiens):
    _, frames = run
    gl, cv = sapiens
    for root in (gl, cv):
        names = sapiens_listing(root)
        assert names == sorted(f"{k}.png" for k in frames)  # every image has its mask, depth and normal
        for folder in ("images", "masks", "parts"):
            assert sorted(os.listdir(root / folder)) == names
        for folder in ("camera_intrinsics", "camera_extrinsics"):
            assert sorted(os.listdir(root / folder)) == [n.replace(".png", ".txt") for n in names]
        for name in names:
            s, f = sapiens_read(root, name), frames[name[:-4]]
            meta = json.loads(f["json"])
            assert s["img"].shape == (H, W, 3) and s["img"].dtype == np.uint8
            assert np.array_equal(s["img"][..., ::-1], load_png(f["rgb.png"])[..., :3])
            fg = s["mask"] > 0
            assert np.array_equal(fg, load_png(f["mask.png"]) > 0) and fg.sum() > 100
            assert s["depth"].dtype == np.float32 and s["depth"].shape == (H, W)
            assert np.array_equal(s["depth"], load_npy(f["depth.npy"]))
            assert np.all(s["depth"][~fg] == 0) and 0.5 < s["depth"][fg].min() <= s["depth"][fg].max() < 20
            n = s["normal"]
            assert n.dtype == np.float32 and n.shape == (H, W, 3) and np.all(n[~fg] == 0)
            # unit within Sapiens' own tolerance (1e-6), so its loader keeps them as written
            assert np.abs(np.linalg.norm(n[fg], axis=1) - 1).max() < 1e-6
            parts = np.asarray(cv2.imread(str(root / "parts" / name), cv2.IMREAD_UNCHANGED))
            assert parts.dtype == np.uint8 and parts.ndim == 2 and parts.max() < 28
            assert np.array_equal(parts > 0, fg)
            assert np.allclose(s["K"], meta["K"], rtol=0, atol=1e-12)
            # world-to-camera with OpenCV axes: the joints project onto the rendered 2D keypoints
            assert np.allclose(s["M"] @ np.asarray(meta["cam_to_world"]), np.eye(4), atol=1e-9)
            joints = np.c_[np.asarray(meta["keypoints3d_world"]), np.ones(17)]
            cam = (s["M"] @ joints.T)[:3]
            uv = (s["K"] @ cam)[:2] / cam[2]
            assert np.allclose(uv.T, np.asarray(meta["keypoints_coco17"])[:, :2], atol=1e-3)
        manifest = json.loads((root / "manifest.json").read_text())
        assert manifest["complete"] and manifest["frames"] == 2 and manifest["frames_with_parts"] == 2
        assert manifest["part_vocabulary"]["name"] == "sapiens28" and manifest["skipped"] == {}
    assert json.loads((gl / "manifest.json").read_text())["normal_frame"] == "opengl"
    assert json.loads((cv / "manifest.json").read_text())["normal_frame"] == "opencv"


def test_normal_frames_opengl_is_exactly_the_flipped_opencv(run, sapiens):
    _, frames = run
    gl, cv = sapiens
    for key, f in frames.items():
        n_cv, n_gl = np.load(cv / "normals" / f"{key}.npy"), np.load(gl / "normals" / f"{key}.npy")
        assert np.array_equal(n_cv, load_npy(f["normal.npy"]))  # opencv: as rendered
        assert np.array_equal(n_gl, n_cv * np.array([1, -1, -1], np.float32))
        fg = load_png(f["mask.png"]) > 0
        assert n_cv[fg][:, 2].mean() < -0.3 and n_gl[fg][:, 2].mean() > 0.3  # facing the camera in each frame


def test_sapiens_export_resumes_and_refuses_to_mix(run, sapiens, capsys):
    out, _ = run
    gl, _ = sapiens
    key = sorted(os.listdir(gl / "images"))[1][:-4]
    kept = (gl / "images" / f"{sorted(os.listdir(gl / 'images'))[0]}").stat().st_mtime_ns
    # a frame cut short: its normals written, its image (written last) not
    good = (gl / "normals" / f"{key}.npy").read_bytes()
    (gl / "images" / f"{key}.png").unlink()
    (gl / "normals" / f"{key}.npy").write_bytes(b"half")
    assert sapiens_listing(gl) == sorted(os.listdir(gl / "masks"))[:1]  # Sapiens would not list it
    assert export(out, "--format", "sapiens", "--to", str(gl)) == 0
    assert (gl / "normals" / f"{key}.npy").read_bytes() == good and (gl / "images" / f"{key}.png").exists()
    assert (gl / "images" / sorted(os.listdir(gl / "images"))[0]).stat().st_mtime_ns == kept  # not rewritten
    capsys.readouterr()
    assert export(out, "--format", "sapiens", "--to", str(gl), "--normal-frame", "opencv") == 2
    assert 'other settings (normal_frame "opengl", now "opencv")' in capsys.readouterr().err  # catalog/run_kind.py
    assert json.loads((gl / "manifest.json").read_text())["normal_frame"] == "opengl"


def test_coco_export_trains_the_pose_task(run, tmp_path, capsys):
    out, frames = run
    to = tmp_path / "pose" / "person_keypoints.json"
    assert export(out, "--format", "coco", "--to", str(to)) == 0
    coco = json.loads(to.read_text())
    (cat,) = coco["categories"]
    assert cat["name"] == "person" and len(cat["keypoints"]) == 17 and cat["keypoints"][0] == "nose"
    assert len(cat["skeleton"]) == 19 and max(max(e) for e in cat["skeleton"]) == 17
    assert len(coco["images"]) == len(coco["annotations"]) == 2
    for image, ann in zip(coco["images"], coco["annotations"]):
        f = frames[image["humanset_key"]]
        meta, mask = json.loads(f["json"]), load_png(f["mask.png"]) > 0
        assert (image["height"], image["width"]) == (H, W) and ann["image_id"] == image["id"]
        assert np.array_equal(np.asarray(cv2.imread(str(to.parent / image["file_name"])))[..., ::-1],
                              load_png(f["rgb.png"])[..., :3])
        rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
        assert ann["bbox"] == [cols[0], rows[0], cols[-1] - cols[0] + 1, rows[-1] - rows[0] + 1]
        assert ann["area"] == mask.sum() and ann["iscrowd"] == 0 and ann["category_id"] == 1
        kp, rendered = np.asarray(ann["keypoints"]).reshape(17, 3), np.asarray(meta["keypoints_coco17"])
        assert np.array_equal(kp[:, 2], rendered[:, 2])  # visibility as rendered
        seen = rendered[:, 2] > 0
        assert np.array_equal(kp[seen, :2], rendered[seen, :2]) and np.all(kp[~seen, :2] == 0)
        assert ann["num_keypoints"] == seen.sum() > 0
        from training.tasks.data import decode_segmentation
        assert np.array_equal(decode_segmentation(ann["segmentation"], H, W), mask)
    # humanset's pose task reads it as it is (images resolved beside the JSON, no --images)
    ft = tmp_path / "ft"
    sets = ["head_width=32", "loader_workers=0", "cpu_threads=1", "log_every=1", "checkpoint_every=100",
            "progress=false"]
    assert humanset(["finetune", "--task", "pose", "--data", str(to), "--output", str(ft), "--model", "tiny",
                     "--image-size", "64x48", "--steps", "2", "--batch-size", "2",
                     *[a for s in sets for a in ("--set", s)]]) == 0
    losses = [json.loads(line)["loss"] for line in (ft / "log.jsonl").read_text().splitlines()]
    assert len(losses) == 2 and all(np.isfinite(losses))
    capsys.readouterr()
    assert export(out, "--format", "coco", "--to", str(to), "--normal-frame", "opengl") == 2
    assert "--format sapiens only" in capsys.readouterr().err


def test_export_of_a_folder_that_is_no_render_run_says_so(tmp_path, capsys):
    assert export(tmp_path, "--format", "sapiens", "--to", str(tmp_path / "x")) == 2
    assert "no render shards" in capsys.readouterr().err
