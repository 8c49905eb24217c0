"""Dedup partitioned by hash, end to end: no task holds more than O(n / P) samples.

The same clusters and verdicts as run_dedup in one process (pipeline/dedup/clusters.py), as Ray tasks that
each read and write files under RUN/work/dedup/dist/{fingerprint}/ (so a crash resumes per task and
per round, and tasks of other settings never mix). Samples are int64 numbers, unit index << 32 | row
(the row among the unit's alive measured rows), so they map back to their unit without a table.

1. count (per chunk of COUNT_CHUNK units, streamed from the listing): parquet footers give the rows
   per unit, written with the unit ids to count files; one streamed pass over those cuts the units
   into batches of rows that fit a task, and each batch task reads its own unit ids from them.
2. scatter (per batch): its units' measure files -> (number, pHash) cut into P ranges by a mix of the
   pHash, and (number, sha256) into P ranges by a mix of the digest.
3. sha (per range): same-sha256 groups -> edges (first number, number).
   phash (per range): same-pHash groups -> edges (representative = smallest number, number), and the
   range's distinct (pHash, representative) cut for the near search by each table's first block
   (pipeline/dedup_parts.range_of), R near ranges.
4. near (per table and near range): reads only its range's files, runs the table
   (`_sorted_table_pairs`) and turns each pair of hashes into an edge between their representatives.
5. components: the large-star / small-star rounds of pipeline/dedup (Kiveris et al.) over (key,
   value) int64 records, P tasks per round, each round's records in files.
6. labels (per partition): vertex -> component (its smallest number), shuffled to the unit batches;
   attach (per batch): (component, number, area, sample_id, sha256) of the labelled samples,
   shuffled by component; group (per partition): canonical order (largest area, then smallest
   sample_id), so dup_of, dup_kind, dup_cluster_size, dup_rank per member, shuffled back by batch;
   write (per batch): one verdict file per unit, VERDICTS, the unit's alive rows in order.

Every task declares memory= from bytes per sample, hash or edge record measured by bench/dedup.py
(docs/dedup.md); the coordinator holds O(batches + tasks) figures, never the run's unit ids or
per-unit counts (at most COUNT_CHUNK of them while it streams).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import sys
import time

import catalog.storage as cstore

from pipeline.dedup import clusters as D
from pipeline.dedup.tables import DEFAULT_BUCKET_CAP, blocks, choose_blocks, sum_stats, tables
from pipeline.dedup.tasks import (attach, cc_labels, cc_round, count_rows, group, near_range, phash_range,
                                  scatter_units, sha_range, write_units)
from pipeline.dedup.files import COUNT_CHUNK
from pipeline.dedup.ranges import TASK_BASE_BYTES, top_blocks
from pipeline.settings import DEFAULTS

log = logging.getLogger("humanset.dedup")

# bytes a task holds per item at its peak (measured by bench/dedup.py --distributed, docs/dedup.md)
SAMPLE_BYTES = 600  # scatter, attach, write: a batch's measure rows (strings included) and their cuts
SHA_BYTES = 400  # sha: (number, digest string) rows, their sort and the group compare
PHASH_BYTES = 120  # phash: (number, pHash), the lexsort, the near-search cuts
NEAR_BYTES = 64  # near: (pHash, representative), sorted copy, layout, candidates, scan temporaries
EDGE_BYTES = 80  # a components round: (key, value) records, their lexsort, the emitted records
GROUP_BYTES = 400  # group: (component, number, area, sample_id, sha256) rows and their sort
SKEW = 2  # a task of a range declares twice the range's expected share
IN_PROCESS_BYTES = 520  # run_dedup in one process, per sample (docs/dedup.md): decides `auto`


def wanted(setting, n_rows: int, task_memory: int) -> bool:
    """dedup.partitioned: true, false, or auto (when one process would need more than task_memory)."""
    if setting == "auto":
        return n_rows * IN_PROCESS_BYTES > task_memory
    return bool(setting)


def _pow2(x: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(x, 1))))


def plan(n: int, task_memory: int, m: int = 6) -> tuple[int, int, int]:
    """(P, rows per batch, near range bits) for n samples: the fewest power-of-two ranges whose
    tasks fit task_memory; the near search gets at least P ranges (at most 2^narrowest block)."""
    room = max(4096, task_memory - TASK_BASE_BYTES)
    P = _pow2(SKEW * n * max(SHA_BYTES, GROUP_BYTES) / room)
    R = max(P, _pow2(SKEW * n * NEAR_BYTES / room))
    narrowest = min(w for _, w in blocks(m))
    rows = min(room // SAMPLE_BYTES, math.ceil(max(n, 1) / P))  # a batch: at most a range's share
    return P, max(1, rows), min(narrowest, int(math.log2(R)))


def batch_rows(counts, rows: int) -> list[tuple[int, int, int]]:
    """(a, b, rows in it): unit index ranges [a, b) of at most `rows` rows (a unit larger than that
    is a batch alone), from one pass over an iterable of counts (running sums only)."""
    out, a, have, i = [], 0, 0, 0
    for i, c in enumerate(counts, 1):
        if have and have + c > rows:
            out.append((a, i - 1, have))
            a, have = i - 1, 0
        have += c
    if a < i or not out:
        out.append((a, i, have))
    return out


def batches(counts, rows: int) -> list[tuple[int, int]]:
    return [(a, b) for a, b, _ in batch_rows(counts, rows)]


def _chunks(ids, size: int):
    buf = []
    for u in ids:
        buf.append(u)
        if len(buf) == size:
            yield buf
            buf = []
    if buf:
        yield buf


def _listed(run):
    """The run's unit ids in listing order, streamed from RUN/units.jsonl."""
    from pipeline.inputs.listing import iter_listing
    return (u.unit_id for u in iter_listing(D._listing(run)))


def _counted(units: str, chunks: int, h):
    """Each unit's row count from the count files, in order (one file held at a time); the ids and
    counts go into the hash h on the way."""
    for c in range(chunks):
        t = cstore.read_table_at(cstore.join(units, f"c{c:06d}.parquet"))
        for u, n in zip(t.column("unit").to_pylist(), t.column("rows").to_pylist()):
            h.update(f"{u}\0{n}\n".encode())
            yield n


class Tasks:
    """Runs task functions as Ray tasks (memory= declared) when Ray is up, else one by one here."""

    def __init__(self, use_ray: bool):
        self.use_ray, self.count, self.peak = use_ray, 0, 0.0
        self.resumed, self.by_kind, self.nodes, self.seconds = 0, {}, set(), {}
        if use_ray:
            import ray
            self.ray = ray
            self.node_memory = max((n["Resources"].get("memory", 0) for n in ray.nodes() if n.get("Alive")),
                                   default=0)

    def map(self, fn, args, memory, label: str, limit: int | None = None) -> list[dict]:
        """fn(*a) for each a of `args` (an iterable: with `limit`, at most that many in flight, so
        a generator of arguments is never held whole); their stats in order."""
        t0 = time.perf_counter()
        if self.use_ray:
            remote, pending, out = self.ray.remote(num_cpus=1)(fn), {}, []
            for i, a in enumerate(args):
                mm = int(memory(a) if callable(memory) else memory)
                if self.node_memory and mm > self.node_memory:
                    raise RuntimeError(f"dedup: a {label} task needs {mm / 2**30:.1f} GiB, more than any node has "
                                       f"({self.node_memory / 2**30:.1f} GiB); lower dedup.task_memory")
                pending[remote.options(memory=mm).remote(*a)] = i
                while limit and len(pending) >= limit:
                    ready, _ = self.ray.wait(list(pending), num_returns=1)
                    out.append((pending.pop(ready[0]), self.ray.get(ready[0])))
            out += [(pending[r], v) for r, v in zip(pending, self.ray.get(list(pending)))]
            out = [v for _, v in sorted(out, key=lambda x: x[0])]
        else:
            out = [fn(*a) for a in args]
        self.count += len(out)
        for st in out:
            self.peak = max(self.peak, st.get("peak_rss_mb", 0))
            self.by_kind[label] = max(self.by_kind.get(label, 0), st.get("peak_rss_mb", 0))
            self.nodes.add(st.get("node"))
            self.seconds[label] = round(self.seconds.get(label, 0) + st.get("task_seconds", 0), 3)
            self.resumed += bool(st.get("resumed"))
        log.log(logging.DEBUG if label == "components" else logging.INFO, "dedup: %d %s tasks done in %.1f s%s",
                len(out), label, time.perf_counter() - t0,
                f", {sum(bool(s.get('resumed')) for s in out)} from a former attempt" if any(
                    s.get("resumed") for s in out) else "")
        return out


def fingerprint(units_hash: str, settings: dict) -> str:
    """The work folder's name: the settings and the hash of the (unit id, rows) list."""
    return hashlib.sha1((json.dumps(settings, sort_keys=True) + units_hash).encode()).hexdigest()[:16]


def run_dedup(run, unit_ids: list[str] | None, cfg: dict) -> dict:
    """Phase 2 as the engine runs it: partitioned by hash when dedup.partitioned says so (true, or
    auto and the run too large for one process), else pipeline/dedup.run_dedup in this process."""
    from catalog.storage import retry
    retry.configure(cfg)  # a Ray task of its own: the run's storage.retry_*
    before = retry.snapshot()
    d = cfg.get("dedup", {}) or {}
    st = None
    if d.get("partitioned", DEFAULTS.dedup.partitioned):
        st = run_dedup_distributed(run, unit_ids, cfg)  # None: auto, and small enough for one process
    st = st if st is not None else D.run_dedup(run, unit_ids, cfg)
    return {**st, "store": retry.since(before)}  # this process's retries (not its partitions' tasks')


def run_dedup_distributed(run, unit_ids, cfg: dict, use_ray: bool | None = None) -> dict | None:
    """run_dedup partitioned by hash over `unit_ids` (an iterable, streamed; None: RUN/units.jsonl).
    Returns its counts, or None when dedup.partitioned is auto and the run is small enough for one
    process (the caller then runs it there)."""
    t_start = time.perf_counter()
    d = cfg.get("dedup", {}) or {}
    from pipeline.dedup.ranges import DEFAULT_TASK_MEMORY
    task_memory = int(d.get("task_memory") or DEFAULT_TASK_MEMORY)
    if use_ray is None:  # a process that has not imported Ray runs none (its import is not paid for)
        ray = sys.modules.get("ray")
        use_ray = ray is not None and ray.is_initialized()
    ex = Tasks(use_ray)
    run_s = str(run)
    units = cstore.join(D.dedup_dir(run), "dist", "units")  # count files: rewritten by every call
    chunks = _chunks(_listed(run) if unit_ids is None else iter(unit_ids), COUNT_CHUNK)
    first = next(chunks, [])
    if len(first) < COUNT_CHUNK:  # a few footers: read here
        got = [count_rows(run_s, units, 0, first)]
    else:
        got = ex.map(count_rows, ((run_s, units, c, ids) for c, ids in enumerate(itertools.chain([first], chunks))),
                     TASK_BASE_BYTES, "count", limit=64)
    del first
    n, n_units = sum(g["rows"] for g in got), sum(g["units"] for g in got)
    if not wanted(d.get("partitioned", DEFAULTS.dedup.partitioned), n, task_memory):
        return None
    enabled = "dedup" in cfg.get("stages", ["dedup"])
    k = d.get("max_distance", DEFAULTS.dedup.max_distance)
    exact = bool(d.get("exact", DEFAULTS.dedup.exact))
    bucket_cap = int(d.get("bucket_cap") or DEFAULT_BUCKET_CAP)
    m = int(d.get("blocks") or choose_blocks(max(n, 2), max(int(k or 0), 1)))
    P, rows, rbits = plan(n, task_memory, m)
    P = int(d.get("partitions") or P)  # partitions, batch_rows, near_range_bits: tests and benches only
    h = hashlib.sha1()
    plan_b = batch_rows(_counted(units, len(got), h), int(d.get("batch_rows") or rows))  # O(batches)
    bt, brow = [(a, b) for a, b, _ in plan_b], [r for _, _, r in plan_b]
    starts = [a for a, _ in bt]
    rbits = rbits if d.get("near_range_bits") is None else int(d["near_range_bits"])
    fp = fingerprint(h.hexdigest(), {"k": k, "exact": exact, "cap": bucket_cap, "P": P, "bt": bt, "m": m,
                                     "rbits": rbits, "enabled": enabled})
    root = cstore.join(D.dedup_dir(run), "dist", fp)
    log.info("dedup: %d samples in %d units, partitioned: %d batches, %d ranges, %d near ranges x %d tables (%s)",
             n, n_units, len(bt), P, 1 << rbits, len(tables(m, k)) if k and k > 0 else 0, root)
    B = len(bt)

    def batch_mem(a):
        return TASK_BASE_BYTES + SAMPLE_BYTES * brow[a[2]]
    batch_args = [(run_s, root, i, units, a, b, P, starts) for i, (a, b) in enumerate(bt)]
    sc = ex.map(scatter_units, batch_args, batch_mem, "scatter")
    phashes = sum(s["phashes"] for s in sc)
    stats = {"candidates": n}
    on = enabled and phashes > 0
    sources = []
    rounds = 0
    if on:
        share = SKEW * n / P
        if exact:
            ex.map(sha_range, [(root, j, B, P) for j in range(P)], TASK_BASE_BYTES + SHA_BYTES * share, "sha")
            sources += [f"sha{j}" for j in range(P)]
        use_phash = k is not None and k >= 0
        stats["distinct_hashes"] = 0
        if use_phash:
            near = k > 0
            tops = top_blocks(m, k) if near else []
            ph = ex.map(phash_range, [(root, j, B, P, m, tops, rbits if near else 0) for j in range(P)],
                        TASK_BASE_BYTES + PHASH_BYTES * share, "phash")
            sources += [f"ph{j}" for j in range(P)]
            distinct = sum(s["distinct"] for s in ph)
            stats["distinct_hashes"] = distinct
            if near and distinct > 1:
                R = 1 << rbits
                todo = [(root, t, r, P, m, k, rbits, tops.index(tables(m, k)[t][0]), bucket_cap, P)
                        for t in range(len(tables(m, k))) for r in range(R)]
                per = ex.map(near_range, todo, TASK_BASE_BYTES + NEAR_BYTES * SKEW * max(distinct, 1) / R, "near")
                sources += [f"nr{t:03d}-{r:04d}" for t in range(len(tables(m, k))) for r in range(R)]
                stats.update(sum_stats(m, k, per), ranges=R)
        rounds, last, edges = components(ex, root, sources, P)
        stats.update(components="distributed", component_rounds=rounds, component_partitions=P)
        lab = ex.map(cc_labels, [(root, last, j, P, starts) for j in range(P)],
                     TASK_BASE_BYTES + EDGE_BYTES * SKEW * max(edges, 1) / P, "labels")
        labelled = sum(s["labelled"] for s in lab)
        ex.map(attach, [(*a, B) for a in batch_args], batch_mem, "attach")
        ex.map(group, [(root, q, B, starts) for q in range(P)],
               TASK_BASE_BYTES + GROUP_BYTES * SKEW * max(labelled, 1) / P, "group")
    out = ex.map(write_units, [(run_s, root, i, units, a, b, P, on) for i, (a, b) in enumerate(bt)],
                 batch_mem, "write")
    for key in ("duplicates", "exact_duplicates", "near_duplicates"):
        stats[key] = sum(s[key] for s in out)
    stats.update(partitions=P, batches=B, tasks=ex.count, resumed_tasks=ex.resumed,
                 max_task_rss_mb=ex.peak, task_rss_mb=ex.by_kind, task_seconds=ex.seconds, nodes=len(ex.nodes - {None}), seconds=round(time.perf_counter() - t_start, 3))
    if stats.get("hot_buckets_skipped"):
        log.warning("dedup: %d hash buckets larger than dedup.bucket_cap=%d (%d hashes) were not searched "
                    "for near duplicates in some tables; raise dedup.bucket_cap to search them",
                    stats["hot_buckets_skipped"], bucket_cap, stats["hot_hashes_skipped"])
    cstore.write_json_at(cstore.join(D.dedup_dir(run), "_done.json"), stats)
    return stats


def components(ex: Tasks, root: str, sources: list[str], P: int) -> tuple[int, int, int]:
    """Large-star / small-star rounds until a large-star and the small-star after it change no edge.

    Round i's task j reads the records partitioned to j by round i - 1 (round 0: the edge files of
    the sha, phash and near tasks) and writes its output to round i's files, so a resumed run
    re-enters the loop and every finished round answers from its files. Returns (rounds, last
    round, edge records left)."""
    op, i, large_changes, edges = "large", 0, None, 0
    srcs = sources
    while True:
        i += 1
        st = ex.map(cc_round, [(root, i, op, j, srcs, P) for j in range(P)],
                    lambda a, e=edges: TASK_BASE_BYTES + EDGE_BYTES * SKEW * max(e or 1, 1) / P, "components")
        srcs = [f"p{j}" for j in range(P)]
        changes = sum(s["changes"] for s in st)
        edges = sum(s["edges"] for s in st) * 2
        log.info("dedup: components round %d (%s-star): %d edges, %d changed", i, op, edges // 2, changes)
        if op == "large":
            large_changes, op = changes, "small"
        elif large_changes == 0 and changes == 0:
            return i, i, edges
        else:
            op = "large"
