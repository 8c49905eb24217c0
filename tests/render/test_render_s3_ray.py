"""`humanset render --ray --output s3://...` against a real S3 server (SeaweedFS on 127.0.0.1): the run
lock of an OUT on S3 refuses a second render while its holder's heartbeat is fresh (even with
--force-unlock), refuses a stale one without --force-unlock, and a render on Ray actors forced onto
the stale lock takes it over loudly and writes every output to S3 from the actors, nothing locally."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.blender

pytest.importorskip("bpy", reason="render tests need the Blender wheel: pip install -r deps/render.pip.txt")
pytest.importorskip("anny", reason="render tests need anny: pip install -r deps/render.pip.txt")

import catalog  # noqa: E402
from catalog import storage as st  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = ["sampling.camera.height=96", "sampling.camera.width=72", "cycles.samples=4", "cycles.device=cpu",
        "cycles.denoiser=null", "output.frames_per_shard=1"]
LOCK_MESSAGE = "another run is using this directory"

# a render that died holding OUT's lock: the lock object with a heartbeat that stops when it is killed
_HOLDER = """
import sys, time
from catalog.storage import open_storage
with open_storage(sys.argv[1]).run_lock(lease_s=1, heartbeat_s=0.25):
    print("held", flush=True)
    time.sleep(300)
"""


def _env(scratch, ray_tmp):
    return dict(os.environ, TMPDIR=str(scratch), RAY_TMPDIR=str(ray_tmp),
                PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))


def _render(out, cwd, scratch, ray_tmp, *extra, timeout=600):
    sets = [a for s in TINY for a in ("--set", s)]
    return subprocess.run([sys.executable, "-m", "humanset.cli", "render", "--frames", "2", "--output", out,
                           "--seed", "5", "--no-progress", *sets, *extra], env=_env(scratch, ray_tmp), cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def stale(s3_server, tmp_path_factory):
    """OUT on S3 with a lock whose holder is alive at first (`proc`), and folders to run renders in."""
    out = s3_server.prefix("render-lock")
    cwd, scratch = tmp_path_factory.mktemp("cwd"), tmp_path_factory.mktemp("scratch")
    ray_tmp = Path(tempfile.mkdtemp(prefix="hr-"))  # short: Ray's socket paths must fit 107 bytes
    env = _env(scratch, ray_tmp)
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, out], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout.readline().strip() == b"held"
        yield {"out": out, "cwd": cwd, "scratch": scratch, "ray_tmp": ray_tmp, "proc": proc}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_a_live_lock_refuses_a_render_even_forced_and_a_stale_one_needs_force_unlock(stale):
    out, cwd, scratch, ray_tmp = stale["out"], stale["cwd"], stale["scratch"], stale["ray_tmp"]
    time.sleep(1.5)  # past the 1 s lease: only the holder's heartbeat keeps its lock fresh
    p = _render(out, cwd, scratch, ray_tmp, "--ray", "--force-unlock", "--lock-lease", "1", timeout=120)
    assert p.returncode == 2 and LOCK_MESSAGE in p.stderr, p.stderr[-3000:]
    assert "pass --force-unlock" not in p.stderr and "TAKING OVER" not in p.stderr  # a live run is never taken
    stale["proc"].send_signal(signal.SIGKILL)  # the holder dies: nothing releases the lock
    stale["proc"].wait()
    time.sleep(2.5)  # its heartbeat ages past the lease
    p = _render(out, cwd, scratch, ray_tmp, "--ray", "--lock-lease", "1", timeout=120)
    assert p.returncode == 2 and LOCK_MESSAGE in p.stderr and "pass --force-unlock" in p.stderr, p.stderr[-3000:]
    names = {e.path for e in st.open_storage(out).list()}
    assert names == {".lock"}  # the refused renders wrote nothing: no manifest, no catalog


def test_a_forced_render_on_ray_actors_takes_the_stale_lock_and_writes_only_to_s3(stale):
    out, cwd, scratch, ray_tmp = stale["out"], stale["cwd"], stale["scratch"], stale["ray_tmp"]
    assert stale["proc"].poll() is not None, "runs after the test that leaves the lock stale"
    store = st.open_storage(out)
    dead_owner = store.read_json(".lock")["owner"]
    p = _render(out, cwd, scratch, ray_tmp, "--ray", "--workers", "1", "--cpus-per-worker", "1",
                "--force-unlock", "--lock-lease", "1")
    assert p.returncode == 0, p.stderr[-4000:]
    assert "TAKING OVER a stale run lock" in p.stderr and dead_owner in p.stderr
    result = json.loads([line for line in p.stdout.splitlines() if line.startswith("{")][-1])
    assert result == {"frames": 2, "rendered": 2, "failed": 0, "shards_done": 2, "shards": 2}
    names = {e.path for e in store.list()}
    want = {".humanset.json", "render.json", "catalog/hdris/hdris.parquet"}  # the kind marker first
    for s in ("render-00000", "render-00001"):
        want |= {f"shards/{s}.tar", f"shards/{s}.parquet", f"shards/{s}.stats.json", f"catalog/frames/{s}.parquet",
                 f"catalog/scans/anny-{s}.parquet", f"contact/{s}.png"}
    assert names == want, names ^ want  # the actors wrote shards and markers; the lock was released
    assert list(cwd.iterdir()) == []  # nothing where the command ran
    assert [x for x in scratch.rglob("*") if "humanset-render" in str(x)] == []  # the actors' staging removed
    con = catalog.connect(out)
    assert con.sql("SELECT frame_index, error FROM frames ORDER BY 1").fetchall() == [(0, None), (1, None)]
    tars = {t: store.size(f"shards/{t}") for t in catalog.list_shard_names(store.uri_of("shards"))}
    assert sorted(tars) == ["render-00000.tar", "render-00001.tar"] and min(tars.values()) > 10_000
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in p.stdout + p.stderr + store.read_bytes("render.json").decode()
