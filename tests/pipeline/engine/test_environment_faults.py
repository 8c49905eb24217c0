"""Faults of the environment end a run in one line (exit status 3) and a rerun resumes: a RUN on a
file system that fills up, or one mounted read-only. Real file systems: a small tmpfs (needs root,
as CI runs; elsewhere the tests say why they skip)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import catalog
from pipeline.config import load_config
from pipeline.engine.driver import curate

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[3]
CHEAP = ["stages=[decode,size,dedup]", "ray.num_cpus=2", "engine.executor=ray"]  # on Ray; the local executor's
# line is compared with Ray's in tests/pipeline/engine/test_local.py


def _curate(crawl, run, *sets):
    cmd = [sys.executable, str(ROOT / "pipeline" / "curate.py"), "--input", str(crawl), "--output", str(run),
           "--no-progress"]
    for s in [*CHEAP, *sets]:
        cmd += ["--set", s]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def tmpfs(tmp_path):
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a small tmpfs (CI runs as root)")
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)]).returncode:
        pytest.skip("mount -t tmpfs is not permitted in this container")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)])


def _crawl(folder, n=24):
    from pipeline.demo.crawl import photo_like
    folder.mkdir()
    for i in range(n):  # ~24 x 160 KB of curated bytes: more than the 1 MB file system holds
        (folder / f"{i:03d}.jpg").write_bytes(photo_like(720, 540, 900 + i))
    return folder


def _error_lines(stderr):
    return [x for x in stderr.splitlines() if x.startswith("humanset curate: error")]


def test_no_space_left_ends_in_one_line_and_the_moved_run_resumes(tmp_path, tmpfs, ray_local):
    crawl = _crawl(tmp_path / "crawl")
    run = tmpfs / "run"
    p = _curate(crawl, run, "input.files_per_unit=4")
    assert p.returncode == 3, p.stderr[-3000:]
    (line,) = _error_lines(p.stderr)
    assert "no space left on device" in line and "free space on" in line and "rerun the same command" in line
    assert "Traceback" not in p.stderr and "RayTaskError" not in p.stderr
    # moved to a disk with room, the same command finishes it; the catalog equals a clean run's
    moved = tmp_path / "moved"
    shutil.copytree(run, moved)
    p = _curate(crawl, moved, "input.files_per_unit=4")
    assert p.returncode == 0, p.stderr[-3000:]
    # the clean run it must equal needs no child process of its own: the session Ray curates it
    clean = tmp_path / "clean"
    curate([str(crawl)], str(clean), load_config(sets=[*CHEAP, "input.files_per_unit=4"]), progress=False)

    def table(r):
        t = catalog.connect(r).sql("SELECT * FROM samples").to_arrow_table()
        return t.sort_by("sample_id")
    assert table(moved).equals(table(clean))
    assert json.loads((moved / "manifest.json").read_text())["counts"] == \
        json.loads((clean / "manifest.json").read_text())["counts"]


def test_a_read_only_run_directory_ends_in_one_line(tmp_path, tmpfs):
    crawl = _crawl(tmp_path / "crawl", 2)
    assert subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)]).returncode == 0
    p = _curate(crawl, tmpfs / "run")
    assert p.returncode == 3, p.stderr[-3000:]
    (line,) = _error_lines(p.stderr)
    assert "read-only file system" in line and str(tmpfs) in line and "Traceback" not in p.stderr
