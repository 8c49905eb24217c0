"""`bench/stats.py --parts N [N ...]`: what one more catalog part costs `humanset stats`, `query`, `report`
and `select`.

For each N a synthetic run of N small catalog parts (`--rows-per-part` rows each, realistic columns
from bench/synthetic_catalog.py conformed to catalog.SAMPLES; every 50th part has zero rows), one
stats marker per unit (every 40th unit failed with a unit error, some with their `unit_error_kind`,
some without) and a manifest of a complete run. The parts are one generated table written again
with other ids, so generating 50,000 costs little more than writing them. Each command runs in its
own child process (`python -m humanset.cli ...`); its wall seconds and peak RSS (ru_maxrss of that
child, from wait4) are reported, with the per-part time and the ratios between the largest and the
smallest N. Prints one JSON object.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import catalog  # noqa: E402
from synthetic_catalog import CONFIG, chunk  # noqa: E402  (bench/, this script's folder)

UNIT_ERRORS = [("not_a_tar", "not a tar archive (bad header checksum at byte 0)"),
               ("truncated", "tar ends inside member 00017.jpg at byte 81920"),
               ("bad_index", "index crawl.parquet lists 12 keys the tar lacks")]
QUERY = "SELECT reject_reason, count(*) FROM samples GROUP BY 1 ORDER BY 2 DESC"
# stricter than the run: nothing new is kept, so select needs no image bytes (the sources are synthetic)
SELECT_SETS = ["size.min_short_side=100000"]


def _config() -> dict:
    try:
        from pipeline.config import default_config

        cfg = default_config()
    except ImportError:  # pragma: no cover - the bench runs from a full checkout
        cfg = {}
    for k, v in CONFIG.items():
        cfg[k] = dict(cfg.get(k) or {}, **v) if isinstance(v, dict) else v
    cfg["stages"] = ["decode", "size", "dedup"]  # the cheap cascade: select builds no model stage
    return cfg


def generate(run: Path, n_parts: int, rows_per_part: int, seed: int) -> dict:
    t0 = time.perf_counter()
    base = chunk(np.random.default_rng(seed), 0, rows_per_part)
    base = base.set_column(base.schema.get_field_index("dup_of"), "dup_of", pa.nulls(base.num_rows, pa.string()))
    samples, stats = run / "catalog" / "samples", run / "stats"
    samples.mkdir(parents=True, exist_ok=True)
    stats.mkdir(parents=True, exist_ok=True)
    empty = catalog.SAMPLES.empty_table()
    keys = pc.utf8_lpad(pa.array(np.arange(rows_per_part)).cast(pa.string()), 9, "0")
    n_inputs = n_kept = 0
    for i in range(n_parts):
        unit = f"crawl-{i:07d}"
        if i % 50 == 49:
            table = empty
        else:
            ids = pa.array([f"{i:012x}{k:012x}" for k in range(rows_per_part)])
            shard = pa.array([unit] * rows_per_part)
            table = base.set_column(0, "sample_id", ids)
            table = table.set_column(table.schema.get_field_index("shard"), "shard", shard)
            table = table.set_column(table.schema.get_field_index("source_uri"), "source_uri",
                                     pc.binary_join_element_wise("s3://crawl/", shard, ".tar#", keys, ".jpg", ""))
        pq.write_table(table, samples / f"{unit}.parquet", compression="zstd")
        kept = int(pc.sum(table.column("keep")).as_py() or 0)
        rejected: dict[str, int] = {}
        for r in table.column("reject_reason").to_pylist():
            if r:
                rejected[r] = rejected.get(r, 0) + 1
        marker = {"unit": unit, "source": f"s3://crawl/{unit}.tar", "inputs": table.num_rows, "kept": kept,
                  "rejected": rejected, "shards": [], "unit_error": None, "finished": "2026-12-01T00:00:00Z"}
        if i % 40 == 7:
            kind, detail = UNIT_ERRORS[(i // 40) % len(UNIT_ERRORS)]
            marker["unit_error"] = f"{kind}: s3://crawl/{unit}.tar: {detail}"
            if i % 80 == 7:  # markers of an older engine lack the field
                marker["unit_error_kind"] = kind
        (stats / f"{unit}.json").write_text(json.dumps(marker))
        n_inputs += table.num_rows
        n_kept += kept
        if i % 5000 == 4999:
            print(f"generated {i + 1:,}/{n_parts:,} parts", file=sys.stderr, flush=True)
    catalog.write_json(run / "manifest.json", {
        "config": _config(), "stages": ["decode", "size", "dedup"], "skipped_stages": {}, "funnel": [],
        "inputs": ["s3://crawl/"], "status": "complete", "units": n_parts, "started": None, "finished": None,
        "counts": {"inputs": n_inputs, "kept": n_kept}, "versions": {"bench": "synthetic"},
        "bench_parts": n_parts, "bench_rows_per_part": rows_per_part})
    return {"generate_s": round(time.perf_counter() - t0, 1), "rows": n_inputs}


def _child(argv: list[str]) -> dict:
    """Run `python -m humanset.cli ARGV` with output discarded; wall seconds and the child's peak RSS."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")]))
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "humanset.cli", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"humanset {' '.join(argv)} exited {proc.returncode}: {err.decode()[-2000:]}")
    return {"wall_s": round(wall, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}


def compact_run(run: Path) -> float:
    """The catalog compacted as the engine leaves a finished run (catalog/compact.py), in-process."""
    from catalog import compact
    t0 = time.perf_counter()
    compact.invalidate(run)
    units = sorted(p.stem for p in (run / "stats").glob("*.json"))
    groups = [units[i:i + compact.GROUP] for i in range(0, len(units), compact.GROUP)]
    rows = sum(compact.compact_group(str(run), i, g) for i, g in enumerate(groups))
    compact.finish(run, len(groups), rows, len(units))
    return round(time.perf_counter() - t0, 2)


def measure(run: Path, n_parts: int, select: bool = True) -> dict:
    out = {"stats": _child(["stats", str(run), "--json"]),
           "query": _child(["query", str(run), QUERY]),
           "report": _child(["report", str(run), "--out", str(run / "bench-report.html"), "--thumbs", "0"])}
    if not select:
        for r in out.values():
            r["ms_per_part"] = round(1000 * r["wall_s"] / n_parts, 3)
        return out
    sel = run.parent / f"{run.name}-select"
    if sel.exists():
        import shutil

        shutil.rmtree(sel)
    out["select"] = _child(["select", str(run), "--output", str(sel), "--no-progress",
                            *[a for s in SELECT_SETS for a in ("--set", s)]])
    for r in out.values():
        r["ms_per_part"] = round(1000 * r["wall_s"] / n_parts, 3)
    return out


def bench_parts(root: Path, sizes: list[int], rows_per_part: int, seed: int, compacted: bool = False,
                select: bool = True) -> dict:
    result = {"rows_per_part": rows_per_part, "compacted": compacted, "runs": {}}
    for n in sizes:
        run = root / f"parts-{n}"
        m = run / "manifest.json"
        if m.exists() and catalog.read_json(m).get("bench_parts") == n \
                and catalog.read_json(m).get("bench_rows_per_part") == rows_per_part:
            gen = {"generate_s": None}  # reused
        else:
            gen = generate(run, n, rows_per_part, seed)
        if compacted:
            gen["compact_s"] = compact_run(run)
        result["runs"][str(n)] = {**gen, **measure(run, n, select)}
    if len(sizes) > 1:
        lo, hi = result["runs"][str(min(sizes))], result["runs"][str(max(sizes))]
        result["ratios_largest_vs_smallest"] = {
            cmd: {"peak_rss": round(hi[cmd]["peak_rss_mb"] / lo[cmd]["peak_rss_mb"], 3),
                  "time_per_part": round(hi[cmd]["ms_per_part"] / lo[cmd]["ms_per_part"], 3)}
            for cmd in ("stats", "query", "report", "select") if cmd in hi}
    return result
