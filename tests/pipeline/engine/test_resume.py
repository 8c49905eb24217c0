"""kill -9 the driver mid-run, rerun the same command: the catalog equals a clean run's."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import catalog
from pipeline.config import load_config
from pipeline.engine.driver import curate

ROOT = Path(__file__).resolve().parents[3]
UNITS = 12


@pytest.fixture(scope="module")
def crawl(tmp_path_factory):
    from pipeline.demo.crawl import photo_like, write_webdataset
    folder = tmp_path_factory.mktemp("resume") / "crawl"
    samples = []
    for i in range(UNITS * 5):
        seed = i if i % 7 else i // 2  # every 7th repeats an earlier image: duplicates across units
        samples.append((f"{i:06d}", "jpg", photo_like(480, 360, seed), f"sample {i}"))
    write_webdataset(folder, samples, per_shard=5)
    return folder


def _catalog(run):
    con = catalog.connect(run)
    rows = con.sql("SELECT * FROM samples ORDER BY sample_id").to_arrow_table()
    shards = sorted(tuple(r) for r in con.execute("SELECT key, sample_id, sha256 FROM shards").fetchall())
    return rows, shards


def _driver(crawl, run, executor):
    cmd = [sys.executable, str(ROOT / "pipeline" / "curate.py"), "--input", str(crawl), "--output", str(run),
           "--no-progress", "--set", "ray.num_cpus=2", "--set", "stages=[decode,size,dedup]",
           "--set", f"engine.executor={executor}"]
    return subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def clean(crawl, ray_local, tmp_path_factory):
    run = tmp_path_factory.mktemp("resume") / "clean"
    curate([str(crawl)], str(run), load_config(sets=["ray.num_cpus=2", "stages=[decode,size,dedup]"]),
           progress=False)
    return _catalog(run)


# one phase on each executor (the clean run is on Ray: the in-process Ray of the session); the local
# executor's own kill tests are in test_local.py
@pytest.mark.parametrize("kill_when, executor", [("measure", "ray"), ("stats", "local")])
@pytest.mark.e2e
def test_kill_minus_9_then_resume_equals_clean_run(crawl, clean, tmp_path, kill_when, executor):
    run = tmp_path / "crashed"
    folder = run / ("work/measure" if kill_when == "measure" else "stats")
    p = _driver(crawl, run, executor)
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None and len(list(folder.glob("*"))) < 2:
        time.sleep(0.02)
    assert p.poll() is None, f"the run ended before it could be killed: {p.stderr.read()[-2000:]}"
    os.killpg(p.pid, signal.SIGKILL)  # the driver and its Ray or worker processes, like a lost machine
    p.wait()
    done = len(list((run / "stats").glob("*.json")))
    assert done < UNITS, "killed after the end: nothing to resume"
    p = _driver(crawl, run, executor)
    assert p.wait(timeout=600) == 0, p.stderr.read()[-3000:]
    a, b = clean, _catalog(run)
    assert a[0].num_rows == UNITS * 5
    assert a[0].equals(b[0]), "resumed catalog differs from the clean run's"
    assert a[1] == b[1], "resumed curated shards differ from the clean run's"
    assert not list(run.rglob(".*.tmp-*")), "temporary files left behind"
    assert catalog.read_json(run / "manifest.json")["status"] == "complete"


def test_a_manifest_from_before_a_new_setting_still_resumes():
    """A run written before a setting existed resumes (the setting at its default reproduces it);
    a setting that differs still refuses the resume."""
    import copy
    from pipeline.config import with_defaults
    cfg = load_config(sets=["ray.num_cpus=2", "stages=[decode,size,dedup]"])
    old = copy.deepcopy(cfg)
    del old["engine"]["keep_work"]
    assert old != cfg and with_defaults(old) == cfg
    old["engine"]["window_units"] = cfg["engine"]["window_units"] + 1
    assert with_defaults(old) != cfg
