"""Dedup clustering at scale on synthetic 64-bit pHashes. Prints one JSON line per --n.

Hashes: uniform, plus 5% planted near-copies of uniform ones (0-4 flipped bits, their own sha256),
plus 1% skewed hashes (1-4 flips among 12 fixed bits around 5 centres: the hot buckets real
pHashes of flat images make). Reports seconds, us per hash, the driver's peak memory above its
RSS at the start (sampled every 5 ms; in-process the input table exists before the start, with
--ray the driver reads the measure files after it; Ray workers are not counted), candidate pairs, and the recall of the planted copies (share of them
in their original's cluster; the target is 1.0).

    python bench/dedup.py --n 1000000 4000000 16000000          # pipeline.dedup.clusters.cluster, in process
    python bench/dedup.py --n 4000000 --ray --num-cpus 8         # run_dedup: measure files, Ray tasks
    python bench/dedup.py --n 4000000 --ray --components-memory 0   # ... components on Ray too
    python bench/dedup.py --distributed --n 1000000 4000000 16000000   # partitioned by hash, end to end

--distributed runs pipeline/dedup_dist over per-unit measure files (--unit-rows each) on a local Ray
with dedup.task_memory = --task-memory, so the partitions grow with n and a task's share does not;
it reports the largest peak RSS any task returned (max_task_rss_mb), the number of tasks, and the
memory the tasks declared (max_declared_mb) next to the driver's.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # a local benchmark stays on loopback

PLANTED, SKEWED, CENTRES, FIXED_BITS = 0.05, 0.01, 5, 12


def synthetic(n: int, seed: int = 0) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """(table, planted rows, their originals' rows); rows are shuffled, sample_id = zero-padded row."""
    rng = np.random.default_rng(seed)
    n_planted, n_skewed = int(n * PLANTED), int(n * SKEWED)
    n_uniform = n - n_planted - n_skewed
    h = np.empty(n, dtype=np.uint64)
    h[:n_uniform] = rng.integers(0, 2**64, n_uniform, dtype=np.uint64, endpoint=False)
    src = rng.integers(0, n_uniform, n_planted)
    copies = h[src].copy()
    flips = rng.integers(0, 5, n_planted)  # 0-4 distinct bits per copy
    bits = _distinct_bits(rng, n_planted, 4)
    for f in range(4):
        on = flips > f
        copies[on] ^= np.uint64(1) << bits[on, f]
    h[n_uniform:n_uniform + n_planted] = copies
    centres = rng.integers(0, 2**64, CENTRES, dtype=np.uint64, endpoint=False)
    fixed = rng.choice(64, FIXED_BITS, replace=False).astype(np.uint64)
    sk = centres[rng.integers(0, CENTRES, n_skewed)]
    for _ in range(4):
        on = rng.random(n_skewed) < 0.6
        sk[on] ^= np.uint64(1) << fixed[rng.integers(0, FIXED_BITS, int(on.sum()))]
    h[n_uniform + n_planted:] = sk
    perm = rng.permutation(n)  # row r holds hash h[perm[r]]
    row_of = np.empty(n, dtype=np.int64)
    row_of[perm] = np.arange(n)
    table = pa.table({"sample_id": _digits(n), "sha256": _hex(rng.integers(0, 256, (n, 32), dtype=np.uint8)),
                      "phash": pa.array(h[perm]), "width": pa.array(rng.integers(64, 4000, n, dtype=np.int32)),
                      "height": pa.array(rng.integers(64, 4000, n, dtype=np.int32))})
    planted_rows = row_of[np.arange(n_uniform, n_uniform + n_planted)]
    return table, planted_rows, row_of[src]


def _distinct_bits(rng, n: int, f: int) -> np.ndarray:
    """(n, f) bit positions, distinct within each row (rows with a repeat are drawn again)."""
    bits = rng.integers(0, 64, (n, f)).astype(np.uint64)
    while True:
        s = np.sort(bits, axis=1)
        bad = np.flatnonzero((s[:, 1:] == s[:, :-1]).any(axis=1))
        if not len(bad):
            return bits
        bits[bad] = rng.integers(0, 64, (len(bad), f)).astype(np.uint64)


def _digits(n: int, width: int = 10) -> pa.Array:
    d = (np.arange(n, dtype=np.int64)[:, None] // (10 ** np.arange(width - 1, -1, -1))) % 10 + 48
    return _fixed_strings(d.astype(np.uint8), width)


def _hex(raw: np.ndarray) -> pa.Array:
    lut = np.frombuffer(b"0123456789abcdef", np.uint8)
    out = np.empty((len(raw), raw.shape[1] * 2), np.uint8)
    out[:, 0::2], out[:, 1::2] = lut[raw >> 4], lut[raw & 15]
    return _fixed_strings(out, out.shape[1])


def _fixed_strings(chars: np.ndarray, width: int) -> pa.Array:
    n = len(chars)
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * width).tobytes())
    return pa.Array.from_buffers(pa.string(), n, [None, offsets, pa.py_buffer(chars.tobytes())])


class PeakRSS:
    """Peak resident memory of this process while inside the block, sampled every 5 ms."""

    def __enter__(self):
        self.base = self.peak = _rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._poll, daemon=True)
        self._t.start()
        return self

    def _poll(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, _rss())


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_inprocess(table: pa.Table, k: int, blocks: int | None) -> tuple[pa.Table, dict]:
    from pipeline.dedup.clusters import cluster_stats
    return cluster_stats(table, k, blocks=blocks)


def prepare_ray(table: pa.Table, unit_rows: int, num_cpus: int, workdir: Path) -> tuple[Path, list[str]]:
    """The engine's inputs: per-unit measure files, and a local Ray (both before the clock starts)."""
    import pyarrow.parquet as pq

    import ray
    run = workdir / "run"
    shutil.rmtree(run, ignore_errors=True)
    (run / "work" / "measure").mkdir(parents=True)
    units = []
    for i, off in enumerate(range(0, table.num_rows, unit_rows)):
        part = table.slice(off, unit_rows)
        part = part.append_column("_alive", pa.array(np.ones(part.num_rows, bool)))
        units.append(f"u{i:05d}")
        pq.write_table(part, run / "work" / "measure" / f"{units[-1]}.parquet")
    if not ray.is_initialized():
        ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level="WARNING")
    return run, units


def run_ray(run: Path, units: list[str], k: int, blocks: int | None, components_memory: int | None
            ) -> tuple[pa.Table, dict]:
    """run_dedup as the engine calls it: tables as Ray tasks, verdicts per unit."""
    from pipeline.dedup.clusters import read_verdicts, run_dedup
    stats = run_dedup(run, units, {"dedup": {"max_distance": k, "blocks": blocks,
                                             "components_memory": components_memory}})
    return pa.concat_tables([read_verdicts(run, u) for u in units]), stats


def run_distributed(run: Path, units: list[str], k: int, blocks: int | None, task_memory: int
                    ) -> tuple[pa.Table, dict]:
    """run_dedup with dedup.partitioned: true (pipeline/dedup/partitioned.py), verdicts per unit."""
    from pipeline.dedup.clusters import read_verdicts
    from pipeline.dedup.partitioned import run_dedup
    stats = run_dedup(run, units, {"dedup": {"max_distance": k, "blocks": blocks, "partitioned": True,
                                             "task_memory": task_memory}})
    return pa.concat_tables([read_verdicts(run, u) for u in units]), stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, nargs="+", default=[100_000, 300_000], help="hashes per run")
    ap.add_argument("--k", type=int, default=4, help="max Hamming distance (dedup.max_distance)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--blocks", type=int, help="dedup.blocks (default: chosen from the number of hashes)")
    ap.add_argument("--ray", action="store_true", help="run_dedup over per-unit files with Ray tasks")
    ap.add_argument("--unit-rows", type=int, default=1_000_000, help="rows per measure file with --ray")
    ap.add_argument("--num-cpus", type=int, default=os.cpu_count(), help="Ray CPUs with --ray")
    ap.add_argument("--components-memory", type=int,
                    help="with --ray: dedup.components_memory in bytes (0: components on Ray)")
    ap.add_argument("--distributed", action="store_true",
                    help="dedup partitioned by hash end to end (pipeline/dedup/partitioned.py) over per-unit files")
    ap.add_argument("--task-memory", type=int, default=(256 + 768) << 20,
                    help="with --distributed: dedup.task_memory in bytes (sets the partitions)")
    ap.add_argument("--workdir", help="with --ray: where the run folder goes (default: a temp dir)")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="humanset-bench-dedup-"))
    if args.distributed:
        args.ray = True
        if args.unit_rows == ap.get_default("unit_rows"):
            args.unit_rows = 10_000
    for n in args.n:
        table, planted, originals = synthetic(n, args.seed)
        if args.ray:
            run, units = prepare_ray(table, args.unit_rows, args.num_cpus, work)
            del table  # run_dedup reads the measure files
        with PeakRSS() as mem:
            t0 = time.perf_counter()
            if args.distributed:
                out, stats = run_distributed(run, units, args.k, args.blocks, args.task_memory)
            elif args.ray:
                out, stats = run_ray(run, units, args.k, args.blocks, args.components_memory)
            else:
                out, stats = run_inprocess(table, args.k, args.blocks)
            seconds = time.perf_counter() - t0
        # both outputs hold rows in sample_id = row order: canonical per row, then compare pairs
        out = out.take(pc.sort_indices(out, sort_keys=[("sample_id", "ascending")]))
        canon = pc.coalesce(out.column("dup_of"), out.column("sample_id"))
        found = pc.equal(canon.take(pa.array(planted)), canon.take(pa.array(originals)))
        recall = pc.sum(found).as_py() / max(1, len(planted))
        print(json.dumps({
            "benchmark": "dedup", "n": n,
            "mode": "distributed" if args.distributed else "ray run_dedup" if args.ray else "cluster in process",
            "max_task_rss_mb": stats.get("max_task_rss_mb"), "task_rss_mb": stats.get("task_rss_mb"),
            "task_seconds": stats.get("task_seconds"),
            "tasks": stats.get("tasks"),
            "partitions": stats.get("partitions"), "ranges": stats.get("ranges"), "batches": stats.get("batches"),
            "k": args.k, "seconds": round(seconds, 2), "us_per_hash": round(seconds / n * 1e6, 3),
            "peak_rss_above_start_mb": round((mem.peak - mem.base) / 2**20, 1),
            "bytes_per_hash": round((mem.peak - mem.base) / n, 1),
            "ru_maxrss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "distinct_hashes": stats.get("distinct_hashes"), "blocks": stats.get("blocks"),
            "tables": stats.get("tables"), "candidate_pairs": stats.get("candidate_pairs"),
            "near_pairs": stats.get("near_pairs"), "largest_bucket": stats.get("largest_bucket"),
            "hot_buckets_scanned": stats.get("hot_buckets_scanned"),
            "hot_buckets_skipped": stats.get("hot_buckets_skipped"), "components": stats.get("components"),
            "component_rounds": stats.get("component_rounds"),
            "duplicates": int(pc.sum(out.column("dup_of").is_valid()).as_py()),
            "planted": len(planted), "planted_recall": round(recall, 6), "cpus": os.cpu_count()}), flush=True)
        del out
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
