"""The renderer against the geometric oracle, runs, resume and bad inputs (Blender on CPU, tiny frames).

All tests share one warm Blender (BlenderProc initialises once per process). The first use of anny in
a fresh environment builds its cache (~2 minutes, once per machine).
"""
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.blender

pytest.importorskip("bpy", reason="render tests need the Blender wheel: pip install -r deps/render.pip.txt")
pytest.importorskip("anny", reason="render tests need anny: pip install -r deps/render.pip.txt")

import catalog  # noqa: E402
from render import bodies, oracle, sampling  # noqa: E402
from render.run import job as jobmod  # noqa: E402
from render.blender import (FileMeshInput, MeshInput, RenderSettings, SceneInput, builtin_hdri_dir,  # noqa: E402
                            get_renderer)
from render.config import load_config  # noqa: E402
from render.run.output import load_npy, load_png  # noqa: E402
from render.scans import index_hdris, index_scans  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
import humanset_faults  # noqa: E402  (test-only fault injection: tests/faults)

H, W = 96, 72
TINY = [f"sampling.camera.height={H}", f"sampling.camera.width={W}", "cycles.samples=4", "cycles.device=cpu",
        "cycles.denoiser=null"]


@pytest.fixture(scope="module")
def renderer():
    return get_renderer(RenderSettings(samples=4, denoiser=None, device="cpu"))


@pytest.fixture(scope="module")
def body():
    return bodies.make_body(0, 5)


def _scene(body_bbox, mesh, seed=0, index=5, fill=(0.6, 0.7)):
    cam = sampling.sample_camera(seed, index, *body_bbox, sampling.CameraConfig(height=H, width=W, fill=fill))
    return cam, SceneInput(mesh=mesh, hdri_path=str(builtin_hdri_dir() / "courtyard.exr"), hdri_rotation_deg=40.0,
                           hdri_strength=1.0, K=cam["K"], cam_to_world=cam["cam_to_world"], height=H, width=W)


def _check_against_oracle(out, vertices, faces, cam):
    o = oracle.raycast(vertices, faces, cam["K"], cam["cam_to_world"], H, W)
    m = oracle.compare(out, o)
    assert m["interior_px"] > 100, m
    assert m["mask_iou"] > 0.99, m
    assert m["depth_abs_err_max_m"] < 1e-3, m
    assert m["normal_angle_median_deg"] < 1.0, m
    return m


def test_ground_truth_matches_oracle(renderer, body):
    cam, scene = _scene(body.bbox, MeshInput(body.vertices, body.faces, body.uvs, body.texture))
    out = renderer.render(scene)
    assert out["rgb"].shape == (H, W, 3) and out["rgb"].dtype == np.uint8
    assert out["depth_m"].dtype == np.float32 and out["normal"].shape == (H, W, 3)
    m = out["mask"] > 0
    n = np.linalg.norm(out["normal"][m], axis=-1)
    assert np.allclose(n, 1.0, atol=1e-4)
    # OpenCV frame: visible surfaces face the camera (negative z component on average)
    assert out["normal"][m][:, 2].mean() < -0.3
    # the HDRI lights the person and fills the background
    assert out["rgb"][~m].std() > 1 and out["rgb"][m].mean() > 5
    _check_against_oracle(out, body.vertices, body.faces, cam)


def test_part_labels_match_oracle(renderer, body):
    """parts: the Sapiens-28 class of the face hit at each pixel centre, 0 exactly off the mask."""
    from render import parts
    mesh = MeshInput(body.vertices, body.faces, body.uvs, body.texture, face_labels=body.parts)
    cam, scene = _scene(body.bbox, mesh, index=9, fill=(0.8, 0.85))
    out = renderer.render(scene)
    labels, mask = out["parts"], out["mask"] > 0
    assert labels.dtype == np.uint8 and labels.shape == (H, W)
    assert np.array_equal(labels > 0, mask)
    o = oracle.raycast(body.vertices, body.faces, cam["K"], cam["cam_to_world"], H, W)
    agreement = oracle.part_agreement(labels, oracle.part_labels(o, body.parts), out["mask"])
    assert agreement >= 0.99, agreement
    names = parts.vocabulary()["names"]
    seen = {names[c] for c in np.unique(labels) if c}
    assert {"Face_Neck", "Torso"} <= seen and len(seen) >= 6, seen
    # the oracle is not a copy of the renderer: a wrong label table disagrees
    shifted = oracle.part_labels(o, np.roll(body.parts, 1000))
    assert oracle.part_agreement(labels, shifted, out["mask"]) < 0.9


def test_anny_parts_cover_the_body_and_sides_are_the_persons(body):
    from render import parts
    names = parts.vocabulary()["names"]
    assert body.parts.shape == (len(body.faces),) and body.parts.min() >= 1
    centre = {names[c]: body.vertices[body.faces[body.parts == c]].reshape(-1, 3).mean(0) for c in np.unique(body.parts)}
    assert set(centre) == {"Face_Neck", "Torso", *(f"{s}_{p}" for s in ("Left", "Right") for p in (
        "Hand", "Foot", "Upper_Arm", "Lower_Arm", "Upper_Leg", "Lower_Leg"))}
    # anny's body faces -y with its left side at +x; the head is on top, the feet at the bottom
    assert all(centre[f"Left_{p}"][0] > centre[f"Right_{p}"][0] for p in ("Hand", "Foot", "Upper_Leg"))
    assert centre["Face_Neck"][2] > centre["Torso"][2] > centre["Left_Upper_Leg"][2] > centre["Left_Foot"][2]


def test_obj_import_turns_y_up_and_centimetres(renderer, body, tmp_path):
    """The anny body as a Y-up OBJ in centimetres: indexed, scaled, turned upright, same ground truth."""
    cm = bodies.Body(body.vertices * 100, body.faces, body.uvs, body.texture, body.params)
    path = bodies.export_obj(cm, tmp_path / "lib", "person_cm")
    (row,) = index_scans(tmp_path / "lib")
    assert row["ok"] and row["unit_scale"] == pytest.approx(0.01) and row["up_axis"] == "Y", row
    assert any("centimetres" in w for w in row["warnings"])
    assert row["texture"] and row["n_triangles"] == len(body.faces)
    assert np.allclose(row["bbox_min"], body.bbox[0], atol=1e-4) and np.allclose(row["bbox_max"], body.bbox[1], atol=1e-4)
    mesh = FileMeshInput(str(path), unit_scale=row["unit_scale"], up_axis=row["up_axis"], texture=row["texture"])
    cam, scene = _scene(body.bbox, mesh, index=6)
    out = renderer.render(scene)
    _check_against_oracle(out, body.vertices, body.faces, cam)


def _tiny_run(out, frames, scans="anny", hdris="builtin", extra=()):
    cfg = load_config(sets=TINY + ["output.frames_per_shard=2", *extra])
    return jobmod.prepare_run(out, scans, hdris, frames, 3, cfg)


def test_run_writes_shards_catalogs_and_resumes(tmp_path, monkeypatch):
    out = tmp_path / "run"
    spec = _tiny_run(out, 3)
    calls = []
    real = jobmod.ShardRenderer.render_frame

    def crash_on_frame_1(self, i):
        calls.append(i)
        if i == 1:
            raise KeyboardInterrupt("simulated crash")
        return real(self, i)

    monkeypatch.setattr(jobmod.ShardRenderer, "render_frame", crash_on_frame_1)
    with pytest.raises(KeyboardInterrupt):
        jobmod.run_local(spec, progress=False)
    assert calls == [0, 1]
    assert (out / "staging" / "render-00000" / "00000000.json").exists()
    assert not jobmod.shard_done(spec, 0)

    calls.clear()
    monkeypatch.setattr(jobmod.ShardRenderer, "render_frame", lambda self, i: (calls.append(i), real(self, i))[1])
    spec = _tiny_run(out, 3)
    jobmod.run_local(spec, progress=False)
    assert calls == [1, 2]  # frame 0 survived the crash and is not rendered again
    calls.clear()
    jobmod.run_local(_tiny_run(out, 3), progress=False)
    assert calls == []

    con = catalog.connect(out)
    rows = con.sql("SELECT frame_index, key, shard, error, person_px, K, cam_to_world, params FROM frames "
                   "ORDER BY frame_index").fetchall()
    assert [r[0] for r in rows] == [0, 1, 2] and all(r[3] is None for r in rows)
    assert [r[2] for r in rows] == ["render-00000.tar", "render-00000.tar", "render-00001.tar"]
    assert con.sql("SELECT count(*) FROM scans WHERE format = 'anny'").fetchall()[0][0] == 3
    assert con.sql("SELECT count(*) FROM hdris WHERE ok").fetchall()[0][0] == 8
    assert not (out / "staging" / "render-00000").exists()
    assert (out / "contact" / "render-00000.png").exists() and (out / "contact" / "render-00001.png").exists()

    recs = {}
    for tar in catalog.list_shards(out / "shards"):
        for rec in catalog.iter_tar(tar):
            recs[rec.key] = rec
    assert sorted(recs) == ["00000000", "00000001", "00000002"]
    r = recs["00000001"]
    assert set(r.files) == {"rgb.png", "depth.npy", "normal.npy", "mask.png", "parts.png", "json"}
    meta = json.loads(r.files["json"])
    part_png = load_png(r.files["parts.png"])
    assert part_png.dtype == np.uint8 and np.array_equal(part_png > 0, load_png(r.files["mask.png"]) > 0)
    assert meta["params"]["parts"] == {"vocabulary": "sapiens28"}
    manifest = json.loads((out / "render.json").read_text())
    assert manifest["part_vocabulary"]["names"][2] == "Face_Neck" and len(manifest["part_vocabulary"]["names"]) == 28
    depth, normal, mask = load_npy(r.files["depth.npy"]), load_npy(r.files["normal.npy"]), load_png(r.files["mask.png"])
    assert depth.shape == (H, W) and normal.shape == (H, W, 3) and mask.dtype == np.uint8
    assert ((depth > 0) == (mask > 0)).all() and meta["person_px"] == int((mask > 0).sum())
    assert np.asarray(meta["K"]).shape == (3, 3) and np.asarray(meta["cam_to_world"]).shape == (4, 4)
    assert meta["params"]["body"]["phenotype"] and meta["params"]["camera"]["focal_mm"] > 0
    # COCO-17 keypoints of the anny body: projected joints land on the person, the nose above the ankles
    kps = np.asarray(meta["keypoints_coco17"])
    assert kps.shape == (17, 3) and meta["keypoint_names"][0] == "nose"
    inside = kps[kps[:, 2] > 0]
    assert len(inside) >= 12
    near = [mask[max(0, int(round(y)) - 1):int(round(y)) + 2, max(0, int(round(x)) - 1):int(round(x)) + 2].max()
            for x, y, _ in inside]
    assert np.mean(np.asarray(near) > 0) > 0.9
    k3 = np.asarray(meta["keypoints3d_world"])
    assert k3[0, 2] > k3[15, 2] + 1.0 and k3[0, 2] > k3[16, 2] + 1.0

    # the same seed reproduces the same parameters, and the re-rendered frame is identical geometry
    fresh = _tiny_run(tmp_path / "again", 2)
    jobmod.run_local(fresh, progress=False)
    (again,) = [x for x in catalog.iter_tar(catalog.list_shards(tmp_path / "again" / "shards")[0]) if x.key == "00000001"]
    meta2 = json.loads(again.files["json"])
    assert meta2["params"]["camera"] == meta["params"]["camera"] and meta2["params"]["body"] == meta["params"]["body"]
    assert np.array_equal(load_npy(again.files["depth.npy"]), depth)
    # ... and the same image: nothing of the previous frame (texture, HDRI) leaks into the next one
    assert np.array_equal(load_png(again.files["rgb.png"]), load_png(r.files["rgb.png"]))

    # resuming with different settings is refused
    with pytest.raises(ValueError, match=r"holds a render run \(humanset render\) with other settings \(config"):
        jobmod.prepare_run(out, "anny", "builtin", 3, 3, load_config(sets=TINY))


def test_bad_inputs_are_reported_and_the_job_goes_on(tmp_path, body, monkeypatch):
    lib = tmp_path / "scans"
    lib.mkdir()
    (lib / "corrupt.obj").write_text("v 0 0\nf 1 2 9\nthis is not an obj file\n")
    (lib / "broken.glb").write_bytes(b"glTF\x02\x00\x00\x00garbage")
    crashing = bodies.export_obj(body, lib, "crashes_importer")  # the index's importer aborts on it:
    for k, v in humanset_faults.env({"abort_on_import": [crashing.name]}).items():  # tests/faults
        monkeypatch.setenv(k, v)
    bodies.export_obj(body, lib, "textured")
    bodies.export_obj(body, lib / "notex", "missing_texture")
    (lib / "notex" / "missing_texture.png").unlink()
    rows = {r["scan_id"]: r for r in index_scans(lib)}
    assert not rows["corrupt"]["ok"] and rows["corrupt"]["reject_reason"]
    assert not rows["broken"]["ok"] and "cannot load" in rows["broken"]["reject_reason"]
    # an import that kills Blender's process costs only that scan: the index goes on in a new process
    assert not rows["crashes_importer"]["ok"] and rows["crashes_importer"]["reject_reason"].startswith("blender_crash")
    assert rows["textured"]["ok"] and rows["textured"]["texture"] and not rows["textured"]["warnings"]
    miss = rows["notex/missing_texture"]
    assert miss["ok"] and any("missing" in w and "plain material" in w for w in miss["warnings"]), miss

    hd = tmp_path / "hdris"
    hd.mkdir()
    shutil.copy(builtin_hdri_dir() / "studio.exr", hd / "studio.exr")
    (hd / "broken.hdr").write_bytes(b"#?RADIANCE\nnot really\n")
    hrows = {r["hdri_id"]: r for r in index_hdris(hd)}
    assert hrows["studio"]["ok"] and hrows["studio"]["width"] > 0
    assert not hrows["broken"]["ok"] and "unreadable" in hrows["broken"]["reject_reason"]

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="holds no mesh files"):
        index_scans(empty)

    # a run over the library renders the usable scans (missing texture -> plain material, warning kept)
    spec = _tiny_run(tmp_path / "run", 2, scans=str(lib), hdris=str(hd))
    stats = jobmod.run_local(spec, progress=False)
    assert stats[0]["rendered"] == 2, stats
    con = catalog.connect(tmp_path / "run")
    assert con.sql("SELECT count(*) FROM scans WHERE NOT ok").fetchall()[0][0] == 3
    assert {r[0] for r in con.sql("SELECT DISTINCT hdri_id FROM frames").fetchall()} == {"studio"}
    # scan files carry no part labels: the member is left out and the frames catalog says why
    for (params, members) in con.sql("SELECT params, members FROM frames").fetchall():
        assert "no part labels" in json.loads(params)["parts"]["missing"]
        assert not any(m["name"].endswith(".parts.png") for m in members)

    # a camera that can never see the whole person: each frame fails with the reason, the run completes
    spec = _tiny_run(tmp_path / "unseen", 2, extra=["sampling.camera.fill=[1.5,1.6]", "sampling.camera.max_resamples=3"])
    stats = jobmod.run_local(spec, progress=False)
    assert stats[0]["failed"] == 2 and all("after 3 draws" in e for e in stats[0]["errors"].values())
    err = catalog.connect(tmp_path / "unseen").sql("SELECT error FROM frames").fetchall()
    assert len(err) == 2 and all("PersonNotInFrame" in e[0] for e in err)
    assert jobmod.shard_done(spec, 0)


def test_ray_driver_renders_missing_shards(tmp_path, ray_local):
    from render.run.distributed import run_ray
    spec = _tiny_run(tmp_path / "ray", 2, extra=["output.frames_per_shard=1"])
    stats = run_ray(spec, workers=1, cpus_per_worker=1, progress=False)
    assert sorted(s["shard"] for s in stats) == ["render-00000", "render-00001"]
    assert all(s["rendered"] == 1 for s in stats)
    assert run_ray(spec, workers=1, cpus_per_worker=1, progress=False) == []  # all done: nothing to do
    n = catalog.connect(tmp_path / "ray").sql("SELECT count(*) FROM frames WHERE error IS NULL").fetchall()[0][0]
    assert n == 2


@pytest.mark.parametrize("fmt", ["fbx", "glb"])
def test_fbx_and_gltf_scans_match_the_oracle(renderer, body, tmp_path, fmt):
    """The body re-exported by Blender's own FBX / glTF exporters (Y-up files): indexed and rendered."""
    import bpy
    obj = bodies.export_obj(body, tmp_path / "src", "person")
    bpy.ops.object.select_all(action="DESELECT")
    bpy.ops.wm.obj_import(filepath=str(obj))
    imported = list(bpy.context.selected_objects)
    lib = tmp_path / "lib"
    lib.mkdir()
    target = lib / f"person.{fmt}"
    if fmt == "fbx":
        bpy.ops.export_scene.fbx(filepath=str(target), use_selection=True, path_mode="COPY", embed_textures=True)
    else:
        bpy.ops.export_scene.gltf(filepath=str(target), use_selection=True, export_format="GLB")
    for o in imported:
        bpy.data.objects.remove(o, do_unlink=True)
    (row,) = index_scans(lib)
    assert row["ok"] and row["format"] == fmt and row["n_triangles"] == len(body.faces), row
    assert row["unit_scale"] == pytest.approx(1.0)
    assert np.allclose(row["bbox_min"], body.bbox[0], atol=1e-3) and np.allclose(row["bbox_max"], body.bbox[1], atol=1e-3)
    mesh = FileMeshInput(str(target), unit_scale=row["unit_scale"], up_axis=row["up_axis"], texture=row["texture"])
    cam, scene = _scene(body.bbox, mesh, index=7)
    _check_against_oracle(renderer.render(scene), body.vertices, body.faces, cam)


def test_a_scan_that_crashes_blender_fails_its_frames_and_the_run_goes_on(tmp_path, body, ray_local):
    """A scan whose import aborts the worker process: the Ray actor restarts, the frame is tried twice and
    failed with error "blender_crash", the scan is rejected for its other frames and in the scan catalog;
    the good scan renders, scan-major (one load for its two frames)."""
    import ray.cloudpickle

    from render.run.distributed import run_ray
    lib = tmp_path / "lib"
    bodies.export_obj(body, lib, "good")
    bad = bodies.export_obj(body, lib, "crashy")  # a valid OBJ whose import aborts the render actor (tests/faults)
    ray.cloudpickle.register_pickle_by_value(humanset_faults)  # the actors need no path to tests/faults
    cfg = load_config(sets=TINY + ["output.frames_per_shard=2", "schedule.frames_per_scan_visit=2"])
    spec = jobmod.prepare_run(tmp_path / "run", str(lib), "builtin", 4, 1, cfg)
    assert spec.scan_ids == ["crashy", "good"]  # seed 1 draws crashy for frames 0 and 3, good for 1 and 2
    assert [spec.shard_frames(0), spec.shard_frames(1)] == [[0, 3], [1, 2]]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(jobmod, "ShardRenderer", humanset_faults.crashing_shard_renderer([bad.name]))
        stats = run_ray(spec, workers=1, cpus_per_worker=1, progress=False)
    assert sorted(s["shard"] for s in stats) == ["render-00000", "render-00001"]
    con = catalog.connect(tmp_path / "run")
    rows = {r[0]: r[1:] for r in con.sql("SELECT frame_index, scan_id, error, params FROM frames").fetchall()}
    assert rows[0][:2] == ("crashy", "blender_crash") and "died 2 time(s)" in json.loads(rows[0][2])["error_detail"]
    assert rows[3][:2] == ("crashy", "blender_crash") and "rejected" in json.loads(rows[3][2])["error_detail"]
    assert rows[1][1] is None and rows[2][1] is None
    (ok, reason), = con.sql("SELECT ok, reject_reason FROM scans WHERE scan_id = 'crashy'").fetchall()
    assert not ok and reason.startswith("blender_crash")
    assert con.sql("SELECT ok FROM scans WHERE scan_id = 'good'").fetchall() == [(True,)]
    timings = {}
    for tar in catalog.list_shards(tmp_path / "run" / "shards"):
        for rec in catalog.iter_tar(tar):
            timings[int(rec.key)] = json.loads(rec.files["json"])["timings"]
    # the scan stayed loaded: frame 2 only looked its key up (scan_load_s is that lookup, ~0.1 ms)
    assert timings[1]["scan_loaded"] == 1 and timings[1]["scan_load_s"] > 0
    assert timings[2]["scan_loaded"] == 0 and timings[2]["scan_load_s"] < 0.01
    assert set(timings[2]) >= {"scan_load_s", "setup_s", "render_s", "write_s"}
    # frame 2 rendered with the scan (and Cycles' scene) kept from frame 1 equals a fresh render of it
    worker = jobmod.ShardRenderer(spec)
    worker.renderer.unload()
    _, members, _ = worker.render_frame(2)
    (kept,) = [r for t in catalog.list_shards(tmp_path / "run" / "shards") for r in catalog.iter_tar(t) if r.key == "00000002"]
    assert np.array_equal(load_png(members["rgb.png"]), load_png(kept.files["rgb.png"]))
    # a rerun has nothing left to do and still draws frames from the original scan list
    assert jobmod.prepare_run(tmp_path / "run", str(lib), "builtin", 4, 1, cfg).scan_ids == ["crashy", "good"]


def _heavy_scans_module():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "bench" / "heavy_scans.py"
    spec = importlib.util.spec_from_file_location("heavy_scans", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_heavy_generated_scan_is_renderpeople_sized_and_renders_true(renderer, tmp_path):
    """bench/heavy_scans.py: >= 300k triangles and a 4096² albedo from an anny body, offline; the renderer
    imports it like any scan and its silhouette and depth match the oracle on the unsubdivided body
    (midpoint subdivision leaves the surface where it was)."""
    from render.blender import image_size
    heavy = _heavy_scans_module()
    info = heavy.write_heavy_scan(tmp_path / "lib", "heavy", seed=0, index=4)
    assert info["faces"] >= 300_000 and info["texture"] == [4096, 4096]
    (row,) = index_scans(tmp_path / "lib")
    assert row["ok"] and row["n_triangles"] == info["faces"] and not row["warnings"], row
    assert image_size(row["texture"]) == (4096, 4096)
    body = bodies.make_body(0, 4)
    mesh = FileMeshInput(row["path"], unit_scale=row["unit_scale"], up_axis=row["up_axis"], texture=row["texture"])
    cam, scene = _scene(body.bbox, mesh, index=3)
    out = renderer.render(scene)
    m = oracle.compare(out, oracle.raycast(body.vertices, body.faces, cam["K"], cam["cam_to_world"], H, W))
    assert m["mask_iou"] > 0.99 and m["depth_abs_err_max_m"] < 1e-3, m
    assert out["rgb"][out["mask"] > 0].std() > 3  # the texture shows
