"""Benchmark `humanset stats` / `query` / `report` on a synthetic curation catalog (10 million rows by default).

    python bench/stats.py --out runs/bench-stats        # generate (once) and measure
    python bench/stats.py --out runs/bench-stats-small --rows 200000
    python bench/stats.py --out runs/bench-parts --parts 10000 50000   # per-part costs (bench/stats_parts.py)
    python bench/stats.py --out runs/bench-parts --parts 10000 50000 --compact --skip-select  # as a finished run

The catalog (bench/synthetic_catalog.py) is written in chunks with pyarrow, conforming to catalog.SAMPLES,
with realistic columns. Measuring runs in a child process so that its peak memory (getrusage) is DuckDB's,
not the generator's. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import catalog  # noqa: E402
from stats_parts import bench_parts  # noqa: E402  (bench/, this script's folder)
from synthetic_catalog import generate  # noqa: E402


QUERIES = {
    "reasons_group_by": "SELECT reject_reason, count(*) FROM samples GROUP BY 1 ORDER BY 2 DESC",
    "kept_3plus_persons_over_0.95": "SELECT count(*) FROM samples WHERE keep AND person_n_pass >= 3 "
                                    "AND person_score_max > 0.95",
    "persons_view_by_shard_top10": "SELECT shard, avg(score), count(*) FROM persons WHERE keep "
                                   "GROUP BY shard ORDER BY 3 DESC LIMIT 10",
    "export_kept_multi_person_parquet": "COPY (SELECT sample_id, source_uri, person_boxes FROM samples "
                                        "WHERE keep AND person_n_pass >= 2) TO '{out}' (FORMAT parquet)",
}


def measure(run: Path) -> dict:
    """Time every statistic, the whole `stats`, a few queries and the report (charts only)."""
    from explore import report, stats

    res = {"timings_s": {}}
    con, (p,) = stats.open_runs(run)
    manifest = stats.read_manifest(run)
    sections = {
        "totals": lambda: stats.totals(con), "funnel": lambda: stats.funnel(con, manifest),
        "reasons": lambda: stats.reasons(con), "decode_errors": lambda: stats.decode_errors(con),
        "persons_per_kept_image": lambda: stats.persons_per_image(con), "geometry": lambda: stats.geometry(con),
        "persons": lambda: stats.persons(con, manifest), "scores": lambda: stats.scores(con, manifest),
        "per_source": lambda: stats.per_source(con), "duplicates": lambda: stats.duplicates(con),
    }
    for name, fn in sections.items():
        t0 = time.perf_counter()
        fn()
        res["timings_s"][f"stats.{name}"] = round(time.perf_counter() - t0, 3)
    t0 = time.perf_counter()
    s = stats.run_stats(run)
    res["timings_s"]["stats_total"] = round(time.perf_counter() - t0, 3)
    res["rows"], res["kept"] = s["totals"]["inputs"], s["totals"]["kept"]
    for name, sql in QUERIES.items():
        t0 = time.perf_counter()
        con.execute(sql.format(out=run / "bench-export.parquet")).fetchall()
        res["timings_s"][f"query.{name}"] = round(time.perf_counter() - t0, 3)
    (run / "bench-export.parquet").unlink(missing_ok=True)
    con.close()
    # thumbnails would read the (nonexistent) s3 sources: time the SQL, charts and HTML only
    t0 = time.perf_counter()
    html = report.render_report(run, thumbs=0)
    res["timings_s"]["report_without_thumbnails"] = round(time.perf_counter() - t0, 3)
    res["report_bytes"] = len(html)
    res["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="run directory to create (reused when it already has the rows)")
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--chunk-rows", type=int, default=500_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parts", type=int, nargs="+", metavar="N",
                    help="instead: runs of N small catalog parts each (with stats markers), and `humanset stats`, "
                         "`query`, `report` and `select` on each in a child process (wall s, peak RSS)")
    ap.add_argument("--rows-per-part", type=int, default=1, help="with --parts: rows per part (default 1, one-image shards)")
    ap.add_argument("--compact", action="store_true",
                    help="with --parts: compact each run's catalog first, as the engine does at the end of a run")
    ap.add_argument("--skip-select", action="store_true", help="with --parts: leave out `select` (its loop reads every part)")
    ap.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = ap.parse_args()
    run = Path(args.out)
    if args.parts:
        print(json.dumps(bench_parts(run, args.parts, args.rows_per_part, args.seed, args.compact,
                                     not args.skip_select), indent=2))
        return
    if args.measure_only:
        print(json.dumps(measure(run)))
        return
    result = {"rows": args.rows}
    manifest = run / "manifest.json"
    if manifest.exists() and catalog.read_json(manifest).get("bench_rows") == args.rows:
        result["generate_s"] = None  # reused
    else:
        result["generate_s"] = round(generate(run, args.rows, args.chunk_rows, args.seed), 1)
    result["catalog_mb"] = round(sum(f.stat().st_size for f in (run / "catalog").rglob("*.parquet")) / 1e6, 1)
    child = subprocess.run([sys.executable, __file__, "--out", str(run), "--measure-only"],
                           capture_output=True, text=True, check=True)
    result.update(json.loads(child.stdout))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
