"""Benchmark `humanset browse` on a synthetic compacted catalog (10^6 rows by default): how soon the first
page of the grid answers, and what the other requests of the app cost at that size.

    python bench/browse.py --out runs/bench-browse                  # generate (once) and measure
    python bench/browse.py --out runs/bench-browse --rows 10000000 --repeats 9

The rows are bench/synthetic_catalog.py's crawl (realistic sizes, scores, reasons, duplicate clusters),
written as parts of 100,000 rows and compacted by catalog/compact.py as a finished run is. Measuring
runs in a child process, so DuckDB starts cold: `open_s` is BrowseApp() (the views), `first_page_s`
the first GET /api/samples over HTTP after it, `start_to_first_page_s` both (what a user waits for).
Then each request is repeated (`--repeats`, median, warm). `scan` says how many rows DuckDB read for
a page (its profiler's rows_scanned) against the catalog's rows: the first page in catalog order
stops after a few row groups. `full_scan_s` is one aggregate over every row, for scale. Prints JSON.
"""
from __future__ import annotations

import argparse
import os
import json
import resource
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import catalog  # noqa: E402
from synthetic_catalog import CONFIG, STAGES, chunk  # noqa: E402  (bench/, this script's folder)

PART_ROWS = 100_000


def generate(run: Path, rows: int, seed: int = 0) -> float:
    """RUN with `rows` synthetic catalog rows, compacted as a finished run (catalog/compact.py)."""
    from catalog.compact import compact_group, finish

    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    units = []
    for i, start in enumerate(range(0, rows, PART_ROWS)):
        units.append(f"part-{i:05d}")
        part = run / "catalog" / "samples" / f"{units[-1]}.parquet"
        part.parent.mkdir(parents=True, exist_ok=True)
        # plain pages: the parts are only read once, by the compaction, which writes what browse reads
        # (zstd and dictionaries here cost a third of the time for 10^6 rows and change nothing there)
        pq.write_table(chunk(rng, start, min(PART_ROWS, rows - start)), part, compression="none",
                       use_dictionary=False)
    catalog.write_json(run / "manifest.json", {
        "config": CONFIG, "stages": STAGES, "skipped_stages": {}, "funnel": [], "inputs": ["s3://crawl/"],
        "started": "2026-01-01T00:00:00Z", "finished": "2026-01-01T01:00:00Z", "versions": {"bench": "synthetic"},
        "bench_rows": rows})
    n = compact_group(str(run), 0, units)
    finish(run, 1, n, len(units))
    return time.perf_counter() - t0


def ready(run: Path, rows: int) -> bool:
    from catalog.compact import is_compacted

    m = run / "manifest.json"
    return m.exists() and catalog.read_json(m).get("bench_rows") == rows and is_compacted(run)


def rows_scanned(con, sql: str, args) -> int:
    """Rows DuckDB's table scans read for one query (its profiler), on a cursor of its own."""
    cur = con.cursor()
    try:
        cur.execute("PRAGMA enable_profiling = 'no_output'")
        cur.execute(sql, args).fetchall()
        return int(json.loads(cur.get_profiling_information(format="json"))["query"]["total_rows_scanned"])
    finally:
        cur.close()


def _get(url: str):
    with urllib.request.urlopen(url, timeout=120) as r:
        body = r.read()
    return json.loads(body) if r.headers.get("Content-Type", "").startswith("application/json") else body


def _timed(url: str):
    t0 = time.perf_counter()
    out = _get(url)
    return time.perf_counter() - t0, out


REQUESTS = {  # name -> path and query of a request the app makes
    "first_page_catalog_order": "api/samples",
    "first_page_rejected_by_person": "api/samples?stage=person",
    "first_page_watermark_above_0.5": "api/samples?watermark_min=0.5",
    "first_page_sorted_by_person_score": "api/samples?sort=person",
    "first_page_sorted_filtered": "api/samples?keep=kept&sort=watermark&order=asc",
    "count_all": "api/count",
    "count_person_score_0.9_to_0.95": "api/count?person_min=0.9&person_max=0.95",
    "funnel_and_reasons": "api/funnel",
}


def measure(run: Path, repeats: int) -> dict:
    from explore.browse.filters import PAGE_SIZE, page_sql, parse_filter, parse_order
    from explore.browse.server import BrowseApp, start

    res: dict = {"timings_s": {}}
    t0 = time.perf_counter()
    app = BrowseApp(run)
    res["open_s"] = round(time.perf_counter() - t0, 4)
    server, url = start(app)
    try:
        dt, page = _timed(url + "api/samples")
        res["first_page_s"] = round(dt, 4)
        res["start_to_first_page_s"] = round(time.perf_counter() - t0, 4)
        res["first_page_rows"] = len(page["rows"])
        cold = {}
        for name, path in REQUESTS.items():  # the first time each is asked (counts and summary get cached)
            cold[name] = round(_timed(url + path)[0], 4)
        res["cold_s"] = cold
        warm = {}
        for name, path in REQUESTS.items():
            if name.startswith(("count", "funnel_and")):
                continue  # cached per filter: a repeat measures the cache
            warm[name] = round(statistics.median(_timed(url + path)[0] for _ in range(repeats)), 4)
        # pages 100 and 1,000 of a sorted grid, by the cursor the page before them hands out (its last row)
        con = app.catalog.con
        for n in (100, 1000):
            value, sid = con.execute("SELECT person_score_max, sample_id FROM samples ORDER BY person_score_max "
                                     f"DESC NULLS LAST, sample_id LIMIT 1 OFFSET {(n - 1) * PAGE_SIZE - 1}").fetchone()
            q = "api/samples?sort=person&after=" + urllib.request.quote(json.dumps([value, sid]))
            warm[f"page_{n}_sorted_keyset"] = round(statistics.median(_timed(url + q)[0] for _ in range(repeats)), 4)
        warm["page_100_catalog_order"] = round(statistics.median(
            _timed(url + f"api/samples?offset={99 * PAGE_SIZE}")[0] for _ in range(repeats)), 4)
        row = page["rows"][PAGE_SIZE // 2]
        warm["sample_page_with_shard_hint"] = round(statistics.median(
            _timed(url + f"api/sample/{row['sample_id']}?shard={row['shard']}")[0] for _ in range(repeats)), 4)
        warm["sample_page_without_hint"] = round(statistics.median(
            _timed(url + f"api/sample/{row['sample_id']}")[0] for _ in range(repeats)), 4)
        res["timings_s"] = warm
        total = con.execute("SELECT count(*) FROM samples").fetchone()[0]
        scans = {}
        for name, params in (("first_page_catalog_order", {}), ("first_page_rejected_by_person", {"stage": "person"}),
                             ("first_page_sorted_by_person_score", {"sort": "person"})):
            sql, args = page_sql(parse_filter(params, lambda k: []), parse_order(params), PAGE_SIZE)
            scans[name] = rows_scanned(con, sql, args)
        res["scan"] = {"catalog_rows": total, "rows_scanned": scans}
        t1 = time.perf_counter()
        con.execute("SELECT count(*) FILTER (WHERE person_score_max > 0.5), max(sample_id), max(reject_reason) "
                    "FROM samples").fetchall()
        res["full_scan_s"] = round(time.perf_counter() - t1, 4)
    finally:
        server.shutdown()
        server.server_close()
        app.close()
    res["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="run directory to create (reused when it already has the rows)")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=5, help="repeats of each warm request (median)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = ap.parse_args()
    run = Path(args.out)
    if args.measure_only:
        print(json.dumps(measure(run, args.repeats)))
        return
    result = {"rows": args.rows}
    result["generate_s"] = None if ready(run, args.rows) else round(generate(run, args.rows, args.seed), 1)
    result["catalog_mb"] = round(sum(f.stat().st_size for f in (run / "catalog" / "compact").rglob("*.parquet")) / 1e6, 1)
    child = subprocess.run([sys.executable, __file__, "--out", str(run), "--measure-only", "--repeats",
                            str(args.repeats)], capture_output=True, text=True)
    if child.returncode:
        sys.exit(f"bench/browse.py: the measuring process failed:\n{child.stderr[-3000:]}")
    result.update(json.loads(child.stdout))
    result["load_1min"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
