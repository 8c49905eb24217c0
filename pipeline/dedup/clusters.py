"""Run-wide duplicate clusters: exact (same sha256 or same pHash) and near (pHash Hamming distance <= k).

1. Exact duplicates are collapsed first: samples with one sha256, and samples with one pHash, are
   linked to one representative, so each distinct pHash enters the near search once.
2. Near pairs among the distinct hashes come from permuted block tables (Manku, Jain and Das Sarma,
   "Detecting near-duplicates for web crawling", WWW 2007): cut the 64 bits into m blocks; two
   hashes within distance k agree exactly on at least m-k blocks, so for each of the C(m, k) choices
   of m-k blocks one table sorts the hashes with those blocks moved to the top bits (the key) and
   compares only hashes with the same key, verifying each with a popcount. A pair is emitted by the
   first table (in a fixed order) whose kept blocks it agrees on, so by exactly one table. m is
   chosen from the number of distinct hashes so buckets stay small (`choose_blocks`).
   A bucket with more than WINDOW hashes is compared by an exact blocked scan; one with more than
   `dedup.bucket_cap` hashes is skipped, counted in the stats and logged, never silently.
   The tables are independent: run_dedup runs them as Ray tasks (the hash array is put in the
   object store once) and writes each table's pairs to its own file, so a crashed dedup resumes
   per table.
3. Clusters are the connected components of all links (numpy union-find in this process); each
   keeps one canonical sample: largest area, then smallest sample_id. When the near pairs would
   need more than `dedup.components_memory` in this process (PAIR_BYTES each), run_dedup first
   reduces them on Ray to one link per distinct hash (`ray_components`: large-star / small-star
   rounds over partitions of the pair files), so the process running it (the engine's dedup task)
   never holds the pairs; the clusters are the same.

Everything is a pure function of the inputs, so a resumed run gets the same clusters as a clean one.

Code: step 2 (block tables, pair files) lives in pipeline/dedup/tables.py, step 3's components in
pipeline/dedup/components.py; this module has the verdicts and run_dedup (measure files in, verdicts out).

Memory in the process that builds the components, per sample: its sample_id and sha256 as Arrow
strings (4 + length each) plus about 80 bytes of numpy arrays at the peak (pHash, sha256 key, area,
sort orders, parent); per near pair at most PAIR_BYTES = 48 (two hashes while the pair files are
read, two sample numbers and the union-find's temporaries after), or nothing on the Ray path, which
gives it at most one link (two hashes, 16 bytes) per distinct hash. A Ray components task holds its
partition's edge records (8 bytes each, two per pair at first) about three times while it sorts.
A near-search table holds 8 bytes per distinct hash (its sorted permuted copy) plus its candidate
positions (4 bytes each, about one per hash), next to the shared hash array (8 bytes per distinct
hash); its scan runs in steps, so other temporaries stay small. In one process (near_pairs) the
sorted values of the first table of a group (same top block) are kept, 8 bytes per distinct hash,
while the group's other tables are sorted from them. bench/dedup.py measures the totals.
"""
from __future__ import annotations

import logging
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq  # noqa: F401 (read through catalog.storage; tests patch pq.read_table here)
import pyarrow.compute as pc

import catalog.storage as cstore
from catalog.schema import MEASURE, VERDICTS

from pipeline.dedup.components import as_string_chunks, components, ray_components
from pipeline.dedup.tables import (DEFAULT_BUCKET_CAP, _fingerprint, choose_blocks, loc, near_pairs, run_table,
                                   sum_stats, table_file, tables)
from pipeline.settings import DEFAULTS

log = logging.getLogger("humanset.dedup")

RAY_MIN_HASHES = 100_000  # fewer distinct hashes: the tables run in this process (a task costs more)


# --------------------------------------------------------------------------------------------
# Components -> verdicts (pure: arrays in, arrays out)

def verdicts(root: np.ndarray, sample_id: pa.Array, area: np.ndarray, sha256) -> pa.Table:
    """dup_of / dup_kind / dup_cluster_size per sample, in input order.

    The canonical sample of a component is the largest (area), then the smallest sample_id;
    dup_kind is 'exact' when a sample has its canonical's sha256, else 'near'.
    """
    n = len(root)
    size = np.bincount(root, minlength=n)[root].astype(np.int32)
    multi = np.flatnonzero(size > 1)
    canon = np.arange(n, dtype=np.int64)  # only entries of multi are read back
    rank = np.zeros(n, dtype=np.int32)  # position in the component's canonical order
    if len(multi):
        sid = as_string_chunks(sample_id)
        t = pa.table({"root": root[multi], "area": area[multi], "sid": sid.take(pa.array(multi)),
                      "node": multi})
        t = t.take(pc.sort_indices(t, sort_keys=[("root", "ascending"), ("area", "descending"),
                                                 ("sid", "ascending")]))
        r = t.column("root").to_numpy()
        node = t.column("node").to_numpy()
        head = np.ones(len(r), dtype=bool)
        head[1:] = r[1:] != r[:-1]
        first = np.flatnonzero(head)[np.cumsum(head) - 1]
        canon[node] = node[first]
        rank[node] = np.arange(len(r)) - first
    dup = np.zeros(n, dtype=bool)
    dup[multi] = canon[multi] != multi
    take = np.where(dup, canon, -1)
    sid_all = as_string_chunks(sample_id)
    dup_of = sid_all.take(pa.array(take, mask=~dup)).cast(pa.string())
    kind = np.ones(n, dtype=np.int32)  # 1 = near
    dups = np.flatnonzero(dup)
    if len(dups):
        sha = as_string_chunks(sha256)
        same = pc.equal(sha.take(pa.array(dups)), sha.take(pa.array(canon[dups]))).fill_null(False)
        kind[dups[same.to_numpy(zero_copy_only=False)]] = 0  # 0 = exact
    dup_kind = pa.DictionaryArray.from_arrays(pa.array(kind, mask=~dup), pa.array(["exact", "near"]))
    return pa.table({"sample_id": sid_all.cast(pa.string()), "dup_of": dup_of,
                     "dup_kind": dup_kind.cast(pa.string()),
                     "dup_cluster_size": pa.array(size, pa.int32()), "dup_rank": pa.array(rank, pa.int32())})


def pixel_area(table: pa.Table) -> np.ndarray:
    w = table.column("width").cast(pa.int64()).fill_null(0).to_numpy()
    h = table.column("height").cast(pa.int64()).fill_null(0).to_numpy()
    return w * h


def cluster(samples: pa.Table, max_distance: int = 4, exact: bool = True) -> pa.Table:
    """samples: sample_id, sha256, phash (uint64, may be null), width, height.

    Returns sample_id, dup_of, dup_kind, dup_cluster_size, dup_rank for every input row, ordered by sample_id.
    The near search runs in this process; run_dedup runs the same tables as Ray tasks.
    """
    return cluster_stats(samples, max_distance, exact)[0]


def cluster_stats(samples: pa.Table, max_distance: int = 4, exact: bool = True, bucket_cap: int | None = None,
                  blocks: int | None = None) -> tuple[pa.Table, dict]:
    """cluster() plus the near search's counts (candidate pairs, tables, hot buckets, ...)."""
    cap = bucket_cap or DEFAULT_BUCKET_CAP
    root, stats = components(samples.column("phash"), samples.column("sha256"), max_distance, exact,
                             lambda h, k: near_pairs(h, k, blocks, bucket_cap=cap))
    out = verdicts(root, samples.column("sample_id"), pixel_area(samples), samples.column("sha256"))
    return out.take(pc.sort_indices(out, sort_keys=[("sample_id", "ascending")])), stats


PAIR_BYTES = 48  # memory per near pair in the in-process union-find at its peak (measured 21-42)
DEFAULT_COMPONENTS_MEMORY = DEFAULTS.dedup.components_memory  # its setting's default (pipeline/settings.py)
MAX_PARTS = 256  # partitions of the edges on Ray (each a reduce task per round)


# --------------------------------------------------------------------------------------------
# Run level: the interface the engine calls (RUN/work/measure -> RUN/work/dedup/{unit}.parquet).

VERDICT_SCHEMA = VERDICTS
MEASURE_COLUMNS = ["sample_id", "sha256", "phash", "width", "height", "_alive"]

def dedup_dir(run):
    """RUN/work/dedup: a Path for a local RUN, a URI string for one on an object store."""
    return loc(cstore.join(run, "work", "dedup"))


def pairs_dir(run):
    return loc(cstore.join(dedup_dir(run), "pairs"))


def is_done(run) -> bool:
    """True once run_dedup finished for this RUN (its marker is written last)."""
    return cstore.exists_at(cstore.join(dedup_dir(run), "_done.json"))


def _run_tables(hashes: np.ndarray, k: int, m: int, bucket_cap: int, folder: Path) -> list[dict]:
    """Every table, as Ray tasks when Ray is up (the hash array put in the object store once)."""
    fp = _fingerprint(hashes)
    todo = list(range(len(tables(m, k))))
    ray = sys.modules.get("ray")  # a process that has not imported Ray runs none (its import is not paid for)
    use_ray = ray is not None and ray.is_initialized()
    log.log(logging.INFO if use_ray and len(hashes) >= RAY_MIN_HASHES else logging.DEBUG,
            "dedup: %d distinct hashes, %d blocks, %d tables%s", len(hashes), m, len(todo),
             " (Ray tasks)" if use_ray and len(hashes) >= RAY_MIN_HASHES else "")
    if not use_ray or len(hashes) < RAY_MIN_HASHES:
        out = []
        for t in todo:
            out.append(run_table(hashes, k, m, t, bucket_cap, str(folder), fp))
            _log_table(len(out), len(todo), out[-1], logging.DEBUG)  # small: seconds in all
        return out
    task = ray.remote(num_cpus=1)(run_table)
    ref = ray.put(hashes)
    refs = [task.remote(ref, k, m, t, bucket_cap, str(folder), fp) for t in todo]
    pending, done = list(refs), 0
    while pending:  # progress on the console as tables finish
        ready, pending = ray.wait(pending, num_returns=1)
        done += 1
        _log_table(done, len(todo), ray.get(ready[0]))
    return ray.get(refs)


def _ray_cpus() -> int | None:
    """CPUs of the Ray cluster this process is connected to; None when Ray is not running."""
    ray = sys.modules.get("ray")
    return int(ray.cluster_resources().get("CPU", 1)) if ray is not None and ray.is_initialized() else None


def _near_links(files: list, hashes: np.ndarray, st: dict, budget: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """The links the union-find over samples gets from the near search, as pairs of hash values.

    The pairs themselves when they fit dedup.components_memory (PAIR_BYTES each), else their
    components computed on Ray, one link per hash that is not its component's smallest.
    """
    need = st["near_pairs"] * PAIR_BYTES
    cpus = _ray_cpus() if need > budget else None
    if cpus is not None:
        parts = min(MAX_PARTS, max(cpus, math.ceil(need / max(budget, 1))))
        log.info("dedup: %d near pairs need ~%.1f GB in this process, over dedup.components_memory=%d: "
                 "components on Ray in %d partitions", st["near_pairs"], need / 1e9, budget, parts)
        x, y, cst = ray_components(files, hashes, parts)
        return x, y, {**st, **cst}
    if need > budget:
        log.warning("dedup: %d near pairs need ~%.1f GB, over dedup.components_memory=%d, but Ray is not "
                    "running: components built in this process", st["near_pairs"], need / 1e9, budget)
    a, b = np.empty(st["near_pairs"], np.uint64), np.empty(st["near_pairs"], np.uint64)
    at = 0
    for f in files:
        p = cstore.read_table_at(f)
        if at + p.num_rows > len(a):
            at += p.num_rows
            break
        a[at:at + p.num_rows] = p.column("a").to_numpy()
        b[at:at + p.num_rows] = p.column("b").to_numpy()
        at += p.num_rows
    if at != len(a):
        raise RuntimeError(f"dedup: the pair files under {str(files[0]).rsplit('/', 1)[0]} hold {at} pairs, their stats "
                           f"{len(a)}; delete that folder and run again")
    return a, b, {**st, "components": "driver"}


def _log_table(done: int, total: int, st: dict, level: int = logging.INFO) -> None:
    log.log(level, "dedup: table %d done (%d/%d): %d candidate pairs, %d near pairs%s", st["table"], done, total,
             st["candidates"], st["pairs"],
             f", {st['hot_buckets_skipped']} buckets over dedup.bucket_cap skipped" if st["hot_buckets_skipped"] else "")


IO_THREADS = 8  # measure files read and verdict files written at once (each one is small)


def listed_unit_ids(run: Path) -> list[str]:
    """The run's unit ids in listing order, read from RUN/units.jsonl (this task, not the driver,
    holds them)."""
    from pipeline.inputs.listing import iter_listing
    return [u.unit_id for u in iter_listing(_listing(run))]


def _listing(run) -> str:
    return cstore.join(run, "units.jsonl") if cstore.is_uri(os.fspath(run)) else os.path.join(os.fspath(run), "units.jsonl")


def read_measured(path) -> pa.Table:
    """A unit's alive measured rows, MEASURE_COLUMNS only. A measure file of any of our versions
    reads: a column it lacks (a unit with no readable sample, a run without the pHash stage) is null."""
    t = cstore.read_table_at(path)
    t = pa.table({c: t.column(c).cast(MEASURE.field(c).type) if c in t.column_names
                  else pa.nulls(t.num_rows, MEASURE.field(c).type) for c in MEASURE_COLUMNS})
    return t.filter(pc.fill_null(t.column("_alive"), False)).drop_columns(["_alive"])


def run_dedup(run, unit_ids: list[str] | None, cfg: dict) -> dict:
    """Cluster every measured sample of the run and write one verdict file per unit.

    Reads RUN/work/measure/{unit}.parquet (columns MEASURE_COLUMNS; only rows with `_alive`
    take part) of `unit_ids` (None: every unit of RUN/units.jsonl), IO_THREADS files at a time,
    writes each near-search table's pairs to RUN/work/dedup/pairs/ (reused after a crash),
    RUN/work/dedup/{unit}.parquet (VERDICT_SCHEMA, the unit's alive rows, in its order) and, last,
    RUN/work/dedup/_done.json with counts. Returns those counts.
    """
    from concurrent.futures import ThreadPoolExecutor

    t_start = time.perf_counter()
    run = run if isinstance(run, str) and cstore.is_uri(run) else Path(run)
    if unit_ids is None:
        unit_ids = listed_unit_ids(run)
    d = cfg.get("dedup", {}) or {}
    enabled = "dedup" in cfg.get("stages", ["dedup"])
    k = d.get("max_distance", DEFAULTS.dedup.max_distance)
    bucket_cap = int(d.get("bucket_cap") or DEFAULT_BUCKET_CAP)
    budget = d.get("components_memory")
    budget = DEFAULT_COMPONENTS_MEMORY if budget is None else int(budget)
    with ThreadPoolExecutor(IO_THREADS) as pool:
        parts = list(pool.map(read_measured, [cstore.join(run, "work", "measure", f"{u}.parquet") for u in unit_ids]))
    table = pa.concat_tables(parts) if parts else measured_empty()
    sizes = [p.num_rows for p in parts]
    del parts
    stats = {"candidates": table.num_rows}
    if table.num_rows and enabled and table.column("phash").null_count < table.num_rows:
        def near(hashes, kk):
            m = int(d.get("blocks") or choose_blocks(len(hashes), kk))
            st = sum_stats(m, kk, _run_tables(hashes, kk, m, bucket_cap, pairs_dir(run)))
            files = [table_file(pairs_dir(run), m, kk, t) for t in range(len(tables(m, kk)))]
            return _near_links(files, hashes, st, budget)
        root, st = components(table.column("phash"), table.column("sha256"), k,
                                           d.get("exact", True), near)
        result = verdicts(root, table.column("sample_id"), pixel_area(table), table.column("sha256"))
        stats.update(st)
        if st.get("hot_buckets_skipped"):
            log.warning("dedup: %d hash buckets larger than dedup.bucket_cap=%d (%d hashes) were not searched "
                        "for near duplicates in some tables; raise dedup.bucket_cap to search them",
                        st["hot_buckets_skipped"], bucket_cap, st["hot_hashes_skipped"])
    else:  # dedup off (or no sample has a pHash): no verdicts
        n = table.num_rows
        result = pa.table({"sample_id": table.column("sample_id").cast(pa.string()),
                           "dup_of": pa.nulls(n, pa.string()), "dup_kind": pa.nulls(n, pa.string()),
                           "dup_cluster_size": pa.nulls(n, pa.int32()), "dup_rank": pa.nulls(n, pa.int32())})
    starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]) if sizes else np.zeros(1, np.int64)

    def write(i: int) -> None:
        cstore.write_parquet_at(cstore.join(dedup_dir(run), f"{unit_ids[i]}.parquet"),
                              result.slice(int(starts[i]), sizes[i]).cast(VERDICT_SCHEMA))
    with ThreadPoolExecutor(IO_THREADS) as pool:
        list(pool.map(write, range(len(unit_ids))))
    dup = result.column("dup_of").is_valid()
    kinds = result.column("dup_kind")
    stats.update(duplicates=int(pc.sum(dup).as_py() or 0),
                 exact_duplicates=int(pc.sum(pc.equal(kinds, "exact")).as_py() or 0),
                 near_duplicates=int(pc.sum(pc.equal(kinds, "near")).as_py() or 0),
                 seconds=round(time.perf_counter() - t_start, 3))
    cstore.write_json_at(cstore.join(dedup_dir(run), "_done.json"), stats)
    return stats


def measured_empty() -> pa.Table:
    return pa.table({c: pa.array([], MEASURE.field(c).type) for c in MEASURE_COLUMNS if c != "_alive"})


def read_verdicts(run, unit_id: str) -> pa.Table:
    """The dedup verdicts of one unit's samples (VERDICT_SCHEMA); reads only that unit's file."""
    return cstore.read_table_at(cstore.join(dedup_dir(run), f"{unit_id}.parquet")).cast(VERDICT_SCHEMA)
