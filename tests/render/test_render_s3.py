"""`humanset render --output s3://...` against a real S3 server (SeaweedFS on 127.0.0.1, signed requests):
every output of the run is an object there (shards + index, catalogs, markers, manifest, contact sheets),
nothing is left on local disk (the working folder, the scratch folder the frames were staged in), the
frames read back through the views and `render export`, and a rerun finds every shard done."""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.blender

pytest.importorskip("bpy", reason="render tests need the Blender wheel: pip install -r deps/render.pip.txt")
pytest.importorskip("anny", reason="render tests need anny: pip install -r deps/render.pip.txt")

import catalog  # noqa: E402
from catalog import storage as st  # noqa: E402
from render.run import job as jobmod  # noqa: E402
from render.config import load_config  # noqa: E402
from render.run.output import load_npy, load_png  # noqa: E402
from faultstore import through  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = ["sampling.camera.height=96", "sampling.camera.width=72", "cycles.samples=4", "cycles.device=cpu",
        "cycles.denoiser=null", "output.frames_per_shard=1"]


def _humanset(args, cwd, scratch, timeout=900):
    env = dict(os.environ, TMPDIR=str(scratch),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-m", "humanset.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def _result(stdout: str) -> dict:
    # the last JSON line (Blender may print its own notes at exit, e.g. "Error: Not freed memory blocks")
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


def _render(out, cwd, scratch, *extra):
    sets = [a for s in TINY for a in ("--set", s)]
    return _humanset(["render", "--frames", "2", "--output", out, "--seed", "3", "--no-progress", *sets, *extra],
                     cwd, scratch)


@pytest.fixture(scope="module")
def s3_render(s3_server, tmp_path_factory):
    out = s3_server.prefix("render")
    cwd, scratch = tmp_path_factory.mktemp("cwd"), tmp_path_factory.mktemp("scratch")
    p = _render(out, cwd, scratch)
    assert p.returncode == 0, p.stderr[-3000:]
    return out, cwd, scratch, p


def test_every_output_of_the_render_is_on_s3_and_none_on_local_disk(s3_render):
    out, cwd, scratch, p = s3_render
    assert _result(p.stdout) == {"frames": 2, "rendered": 2, "failed": 0,
                                                              "shards_done": 2, "shards": 2}
    assert list(cwd.iterdir()) == []  # nothing where the command ran
    assert [x for x in scratch.rglob("*") if "humanset-render" in str(x)] == []  # staged frames removed
    names = {e.path for e in st.open_storage(out).list()}
    want = {".humanset.json", "render.json", "catalog/hdris/hdris.parquet"}  # the kind marker first
    for s in ("render-00000", "render-00001"):
        want |= {f"shards/{s}.tar", f"shards/{s}.parquet", f"shards/{s}.stats.json", f"catalog/frames/{s}.parquet",
                 f"catalog/scans/anny-{s}.parquet", f"contact/{s}.png"}
    assert names == want, names ^ want  # no staging, no attempt marker, no lock left, no temporary file
    store = st.open_storage(out)
    assert store.read_json("shards/render-00000.stats.json")["rendered"] == 1
    manifest = store.read_bytes("render.json").decode()
    assert json.loads(manifest)["out"] == out
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in manifest + p.stdout + p.stderr


def test_frames_read_back_from_s3(s3_render, tmp_path):
    out, cwd, scratch, _ = s3_render
    con = catalog.connect(out)  # the views read the remote catalog parts through the storage layer
    rows = con.sql("SELECT frame_index, shard, error, person_px FROM frames ORDER BY frame_index").fetchall()
    assert [(r[0], r[1], r[2]) for r in rows] == [(0, "render-00000.tar", None), (1, "render-00001.tar", None)]
    assert con.sql("SELECT count(*) FROM scans WHERE format = 'anny'").fetchall()[0][0] == 2
    p = _humanset(["render", "export", out, "--format", "sapiens", "--to", str(tmp_path / "sapiens"),
                   "--normal-frame", "opencv", "--no-progress"], cwd, scratch)
    assert p.returncode == 0, p.stderr[-3000:]
    assert _result(p.stdout)["frames"] == 2
    for (i, _, _, person_px) in rows:
        mask = load_png((tmp_path / "sapiens" / "masks" / f"{i:08d}.png").read_bytes())
        depth = load_npy((tmp_path / "sapiens" / "depths" / f"{i:08d}.npy").read_bytes())
        assert int((mask > 0).sum()) == person_px > 100 and np.array_equal(depth > 0, mask > 0)
    assert list(cwd.iterdir()) == []


def test_a_rerun_finds_every_shard_done(s3_render):
    out, cwd, scratch, _ = s3_render
    store = st.open_storage(out)
    before = {e.path: store.read_bytes(e.path) for e in store.list("shards")}
    p = _render(out, cwd, scratch)  # a new process: the first run's lock object was released at its exit
    assert p.returncode == 0, p.stderr[-3000:]
    assert "2 shards, 0 to render" in p.stderr
    assert {e.path: store.read_bytes(e.path) for e in store.list("shards")} == before  # nothing rewritten
    assert ".lock" not in {e.path for e in store.list()}


def test_a_restarted_worker_finds_the_attempt_marker_on_s3(s3_server, tmp_path, monkeypatch):
    """The attempt marker of a frame whose worker died is an object on OUT (the frames' local scratch
    folder may be on another node): a worker finding it at the attempt limit fails the frame."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the scratch folder, to see it removed
    cfg = load_config(sets=TINY)
    spec = jobmod.prepare_run(s3_server.prefix("crash"), "anny", "builtin", 1, 3, cfg)
    store = st.open_storage(spec.out)
    try:
        assert ".lock" in {e.path for e in store.list()}  # held by this process
        marker = "staging/render-00000/00000000.attempt.json"
        store.write_json(marker, {"attempts": cfg.schedule.max_frame_attempts, "scan_id": None})
        (stats,) = jobmod.run_local(spec, progress=False)
        assert stats["errors"] == {"00000000": "blender_crash"} and stats["rendered"] == 0
    finally:
        jobmod.release_run(spec.out)
    names = {e.path for e in store.list()}
    assert marker not in names and ".lock" not in names
    assert {"shards/render-00000.stats.json", "catalog/frames/render-00000.parquet"} <= names
    assert list(tmp_path.iterdir()) == []


def test_a_render_and_its_export_through_a_faulty_store_equal_the_clean_ones(s3_render, s3_server, tmp_path):
    """The same render with every request through tests/faultstore.py (503 SlowDown, cut bodies, resets,
    lost acknowledgements): the same objects, the same frames, the same exported masks and depths."""
    out, cwd, scratch, _ = s3_render
    faulty = s3_server.prefix("render-faults")
    quick = ["--set", "storage.retry_first_wait_s=0.02", "--set", "storage.retry_max_wait_s=0.5"]
    with through(s3_server.endpoint, seed=21, slowdown=0.15, cut=0.1, lost_ack=0.1, reset=0.03) as fs:
        p = _render(faulty, cwd, scratch, *quick)
        assert p.returncode == 0, p.stderr[-3000:]
        e = _humanset(["render", "export", faulty, "--format", "sapiens", "--to", str(tmp_path / "faulty"),
                       "--normal-frame", "opencv", "--no-progress"], cwd, scratch)
        assert e.returncode == 0, e.stderr[-3000:]
    assert fs.counts["slowdown"] and fs.counts["lost_ack"] and fs.counts["cut"] + fs.counts["reset"], fs.counts
    assert {x.path for x in st.open_storage(faulty).list()} == {x.path for x in st.open_storage(out).list()}
    # what a frame is (its scan, light, camera, body: a pure function of seed and index) and what its
    # shard holds; Cycles' pixels, and so the members' sizes, may differ from one render to the next
    cols = "key, shard, frame_index, scan_id, hdri_id, height, width, params, K, cam_to_world, error, " \
           "list_transform(members, lambda m: m.name) AS names"
    frames = [catalog.connect(r).sql(f"SELECT {cols} FROM frames ORDER BY frame_index").fetchall() for r in (out, faulty)]
    assert frames[0] == frames[1] and len(frames[0]) == 2
    p = _humanset(["render", "export", out, "--format", "sapiens", "--to", str(tmp_path / "clean"),
                   "--normal-frame", "opencv", "--no-progress"], cwd, scratch)
    assert p.returncode == 0, p.stderr[-3000:]
    clean = sorted(f.relative_to(tmp_path / "clean") for f in (tmp_path / "clean").rglob("*") if f.is_file())
    assert sorted(f.relative_to(tmp_path / "faulty") for f in (tmp_path / "faulty").rglob("*") if f.is_file()) == clean
    px = dict(catalog.connect(faulty).sql("SELECT frame_index, person_px FROM frames").fetchall())
    for i, person_px in px.items():  # the exported files are the faulty run's own frames, whole
        mask = load_png((tmp_path / "faulty" / "masks" / f"{i:08d}.png").read_bytes())
        depth = load_npy((tmp_path / "faulty" / "depths" / f"{i:08d}.npy").read_bytes())
        assert int((mask > 0).sum()) == person_px > 100 and np.array_equal(depth > 0, mask > 0)
    assert list(cwd.iterdir()) == []
