"""Run-wide duplicate clusters: exact (same sha256) and near (pHash Hamming distance <= k).

Near pairs are found exactly with the pigeonhole principle: cut the 64-bit hash into k+1 bands;
two hashes within distance k agree on at least one whole band. DuckDB joins distinct hashes on
each band (out of core) and verifies each candidate with bit_count(xor). Clusters are the
connected components of exact + near pairs (union-find); each keeps one canonical sample:
largest resolution, then smallest sample_id. The result is a pure function of the inputs, so a
resumed run gets the same clusters as a clean one.
"""
from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def bands(k: int, bits: int = 64) -> list[tuple[int, int]]:
    """(shift, width) of k+1 bands covering `bits` bits."""
    n = k + 1
    widths = [bits // n + (1 if i < bits % n else 0) for i in range(n)]
    out, shift = [], bits
    for w in widths:
        shift -= w
        out.append((shift, w))
    return out


def _union_find(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Root per node after unioning every (a[i], b[i]); path halving, vectorised over edges."""
    parent = np.arange(n, dtype=np.int64)

    def find(x):
        while True:
            p = parent[x]
            gp = parent[p]
            if np.array_equal(p, gp):
                return p
            parent[x] = gp
            x = gp

    while len(a):
        ra, rb = find(a), find(b)
        diff = ra != rb
        ra, rb = ra[diff], rb[diff]
        if not len(ra):
            break
        lo, hi = np.minimum(ra, rb), np.maximum(ra, rb)
        parent[hi] = lo  # several edges may write the same hi: others are redone next round
        a, b = lo, hi
    return find(np.arange(n, dtype=np.int64))


def cluster(samples: pa.Table, max_distance: int = 4, exact: bool = True) -> pa.Table:
    """samples: sample_id, sha256, phash (uint64, may be null), width, height.

    Returns sample_id, dup_of, dup_kind, dup_cluster_size for every input row.
    """
    con = duckdb.connect()
    con.register("s0", samples)
    # row order fixed by sample_id, so node numbers (and everything after) are deterministic
    con.execute("CREATE TEMP TABLE s AS SELECT row_number() OVER (ORDER BY sample_id) - 1 AS i, "
                "sample_id, sha256, phash, coalesce(width, 0)::BIGINT * coalesce(height, 0) AS area FROM s0")
    n = con.execute("SELECT count(*) FROM s").fetchall()[0][0]
    edges = []
    if exact:
        edges.append("SELECT min(i) OVER (PARTITION BY sha256) AS a, i AS b FROM s WHERE sha256 IS NOT NULL")
    if max_distance is not None and max_distance >= 0:
        # identical hashes: one edge to the first sample of the hash
        edges.append("SELECT min(i) OVER (PARTITION BY phash) AS a, i AS b FROM s WHERE phash IS NOT NULL")
        if max_distance > 0:
            con.execute("CREATE TEMP TABLE h AS SELECT phash, min(i) AS i FROM s "
                        "WHERE phash IS NOT NULL GROUP BY phash")
            for shift, width in bands(max_distance):
                mask = (1 << width) - 1
                band = f"((phash >> {shift}) & {mask}::UBIGINT)"
                edges.append(
                    f"SELECT x.i AS a, y.i AS b FROM (SELECT i, phash, {band} AS band FROM h) x "
                    f"JOIN (SELECT i, phash, {band} AS band FROM h) y "
                    f"ON x.band = y.band AND x.phash < y.phash "
                    f"WHERE bit_count(xor(x.phash, y.phash)) <= {int(max_distance)}")
    if edges:
        e = con.execute(" UNION ".join(f"({q})" for q in edges)).fetchnumpy()
        a, b = e["a"].astype(np.int64), e["b"].astype(np.int64)
    else:
        a = b = np.zeros(0, dtype=np.int64)
    root = _union_find(n, a, b)
    con.register("roots", pa.table({"i": np.arange(n, dtype=np.int64), "root": root}))
    return con.sql("""
        WITH c AS (
            SELECT s.*, r.root,
                   count(*) OVER (PARTITION BY r.root) AS size,
                   first_value(s.sample_id) OVER (PARTITION BY r.root ORDER BY s.area DESC, s.sample_id) AS canon,
                   first_value(s.sha256) OVER (PARTITION BY r.root ORDER BY s.area DESC, s.sample_id) AS canon_sha
            FROM s JOIN roots r USING (i))
        SELECT sample_id,
               CASE WHEN sample_id <> canon THEN canon END AS dup_of,
               CASE WHEN sample_id = canon THEN NULL
                    WHEN sha256 = canon_sha THEN 'exact' ELSE 'near' END AS dup_kind,
               size::INTEGER AS dup_cluster_size
        FROM c ORDER BY sample_id""").to_arrow_table()


# --------------------------------------------------------------------------------------------
# Run level: the interface the engine calls (RUN/work/measure -> RUN/work/dedup/{unit}.parquet).

VERDICT_SCHEMA = pa.schema([pa.field("sample_id", pa.string()), pa.field("dup_of", pa.string()),
                            pa.field("dup_kind", pa.string()), pa.field("dup_cluster_size", pa.int32())])
MEASURE_COLUMNS = ["sample_id", "sha256", "phash", "width", "height", "_alive"]


def dedup_dir(run) -> Path:
    return Path(run) / "work" / "dedup"


def is_done(run) -> bool:
    """True once run_dedup finished for this RUN (its marker is written last)."""
    return (dedup_dir(run) / "_done.json").exists()


def run_dedup(run, unit_ids: list[str], cfg: dict) -> dict:
    """Cluster every measured sample of the run and write one verdict file per unit.

    Reads RUN/work/measure/{unit}.parquet (columns MEASURE_COLUMNS; only rows with `_alive`
    take part), writes RUN/work/dedup/{unit}.parquet (VERDICT_SCHEMA, the unit's alive rows)
    and, last, RUN/work/dedup/_done.json with counts. Returns those counts.
    """
    import catalog
    run = Path(run)
    d = cfg.get("dedup", {})
    enabled = "dedup" in cfg.get("stages", ["dedup"])
    parts = []
    for u in unit_ids:
        t = pq.read_table(run / "work" / "measure" / f"{u}.parquet", columns=MEASURE_COLUMNS)
        t = t.filter(t.column("_alive")).drop_columns(["_alive"])
        parts.append(t.append_column("_unit", pa.array([u] * t.num_rows, pa.string())))
    table = pa.concat_tables(parts) if parts else None
    if table is not None and table.num_rows and enabled:
        result = cluster(table.drop_columns(["_unit"]), d.get("max_distance", 4), d.get("exact", True))
    else:
        ids = table.column("sample_id") if table is not None else pa.array([], pa.string())
        n = len(ids)
        result = pa.table({"sample_id": ids, "dup_of": pa.nulls(n, pa.string()),
                           "dup_kind": pa.nulls(n, pa.string()), "dup_cluster_size": pa.nulls(n, pa.int32())})
    units = {r: u for r, u in zip(table.column("sample_id").to_pylist(),
                                  table.column("_unit").to_pylist())} if table is not None else {}
    by_unit: dict[str, list[int]] = {u: [] for u in unit_ids}
    for i, sid in enumerate(result.column("sample_id").to_pylist()):
        by_unit[units[sid]].append(i)
    for u, idx in by_unit.items():
        part = result.take(pa.array(idx, pa.int64())).cast(VERDICT_SCHEMA)
        catalog.write_parquet(dedup_dir(run) / f"{u}.parquet", part)
    stats = {"candidates": result.num_rows,
             "duplicates": result.filter(pc.is_valid(result.column("dup_of"))).num_rows}
    catalog.write_json(dedup_dir(run) / "_done.json", stats)
    return stats


def read_verdicts(run, unit_id: str) -> pa.Table:
    """The dedup verdicts of one unit's samples (VERDICT_SCHEMA); reads only that unit's file."""
    return pq.read_table(dedup_dir(run) / f"{unit_id}.parquet").cast(VERDICT_SCHEMA)
