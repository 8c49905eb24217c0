"""Are two curation runs of the same input the same? For a refactor that must not change what a run
writes: run the old code and the new on one crawl, then

    python scripts/same_run.py RUN_A RUN_B            # JSON on stdout; exit 0 when the same, 1 if not

e.g. the demo crawl (pipeline/demo/crawl.py: write_webdataset(folder, demo_samples())), curated by each
checkout into its own run: `humanset curate --input CRAWL --output RUN_A --config pipeline/demo/demo.yaml`
(and the same crawl as a folder of loose images and as a Parquet manifest, for the other input kinds).

Compared: the catalog (every Parquet file under catalog/, `Table.equals` after sorting by sample_id,
schemas with their metadata), the curated shards (each tar byte for byte, each index as a table), the
unit listing (units.jsonl, byte for byte) and the run manifest and per-unit stats (as JSON). Left out,
because two runs of the same code differ there: the keys PER_RUN_KEYS of the JSON files (timings,
clocks, memory, Ray node ids, library versions); `--show-per-run` lists what differs in them, to
check the list. The catalog and the shards have no such part: two runs of the demo crawl with the
same code wrote them identical.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pyarrow.parquet as pq

# keys of manifest.json and stats/*.json, at any depth, that hold clocks, timings, memory, Ray's node
# ids or library versions
PER_RUN_KEYS = ("started", "finished", "seconds", "timeline", "versions", "peak_rss_mb", "actor_setup", "node_id")


def _table(path: Path):
    """The table sorted by sample_id (then key), and its schema's metadata."""
    t = pq.read_table(path)
    if "sample_id" in t.column_names and t.num_rows:
        t = t.sort_by([(c, "ascending") for c in ("sample_id", "key") if c in t.column_names])
    return t, t.schema.metadata or {}


def _strip(obj, removed: set[str], at: str = ""):
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in PER_RUN_KEYS:
                removed.add(f"{at}{k}")
                continue
            out[k] = _strip(v, removed, f"{at}{k}.")
        return out
    if isinstance(obj, list):
        return [_strip(v, removed, at) for v in obj]
    return obj


def _json_diff(a, b, at: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{at}{k}: only in {'B' if k not in a else 'A'}")
            else:
                out += _json_diff(a[k], b[k], f"{at}{k}.")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _json_diff(x, y, f"{at}[{i}].")]
    return [] if a == b else [f"{at.rstrip('.')}: {str(a)[:120]!s} != {str(b)[:120]!s}"]


def _relative(root: Path, pattern: str) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.glob(pattern) if p.is_file()}


def compare(a: Path, b: Path, show_per_run: bool = False) -> dict:
    report: dict = {"a": str(a), "b": str(b), "differences": [], "compared": {}}
    diff = report["differences"]

    for kind, pattern in (("catalog", "catalog/**/*.parquet"), ("shard_index", "shards/*.parquet")):
        names_a, names_b = _relative(a, pattern), _relative(b, pattern)
        diff += [f"{n}: only in {'A' if n in names_a else 'B'}" for n in sorted(names_a ^ names_b)]
        rows = 0
        for n in sorted(names_a & names_b):
            (ta, ma), (tb, mb) = _table(a / n), _table(b / n)
            if ta.schema != tb.schema:
                diff.append(f"{n}: schemas differ: {ta.schema} != {tb.schema}")
            elif not ta.equals(tb):
                bad = [c for c in ta.column_names if not ta.column(c).equals(tb.column(c))]
                diff.append(f"{n}: rows differ in columns {bad}")
            if ma != mb:
                diff.append(f"{n}: schema metadata differs")
            rows += ta.num_rows
        report["compared"][kind] = {"files": len(names_a & names_b), "rows": rows}

    for kind, pattern in (("shard_tar", "shards/*.tar"), ("listing", "units.jsonl")):
        names_a, names_b = _relative(a, pattern), _relative(b, pattern)
        diff += [f"{n}: only in {'A' if n in names_a else 'B'}" for n in sorted(names_a ^ names_b)]
        same = [n for n in sorted(names_a & names_b) if (a / n).read_bytes() == (b / n).read_bytes()]
        diff += [f"{n}: bytes differ" for n in sorted(names_a & names_b) if n not in same]
        report["compared"][kind] = {"files": len(names_a & names_b),
                                    "bytes": sum((a / n).stat().st_size for n in names_a & names_b)}

    removed: set[str] = set()
    per_run: list[str] = []
    for pattern in ("manifest.json", "stats/*.json"):
        names_a, names_b = _relative(a, pattern), _relative(b, pattern)
        diff += [f"{n}: only in {'A' if n in names_a else 'B'}" for n in sorted(names_a ^ names_b)]
        for n in sorted(names_a & names_b):
            ja, jb = json.loads((a / n).read_text()), json.loads((b / n).read_text())
            if show_per_run:
                per_run += [f"{n}: {d}" for d in _json_diff(ja, jb)]
            diff += [f"{n}: {d}" for d in _json_diff(_strip(ja, removed), _strip(jb, set()))]
        report["compared"][pattern] = len(names_a & names_b)
    report["left_out"] = sorted({k.split(".")[-1] for k in removed})
    if show_per_run:
        report["per_run_differences"] = per_run
    report["same"] = not diff
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_a", type=Path)
    p.add_argument("run_b", type=Path)
    p.add_argument("--show-per-run", action="store_true", help="also list the differences in the left-out keys")
    args = p.parse_args(argv)
    report = compare(args.run_a, args.run_b, args.show_per_run)
    print(json.dumps(report, indent=2))
    return 0 if report["same"] else 1


if __name__ == "__main__":
    sys.exit(main())
