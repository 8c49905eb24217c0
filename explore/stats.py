"""Dataset statistics of a curation run, computed by DuckDB straight from the run's Parquet files.

Every function takes a DuckDB connection on which a run's views are registered (catalog.duck), plus
the view prefix, and returns plain dicts and lists. The CLI (`humanset stats`), the HTML report and
bench/stats.py share these functions; nothing is loaded into pandas.

Size: one concern, the statistics of a run: the SQL building blocks (manifest and threshold lookups,
row fetching, reason kinds, quantiles) come first, then the funnel, reasons and distributions built
from them; split, each half was only read with the other.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from catalog import run_kind
from catalog.duck import register, retry_by_generation, run_exists, run_location, worth_loading
from catalog.rules import INPUT_STAGE, PERSON_SCORE, PERSON_SCORE_COLUMNS, RULES, Rule
from catalog.unit_stats import unit_outcomes
from explore import person_rule

# ----------------------------------------------------------------------------------------------------
# The SQL building blocks: manifest and threshold lookups, row fetching, reason
# kinds and quantiles (exact below EXACT_MAX_ROWS samples, else from a reservoir sample).

QUANTILES = (0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0)


EXACT_MAX_ROWS = 20_000_000  # above this many samples quantiles come from a reservoir sample


RESERVOIR = 1_000_000


REASON_KIND = "trim(regexp_extract({col}, '^([^:]*(:[^:]*)?)', 1))"


_REASON_KIND_RE = re.compile(r"^([^:]*(:[^:]*)?)")


def reason_kind(reason: str) -> str:
    """REASON_KIND in Python."""
    return _REASON_KIND_RE.match(reason).group(1).strip()


FAILED = "NOT coalesce(keep, false)"


def read_manifest(run_dir) -> dict:
    """RUN/manifest.json, or {} for a run that has not written one (yet)."""
    from catalog.storage import is_uri, storage_for
    if is_uri(run_dir):  # a run on an object store
        store = storage_for(run_dir)
        return store.read_json("manifest.json") if store.exists("manifest.json") else {}
    path = Path(run_dir) / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {}


def threshold(manifest: dict, rule: Rule | None):
    """The active threshold of `rule` in the run's manifest: its config value, the rule's default
    when the config lacks the key, None without a config (a run with no manifest) or when off."""
    config = manifest.get("config")
    if rule is None or not config:
        return None
    section = config.get(rule.stage)
    return rule.threshold(section if isinstance(section, dict) else {})


def fetch_rows(con, sql: str, params=None) -> list[dict]:
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def percent(n, total) -> float:
    return round(100.0 * n / total, 2) if total else 0.0


def quantile_sql(expr: str, where: str = "", exact: bool = True) -> str:
    """quantiles, n, mean, min, max of expr. Exact quantiles hold every value in memory, so large
    catalogs use a reservoir sample (RESERVOIR values); min and max stay exact either way."""
    qs = ", ".join(str(q) for q in QUANTILES)
    f = f" FILTER (WHERE {where})" if where else ""
    q = f"quantile_cont({expr}, [{qs}])" if exact else f"reservoir_quantile({expr}, [{qs}], {RESERVOIR})"
    return f"{q}{f}, count({expr}){f}, avg({expr}){f}, min({expr}){f}, max({expr}){f}"


N_QUANTILE_SQL = 5  # values _quantile_sql yields


def quantile_dict(qs, n, mean, lo, hi, exact: bool = True) -> dict:
    if not n:
        return {"n": 0}
    q = {f"p{round(q * 100):g}": round(float(v), 4) for q, v in zip(QUANTILES, qs)}
    q["p0"], q["p100"] = round(float(lo), 4), round(float(hi), 4)
    return {"n": n, "mean": round(float(mean), 4), "quantiles": q, **({} if exact else {"approximate": True})}


def quantile_block(con, cols: list[str], scopes: dict[str, str], source: str, exact: bool) -> dict:
    """{scope: {col: quantile dict}} in one scan; scopes map a name to a filter ('' = all rows)."""
    parts = [quantile_sql(c, where, exact) for where in scopes.values() for c in cols]
    vals = con.execute(f"SELECT {', '.join(parts)} FROM {source}").fetchone()
    out, k = {}, 0
    for scope in scopes:
        out[scope] = {}
        for c in cols:
            out[scope][c] = quantile_dict(*vals[k:k + N_QUANTILE_SQL], exact=exact)
            k += N_QUANTILE_SQL
    return out


# ----------------------------------------------------------------------------------------------------
PERSON_BUCKETS = ("1", "2", "3", "4", "5+")

# "decode:truncated: image file is truncated" -> "decode:truncated"; "size:short_side<300" stays


# per-image measurements shown beside the rules' columns (catalog.rules), with no threshold of their own
INFO_COLUMNS = {"dedup": ("dup_cluster_size",), "person": ("n_persons", "person_look_score")}
STAGE_ORDER = ("size", "dedup", "person", "text", "watermark", "art")
# columns whose values are probabilities: histograms over [0, 1] rather than over the data range
UNIT_RANGE = {"person_score_max", "person_score_calibrated", "person_look_score", "watermark_score", "art_score",
              "text_area_frac"}


def stage_order(con, manifest: dict, p: str = "") -> list[str]:
    """Stages in cascade order: the manifest's, else the config's, else the order rows record."""
    stages = manifest.get("stages") or (manifest.get("config") or {}).get("stages")
    if stages:
        return list(stages)
    rows = con.execute(
        f"SELECT s FROM (SELECT unnest(scored_stages) AS s, generate_subscripts(scored_stages, 1) AS i "
        f"FROM {p}samples) GROUP BY s ORDER BY min(i), s").fetchall()
    return [r[0] for r in rows]


def totals(con, p: str = "") -> dict:
    n, kept, bad = con.execute(
        f"SELECT count(*), count(*) FILTER (WHERE keep), count(*) FILTER (WHERE decode_error IS NOT NULL) "
        f"FROM {p}samples").fetchone()
    return {"inputs": n, "kept": kept, "rejected": n - kept, "kept_pct": percent(kept, n), "decode_errors": bad}


def funnel(con, manifest: dict, p: str = "", n: int | None = None) -> list[dict]:
    """inputs -> remaining after each stage -> kept, from each row's first failing stage.

    Works for cascade runs and --score-all runs alike, since reject_reason is the first failure in
    stage order. Rejections by a stage the manifest does not list are shown after the listed ones.
    """
    if n is None:
        n = con.execute(f"SELECT count(*) FROM {p}samples").fetchone()[0]
    dropped = dict(con.execute(
        f"SELECT coalesce(nullif(split_part(reject_reason, ':', 1), ''), '(no reason)'), count(*) "
        f"FROM {p}samples WHERE {FAILED} GROUP BY 1").fetchall())
    skipped = manifest.get("skipped_stages") or {}
    stages = stage_order(con, manifest, p)
    # skipped stages are shown where the config's cascade has them
    configured = (manifest.get("config") or {}).get("stages") or []
    if any(s not in stages for s in skipped):
        stages = [s for s in configured if s in stages or s in skipped] + \
                 [s for s in stages if s not in configured] + [s for s in skipped if s not in configured]
    stages += sorted((s for s in dropped if s not in stages), key=lambda s: -dropped[s])
    if INPUT_STAGE in stages:  # samples the source never gave bytes for (a failed download) come first
        stages = [INPUT_STAGE] + [s for s in stages if s != INPUT_STAGE]
    out = [{"stage": "inputs", "count": n, "pct": percent(n, n), "dropped": 0}]
    left = n
    for s in stages:
        left -= dropped.get(s, 0)
        row = {"stage": s, "count": left, "pct": percent(left, n), "dropped": dropped.get(s, 0)}
        if s in skipped:
            row["skipped"] = skipped[s]
        out.append(row)
    out.append({"stage": "kept", "count": left, "pct": percent(left, n), "dropped": 0})
    return out


def reasons(con, p: str = "", n: int | None = None) -> list[dict]:
    """Reject reasons (normalised to 'stage:kind') with the number of samples they rejected first,
    and the number they failed at all (differs from `first` when later stages scored rejected rows)."""
    if n is None:
        n = con.execute(f"SELECT count(*) FROM {p}samples").fetchone()[0]
    # group the raw strings first: few distinct values, so the regex runs on those only
    first = {r[0]: r[1:] for r in con.execute(f"""
        SELECT {REASON_KIND.format(col='r')}, sum(n)::BIGINT, min(r)
        FROM (SELECT reject_reason AS r, count(*) AS n FROM {p}samples WHERE reject_reason IS NOT NULL GROUP BY 1)
        GROUP BY 1""").fetchall()}
    every = dict(con.execute(f"""
        SELECT {REASON_KIND.format(col='r')}, sum(n)::BIGINT
        FROM (SELECT r, count(*) AS n FROM (SELECT unnest(reject_reasons) AS r FROM {p}samples
                                            WHERE len(reject_reasons) > 0) GROUP BY 1)
        GROUP BY 1""").fetchall())
    rows = []
    for kind in set(first) | set(every):
        n_first, example = first.get(kind, (0, None))
        rows.append({"reason": kind, "stage": kind.split(":", 1)[0], "first": n_first,
                     "pct": percent(n_first, n), "any": every.get(kind, n_first), "example": example})
    return sorted(rows, key=lambda r: (-r["first"], -r["any"], r["reason"]))


def decode_errors(con, p: str = "") -> list[dict]:
    """Decode errors grouped by kind (the text before the first ':'), with one full example."""
    return fetch_rows(con, f"""
        SELECT trim(split_part(decode_error, ':', 1)) AS kind, count(*) AS count, min(decode_error) AS example
        FROM {p}samples WHERE decode_error IS NOT NULL GROUP BY 1 ORDER BY count DESC, kind""")


def formats(con, p: str = "") -> list[dict]:
    return fetch_rows(con, f"""
        SELECT coalesce(format, '(unknown)') AS format, count(*) AS count, count(*) FILTER (WHERE keep) AS kept
        FROM {p}samples WHERE decode_error IS NULL GROUP BY 1 ORDER BY count DESC""")


def persons_per_image(con, p: str = "") -> dict:
    """Kept images by persons that pass the person rule (Sapiens' persons-per-image figure).

    Images the person stage did not measure are counted under 'not measured'.
    """
    rows = dict(con.execute(f"""
        SELECT CASE WHEN person_n_pass IS NULL THEN 'not measured'
                    WHEN person_n_pass >= 5 THEN '5+' ELSE person_n_pass::VARCHAR END, count(*)
        FROM {p}samples WHERE keep GROUP BY 1""").fetchall())
    out = {b: rows.pop(b, 0) for b in PERSON_BUCKETS}
    out.update(sorted(rows.items()))  # '0' (kept without a passing person) or 'not measured'
    return out


def geometry(con, p: str = "", exact: bool = True) -> dict:
    """Quantiles of width, height, aspect, short side and file size, over decoded and kept images."""
    return quantile_block(con, ["width", "height", "aspect", "short_side", "file_bytes"],
                           {"decoded": "", "kept": "keep"}, f"{p}samples WHERE decode_error IS NULL", exact)


def persons_source(p: str) -> str:
    # every detected person, unnested directly: cheaper than the persons view's range join at scale
    return f"""(SELECT keep, s AS score,
                       greatest(b[3] - b[1], b[4] - b[2]) AS box_longer_side,
                       least(b[3] - b[1], b[4] - b[2]) AS box_shorter_side
                FROM (SELECT keep, unnest(person_boxes) AS b, unnest(person_scores) AS s
                      FROM {p}samples WHERE len(person_scores) > 0))"""


def persons(con, manifest: dict, p: str = "", exact: bool = True) -> dict:
    """Per detected person: raw score and box-side quantiles, all detections and those in kept images,
    beside the run's person rule (explore.person_rule.rule: thresholds, box rule, which score the cut
    reads). Only the raw score is stored per box; a calibrated cut's score is per image."""
    out = quantile_block(con, ["score", "box_longer_side", "box_shorter_side"],
                          {"detected": "", "in_kept_images": "keep"}, persons_source(p), exact)
    out.update(person_rule.rule(manifest))
    out["second_look"] = second_look(con, p)
    return out


def second_look(con, p: str = "") -> dict:
    """The person stage's second look (person.second_look): images it read (no box passed the cut, one was over
    the size rule), those that then passed the person rule (it only ever raises a box's score, so every one of
    them passed because of it) and those kept."""
    if "person_look_box" not in columns(con, f"{p}samples"):  # a table of only some columns
        return {"read": 0, "passed": 0, "kept": 0}
    read, passed, kept = con.execute(f"""
        SELECT count(person_look_box), count(person_look_box) FILTER (WHERE person_n_pass > 0),
               count(person_look_box) FILTER (WHERE person_n_pass > 0 AND keep) FROM {p}samples""").fetchone()
    return {"read": read, "passed": passed, "kept": kept}


def _stage_measures(stage: str, manifest: dict) -> list[tuple[str, Rule | None]]:
    """(column, rule or None) of a stage: its rules' columns, then its other columns. The person score
    rule cuts the column the run's person.score names; the other person score is shown without one."""
    rules = list(RULES.get(stage, ()))
    extra: list[str] = []
    if stage == PERSON_SCORE.stage:
        cut = person_rule.score_rule(manifest)
        rules = [cut if r == PERSON_SCORE else r for r in rules]
        extra = [c for c in PERSON_SCORE_COLUMNS.values() if c != cut.column]
    return [(r.column, r) for r in rules] + [(c, None) for c in extra + list(INFO_COLUMNS.get(stage, ()))]


def scores(con, manifest: dict, p: str = "", exact: bool = True) -> list[dict]:
    """Distribution of every stored per-image score, with the run's active threshold on it.

    `fail_threshold` counts measured rows on the rejected side of the threshold, whatever stage
    rejected them first. One scan for all columns.
    """
    have = columns(con, f"{p}samples")
    measures = [(stage, col, rule, threshold(manifest, rule))
                for stage in STAGE_ORDER for col, rule in _stage_measures(stage, manifest) if col in have]
    parts = []
    for _stage, col, rule, t in measures:
        parts.append(quantile_sql(col, exact=exact))
        parts.append(f"count(*) FILTER (WHERE {rule.sql_fails(col, t)})" if _number(t) else "NULL")
    vals = con.execute(f"SELECT {', '.join(parts)} FROM {p}samples").fetchone()
    out = []
    k = N_QUANTILE_SQL + 1
    for i, (stage, col, rule, t) in enumerate(measures):
        *q, fails = vals[k * i: k * i + k]
        if not q[1]:
            continue  # the run never measured it
        d = {"stage": stage, "column": col, **quantile_dict(*q, exact=exact), "threshold": None}
        if _number(t):
            d["threshold"] = {"key": rule.config_key, "value": t, "keep": f"{rule.keep} {t}"}
            d["fail_threshold"] = fails
        out.append(d)
    return out


def columns(con, relation: str) -> set[str]:
    """The column names of a table or view."""
    return {r[0] for r in con.execute(f"DESCRIBE {relation}").fetchall()}


def _number(t) -> bool:
    """A threshold usable in SQL: finite (config validation refuses NaN; an old manifest may hold it)."""
    return isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)


MAX_PER_SOURCE = 1000  # per-source rows returned (a crawl has ~10^6 units; the markers count them all)


def per_source(con, p: str = "", limit: int = MAX_PER_SOURCE) -> list[dict]:
    """One row per input unit (shard), the first `limit` by name: inputs, kept, decode errors and its
    most common reason. Each row carries `sources`, the number of units with rows."""
    rows = fetch_rows(con, f"""
        WITH c AS (SELECT shard, count(*) AS inputs, count(*) FILTER (WHERE keep) AS kept,
                          count(*) FILTER (WHERE decode_error IS NOT NULL) AS decode_errors
                   FROM {p}samples GROUP BY shard),
             first AS (SELECT *, count(*) OVER () AS sources FROM c ORDER BY shard LIMIT {int(limit)}),
             raw AS (SELECT shard, reject_reason AS r, count(*) AS n FROM {p}samples
                     WHERE reject_reason IS NOT NULL AND shard IN (SELECT shard FROM first) GROUP BY 1, 2),
             kinds AS (SELECT shard, {REASON_KIND.format(col='r')} AS kind, sum(n) AS n FROM raw GROUP BY 1, 2),
             top AS (SELECT shard, arg_max(kind, n) AS top_reason FROM kinds GROUP BY 1)
        SELECT first.*, top.top_reason FROM first
        LEFT JOIN top ON first.shard IS NOT DISTINCT FROM top.shard ORDER BY first.shard""")
    for r in rows:
        r["kept_pct"] = percent(r["kept"], r["inputs"])
    return rows


def duplicates(con, p: str = "") -> dict:
    """Duplicate clusters: how many, how large, exact vs near, and the largest one's canonical."""
    # count(DISTINCT) in a query of its own: beside FILTERed aggregates DuckDB 2.0 held ~20 KB per part
    clusters = con.execute(f"SELECT count(*) FROM (SELECT DISTINCT dup_of FROM {p}samples "
                           f"WHERE dup_of <> sample_id)").fetchone()[0]
    n_dup, largest, canonical, exact, near = con.execute(f"""
        SELECT count(*) FILTER (WHERE dup_of <> sample_id),
               max(dup_cluster_size),
               arg_max(coalesce(dup_of, sample_id), dup_cluster_size) FILTER (WHERE dup_cluster_size > 1),
               count(*) FILTER (WHERE dup_kind = 'exact' AND dup_of <> sample_id),
               count(*) FILTER (WHERE dup_kind = 'near' AND dup_of <> sample_id)
        FROM {p}samples""").fetchone()
    sizes = fetch_rows(con, f"""
        SELECT dup_cluster_size AS size, count(*) // dup_cluster_size AS clusters FROM {p}samples
        WHERE dup_cluster_size > 1 GROUP BY 1 ORDER BY 1""")
    return {"duplicates": n_dup, "clusters": clusters, "largest_cluster": largest or 1,
            "largest_canonical": canonical, "exact": exact, "near": near, "cluster_sizes": sizes}


def has_view(con, name: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = ?", [name]).fetchone()[0])


def curated(con, p: str = "") -> dict | None:
    """What the curated shards hold (None when the run wrote no shards)."""
    if not has_view(con, f"{p}shards"):
        return None
    files, rows = con.execute(f"SELECT count(DISTINCT shard), count(*) FROM {p}shards").fetchone()
    nbytes = con.execute(f"SELECT sum(m.size) FROM (SELECT unnest(members) AS m FROM {p}shards)").fetchone()[0]
    return {"shards": files, "samples": rows, "bytes": int(nbytes or 0)}


def store_line(store: dict) -> str:
    """The manifest's `store` counts (catalog/storage/retry.py) in one line: what the object store
    made the run retry, and for what."""
    n, retries = int(store.get("requests") or 0), int(store.get("retries") or 0)
    per = f" ({1000 * retries / n:.1f} per 1,000)" if n else ""
    line = (f"store: {n:,} requests, {retries:,} retried{per}, {int(store.get('throttled') or 0):,} throttled, "
            f"{int(store.get('resumed_reads') or 0):,} reads resumed")
    kinds = ", ".join(f"{k} {v:,}" for k, v in (store.get("retries_for") or {}).items())
    return f"{line} (retries: {kinds})" if kinds else line


def run_info(manifest: dict, run_dir) -> dict:
    keys = ("stages", "skipped_stages", "inputs", "started", "finished", "versions", "store")
    return {"run": str(run_dir), "has_manifest": bool(manifest), **{k: manifest.get(k) for k in keys}}


def collect(con, manifest: dict, run_dir, p: str = "", exact: bool | None = None) -> dict:
    """Every statistic of one run registered on `con` with view prefix `p`.

    Quantiles are exact up to EXACT_MAX_ROWS samples and from a reservoir sample above (exact=None).
    """
    tot = totals(con, p)
    if exact is None:
        exact = tot["inputs"] <= EXACT_MAX_ROWS
    units = unit_outcomes(run_dir)
    tot.update(units=units["units"], units_with_errors=units["units_with_errors"])
    return {
        "run": run_info(manifest, run_dir),
        "totals": tot,
        "units": units,
        "funnel": funnel(con, manifest, p, tot["inputs"]),
        "reasons": reasons(con, p, tot["inputs"]),
        "decode_errors": decode_errors(con, p),
        "formats": formats(con, p),
        "persons_per_kept_image": persons_per_image(con, p),
        "geometry": geometry(con, p, exact),
        "persons": persons(con, manifest, p, exact),
        "scores": scores(con, manifest, p, exact),
        "per_source": per_source(con, p),
        "duplicates": duplicates(con, p),
        "curated": curated(con, p),
    }


def overlap(con, pa_: str, pb: str) -> dict:
    """How two runs' decisions differ, sample by sample (joined on sample_id)."""
    row = con.execute(f"""
        SELECT count(*) FILTER (WHERE a.keep AND b.keep),
               count(*) FILTER (WHERE a.keep AND NOT coalesce(b.keep, false)),
               count(*) FILTER (WHERE b.keep AND NOT coalesce(a.keep, false)),
               count(*) FILTER (WHERE b.sample_id IS NULL),
               count(*) FILTER (WHERE a.sample_id IS NULL)
        FROM {pa_}samples a FULL JOIN {pb}samples b ON a.sample_id = b.sample_id""").fetchone()
    why = fetch_rows(con, f"""
        SELECT {REASON_KIND.format(col='b.reject_reason')} AS reason, count(*) AS count
        FROM {pa_}samples a JOIN {pb}samples b ON a.sample_id = b.sample_id
        WHERE a.keep AND NOT coalesce(b.keep, false) GROUP BY 1 ORDER BY count DESC LIMIT 20""")
    return {"kept_in_both": row[0], "kept_only_in_a": row[1], "kept_only_in_b": row[2],
            "only_in_a": row[3], "only_in_b": row[4], "why_b_rejected_a_kept": why}


def open_runs(*run_dirs, by_generation: bool = False, load: bool = False):
    """A DuckDB connection with each run's views registered, and the view prefix of each run.

    One run gets the plain names (samples, persons, shards, ...); several get r0_samples, r1_samples...
    by_generation: type the views from every part's columns (catalog.duck: runs with older parts).
    load: `samples` is a temporary table of the run's rows, read once (catalog.duck.load_table), when
    the run's parts are small (catalog.duck.worth_loading).
    """
    import tempfile

    import duckdb

    # a loaded table larger than DuckDB's memory spills to the system's temporary folder, never the cwd
    con = duckdb.connect(config={"temp_directory": str(Path(tempfile.gettempdir()) / "humanset-duckdb")})
    prefixes = []
    try:
        for i, run in enumerate(run_dirs):
            if not run_exists(run_location(run)):
                raise FileNotFoundError(f"{run}: no such run directory; pass a curation run's folder (humanset curate "
                                        "--output RUN)")
            kind = run_kind.kind_of(run)
            if kind not in (None, "curate", "select"):
                raise FileNotFoundError(f"{run}: holds {run_kind.describe(kind)}; pass a curation run's folder "
                                        "(humanset curate --output RUN)")
            prefix = "" if len(run_dirs) == 1 else f"r{i}_"
            # load: a dozen scans follow, so the parts are read once, a chunk at a time (catalog.duck)
            loaded = ("samples",) if load and worth_loading(run) else ()
            if f"{prefix}samples" not in register(con, run, prefix, by_generation, loaded):
                raise FileNotFoundError(f"{run}: no catalog/samples/*.parquet in it; "
                                        "is it a curation run directory?")
            prefixes.append(prefix)
    except BaseException:
        con.close()
        raise
    return con, prefixes


def run_stats(*run_dirs) -> dict:
    """Statistics of one run, or of several side by side with their overlap ({'runs': [...]})."""
    return retry_by_generation(lambda by_generation: _run_stats(run_dirs, by_generation))


def _run_stats(run_dirs, by_generation: bool) -> dict:
    con, prefixes = open_runs(*run_dirs, by_generation=by_generation, load=True)
    try:
        results = [collect(con, read_manifest(r), r, p) for r, p in zip(run_dirs, prefixes)]
        if len(run_dirs) == 1:
            return results[0]
        out = {"runs": results}
        if len(run_dirs) == 2:
            out["overlap"] = overlap(con, *prefixes)
        return out
    finally:
        con.close()


def histogram(con, expr: str, source: str, bins: int = 40, lo=None, hi=None, where: str = "") -> dict:
    """Counts of `expr` over `source` in equal bins, computed in SQL (nothing is fetched per row).

    Without lo/hi the range is the data's 0.5th..99.5th percentile (its min..max below 1000 values),
    so one outlier cannot squash the chart; values outside land in the first/last bin and are
    counted in `clipped`.
    """
    w = f"WHERE ({expr}) IS NOT NULL" + (f" AND ({where})" if where else "")
    if lo is None or hi is None:
        n, qlo, qhi = con.execute(
            f"SELECT count(*), CASE WHEN count(*) < 1000 THEN min({expr}) ELSE quantile_cont({expr}, 0.005) END, "
            f"CASE WHEN count(*) < 1000 THEN max({expr}) ELSE quantile_cont({expr}, 0.995) END "
            f"FROM {source} {w}").fetchone()
        if not n:
            return {"edges": [], "counts": [], "clipped": 0}
        lo = qlo if lo is None else lo
        hi = qhi if hi is None else hi
    return _binned(con, expr, source, w, bins, float(lo), float(hi))


def histogram_from(con, expr: str, source: str, q: dict, bins: int = 40, lo=None, hi=None) -> dict:
    """histogram() with its range taken from a quantile dict of collect(): p1..p99 (min..max below
    1000 values). Saves the range scan when the statistics are already there."""
    if not q.get("n"):
        return {"edges": [], "counts": [], "clipped": 0}
    small = q["n"] < 1000
    lo = q["quantiles"]["p0" if small else "p1"] if lo is None else lo
    hi = q["quantiles"]["p100" if small else "p99"] if hi is None else hi
    return _binned(con, expr, source, f"WHERE ({expr}) IS NOT NULL", bins, float(lo), float(hi))


def _binned(con, expr: str, source: str, w: str, bins: int, lo: float, hi: float) -> dict:
    if hi <= lo:
        hi = lo + 1.0
    width = (hi - lo) / bins
    rows = con.execute(f"""
        SELECT least(greatest(floor((({expr}) - {lo!r}) / {width!r})::BIGINT, 0), {bins - 1}) AS b,
               count(*), count(*) FILTER (WHERE ({expr}) < {lo!r} OR ({expr}) > {hi!r})
        FROM {source} {w} GROUP BY b""").fetchall()
    counts = [0] * bins
    clipped = 0
    for b, n, c in rows:
        counts[b] += n
        clipped += c
    return {"edges": [lo + i * width for i in range(bins + 1)], "counts": counts, "clipped": clipped}
