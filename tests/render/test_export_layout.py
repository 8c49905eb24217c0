"""`humanset render export` on generated render shards (no Blender): background values, resume without
reopening finished shards, skipped frames named, COCO keypoints and visibility, errors that say what to do."""
import json
import os

import numpy as np
import pytest

import catalog
from humanset.cli import main as humanset
from render import export as ex
from render.export_coco import COCO17_SKELETON, mask_box, mask_rle
from render.run.output import load_png, npy_bytes, png_bytes
from training_fixtures import sphere_frame, write_sphere_renders


def export(run_dir, *args) -> int:
    return humanset(["render", "export", str(run_dir), "--no-progress", *args])


def listing(root) -> list[str]:
    """Sapiens' listing: .png images and masks matched by name with depths/ and normals/ .npy files."""
    names = {x for x in os.listdir(root / "images") if x.endswith(".png")}
    names &= {x for x in os.listdir(root / "masks") if x.endswith(".png")}
    for folder in ("depths", "normals"):
        names &= {x.replace(".npy", ".png") for x in os.listdir(root / folder) if x.endswith(".npy")}
    return sorted(names)


def add_shard(run, index: int, frames: list[dict]) -> None:
    """One more shard holding `frames` ({key, mask override, keypoints}) of sphere renders."""
    rng = np.random.default_rng(index)
    with catalog.ShardWriter(run / "shards", "render", catalog.FRAMES, max_count=1 << 20) as w:
        w.index = index
        for fr in frames:
            f = sphere_frame(rng)
            mask = fr.get("mask", f["mask"])
            meta = {"frame_index": int(fr["key"]), "K": f["K"].tolist(), "cam_to_world": np.eye(4).tolist(),
                    **({"keypoints_coco17": fr["keypoints"], "keypoint_names": ex_names()} if "keypoints" in fr else {})}
            w.add(fr["key"], {"rgb.png": png_bytes(f["rgb"].astype(np.uint8)),
                              "depth.npy": npy_bytes(np.where(mask, f["depth"], 0).astype(np.float32)),
                              "normal.npy": npy_bytes(np.where(mask[..., None], f["normal"], 0).astype(np.float32)),
                              "mask.png": png_bytes(np.asarray(mask, np.uint8) * 255), "json": meta},
                  {"frame_index": int(fr["key"])})


def ex_names():
    from render.bodies import COCO17
    return COCO17


@pytest.fixture
def run(tmp_path):
    return write_sphere_renders(tmp_path / "run", n_frames=4, per_shard=2)  # odd frames: inf background


def test_background_is_zero_and_the_frames_are_sapiens_listable(run, tmp_path):
    to = tmp_path / "sap"
    assert export(run, "--format", "sapiens", "--to", str(to)) == 0
    assert listing(to) == [f"{i:08d}.png" for i in range(4)]
    for i in range(4):
        key = f"{i:08d}"
        fg = load_png((to / "masks" / f"{key}.png").read_bytes()) > 0
        depth, normal = np.load(to / "depths" / f"{key}.npy"), np.load(to / "normals" / f"{key}.npy")
        assert depth.dtype == normal.dtype == np.float32
        assert np.all(depth[~fg] == 0) and np.all(np.isfinite(depth)) and depth[fg].min() > 1  # inf -> 0
        assert np.all(normal[~fg] == 0) and normal[fg][:, 2].mean() > 0.3  # opengl: towards the viewer
    manifest = json.loads((to / "manifest.json").read_text())
    assert manifest["complete"] and manifest["normal_frame"] == "opengl" and manifest["frames"] == 4
    assert manifest["frames_with_parts"] == 0 and os.listdir(to / "images")
    hidden = sorted(x for x in os.listdir(to) if x.startswith("."))
    assert hidden == [".humanset.json"], hidden  # its kind marker; no .lock left in the dataset once it is done


def test_rerun_opens_no_finished_shard_and_redoes_a_cut_frame(run, tmp_path, monkeypatch):
    to = tmp_path / "sap"
    assert ex.export_sapiens(run, to, "opencv", progress=False)["frames"] == 4
    opened = []
    frames = ex.RunReader.frames
    monkeypatch.setattr(ex.RunReader, "frames", lambda self, shard: opened.append(shard) or frames(self, shard))
    assert ex.export_sapiens(run, to, "opencv", progress=False)["frames"] == 4
    assert opened == []
    (to / "images" / "00000003.png").unlink()  # the image is written last: without it the frame is redone
    (to / "depths" / "00000003.npy").write_bytes(b"cut")
    assert ex.export_sapiens(run, to, "opencv", progress=False)["frames"] == 4
    assert opened == ["shards/render-00001.tar"]
    assert np.load(to / "depths" / "00000003.npy").shape == (96, 72)


def test_frames_sapiens_cannot_load_are_skipped_and_named(run, tmp_path):
    add_shard(run, 7, [{"key": "00000070", "mask": np.zeros((96, 72), bool)}])
    summary = ex.export_sapiens(run, tmp_path / "sap", progress=False)
    assert summary["frames"] == 4 and summary["skipped"] == {"00000070": "empty_mask"}
    assert "00000070.png" not in os.listdir(tmp_path / "sap" / "images")


def test_coco_keypoints_keep_the_rendered_visibility(run, tmp_path):
    h, w = 96, 72
    points = [[10.0 + k, 20.0 + k, 2] for k in range(17)]
    points[3] = [30.5, 40.25, 1]       # in the image, hidden
    points[16] = [-4.0, 120.0, 0]      # outside the image
    add_shard(run, 8, [{"key": "00000080", "keypoints": points}])
    to = tmp_path / "coco" / "kp.json"
    assert export(run, "--format", "coco", "--to", str(to)) == 0
    coco = json.loads(to.read_text())
    assert coco["categories"][0]["skeleton"] == COCO17_SKELETON and coco["categories"][0]["keypoints"] == ex_names()
    (image,), (ann,) = coco["images"], coco["annotations"]
    assert image == {"id": 80, "file_name": "kp_images/00000080.png", "height": h, "width": w,
                     "humanset_shard": "render-00008.tar", "humanset_key": "00000080"}
    kp = np.asarray(ann["keypoints"]).reshape(17, 3)
    assert kp[3].tolist() == [30.5, 40.25, 1] and kp[16].tolist() == [0, 0, 0] and kp[0].tolist() == [10, 20, 2]
    assert ann["num_keypoints"] == 16
    assert (to.parent / image["file_name"]).is_file()
    assert sorted(coco["info"]["skipped"]) == [f"{i:08d}" for i in range(4)]  # sphere frames have no joints


def test_mask_box_and_rle():
    m = np.zeros((5, 4), bool)
    m[1:3, 2] = True
    m[4, 3] = True
    assert mask_box(m) == [2.0, 1.0, 2.0, 4.0]
    rle = mask_rle(m)
    assert rle["size"] == [5, 4] and sum(rle["counts"]) == 20
    assert mask_rle(np.ones((2, 2), bool))["counts"] == [0, 4]
    from training.tasks.data import decode_segmentation
    assert np.array_equal(decode_segmentation(rle, 5, 4), m)


def test_bad_inputs_say_what_to_do(run, tmp_path, capsys):
    assert export(tmp_path, "--format", "sapiens", "--to", str(tmp_path / "x")) == 2
    assert "no render shards" in capsys.readouterr().err
    assert export(run, "--format", "coco", "--to", str(tmp_path / "kp.json")) == 2
    assert "no frame with a person and COCO-17 keypoints" in capsys.readouterr().err
    assert export(run, "--format", "coco", "--to", str(tmp_path / "kp")) == 2
    assert "one .json file" in capsys.readouterr().err
    assert export(run, "--format", "sapiens", "--to", str(tmp_path / "s")) == 0
    capsys.readouterr()
    assert export(run, "--format", "sapiens", "--to", str(tmp_path / "s"), "--normal-frame", "opencv") == 2
    err = capsys.readouterr().err
    assert "holds an export of a render run (humanset render export) with other settings" in err
    assert "pass another --to" in err


def test_a_folder_another_export_is_writing_is_refused(run, tmp_path, capsys):
    with catalog.run_lock(tmp_path / "busy"):
        assert export(run, "--format", "sapiens", "--to", str(tmp_path / "busy")) == 2
    assert "another run is using this directory" in capsys.readouterr().err
