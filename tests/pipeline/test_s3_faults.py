"""A run on an object store that throttles, cuts bodies, resets connections and loses
acknowledgements (tests/faultstore.py in front of the SeaweedFS fixture), as the issue tried it:
`humanset curate --input s3://.../crawl/ --output s3://.../rN --set 'stages=[decode,size,dedup]'` on
a crawl of 6 shards, every request of the driver and its workers through the proxy. The run exits 0
with a catalog and curated shards equal to a clean run's and no object besides the clean run's;
`select`, `stats`, `report` and `calibrate` through the same proxy give what they give on the clean run; the
retries are counted in the markers, the manifest and `humanset stats`. A wrong secret or a missing
bucket ends the command in one line, exit 3, without a retry loop."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import catalog
from catalog import storage as st
from faultstore import through

ROOT = Path(__file__).resolve().parents[2]
RATES = dict(slowdown=0.1, cut=0.05, lost_ack=0.05, reset=0.02)
QUICK = ["--set", "storage.retry_first_wait_s=0.02", "--set", "storage.retry_max_wait_s=0.5"]


def _cli(*args, cwd, timeout=900):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-m", "humanset.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def _curate(inp, run, cwd, *extra):
    return _cli("curate", "--input", inp, "--output", run, "--no-progress", "--set", "ray.num_cpus=2",
                "--set", "stages=[decode,size,dedup]", *extra, cwd=cwd)


def _catalog(run):
    con = catalog.connect(run)
    rows = con.sql("SELECT * FROM samples ORDER BY sample_id").to_arrow_table()
    shards = sorted(tuple(r) for r in con.execute("SELECT key, sample_id, sha256 FROM shards").fetchall())
    return rows, shards


@pytest.fixture(scope="module")
def runs(s3_server, tmp_path_factory):
    """The crawl (6 shards of 8 images) on S3, curated once straight to the store and once through the
    faulty proxy (seed 11): (store, input URI, clean RUN, faulty RUN, cwd, faulty run's process, proxy counts)."""
    from pipeline.demo.crawl import demo_samples, write_webdataset
    folder = tmp_path_factory.mktemp("crawl")
    store = st.open_storage(s3_server.prefix("faults"))
    for t in write_webdataset(folder, demo_samples(), per_shard=8):
        store.write_bytes(f"crawl/{t.name}", t.read_bytes())
    cwd = tmp_path_factory.mktemp("cwd")
    inp, clean, faulty = store.uri_of("crawl") + "/", store.uri_of("runs/clean"), store.uri_of("runs/r11")
    # the clean run on Ray, the faulty one as `auto` runs it (6 shards: the local executor); their
    # catalogs and shards must be equal across the two executors
    p = _curate(inp, clean, cwd, "--set", "engine.executor=ray")
    assert p.returncode == 0, p.stderr[-3000:]
    with through(s3_server.endpoint, seed=11, **RATES) as fs:
        # the random faults land where the requests' timing puts them (about 1 run in 100 met no cut):
        # one cut body of an input shard and one lost acknowledgement of a write are aimed as well
        fs.once("GET", "/crawl/", "cut")
        fs.once("PUT", "/runs/r11/", "lost_ack")
        p = _curate(inp, faulty, cwd, *QUICK)
        counts = dict(fs.counts)
    assert p.returncode == 0, p.stderr[-3000:]
    return store, inp, clean, faulty, cwd, p, counts


def test_a_run_through_a_faulty_store_equals_a_clean_one_and_leaves_nothing_else(runs):
    store, _, clean, faulty, cwd, p, counts = runs
    assert counts["slowdown"] and counts["lost_ack"] and counts["cut"], counts  # the faults did happen
    assert "Traceback" not in p.stderr and list(cwd.iterdir()) == []
    rows, shards = _catalog(faulty)
    rows_c, shards_c = _catalog(clean)
    assert rows.num_rows == 48 and rows.equals(rows_c) and shards == shards_c
    names = {e.path for e in st.open_storage(faulty).list()}
    assert names == {e.path for e in st.open_storage(clean).list()}  # no lock, probe or stray object
    import boto3
    s3 = boto3.session.Session().client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    prefix = faulty.split("/", 3)[3] + "/"
    assert not s3.list_multipart_uploads(Bucket=store.bucket, Prefix=prefix).get("Uploads")  # none left open


def test_the_retries_are_counted_in_the_markers_the_manifest_and_stats(runs):
    _, _, _, faulty, cwd, _, counts = runs
    r = st.open_storage(faulty)
    manifest = r.read_json("manifest.json")
    got = manifest["store"]
    assert got["retries"] > 0 and got["throttled"] > 0 and got["requests"] > got["retries"], got
    assert got["gave_up"] == 0 and sum(got["retries_for"].values()) == got["retries"]
    markers = [r.read_json(e.path) for e in r.list("stats")]
    assert len(markers) == 6 and all("store" in m for m in markers)
    assert sum(m["store"]["retries"] for m in markers) <= got["retries"]
    p = _cli("stats", faulty, cwd=cwd)
    assert p.returncode == 0, p.stderr[-2000:]
    line = next(x for x in p.stdout.splitlines() if x.strip().startswith("store:"))
    assert f"{got['requests']:,} requests, {got['retries']:,} retried" in line and "throttled" in line


def test_select_stats_and_report_through_a_faulty_store_give_what_they_give_on_a_clean_one(runs, s3_server):
    store, _, clean, faulty, cwd, _, _ = runs
    ids = [r[0] for r in catalog.connect(clean).execute("SELECT sample_id FROM samples ORDER BY sample_id").fetchall()]
    labels = cwd.parent / "labels.csv"  # calibrate's labels and curves are local files: not in cwd, which stays empty
    labels.write_text("sample_id,label\n" + "".join(f"{sid},text={i % 2}\n" for i, sid in enumerate(ids[:8])))
    sel = ("select", "--set", "size.min_short_side=400", "--no-progress")
    p = _cli(*sel[:1], clean, *sel[1:], "--output", store.uri_of("sel/clean"), cwd=cwd)
    assert p.returncode == 0, p.stderr[-3000:]
    with through(s3_server.endpoint, seed=12, **RATES) as fs:
        p = _cli(*sel[:1], faulty, *sel[1:], *QUICK, "--output", store.uri_of("sel/r11"), cwd=cwd)
        assert p.returncode == 0, p.stderr[-3000:]
        stats = _cli("stats", faulty, "--json", cwd=cwd)
        report = _cli("report", faulty, "--thumbs", "2", cwd=cwd)
        cal = _cli("calibrate", faulty, "--labels", str(labels), "--out", str(labels.with_suffix(".png")), cwd=cwd)
    assert fs.counts["slowdown"] + fs.counts["cut"] + fs.counts["reset"] + fs.counts["lost_ack"] > 0, fs.counts
    rows, shards = _catalog(store.uri_of("sel/r11"))
    rows_c, shards_c = _catalog(store.uri_of("sel/clean"))
    assert rows.equals(rows_c) and shards == shards_c
    assert stats.returncode == 0, stats.stderr[-2000:]
    clean_stats = json.loads(_cli("stats", clean, "--json", cwd=cwd).stdout)
    got = json.loads(stats.stdout)
    for k in ("totals", "funnel", "reasons", "curated"):
        assert got[k] == clean_stats[k], k
    for d in (got, clean_stats):  # arg_max over clusters of one size: any of them, in scan order
        d["duplicates"].pop("largest_canonical")
    assert got["duplicates"] == clean_stats["duplicates"]
    assert report.returncode == 0, report.stderr[-2000:]
    assert st.open_storage(faulty).exists("report.html")
    assert cal.returncode == 0, cal.stderr[-2000:]
    clean_cal = _cli("calibrate", clean, "--labels", str(labels), "--out", str(labels.with_suffix(".png")), cwd=cwd)
    # the run scored no text (stages decode, size, dedup): every labelled id was found in its catalog, none scored
    assert cal.stdout == clean_cal.stdout and "8 not scored by the stage, 0 not in the run" in cal.stdout


def test_a_wrong_secret_or_a_missing_bucket_is_one_line_exit_3_and_no_retry_loop(runs, s3_server, monkeypatch):
    store, inp, _, _, cwd, _, _ = runs
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-" + s3_server.secret_key[::-1])
    t0 = time.monotonic()
    p = _curate(inp, store.uri_of("runs/denied"), cwd)
    assert p.returncode == 3, p.stderr[-2000:]
    err = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith(f"humanset curate: error: {inp.rstrip('/')}: "), p.stderr[-2000:]
    assert "SignatureDoesNotMatch" in err[0] and "AWS_SECRET_ACCESS_KEY" in err[0]
    assert s3_server.secret_key not in p.stderr and os.environ["AWS_SECRET_ACCESS_KEY"] not in p.stderr
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    missing = f"s3://no-such-bucket-{os.urandom(3).hex()}/crawl/"
    p = _curate(missing, store.uri_of("runs/nobucket"), cwd)
    assert p.returncode == 3, p.stderr[-2000:]
    err = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(err) == 1 and "no such bucket (NoSuchBucket); create s3://no-such-bucket-" in err[0], err
    for cmd in (["stats", missing + "runs/r1"],  # a listing, and a GET (the manifest): each a 404 NoSuchBucket
                ["select", missing + "runs/r1", "--set", "size.min_short_side=400", "--output", missing + "sel"]):
        p = _cli(*cmd, cwd=cwd)
        err = [x for x in p.stderr.splitlines() if x.strip()]
        assert p.returncode == 3 and len(err) == 1 and "NoSuchBucket" in err[0], p.stderr[-2000:]
    assert time.monotonic() - t0 < 120  # four commands refused at once, none waiting out a retry policy
