"""What a finished RUN holds: our declared columns only, every unit accounted for, a junk shard and
a stage list without dedup included; the driver hands out units in windows."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import catalog
from catalog.schema import SCHEMAS
from pipeline.config import load_config
from pipeline.engine.driver import curate

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[3]


def _curate(crawl, run, *sets, timeout=600):
    cmd = [sys.executable, str(ROOT / "pipeline" / "curate.py"), "--input", str(crawl), "--output", str(run),
           "--no-progress", "--set", "ray.num_cpus=2", "--set", "engine.executor=ray"]  # Ray Data's path (a run
    # this small would run without Ray: tests/pipeline/engine/test_local.py)
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def junk_run(tmp_path_factory):
    """Three valid shards of the demo crawl, 5 KB of random bytes named .tar and an empty tar,
    through the cheap path in windows of two units."""
    from pipeline.demo.crawl import demo_samples, write_webdataset
    root = tmp_path_factory.mktemp("junk")
    crawl = root / "crawl"
    write_webdataset(crawl, demo_samples())
    (crawl / "junk.tar").write_bytes(os.urandom(5000))
    (crawl / "empty.tar").write_bytes(b"\0" * 10240)
    run = root / "run"
    p = _curate(crawl, run, "stages=[decode,size,dedup]", "engine.window_units=2")
    assert p.returncode == 0, p.stderr[-3000:]
    return crawl, run, p


def test_a_junk_shard_and_an_empty_one_never_stop_the_run(junk_run):
    crawl, run, p = junk_run
    assert "Traceback" not in p.stderr
    markers = {m.stem: json.loads(m.read_text()) for m in (run / "stats").glob("*.json")}
    assert set(markers) == {"00000", "00001", "00002", "junk", "empty"}
    assert markers["junk"]["inputs"] == 0 and markers["junk"]["unit_error"]
    assert markers["empty"]["inputs"] == 0
    assert all(m["node_id"] for m in markers.values())  # the Ray node each unit ran on
    con = catalog.connect(run)
    n, kept = con.execute("SELECT count(*), sum(keep::int) FROM samples").fetchone()
    from pipeline.demo.crawl import demo_samples
    assert n == len(demo_samples()) and kept > 0  # every member of the good shards, curated
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["units"] == 5


def test_every_parquet_file_of_a_run_has_only_declared_columns(junk_run):
    """Nothing of Ray Data's bookkeeping (__fragment_index, __filename, ...) or of our stage-to-stage
    columns reaches a file: each file names its schema, and holds exactly that schema's columns."""
    _, run, _ = junk_run
    files = list(run.rglob("*.parquet"))
    kinds = set()
    for f in files:
        schema = pq.read_schema(f)
        name = (schema.metadata or {}).get(b"humanset.schema", b"").decode()
        assert name in SCHEMAS, f"{f.relative_to(run)}: no declared schema ({schema.names})"
        assert schema.names == SCHEMAS[name].names, f"{f.relative_to(run)}: {schema.names}"
        kinds.add(name)
    assert {"samples", "curated_index", "measure", "verdicts"} <= kinds, kinds


def test_a_stage_list_without_dedup_runs_and_a_broken_one_is_refused_in_one_line(tmp_path, ray_local):
    from pipeline.demo.crawl import photo_like
    crawl = tmp_path / "crawl"
    crawl.mkdir()
    for i in range(3):
        (crawl / f"{i}.jpg").write_bytes(photo_like(400, 320, 700 + i))
    (crawl / "3.jpg").write_bytes((crawl / "0.jpg").read_bytes())  # an exact copy: kept, nothing dedups
    # the run on the session Ray (no child process needed); the refusal below is the CLI's exit status
    curate([str(crawl)], str(tmp_path / "run"), load_config(sets=["stages=[decode,size]"]), progress=False)
    n, kept = catalog.connect(tmp_path / "run").execute("SELECT count(*), sum(keep::int) FROM samples").fetchone()
    assert (n, kept) == (4, 4)
    p = _curate(crawl, tmp_path / "run2", "stages=[size,decode]")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    lines = [x for x in p.stderr.splitlines() if "error" in x]
    assert len(lines) == 1 and "starts with decode" in lines[0], p.stderr


def test_the_closing_counts_come_from_the_markers_and_match_the_catalog(junk_run):
    """The driver sums the units' markers (no scan of the catalog's parts): the same counts as
    DuckDB over the catalog, reject reasons included, and the CLI prints them."""
    crawl, run, p = junk_run
    manifest = json.loads((run / "manifest.json").read_text())
    con = catalog.connect(run)
    want = dict(con.execute("SELECT reject_reason, count(*) FROM samples WHERE reject_reason IS NOT NULL "
                            "GROUP BY 1").fetchall())
    assert want and manifest["reject_reasons"] == want
    n, kept = con.execute("SELECT count(*), sum(keep::int) FROM samples").fetchone()
    assert manifest["counts"] == {"inputs": n, "kept": kept}
    top = max(want, key=want.get)
    assert f"{want[top]:>8}  {top}" in p.stdout  # the funnel's reject reasons, printed by curate
