"""The near search partitioned by key range: (table, range) tasks that each hold O(n / R) hashes.

A table's key begins with its first kept block (`Layout.top_block`), so two hashes with one key
agree on that block's top `rbits` bits: cutting the hashes by those bits into R = 2^rbits ranges
never splits a bucket, and table t restricted to range r emits exactly the pairs of table t whose
hashes fall in r (the first-table rule is a property of the pair). Tables with one top block share
one cut. So:

1. scatter tasks (one per chunk of SCATTER_CHUNK distinct hashes) cut their chunk by range for
   every top block in use (num_returns = top blocks x R; the coordinator holds only references);
2. one task per (table, range) gets its range's pieces, sorts them in the table's layout and runs
   `_sorted_table_pairs` on them, writing its pairs to
   pairs/m{m}-k{k}-t{t:03d}-r{r:04d}of{R}.parquet (tagged with the fingerprint, so a crash resumes
   per (table, range)). It declares `memory=` TASK_BASE_BYTES + TASK_BYTES_PER_HASH x its hashes,
   so Ray never packs more tasks on a node than fit, and returns its stats with its peak RSS
   (`ru_maxrss`) and the peak of its own numpy allocations (tracemalloc).

R is the smallest power of two for which the expected range fits `dedup.task_memory`, at most
2^(narrowest top block). The pairs files are read by run_dedup like the whole-table files.
"""
from __future__ import annotations

import json
import math
import resource
import sys
import time
import tracemalloc

import numpy as np
import pyarrow as pa

import catalog.storage as cstore
from catalog.schema import NEAR_PAIRS

from pipeline.settings import DEFAULTS
from pipeline.dedup.tables import DEFAULT_BUCKET_CAP, Layout, loc, read_table_stats, sorted_table_pairs, blocks, tables

# one (table, range) task per hash, measured by research/dedup/candidates.py (table_task): the range's
# hashes (8), their sorted permuted copy (8), candidate positions and scan temporaries; see docs/dedup.md
TASK_BYTES_PER_HASH = 48
TASK_BASE_BYTES = 256 << 20  # a Ray worker with numpy and pyarrow imported, before any hash
DEFAULT_TASK_MEMORY = DEFAULTS.dedup.task_memory  # dedup.task_memory
SCATTER_CHUNK = 1 << 22  # distinct hashes per scatter task (its pieces: 8 bytes each, twice)


def range_bits(n: int, m: int, task_memory: int = DEFAULT_TASK_MEMORY) -> int:
    """rbits: the fewest top-block bits that cut n hashes into ranges fitting task_memory."""
    room = max(1, task_memory - TASK_BASE_BYTES)
    need = math.ceil(n * TASK_BYTES_PER_HASH / room)
    narrowest = min(w for _, w in blocks(m))
    return min(narrowest, max(0, math.ceil(math.log2(need)) if need > 1 else 0))


def top_blocks(m: int, k: int) -> list[int]:
    return sorted({tables(m, k)[t][0] for t in range(len(tables(m, k)))})


def range_of(h: np.ndarray, m: int, top: int, rbits: int) -> np.ndarray:
    """Range of each hash under top block `top`: that block's highest rbits bits."""
    if rbits == 0:
        return np.zeros(len(h), dtype=np.int64)
    shift, w = blocks(m)[top]
    return ((h >> np.uint64(shift + w - rbits)) & np.uint64((1 << rbits) - 1)).astype(np.int64)


def scatter(h: np.ndarray, m: int, tops: list[int], rbits: int) -> list[np.ndarray]:
    """The chunk's hashes cut by range for each top block: [tops[0] r=0..R-1, tops[1] ...]."""
    h = np.asarray(h, dtype=np.uint64)
    out = []
    for top in tops:
        r = range_of(h, m, top, rbits)
        order = np.argsort(r, kind="stable")
        cuts = np.searchsorted(r[order], np.arange(1, 1 << rbits))
        out.extend(np.split(h[order], cuts))
    return out


def range_file(folder, m: int, k: int, t: int, r: int, rbits: int):
    return loc(cstore.join(folder, f"m{m}-k{k}-t{t:03d}-r{r:04d}of{1 << rbits}.parquet"))


def range_table(k: int, m: int, t: int, r: int, rbits: int, bucket_cap: int, folder: str, fingerprint: str,
                *pieces: np.ndarray) -> dict:
    """Table t over range r: pairs to its file (once, atomically); its stats and peak memory."""
    path = range_file(folder, m, k, t, r, rbits)
    st = read_table_stats(path, fingerprint, bucket_cap)
    if st is not None:
        return {**st, "resumed": True}
    tracemalloc.start()
    t0 = time.perf_counter()
    lay = Layout(m, k, t)
    h = np.concatenate(pieces) if pieces else np.zeros(0, np.uint64)
    p = lay.sorted_values(h)
    del h
    a, b, st = sorted_table_pairs(p, lay, k, bucket_cap)
    del p
    st.update(range=r, ranges=1 << rbits, seconds=round(time.perf_counter() - t0, 3))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    st["peak_traced_mb"] = round(peak / 2**20, 2)
    st["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    meta = {"fingerprint": fingerprint, "bucket_cap": bucket_cap, "stats": st}
    table = pa.table({"a": a, "b": b}, schema=NEAR_PAIRS).replace_schema_metadata(
        {**NEAR_PAIRS.metadata, b"humanset_dedup": json.dumps(meta).encode()})
    cstore.write_parquet_at(path, table)
    return st


def task_memory_bytes(hashes: int) -> int:
    """memory= a (table, range) task declares for this many hashes."""
    return int(TASK_BASE_BYTES + TASK_BYTES_PER_HASH * hashes)


def partitioned_tables(hashes: np.ndarray, k: int, m: int, folder, fingerprint: str,
                       bucket_cap: int = DEFAULT_BUCKET_CAP, task_memory: int = DEFAULT_TASK_MEMORY,
                       rbits: int | None = None, use_ray: bool | None = None, progress=None
                       ) -> tuple[list[dict], list]:
    """Every (table, range) task of (m, k) over the distinct `hashes`; (their stats, pair files).

    On Ray when it is running (use_ray None), else in this process, task by task.
    """
    hashes = np.asarray(hashes, dtype=np.uint64)
    if rbits is None:
        rbits = range_bits(len(hashes), m, task_memory)
    tops = top_blocks(m, k)
    R = 1 << rbits
    if use_ray is None:  # a process that has not imported Ray runs none (its import is not paid for)
        ray = sys.modules.get("ray")
        use_ray = ray is not None and ray.is_initialized()
    chunks = [hashes[s:s + SCATTER_CHUNK] for s in range(0, max(1, len(hashes)), SCATTER_CHUNK)]
    todo = [(t, r) for t in range(len(tables(m, k))) for r in range(R)]
    files = [range_file(folder, m, k, t, r, rbits) for t, r in todo]
    if not use_ray:
        cut = [scatter(c, m, tops, rbits) for c in chunks]
        out = []
        for t, r in todo:
            i = tops.index(tables(m, k)[t][0]) * R + r
            out.append(range_table(k, m, t, r, rbits, bucket_cap, str(folder), fingerprint, *[c[i] for c in cut]))
            if progress:
                progress(len(out), len(todo), out[-1])
        return out, files
    import ray
    # the scatter's pieces are counted by Ray's object store; a task holds 2 copies of its chunk
    cut_task = ray.remote(num_cpus=1, num_returns=len(tops) * R, memory=task_memory_bytes(2 * SCATTER_CHUNK))(scatter)
    cut = []
    for c in chunks:
        refs = cut_task.remote(c, m, tops, rbits)
        cut.append([refs] if len(tops) * R == 1 else refs)
    expect = max(1, len(hashes)) / R  # the declared size of a range: its expected share, x2 for skew
    task = ray.remote(num_cpus=1, memory=task_memory_bytes(2 * expect))(range_table)
    refs = []
    for t, r in todo:
        i = tops.index(tables(m, k)[t][0]) * R + r
        refs.append(task.remote(k, m, t, r, rbits, bucket_cap, str(folder), fingerprint, *[c[i] for c in cut]))
    del cut
    pending, done = list(refs), 0
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        done += 1
        if progress:
            progress(done, len(todo), ray.get(ready[0]))
    return ray.get(refs), files
