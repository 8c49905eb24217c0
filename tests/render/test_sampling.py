"""Sampling and config: pure Python, no Blender."""
import json

import numpy as np
import pytest

from render import sampling
from render.config import RenderConfig, load_config
from render.scans import judge_scan

BBOX = (np.array([-0.3, -0.15, 0.0]), np.array([0.3, 0.15, 1.75]))


def test_sampling_never_imports_blender():
    src = open(sampling.__file__).read()
    assert "import bpy" not in src and "blenderproc" not in src


def test_only_render_blender_touches_blender_and_the_scene_is_plain_data():
    from pathlib import Path
    root = Path(sampling.__file__).resolve().parents[1]
    words = ("import bpy", "from bpy", "import blenderproc", "from blenderproc", "mathutils")
    touching = sorted(str(p.relative_to(root)) for room in ("catalog", "pipeline", "render", "training", "humanset")
                      for p in (root / room).rglob("*.py") if any(w in p.read_text() for w in words))
    assert touching and all(t.startswith("render/blender/") for t in touching), touching
    scene = (root / "render" / "scene.py").read_text()
    assert "bpy" not in scene and "blender" not in scene.split('"""')[2]  # the code, past its docstring


def test_same_seed_same_parameters_and_person_in_frame():
    cfg = sampling.SamplingConfig()
    a = [sampling.sample_camera(7, i, *BBOX, cfg.camera) for i in range(50)]
    b = [sampling.sample_camera(7, i, *BBOX, cfg.camera) for i in range(50)]
    c = sampling.sample_camera(8, 0, *BBOX, cfg.camera)
    for x, y in zip(a, b):
        assert x["focal_mm"] == y["focal_mm"] and np.array_equal(x["cam_to_world"], y["cam_to_world"])
    assert c["focal_mm"] != a[0]["focal_mm"]
    assert len({round(x["azimuth_deg"], 6) for x in a}) == 50
    for x in a:
        assert sampling.in_frame(sampling.bbox_corners(*BBOX), x["K"], x["cam_to_world"], x["height"], x["width"])
        lo, hi = cfg.camera.focal_mm
        assert lo <= x["focal_mm"] <= hi
        # rotation part is orthonormal and right-handed
        R = x["cam_to_world"][:3, :3]
        assert np.allclose(R.T @ R, np.eye(3), atol=1e-9) and np.isclose(np.linalg.det(R), 1.0)
    s1 = sampling.sample_scene(7, 3, ["a", "b", "c"], ["h1", "h2"], cfg)
    assert s1 == sampling.sample_scene(7, 3, ["a", "b", "c"], ["h1", "h2"], cfg)
    json.dumps(s1)  # parameters are plain JSON


def test_look_at_is_opencv():
    T = sampling.look_at(np.array([0.0, -3.0, 1.0]), np.array([0.0, 0.0, 1.0]))
    assert np.allclose(T[:3, 2], [0, 1, 0])  # z forward, towards the target
    assert np.allclose(T[:3, 1], [0, 0, -1])  # y down
    assert np.allclose(T[:3, 0], [1, 0, 0])  # x right
    K = sampling.intrinsics(50, 1024, 768)
    uv, z = sampling.project(np.array([[0.0, 0.0, 1.0], [0.0, 0.0, 2.0]]), K, T)
    assert np.allclose(uv[0], [(768 - 1) / 2, (1024 - 1) / 2]) and z[0] == pytest.approx(3.0)
    assert uv[1, 1] < uv[0, 1]  # a point above the target appears higher in the image (smaller row)


def test_unseeable_person_is_a_clear_error():
    cam = sampling.CameraConfig(fill=(1.5, 1.6), max_resamples=5)
    with pytest.raises(sampling.PersonNotInFrame, match="after 5 draws.*lower camera.fill"):
        sampling.sample_camera(0, 0, *BBOX, cam)


def test_config_overrides_and_unknown_keys():
    cfg = load_config(sets=["sampling.camera.height=512", "cycles.samples=8"])
    assert cfg.sampling.camera.height == 512 and cfg.cycles.samples == 8
    assert RenderConfig.from_dict(cfg.to_dict()) == cfg
    assert RenderConfig().sampling.camera.height == 1024 and RenderConfig().sampling.camera.width == 768
    with pytest.raises(KeyError, match="unknown key 'hieght'"):
        load_config(sets=["sampling.camera.hieght=512"])


def test_judge_scan_units_and_axes():
    m = {"n_triangles": 10, "bbox_min": [-30, -20, 0], "bbox_max": [30, 20, 175], "textures": []}
    r = judge_scan(m)
    assert r["ok"] and r["unit_scale"] == 0.01 and r["up_axis"] == "Y"
    assert any("centimetres" in w for w in r["warnings"]) and any("plain material" in w for w in r["warnings"])
    assert np.allclose(r["bbox_max"], [0.3, 0.2, 1.75])
    # a Z-up file read as Y-up lies along -Y; it is turned upright
    r = judge_scan({"n_triangles": 10, "bbox_min": [-0.3, -1.8, -0.2], "bbox_max": [0.3, 0.0, 0.2],
                    "textures": ["a.png"], "missing_textures": []})
    assert r["ok"] and r["up_axis"] == "Z" and r["unit_scale"] == 1.0 and r["texture"] == "a.png"
    assert np.allclose(r["bbox_min"], [-0.3, -0.2, 0.0]) and np.allclose(r["bbox_max"], [0.3, 0.2, 1.8])
    r = judge_scan({"n_triangles": 10, "bbox_min": [0, 0, 0], "bbox_max": [0.01, 0.01, 0.05]})
    assert not r["ok"] and "neither metres" in r["reject_reason"]


def test_cli_registers_render_commands(capsys):
    from humanset.cli import build_parser, main
    assert main(["render", "config", "--set", "cycles.samples=3"]) == 0
    out = capsys.readouterr().out
    assert "samples: 3" in out and "height: 1024" in out
    args = build_parser().parse_args(["render", "scan-index", "some/dir", "--output", "x.parquet"])
    assert args.scans_dir == "some/dir" and args.func.__name__ == "run_scan_index"
    assert main(["render", "--frames", "1"]) == 2  # --output missing: a clear error, not a traceback
    assert "--frames and --output are required" in capsys.readouterr().err


def test_part_vocabulary_is_sapiens28_and_the_mapping_is_data():
    from render import parts
    from training.tasks.vocab import load
    voc = parts.vocabulary()
    assert voc["name"] == "sapiens28" and tuple(voc["names"]) == load("sapiens28").names
    names = voc["names"]
    ids = parts.bone_classes(["head", "upperarm02.L", "lowerleg01.R", "finger3-2.R", "spine04", "toe1-1.L"])
    assert [names[i] for i in ids] == ["Face_Neck", "Left_Upper_Arm", "Right_Lower_Leg", "Right_Hand", "Torso",
                                       "Left_Foot"]
    with pytest.raises(KeyError, match="no rule maps anny bone 'tail'"):
        parts.bone_classes(["head", "tail"])
    # a vertex takes its heaviest bone; a face the class most of its corners have
    vc = parts.vertex_classes(np.array([[0.2, 0.8], [0.9, 0.1], [0.5, 0.5]]), np.array([[0, 1], [1, 0], [1, 0]]),
                              np.array([7, 3], np.uint8))
    assert vc.tolist() == [3, 3, 3]
    fc = parts.face_classes(np.array([[0, 1, 2], [0, 1, 3], [3, 1, 1], [0, 3, 4]]), np.array([5, 5, 6, 6, 7]))
    assert fc.tolist() == [5, 5, 5, 5]


def _scene_before_scan_major(seed, i, scan_ids, hdri_ids, cfg):
    """sample_scene as it was before scan-major plans (a reference copy): the plan must not change it."""
    import math
    rng = np.random.default_rng([seed, i, 0])
    lo, hi = cfg.light.strength
    return {"scan_id": scan_ids[int(rng.integers(len(scan_ids)))], "hdri_id": hdri_ids[int(rng.integers(len(hdri_ids)))],
            "hdri_rotation_deg": float(rng.uniform(*cfg.light.rotation_deg)),
            "hdri_strength": float(math.exp(rng.uniform(math.log(lo), math.log(hi))))}


def test_scan_major_plan_covers_each_frame_once_and_keeps_frame_parameters():
    from render.run import plan
    cfg = sampling.SamplingConfig()
    scans, hdris = [f"s{k}" for k in range(50)], ["h0", "h1", "h2"]
    frames, per, visit = 1000, 16, 8  # windows of 400 frames; the last one partial
    shards = [plan.shard_frames(5, k, frames, len(scans), visit, per) for k in range(plan.n_shards(frames, per))]
    flat = [i for s in shards for i in s]
    assert sorted(flat) == list(range(frames)) and all(len(s) == per for s in shards[:-1])
    assert shards == [plan.shard_frames(5, k, frames, len(scans), visit, per) for k in range(len(shards))]
    for i in range(0, frames, 7):  # parameters are still (seed, frame) alone: identical to before
        assert sampling.sample_scene(5, i, scans, hdris, cfg) == _scene_before_scan_major(5, i, scans, hdris, cfg)
        assert scans[sampling.scan_draw(5, i, len(scans))] == sampling.sample_scene(5, i, scans, hdris, cfg)["scan_id"]

    def mean_run(shard_lists):  # frames of one scan rendered back to back
        runs = [1 + sum(sampling.scan_draw(5, a, 50) != sampling.scan_draw(5, b, 50) for a, b in zip(s, s[1:]))
                for s in shard_lists]
        return sum(map(len, shard_lists)) / sum(runs)
    per_frame = [plan.shard_frames(5, k, frames, len(scans), 1, per) for k in range(len(shards))]
    assert per_frame[3] == list(range(48, 64))  # frames_per_scan_visit=1: today's order
    assert mean_run(per_frame) < 1.2 and mean_run(shards) > 4, (mean_run(per_frame), mean_run(shards))
    # a window of exactly one shard is still sorted by scan
    one = plan.shard_frames(0, 0, 8, 4, 2, 8)
    assert plan.window_frames(4, 2, 8) == 8 and sorted(one) == list(range(8))
    assert [sampling.scan_draw(0, i, 4) for i in one] == sorted(sampling.scan_draw(0, i, 4) for i in range(8))


def test_scan_major_plan_keeps_the_scan_distribution_uniform():
    from render.run import plan
    n_scans, frames, per, visit = 40, 16000, 64, 32
    counts = np.zeros(n_scans, int)
    for k in range(plan.n_shards(frames, per)):
        for i in plan.shard_frames(11, k, frames, n_scans, visit, per):
            counts[sampling.scan_draw(11, i, n_scans)] += 1
    assert counts.sum() == frames
    p = 1 / n_scans
    mean, sd = frames * p, np.sqrt(frames * p * (1 - p))
    assert np.all(np.abs(counts - mean) < 4.5 * sd), counts  # each scan's count is Binomial(frames, 1/n)
    chi2 = float(((counts - mean) ** 2 / mean).sum())  # ~ chi-square, n - 1 = 39 dof: mean 39, sd 8.8
    assert chi2 < 39 + 5 * 8.8, chi2


def test_denoiser_may_be_switched_off():
    assert load_config(sets=["cycles.denoiser=null"]).cycles.denoiser is None
    assert load_config(sets=["cycles.denoiser=OPTIX"]).cycles.denoiser == "OPTIX"
    with pytest.raises(ValueError, match="cycles.denoiser must be one of"):
        load_config(sets=["cycles.denoiser=FAST"])
