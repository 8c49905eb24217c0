"""`humanset browse` on a synthetic compacted catalog of 10^6 rows (bench/browse.py makes it): the first
page reads a few row groups, not the catalog; a filtered first page likewise; a sorted page and the
pages after it are exact; a count is computed once per filter. Times are printed, not asserted
(bench/browse.py measures them; docs/benchmarks.md has the figures)."""
from __future__ import annotations

import importlib.util
import json
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from explore.browse.filters import PAGE_SIZE, page_sql, parse_filter, parse_order
from explore.browse.server import BrowseApp, start

ROWS = 1_000_000
BENCH = Path(__file__).resolve().parents[2] / "bench" / "browse.py"


@pytest.fixture(scope="module")
def bench():
    """bench/browse.py, which imports its neighbour synthetic_catalog by bare name: bench/ is on the path
    only while it loads (for good: bench/render.py would shadow the render package)."""
    sys.path.insert(0, str(BENCH.parent))
    try:
        spec = importlib.util.spec_from_file_location("bench_browse", BENCH)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH.parent))
    return module


@pytest.fixture(scope="module")
def big_run(bench, tmp_path_factory):
    run = tmp_path_factory.mktemp("browse-1m") / "run"
    t0 = time.perf_counter()
    bench.generate(run, ROWS)
    print(f"\ngenerated and compacted {ROWS:,} rows in {time.perf_counter() - t0:.1f} s")
    return run


def _get(url: str):
    with urllib.request.urlopen(url, timeout=300) as r:
        return json.loads(r.read())


def test_the_first_page_of_a_million_rows_reads_a_few_row_groups(bench, big_run):
    files = sorted((big_run / "catalog" / "compact" / "samples").glob("*.parquet"))
    assert len(files) == 1 and pq.ParquetFile(files[0]).metadata.num_rows == ROWS  # the compacted catalog
    t0 = time.perf_counter()
    app = BrowseApp(big_run)
    server, url = start(app)
    try:
        page = _get(url + "api/samples")
        first_page_s = time.perf_counter() - t0
        first = pq.ParquetFile(files[0]).read_row_group(0, columns=["sample_id"]).column(0).to_pylist()[:PAGE_SIZE]
        assert [r["sample_id"] for r in page["rows"]] == first and page["next"] == {"offset": PAGE_SIZE}
        con = app.catalog.con
        for params in ({}, {"stage": "person"}, {"keep": "kept"}, {"watermark_min": "0.5"}):
            sql, args = page_sql(parse_filter(params, lambda k: []), parse_order(params), PAGE_SIZE)
            scanned = bench.rows_scanned(con, sql, args)
            assert scanned < ROWS // 10, (params, scanned)  # a streamed LIMIT: it stops once the page is full
        t1 = time.perf_counter()
        counted = _get(url + "api/count?stage=person")["count"]
        count_s = time.perf_counter() - t1
        assert counted == con.execute("SELECT count(*) FROM samples WHERE reject_reason LIKE 'person:%'").fetchone()[0]
        assert len(app.catalog.counts._d) == 1
        _get(url + "api/count?stage=person")
        assert len(app.catalog.counts._d) == 1  # cached per filter
        print(f"first page {first_page_s:.3f} s from start (open + query + HTTP), count {count_s:.3f} s")
    finally:
        server.shutdown()
        server.server_close()
        app.close()


def test_sorted_pages_of_a_million_rows_are_exact(big_run):
    table = pq.read_table(big_run / "catalog" / "compact" / "samples", columns=["sample_id", "watermark_score"])
    scored = table.filter(pc.is_valid(table["watermark_score"]))
    order = np.lexsort((np.array(scored["sample_id"].to_pylist(), dtype=object).astype(str),
                        -scored["watermark_score"].to_numpy()))
    want = np.array(scored["sample_id"].to_pylist(), dtype=object)[order][:3 * PAGE_SIZE].tolist()
    app = BrowseApp(big_run)
    server, url = start(app)
    try:
        got, q = [], "api/samples?sort=watermark"
        t0 = time.perf_counter()
        for _ in range(3):  # the first page, then two by the keyset cursor
            page = _get(url + q)
            got += [r["sample_id"] for r in page["rows"]]
            q = "api/samples?sort=watermark&after=" + urllib.request.quote(page["next"]["after"])
        print(f"\nthree sorted pages {time.perf_counter() - t0:.3f} s")
        assert got == want
    finally:
        server.shutdown()
        server.server_close()
        app.close()
