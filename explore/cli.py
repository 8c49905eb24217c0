"""`humanset stats`, `humanset query` and `humanset report`: look at what a run produced, via DuckDB."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

QUANTILE_COLUMNS = [("min", "p0"), ("p5", "p5"), ("p25", "p25"), ("p50", "p50"), ("p75", "p75"),
                    ("p95", "p95"), ("max", "p100")]
MAX_SOURCES = 25  # per-source rows printed; --json has the first explore.stats.MAX_PER_SOURCE


def register(sub) -> None:
    p = sub.add_parser(
        "stats", help="funnel, reject reasons, persons per image, size and score distributions of a run",
        description="Statistics of a curation run, read from its Parquet files by DuckDB. Give two runs "
                    "to compare them side by side (e.g. a run and a `humanset select` of it).",
        epilog="example: humanset stats runs/crawl --json > stats.json")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directory (RUN/catalog/samples/*.parquet)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser(
        "query", help="run SQL on a run's views: samples, persons, shards",
        description="Run DuckDB SQL on a run. Views: samples (one row per input sample, the curation "
                    "catalog), persons (one row per detected person), shards (curated shard index). "
                    "Parquet is read in place.",
        epilog="examples:\n"
               "  humanset query RUN \"SELECT reject_reason, count(*) FROM samples GROUP BY 1 ORDER BY 2 DESC\"\n"
               "  humanset query RUN \"SELECT * FROM persons WHERE score > 0.95\" --out persons.parquet",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN", help="run directory")
    p.add_argument("sql", metavar="SQL", help="the query (quote it)")
    p.add_argument("--out", metavar="FILE", help="write the result to FILE.parquet or FILE.csv instead of printing")
    p.add_argument("--max-rows", type=int, default=40, help="rows to print (default 40)")
    p.set_defaults(func=cmd_query)

    p = sub.add_parser(
        "report", help="write a self-contained HTML report of a run (charts and thumbnails)",
        description="One HTML file with everything embedded: funnel, reject reasons, persons per image, "
                    "score histograms with the active thresholds, and contact sheets of kept and rejected "
                    "samples read from the stored bytes.")
    p.add_argument("run", metavar="RUN", help="run directory")
    p.add_argument("--out", metavar="FILE", help="output HTML (default RUN/report.html)")
    p.add_argument("--thumbs", type=int, default=12, help="thumbnails per contact sheet (default 12)")
    p.add_argument("--seed", type=int, default=0, help="which random samples the contact sheets show")
    p.set_defaults(func=cmd_report)


# --- stats ------------------------------------------------------------------------------------

def cmd_stats(args) -> int:
    import duckdb

    from explore.stats import run_stats

    try:
        result = run_stats(*args.runs)
    except FileNotFoundError as e:
        print(f"humanset stats: error: {e}", file=sys.stderr)
        return 2
    except duckdb.Error as e:  # e.g. a damaged Parquet file in the catalog
        print(f"humanset stats: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        runs = result["runs"] if "runs" in result else [result]
        print(format_stats(runs, result.get("overlap")))
    return 0


def _num(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return str(v)


def _is_number(v) -> bool:
    if isinstance(v, (int, float)):
        return True
    # the strings this module makes from numbers: "1,234 (5.6%)", "-42"; names like "00017" stay text
    return isinstance(v, str) and (v.endswith("%)") or v[:2].lstrip("-").isdigit() and v.startswith("-")
                                   or v in ("-", "", "skipped"))


def _table(header: list[str], rows: list[list], indent: str = "  ") -> str:
    """Aligned text table: numeric columns right-aligned, text columns left-aligned."""
    right = [all(_is_number(r[i]) for r in rows) for i in range(len(header))]
    cells = [[_num(c) for c in r] for r in [header] + rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for k, r in enumerate(cells):
        parts = [c.rjust(w) if rt else c.ljust(w) for c, w, rt in zip(r, widths, right)]
        lines.append(indent + "  ".join(parts).rstrip())
        if k == 0:
            lines.append(indent + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _labels(runs) -> list[str]:
    return [chr(ord("A") + i) for i in range(len(runs))] if len(runs) > 1 else [""]


def _count_pct(n, pct) -> str:
    return f"{n:,} ({pct:.1f}%)"


def format_stats(runs: list[dict], overlap: dict | None = None) -> str:
    """Plain-text tables of one or more runs' statistics, runs as columns."""
    from explore.person_rule import describe

    labels = _labels(runs)
    multi = len(runs) > 1
    out = []

    def section(title, body):
        out.append(f"\n{title}\n{body}")

    for label, r in zip(labels, runs):
        info, tot = r["run"], r["totals"]
        head = f"run {label}: " if multi else "run: "
        out.append(f"{head}{info['run']}")
        if not info["has_manifest"]:
            out.append("  (no manifest.json: stage order and thresholds unknown; the run may be unfinished)")
        else:
            out.append(f"  stages: {' -> '.join(info['stages'] or [])}   {info['started']} .. {info['finished']}")
            for s, why in (info["skipped_stages"] or {}).items():
                out.append(f"  skipped: {s} ({why})")
        out.append(f"  {tot['inputs']:,} inputs, {tot['kept']:,} kept ({tot['kept_pct']:.1f}%), "
                   f"{tot['decode_errors']:,} decode errors")
        out.append(f"  {tot['units']:,} input units, {tot['units_with_errors']:,} units with errors")
        if info.get("store"):
            from explore.stats import store_line
            out.append(f"  {store_line(info['store'])}")

    # funnel: the union of stages, in the first run's order
    stages = []
    for r in runs:
        stages += [f["stage"] for f in r["funnel"] if f["stage"] not in stages and f["stage"] != "kept"]
    stages.append("kept")
    rows = []
    for s in stages:
        row = [s]
        for r in runs:
            f = next((f for f in r["funnel"] if f["stage"] == s), None)
            if f is None:
                row += ["", ""]
            elif f.get("skipped"):
                row += ["skipped", ""]
            else:
                row += [_count_pct(f["count"], f["pct"]), f"-{f['dropped']:,}" if f["dropped"] else ""]
        rows.append(row)
    section("Funnel (samples left after each stage)",
            _table(["stage"] + [h for lab in labels for h in (f"left {lab}".strip(), f"dropped {lab}".strip())], rows))

    reasons = []
    for r in runs:
        reasons += [x["reason"] for x in r["reasons"] if x["reason"] not in reasons]
    rows = []
    for reason in reasons:
        row = [reason]
        for r in runs:
            x = next((x for x in r["reasons"] if x["reason"] == reason), None)
            row += [_count_pct(x["first"], x["pct"]) if x else 0, x["any"] if x else 0]
        rows.append(row)
    section("Reject reasons (first: rejected the sample first; any: failed it, counting rows later "
            "stages still scored)",
            _table(["reason"] + [h for lab in labels for h in (f"first {lab}".strip(), f"any {lab}".strip())], rows)
            if rows else "  none")

    kinds = []
    for r in runs:
        kinds += [x["kind"] for x in r["decode_errors"] if x["kind"] not in kinds]
    rows = []
    for kind in kinds:
        found = [next((x for x in r["decode_errors"] if x["kind"] == kind), None) for r in runs]
        example = next(x["example"] for x in found if x)
        rows.append([kind] + [x["count"] if x else 0 for x in found] + [example[:70]])
    section("Decode errors by kind",
            _table(["kind"] + [f"count {lab}".strip() for lab in labels] + ["example"], rows) if rows else "  none")

    fmts = []
    for r in runs:
        fmts += [x["format"] for x in r["formats"] if x["format"] not in fmts]
    rows = []
    for fmt in fmts:
        row = [fmt]
        for r in runs:
            x = next((x for x in r["formats"] if x["format"] == fmt), None)
            row += [x["count"], x["kept"]] if x else [0, 0]
        rows.append(row)
    section("Formats of decoded images",
            _table(["format"] + [h for lab in labels for h in (f"decoded {lab}".strip(), f"kept {lab}".strip())], rows)
            if rows else "  none")

    buckets = []
    for r in runs:
        buckets += [b for b in r["persons_per_kept_image"] if b not in buckets]
    rows = [[b] + [r["persons_per_kept_image"].get(b, 0) for r in runs] for b in buckets]
    measured = any(n for r in runs for b, n in r["persons_per_kept_image"].items() if b != "not measured")
    section("Persons per kept image (persons passing the person rule)",
            _table(["persons"] + [f"images {lab}".strip() for lab in labels], rows) if measured
            else "  the person stage measured no kept image (did it run?)")

    qhead = [h for h, _ in QUANTILE_COLUMNS]

    def qrow(name, d):
        if not d or not d.get("n"):
            return [name, 0] + ["-"] * len(QUANTILE_COLUMNS)
        return [name, d["n"]] + [d["quantiles"][k] for _, k in QUANTILE_COLUMNS]

    rows = []
    for col in ("width", "height", "aspect", "short_side", "file_bytes"):
        for scope in ("decoded", "kept"):
            for lab, r in zip(labels, runs):
                rows.append(qrow(f"{col} {scope} {lab}".strip(), r["geometry"][scope][col]))
    approx = any(r["geometry"]["decoded"]["width"].get("approximate") for r in runs)
    section("Image size (decoded images / kept images)"
            + (" -- quantiles from a reservoir sample, min/max exact" if approx else ""),
            _table(["measure", "n"] + qhead, rows))

    rows = []
    for col in ("score", "box_longer_side", "box_shorter_side"):
        for scope in ("detected", "in_kept_images"):
            for lab, r in zip(labels, runs):
                rows.append(qrow(f"{'raw score' if col == 'score' else col} {scope} {lab}".strip(), r["persons"][scope][col]))
    detected = any(r["persons"]["detected"]["score"].get("n") for r in runs)
    rules = [f"{lab + ': ' if multi else ''}{describe(r['persons'])}" for lab, r in zip(labels, runs)]
    section(f"Detected persons (rule: {'; '.join(rules)})" + ("\n  per box the raw score; the calibrated score is "
            "stored per image (Scores per stage)" if any(r["persons"]["score_kind"] != "raw" for r in runs) else ""),
            _table(["measure", "n"] + qhead, rows) if detected else "  no person boxes in the catalog")

    rows = []
    keys = []
    for r in runs:
        keys += [(s["stage"], s["column"]) for s in r["scores"] if (s["stage"], s["column"]) not in keys]
    for stage, col in keys:
        for lab, r in zip(labels, runs):
            s = next((s for s in r["scores"] if (s["stage"], s["column"]) == (stage, col)), None)
            t = (s or {}).get("threshold")
            rows.append(qrow(f"{stage}.{col} {lab}".strip(), s)
                        + [t["keep"] if t else "", s.get("fail_threshold", "") if s else ""])
    section("Scores per stage (rows the stage measured)",
            _table(["score", "n"] + qhead + ["kept if", "fail"], rows) if rows else "  none measured")

    body = []
    for label, r in zip(labels, runs):
        u = r["units"]
        if not u["units_with_errors"]:
            continue
        head = f"  run {label}: " if multi else "  "
        body.append(f"{head}{u['units_with_errors']:,} of {u['units']:,} units")
        body.append(_table(["kind", "units", "example"],
                           [[k["kind"], k["units"], (k["example"] or "")[:70]] for k in u["error_kinds"]]))
        body.append(_table(["unit", "kind", "inputs read", "error"],
                           [[f["unit"], f["kind"], f["inputs"], f["error"][:70]] for f in u["failed_units"]]))
        if u["units_with_errors"] > u["failed_units_listed"]:
            body.append(f"  (first {u['failed_units_listed']:,} by name; every marker: RUN/stats/*.json)")
    section("Units with errors (read stopped at damage; rows before it kept)", "\n".join(body) or "  none")

    shards = []
    for r in runs:
        shards += [x["shard"] for x in r["per_source"] if x["shard"] not in shards]
    n_sources = max((r["per_source"][0]["sources"] for r in runs if r["per_source"]), default=0)
    rows = []
    for shard in shards[:MAX_SOURCES]:
        row = [shard]
        for r in runs:
            x = next((x for x in r["per_source"] if x["shard"] == shard), None)
            row += [x["inputs"], _count_pct(x["kept"], x["kept_pct"]), x["decode_errors"], x["top_reason"] or ""] \
                if x else ["", "", "", ""]
        rows.append(row)
    more = (f"\n  ... and {n_sources - min(len(shards), MAX_SOURCES):,} more sources (--json lists the first "
            f"{len(shards):,})" if n_sources > min(len(shards), MAX_SOURCES) else "")
    section(f"Per source ({n_sources:,} input units with rows)",
            _table(["source"] + [h for lab in labels for h in (f"inputs {lab}".strip(), f"kept {lab}".strip(),
                                                                 f"decode err {lab}".strip(), f"top reason {lab}".strip())],
                   rows) + more)

    fields = [("duplicates", "duplicate samples"), ("exact", "  exact (same sha256)"), ("near", "  near (pHash)"),
              ("clusters", "clusters"), ("largest_cluster", "largest cluster"),
              ("largest_canonical", "largest cluster's canonical sample_id")]
    rows = [[name] + [r["duplicates"][k] for r in runs] for k, name in fields]
    section("Duplicates", _table([""] + [f"run {lab}".strip() for lab in labels], rows))

    rows = [[name] + [(r["curated"] or {}).get(k, "-") for r in runs]
            for k, name in [("shards", "shard files"), ("samples", "samples"), ("bytes", "bytes")]]
    section("Curated shards", _table([""] + [f"run {lab}".strip() for lab in labels], rows))

    if overlap:
        rows = [["kept in both", overlap["kept_in_both"]], ["kept only in A", overlap["kept_only_in_a"]],
                ["kept only in B", overlap["kept_only_in_b"]], ["samples only in A", overlap["only_in_a"]],
                ["samples only in B", overlap["only_in_b"]]]
        body = _table(["samples (joined on sample_id)", "count"], rows)
        if overlap["why_b_rejected_a_kept"]:
            body += "\n\n" + _table(["B's reason for samples only A kept", "count"],
                                    [[x["reason"], x["count"]] for x in overlap["why_b_rejected_a_kept"]])
        section("A vs B", body)
    return "\n".join(out).lstrip("\n")


# --- query ------------------------------------------------------------------------------------

def cmd_query(args, by_generation: bool = False) -> int:
    import duckdb

    from catalog.duck import connect, is_generation_mismatch
    from catalog.io import atomic_path

    out = Path(args.out) if args.out else None
    if not args.sql.strip():
        print('humanset query: error: SQL is empty; pass a query, e.g. "SELECT count(*) FROM samples"',
              file=sys.stderr)
        return 2
    if out and out.suffix.lower() not in (".parquet", ".csv"):
        print(f"humanset query: --out {out}: the file must end in .parquet or .csv", file=sys.stderr)
        return 2
    try:
        con = connect(args.run, by_generation=by_generation)
    except FileNotFoundError as e:
        print(f"humanset query: error: {e}", file=sys.stderr)
        return 2
    except duckdb.Error as e:  # e.g. a Parquet file that is not one
        print(f"humanset query: error: {args.run}: {e}", file=sys.stderr)
        return 1
    try:
        rel = con.sql(args.sql)
        if rel is None:  # a statement without a result
            print("OK")
            return 0
        if out is None:
            rel.show(max_rows=args.max_rows)
            return 0
        with atomic_path(out) as tmp:
            if out.suffix.lower() == ".parquet":
                rel.to_parquet(str(tmp))
            else:
                rel.to_csv(str(tmp))
        n = (_parquet_rows(out) if out.suffix.lower() == ".parquet"
             else con.execute("SELECT count(*) FROM read_csv(?)", [str(out)]).fetchone()[0])
        print(f"wrote {n:,} rows to {out}")
        return 0
    except duckdb.Error as e:
        if is_generation_mismatch(e) and not by_generation:  # the run holds parts of an older schema
            con.close()
            return cmd_query(args, by_generation=True)
        views = ", ".join(r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal "
                                                    "ORDER BY 1").fetchall())
        print(f"humanset query: {e}\n(views of this run: {views})", file=sys.stderr)
        return 2  # the query is the user's to fix
    finally:
        con.close()


def _parquet_rows(path) -> int:
    import pyarrow.parquet as pq

    return pq.read_metadata(path).num_rows


# --- report -----------------------------------------------------------------------------------

def cmd_report(args) -> int:
    import duckdb

    from explore.report import write_report

    from catalog.storage import is_uri
    out = args.out if args.out and is_uri(args.out) else Path(args.out) if args.out else None
    try:
        path = write_report(args.run, out, thumbs=args.thumbs, seed=args.seed)
    except FileNotFoundError as e:
        print(f"humanset report: error: {e}", file=sys.stderr)
        return 2
    except duckdb.Error as e:
        print(f"humanset report: error: {e}", file=sys.stderr)
        return 1
    print(f"report: {path if isinstance(path, str) else path.resolve()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """These commands without the rest of humanset: `python -m explore.cli stats RUN`."""
    parser = argparse.ArgumentParser(prog="python -m explore.cli", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
