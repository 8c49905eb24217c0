"""A RUN on a real S3 server (SeaweedFS on 127.0.0.1): every file of the run is an object there and
nothing of it is on local disk; a rerun resumes from one listing per phase; the run lock is an
object created with If-None-Match (a second run is refused with the local message, a stale lock
is taken over only with --force-unlock, said loudly); no credential in the manifest or the output."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import catalog
from catalog import storage as st

ROOT = Path(__file__).resolve().parents[3]


def _curate(inp, run, cwd, *extra, timeout=600):
    cmd = [sys.executable, str(ROOT / "pipeline" / "curate.py"), "--input", inp, "--output", run, "--no-progress",
           "--set", "ray.num_cpus=2", "--set", "stages=[decode,size,dedup]", *extra]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def s3_run(s3_server, demo_crawl, tmp_path_factory):
    folder, samples = demo_crawl
    store = st.open_storage(s3_server.prefix("run"))
    for t in sorted(folder.glob("*.tar")):
        store.write_bytes(f"crawl/{t.name}", t.read_bytes())
    cwd = tmp_path_factory.mktemp("cwd")
    inp, run = store.uri_of("crawl") + "/", store.uri_of("runs/r1")
    p = _curate(inp, run, cwd)
    assert p.returncode == 0, p.stderr[-3000:]
    return store, inp, run, cwd, p, len(samples), len(list(folder.glob("*.tar")))


def test_every_file_of_the_run_is_on_s3_and_none_on_local_disk(s3_run, s3_server):
    store, _, run, cwd, p, n_samples, n_shards = s3_run
    assert list(cwd.iterdir()) == []  # nothing written where the command ran
    r = st.open_storage(run)
    names = {e.path for e in r.list()}
    assert {"manifest.json", "units.jsonl", "work/dedup/_done.json"} <= names
    assert sum(n.startswith("stats/") for n in names) == n_shards
    assert sum(n.startswith("work/measure/") for n in names) == n_shards
    scratch = ("work/dedup/pairs/", "work/dedup/dist/", "work/fallback/", "work/scored/")  # removed once complete
    assert not [n for n in names if n.startswith(scratch)]
    assert sum(n.startswith("catalog/samples/") for n in names) == n_shards
    assert ".lock" not in names  # released at the end
    assert not any(".tmp-" in n for n in names)
    tars = [n for n in names if n.startswith("shards/") and n.endswith(".tar")]
    assert tars and all(n[:-4] + ".parquet" in names for n in tars)
    con = catalog.connect(run)  # the views read the remote parts through the storage layer
    n, kept = con.execute("SELECT count(*), sum(keep::int) FROM samples").fetchone()
    assert n == n_samples and kept > 0
    assert con.execute("SELECT count(*) FROM shards").fetchone()[0] == kept
    marker = r.read_json(f"stats/{sorted(n for n in names if n.startswith('stats/'))[0][6:]}")
    assert marker["finished"] and "node_id" in marker
    manifest = r.read_bytes("manifest.json").decode()
    assert json.loads(manifest)["status"] == "complete"
    secret, key = s3_server.secret_key, s3_server.access_key
    for text in (manifest, p.stdout, p.stderr):
        assert secret not in text and key not in text


def test_a_rerun_resumes_from_the_markers_and_changes_nothing(s3_run):
    store, inp, run, cwd, _, n_samples, n_shards = s3_run
    r = st.open_storage(run)
    before = {e.path: e.size for e in r.list("catalog")}
    marker = r.read_bytes("stats/" + next(iter(sorted(e.path for e in r.list("stats"))))[6:])
    p = _curate(inp, run, cwd)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"{n_shards} units: {n_shards} done, 0 to measure, 0 to write" in p.stderr
    assert {e.path: e.size for e in r.list("catalog")} == before
    assert r.read_bytes("stats/" + next(iter(sorted(e.path for e in r.list("stats"))))[6:]) == marker


def test_a_held_lock_refuses_a_second_run_and_a_stale_one_needs_force_unlock(s3_run, tmp_path):
    store, inp, _, cwd, _, _, _ = s3_run
    run = store.uri_of("runs/locked")
    r = st.open_storage(run)
    body = json.dumps({"owner": "elsewhere:1:abc", "host": "elsewhere", "pid": 1, "lease_s": 1,
                       "heartbeat_utc": "2026-12-01T00:00:00Z"}).encode()
    assert r.create_once(".lock", body)
    t0 = time.monotonic()
    p = _curate(inp, run, cwd)
    assert p.returncode == 2 and time.monotonic() - t0 < 60
    assert "another run is using this directory" in p.stderr and "Traceback" not in p.stderr
    assert not r.exists("manifest.json") and not r.exists("units.jsonl")  # nothing touched
    time.sleep(2.5)  # older than both leases (ours 2 s, the holder's 1 s): stale, taken only when forced
    p = _curate(inp, run, cwd, "--lock-lease", "2")
    assert p.returncode == 2 and "--force-unlock" in p.stderr, p.stderr[-2000:]
    p = _curate(inp, run, cwd, "--lock-lease", "2", "--force-unlock")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "TAKING OVER a stale run lock" in p.stderr and "elsewhere:1:abc" in p.stderr
    assert not r.exists(".lock")
    assert pq.read_table(r.fs_path("catalog/samples"), filesystem=r.fs).num_rows > 0


def _cli(*args, cwd=None, timeout=300):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-m", "humanset.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def test_stats_query_and_report_read_a_run_on_s3(s3_run, tmp_path):
    store, _, run, _, _, n_samples, n_shards = s3_run
    p = _cli("stats", run, "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    stats = json.loads(p.stdout)
    assert stats["totals"]["inputs"] == n_samples and stats["totals"]["units"] == n_shards
    assert stats["run"]["has_manifest"] and stats["curated"]["samples"] == stats["totals"]["kept"]
    p = _cli("query", run, "SELECT count(*) AS n FROM samples WHERE keep", "--out", str(tmp_path / "q.csv"),
             cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (tmp_path / "q.csv").read_text().split() == ["n", str(stats["totals"]["kept"])]
    p = _cli("report", run, "--thumbs", "2", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    html = st.open_storage(run).read_bytes("report.html").decode()
    assert "humanset run report" in html and html.count("data:image/jpeg;base64") >= 2  # kept thumbs from S3 shards
    assert sorted(x.name for x in tmp_path.iterdir()) == ["q.csv"]


def test_select_recuts_a_run_on_s3_into_another_on_s3(s3_run, tmp_path):
    store, _, run, _, _, n_samples, _ = s3_run
    out = store.uri_of("runs/r1-strict")
    p = _cli("select", run, "--set", "size.min_short_side=500", "--output", out, "--no-progress", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    con = catalog.connect(out)
    n, kept = con.execute("SELECT count(*), sum(keep::int) FROM samples").fetchone()
    was = catalog.connect(run).execute("SELECT sum(keep::int) FROM samples").fetchone()[0]
    assert n == n_samples and 0 < kept < was
    assert con.execute("SELECT count(*) FROM shards").fetchone()[0] == kept  # bytes copied into S3 shards
    assert list(tmp_path.iterdir()) == []


def test_select_reclusters_partitioned_on_s3_as_in_one_process(s3_run, tmp_path):
    """A size change re-clusters: the candidate and verdict files are objects of the new run, and
    the partitioned dedup (forced, 10 kB of room a task) gives the catalog the in-process one does."""
    from pipeline.dedup.ranges import TASK_BASE_BYTES
    store, _, run, _, _, _, n_shards = s3_run
    outs = {}
    for name, extra in (("one", ["dedup.partitioned=false"]),
                        ("part", ["dedup.partitioned=true", f"dedup.task_memory={TASK_BASE_BYTES + 10_000}"])):
        outs[name] = store.uri_of(f"runs/r1-{name}")
        sets = [x for s in ["size.min_short_side=300", *extra] for x in ("--set", s)]
        p = _cli("select", run, *sets, "--output", outs[name], "--no-progress", cwd=tmp_path)
        assert p.returncode == 0, p.stderr[-3000:]
    done = json.loads(store.read_bytes("runs/r1-part/work/dedup/_done.json"))
    assert done["components"] == "distributed" and done["partitions"] > 1
    assert sum(1 for _ in store.list("runs/r1-part/work/measure", suffix=".parquet")) == n_shards
    q = "SELECT * FROM samples ORDER BY sample_id"
    assert catalog.connect(outs["part"]).sql(q).to_arrow_table().equals(
        catalog.connect(outs["one"]).sql(q).to_arrow_table())
    assert list(tmp_path.iterdir()) == []  # nothing of either run on local disk
