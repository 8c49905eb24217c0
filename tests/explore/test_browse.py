"""`humanset browse` over HTTP, without a browser: filters, pages, counts, sample pages, images, labels,
and what it refuses (unknown ids, paths, other hosts and origins); on a local run and one on S3.
The browser tests are tests/explore/test_browse_chromium.py, the 10^6-row catalog test_browse_scale.py."""
from __future__ import annotations

import http.client
import json
import os
import urllib.parse
from pathlib import Path

import numpy as np
import pytest

import catalog
from explore.browse import cli as browse_cli
from explore.browse.labels import LabelError, Labels
from explore.browse.server import BrowseApp, start
from stats_run import make_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("browse")
    run_dir, rows = make_run(root, n=48)
    return run_dir, rows


@pytest.fixture
def served(run, tmp_path):
    run_dir, rows = run
    app = BrowseApp(run_dir, tmp_path / "labels.csv")
    server, url = start(app)
    yield app, url, rows, tmp_path / "labels.csv"
    server.shutdown()
    server.server_close()
    app.close()


def request(url: str, path: str, method: str = "GET", body: bytes | None = None, headers: dict | None = None):
    """(status, headers, body) for a raw path (http.client sends it as given: no normalising of ..)."""
    u = urllib.parse.urlsplit(url)
    con = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        con.request(method, path, body=body, headers=headers or {})
        r = con.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        con.close()


def get_json(url: str, path: str):
    status, _, body = request(url, path)
    assert status == 200, (path, status, body[:300])
    return json.loads(body)


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def test_summary_counts_and_funnel_match_the_catalog(served):
    app, url, rows, _ = served
    s = get_json(url, "/api/summary")
    assert s["thresholds"]["watermark"]["value"] == 0.8 and s["labels"]["enabled"] and s["finished"]
    f = get_json(url, "/api/funnel")
    assert f["inputs"] == len(rows) and f["kept"] == sum(r["keep"] for r in rows)
    funnel = {x["stage"]: x for x in f["funnel"]}
    assert funnel["kept"]["count"] == f["kept"]
    assert funnel["person"]["dropped"] == sum((r["reject_reason"] or "").startswith("person:") for r in rows)
    assert {r["reason"] for r in f["reasons"]} == {r["reject_reason"] for r in rows if r["reject_reason"]}


@pytest.mark.parametrize("query, want", [
    ("", lambda r: True),
    ("keep=kept", lambda r: r["keep"]),
    ("keep=rejected", lambda r: not r["keep"]),
    ("stage=person", lambda r: (r["reject_reason"] or "").startswith("person:")),
    ("reason=size:short_side<300", lambda r: r["reject_reason"] == "size:short_side<300"),
    ("dup=duplicate", lambda r: r.get("dup_of") is not None),
    ("dup=kept_member", lambda r: (r.get("dup_cluster_size") or 1) > 1 and r.get("dup_of") is None),
    ("watermark_min=0.9", lambda r: (r.get("watermark_score") or -1) >= 0.9),
    ("person_min=0.9&person_max=0.985", lambda r: 0.9 <= (r.get("person_score_max") or -1) <= 0.985),
    ("shard=loose-00000", lambda r: r["shard"] == "loose-00000"),
    ("keep=kept&shard=crawl-00000.tar", lambda r: r["keep"] and r["shard"] == "crawl-00000.tar"),
    ("reason=x%27%20OR%201%3D1%20--", lambda r: False),  # a quote in a value is a value, never SQL
    ("shard=%27%3B%20DROP%20VIEW%20samples%3B%20--", lambda r: False),
])
def test_filters_select_exactly_the_rows_they_name(served, query, want):
    _, url, rows, _ = served
    expected = {r["sample_id"] for r in rows if want(r)}
    assert get_json(url, f"/api/count?{query}")["count"] == len(expected)
    page = get_json(url, f"/api/samples?{query}&size=240")
    assert {r["sample_id"] for r in page["rows"]} == expected and page["next"] is None


def _walk(url: str, query: str, size: int) -> list[dict]:
    """Every page of a grid, following `next` (an offset or a keyset cursor) to the end."""
    out, q = [], query
    for _ in range(100):
        page = get_json(url, f"/api/samples?{q}&size={size}")
        out += page["rows"]
        if page["next"] is None:
            return out
        q = query + "&" + urllib.parse.urlencode(page["next"])
    raise AssertionError("more than 100 pages")


def test_pages_cover_every_row_once_in_catalog_and_in_sorted_order(served):
    _, url, rows, _ = served
    catalog_order = _walk(url, "", 7)
    assert [r["sample_id"] for r in catalog_order] == [r["sample_id"] for r in rows]  # the part's order
    for sort, col in (("watermark", "watermark_score"), ("person", "person_score_max"), ("short_side", "short_side")):
        for order in ("desc", "asc"):
            got = _walk(url, f"sort={sort}&order={order}", 5)  # many ties and nulls cross page boundaries
            scored = sorted((r for r in rows if r.get(col) is not None), key=lambda r: r["sample_id"])
            scored.sort(key=lambda r: np.float32(r[col]), reverse=order == "desc")  # as stored: float32
            nulls = sorted((r for r in rows if r.get(col) is None), key=lambda r: r["sample_id"])
            assert [r["sample_id"] for r in got] == [r["sample_id"] for r in scored + nulls], (sort, order)


@pytest.mark.parametrize("query", ["sort=evil", "sort=person%3BDROP", "keep=maybe", "person_min=abc",
                                   "person_max=nan", "dup=whatever", "size=0", "size=100000", "offset=-1",
                                   "sort=person&after=notjson", "sort=person&after=%5B1%2C2%5D"])
def test_a_bad_query_value_is_a_400_with_a_message(served, query):
    _, url, _, _ = served
    status, headers, body = request(url, f"/api/samples?{query}")
    assert status == 400 and headers["Content-Type"] == "application/json"
    assert json.loads(body)["error"] and b"Traceback" not in body


@pytest.mark.parametrize("path", [
    "/static/../server.py", "/static/..%2fserver.py", "/static/%2e%2e/queries.py", "/static/app.js/../../cli.py",
    "/static/", "/static/index.htm", "/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd",
    "/img/s/..%2F..%2Fetc%2Fpasswd", "/img/s/../../etc/passwd", "/img/x/0123", "/img/s/", "/img/s/nosuchsample",
    "/api/sample/nosuchsample", "/api/sample/..%2F..%2Fmanifest.json", "/api/sample/%00", "/manifest.json",
    "/catalog/samples/part-00000.parquet", "/shards/humanset-00000.tar", "/api/nothing", "/favicon.ico",
])
def test_paths_outside_the_app_and_unknown_ids_are_404(served, path):
    _, url, _, _ = served
    status, _, body = request(url, path)
    assert status == 404, (path, status)
    assert b"Traceback" not in body and b"root:" not in body


def test_the_app_and_its_assets_are_served_with_a_strict_policy(served):
    _, url, _, _ = served
    for path, kind in (("/", "text/html"), ("/static/app.js", "text/javascript"), ("/static/app.css", "text/css")):
        status, headers, body = request(url, path)
        assert status == 200 and headers["Content-Type"].startswith(kind) and body
        assert "default-src 'none'" in headers["Content-Security-Policy"] and headers["X-Content-Type-Options"] == "nosniff"
    page = request(url, "/")[2].decode()
    assert "http://" not in page and "https://" not in page  # no CDN: it works offline
    assert "https://" not in request(url, "/static/app.js")[2].decode()


def test_sample_page_data_persons_text_source_and_cluster(served):
    app, url, rows, _ = served
    dup = next(r for r in rows if r.get("dup_of"))
    kept_member = next(r for r in rows if r["sample_id"] == dup["dup_of"])
    s = get_json(url, f"/api/sample/{dup['sample_id']}?shard={urllib.parse.quote(dup['shard'])}")
    assert s["row"]["sample_id"] == dup["sample_id"] and s["row"]["reject_reason"] == "dedup:exact_duplicate"
    assert s["source"]["member"] == dup["source_uri"].split("#")[1] and s["source"]["shard"] == dup["shard"]
    c = s["cluster"]
    assert c["kept_id"] == kept_member["sample_id"] and c["size"] == 2
    assert {m["sample_id"] for m in c["members"]} == {dup["sample_id"], kept_member["sample_id"]}
    assert c["why"].startswith("the canonical member (rank 0") and "passed every stage" in c["why"]
    # a wrong shard hint costs a second lookup, not a wrong answer
    assert get_json(url, f"/api/sample/{dup['sample_id']}?shard=nope")["row"]["sample_id"] == dup["sample_id"]
    person = next(r for r in rows if r["keep"] and len(r.get("person_boxes") or []) >= 2)
    s = get_json(url, f"/api/sample/{person['sample_id']}")
    assert len(s["persons"]) == len(person["person_boxes"])
    assert [p["passes"] for p in s["persons"]].count(True) == person["person_n_pass"]  # the run's person rule
    assert s["cluster"] is None and s["text_boxes"] == []


def test_images_come_from_the_curated_shards_or_the_source_and_a_failure_is_a_placeholder(served, run):
    app, url, rows, _ = served
    kept = next(r for r in rows if r["keep"])
    status, headers, body = request(url, f"/img/s/{kept['sample_id']}")
    assert status == 200 and headers["Content-Type"] == "image/jpeg" and body[:2] == b"\xff\xd8"
    assert app.images.get(kept["sample_id"], "s", lambda sid: None)["where"] == "curated shard"
    rejected = next(r for r in rows if r["reject_reason"] == "person:no_person")
    status, headers, body = request(url, f"/img/l/{rejected['sample_id']}")
    assert status == 200 and headers["Content-Type"] == "image/jpeg"
    assert app.images.get(rejected["sample_id"], "l", lambda sid: None)["where"] == "source"
    from PIL import Image
    import io
    assert max(Image.open(io.BytesIO(body)).size) <= 1280
    broken = next(r for r in rows if r["reject_reason"] == "decode:truncated")
    status, headers, body = request(url, f"/img/s/{broken['sample_id']}")
    assert status == 200 and headers["Content-Type"] == "image/svg+xml"
    assert "decode error: truncated" in headers["X-Humanset-Unreadable"] and b"truncated" in body
    # a source that vanished after the run: a placeholder naming the file
    gone = next(r for r in rows if r["reject_reason"] == "text:area_frac>0.05")
    tar = Path(gone["source_uri"].split("#")[0])
    tar.rename(tar.with_suffix(".moved"))
    try:
        status, headers, body = request(url, f"/img/l/{gone['sample_id']}")
    finally:
        tar.with_suffix(".moved").rename(tar)
    assert status == 200 and headers["Content-Type"] == "image/svg+xml"
    assert "no such file" in headers["X-Humanset-Unreadable"].lower() and tar.name in headers["X-Humanset-Unreadable"]
    assert b"Traceback" not in body


def test_labels_are_written_in_the_format_calibrate_reads_and_nothing_into_run(served, run):
    from pipeline.select.calibrate import read_labels

    app, url, rows, labels_csv = served
    run_dir, _ = run
    before = snapshot(run_dir)
    a, b = rows[0]["sample_id"], rows[2]["sample_id"]
    post = lambda obj: request(url, "/api/label", "POST", json.dumps(obj).encode(),  # noqa: E731
                               {"Content-Type": "application/json"})
    for sid, stage, value in ((a, "person", 1), (a, "watermark", 0), (b, "art", 1), (b, "person", 0), (a, "person", 0)):
        status, _, body = post({"sample_id": sid, "stage": stage, "value": value})
        assert status == 200, body
    status, _, body = post({"sample_id": b, "stage": "art", "value": None})  # cleared
    assert status == 200 and json.loads(body)["labels"] == {"person": 0}
    assert read_labels(labels_csv) == {"person": {a: 0, b: 0}, "watermark": {a: 0}}
    assert labels_csv.read_text().splitlines()[0] == "sample_id,label"
    assert get_json(url, f"/api/sample/{a}")["labels"] == {"person": 0, "watermark": 0}
    assert get_json(url, "/api/samples?size=3")["rows"][0]["labels"] == {"person": 0, "watermark": 0}
    for bad, want in (({"sample_id": "nosuch", "stage": "person", "value": 1}, 404),
                      ({"sample_id": a, "stage": "dedup", "value": 1}, 400),
                      ({"sample_id": a, "stage": "person", "value": 2}, 400),
                      (["not", "an", "object"], 400)):
        assert post(bad)[0] == want, bad
    assert snapshot(run_dir) == before  # browsing, images and labels wrote nothing into RUN


def test_labels_are_refused_from_other_origins_hosts_and_forms(served):
    _, url, rows, labels_csv = served
    body = json.dumps({"sample_id": rows[0]["sample_id"], "stage": "person", "value": 1}).encode()
    port = urllib.parse.urlsplit(url).port
    cases = [({"Content-Type": "application/json", "Origin": "http://evil.example"}, 403),
             ({"Content-Type": "text/plain"}, 415),  # what a cross-site form or a no-preflight fetch sends
             ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
             ({"Content-Type": "application/json", "Host": f"evil.example:{port}"}, 403)]  # DNS rebinding
    for headers, want in cases:
        assert request(url, "/api/label", "POST", body, headers)[0] == want, headers
    assert request(url, "/api/summary", headers={"Host": f"rebound.example:{port}"})[0] == 403
    assert request(url, "/api/label", "POST", b"x" * 10000, {"Content-Type": "application/json"})[0] == 413
    assert not labels_csv.exists()
    assert request(url, "/api/label", "POST", body, {"Content-Type": "application/json",
                                                     "Origin": url.rstrip("/")})[0] == 200


def test_read_only_without_labels_and_an_existing_file_is_kept(run, tmp_path):
    run_dir, rows = run
    app = BrowseApp(run_dir)
    try:
        r = app.handle("POST", "/api/label", json.dumps({"sample_id": rows[0]["sample_id"], "stage": "person",
                                                           "value": 1}).encode())
        assert r.status == 409 and b"--labels" in r.body
    finally:
        app.close()
    existing = tmp_path / "bench-labels.csv"
    existing.write_text(f"# from the quality bench\nsample_id,label\n{rows[1]['sample_id']},art=1\n")
    labels = Labels(existing)
    labels.set(rows[0]["sample_id"], "person", 1)
    text = existing.read_text()
    assert text.startswith("sample_id,label\n# from the quality bench\n") and f"{rows[1]['sample_id']},art=1" in text
    from pipeline.select.calibrate import read_labels
    assert read_labels(existing) == {"art": {rows[1]["sample_id"]: 1}, "person": {rows[0]["sample_id"]: 1}}
    bad = tmp_path / "bad.csv"
    bad.write_text("sample_id,label\nabc,person=yes\n")
    with pytest.raises(LabelError, match="bad.csv:2"):
        Labels(bad)


def test_cli_refuses_labels_inside_run_and_a_missing_run(run, tmp_path, capsys):
    run_dir, _ = run
    assert "inside RUN" in browse_cli.labels_path_problem(str(run_dir), str(run_dir / "labels.csv"))
    assert "inside RUN" in browse_cli.labels_path_problem(str(run_dir), str(run_dir / "catalog" / "x.csv"))
    assert browse_cli.labels_path_problem(str(run_dir), str(tmp_path / "labels.csv")) is None
    assert "local file" in browse_cli.labels_path_problem(str(run_dir), "s3://bucket/labels.csv")
    from humanset.cli import main
    assert main(["browse", str(tmp_path / "nothing"), "--port", "0"]) == 2
    assert "no such run directory" in capsys.readouterr().err
    assert main(["browse", str(run_dir), "--labels", str(run_dir / "labels.csv"), "--port", "0"]) == 2
    assert "inside RUN" in capsys.readouterr().err


def test_a_running_run_is_read_as_it_grows(run, tmp_path):
    """Without `finished` in its manifest the counts expire: a part written meanwhile shows up."""
    import shutil

    run_dir, rows = run
    live = tmp_path / "live"
    shutil.copytree(run_dir, live)
    manifest = catalog.read_json(live / "manifest.json")
    manifest.pop("finished")
    catalog.write_json(live / "manifest.json", manifest)
    app = BrowseApp(live)
    try:
        app.catalog.counts.ttl = 0.0
        before = json.loads(app.handle("GET", "/api/count").body)["count"]
        part = catalog.conform([{**rows[0], "sample_id": "f" * 24, "shard": "later"}], catalog.SAMPLES)
        catalog.write_parquet(live / "catalog" / "samples" / "part-00001.parquet", part)
        assert json.loads(app.handle("GET", "/api/count").body)["count"] == before + 1
        assert json.loads(app.handle("GET", "/api/sample/" + "f" * 24).body)["row"]["shard"] == "later"
    finally:
        app.close()


def test_browse_a_run_on_s3_through_the_storage_layer(s3_server, run):
    from catalog import storage as st

    run_dir, rows = run
    store = st.open_storage(s3_server.prefix("browse"))
    for p in sorted(run_dir.rglob("*")):
        if p.is_file():
            store.write_bytes(str(p.relative_to(run_dir)), p.read_bytes())
    app = BrowseApp(store.uri)
    server, url = start(app)
    try:
        assert get_json(url, "/api/summary")["run"].startswith("s3://")
        assert get_json(url, "/api/funnel")["inputs"] == len(rows)
        assert get_json(url, "/api/count?keep=kept")["count"] == sum(r["keep"] for r in rows)
        kept = get_json(url, "/api/samples?keep=kept&size=2")["rows"][0]
        status, headers, body = request(url, f"/img/s/{kept['sample_id']}?shard={urllib.parse.quote(kept['shard'])}")
        assert status == 200 and headers["Content-Type"] == "image/jpeg"
        assert app.images.get(kept["sample_id"], "s", lambda sid: None)["where"] == "curated shard"  # ranged GET on S3
    finally:
        server.shutdown()
        server.server_close()
        app.close()
    assert os.environ.get("AWS_ENDPOINT_URL")  # the fixture's server, on 127.0.0.1


def test_the_demo_ends_with_a_browse_command_that_serves_the_run(run, tmp_path):
    """`make demo`'s last line, run as printed (on a free port): the app answers, Ctrl-C stops it."""
    import re
    import signal
    import subprocess
    import sys

    from humanset.demo import browse_line

    run_dir, rows = run
    line = browse_line(run_dir, tmp_path / "labels.csv")
    cmd = line.split("look at the run: ", 1)[1].split("   (", 1)[0].split()
    assert cmd[:2] == ["humanset", "browse"] and cmd[2] == str(run_dir)
    p = subprocess.Popen([sys.executable, "-m", "humanset.cli", *cmd[1:], "--port", "0"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        first = p.stdout.readline()
        m = re.search(r"(http://127\.0\.0\.1:\d+/)", first)
        assert m, (first, p.stderr.read() if p.poll() is not None else "")
        assert get_json(m[1], "/api/funnel")["inputs"] == len(rows)
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=60) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_why_a_cluster_keeps_its_member():
    from explore.browse.sample_page import why_kept

    canonical = {"sample_id": "a", "dup_rank": 0, "keep": True, "dup_scored": True}
    assert why_kept(canonical, [canonical]).startswith("the canonical member (rank 0")
    first = {"sample_id": "a", "dup_rank": 0, "keep": False, "reject_reason": "person:no_person", "dup_scored": True}
    second = {"sample_id": "b", "dup_rank": 1, "keep": True, "dup_scored": True}
    assert why_kept(second, [first, second]) == ("rank 1, the first member in canonical order that passed: the "
                                                 "members before it were rejected by a model stage (person:no_person)")
    third = {"sample_id": "c", "dup_rank": 2, "keep": False, "reject_reason": "dedup:near_duplicate"}
    why = why_kept(first, [first, {**second, "keep": False, "reject_reason": "text:area_frac>0.05"}, third])
    assert why.startswith("no member passed (2 went to the model stages") and why.endswith("person:no_person")
    assert why_kept(None, []) == "the member the cluster points at is not in the catalog"
