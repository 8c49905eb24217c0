"""Near pairs of distinct pHashes from permuted block tables (pure numpy), and their pair files.

The near search of pipeline/dedup/clusters.py (its docstring, step 2, has the method and the memory): m
blocks, one table per choice of m-k kept blocks (`tables`, `Layout`), the pairs of one table
(`table_pairs`, `sorted_table_pairs`), all tables in this process (`near_pairs`), and one table's
pairs written to, and read back from, its own file (`run_table`, `read_table_stats`), as run_dedup
and pipeline/dedup/ranges.py run them.
"""
from __future__ import annotations

import itertools
import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import catalog.storage as cstore
from catalog.schema import NEAR_PAIRS

from pipeline.settings import DEFAULTS

log = logging.getLogger("humanset.dedup")

BITS = 64
WINDOW = 256  # buckets up to this size: compared as matrices of same-size buckets; larger: blocked scan
DEFAULT_BUCKET_CAP = DEFAULTS.dedup.bucket_cap  # its setting's default (pipeline/settings.py)
MAX_TABLES = 500  # choose_blocks never picks more tables than this (unless k needs it)
MAX_DISTANCE = 32  # beyond half the bits a "near" pHash pair is no longer a duplicate
_SCAN_CELLS = 1 << 22  # cells per step of a bucket matrix or of the blocked scan (memory: 8 bytes each)
_EXACT_SIZES = 32  # buckets up to this size are compared in classes of one size; larger ones padded
_STEP = 1 << 22  # positions per step of a table's scan for equal keys (bounds its temporaries to ~100 MB)


# --------------------------------------------------------------------------------------------
# Permuted block tables (pure numpy; no files, no cluster)

def blocks(m: int, bits: int = BITS) -> list[tuple[int, int]]:
    """(shift, width) of m blocks covering `bits` bits, from the top; the first get the extra bits."""
    if not 1 <= m <= bits:
        raise ValueError(f"blocks: need 1 <= m <= {bits}, got m={m}")
    widths = [bits // m + (1 if i < bits % m else 0) for i in range(m)]
    out, shift = [], bits
    for w in widths:
        shift -= w
        out.append((shift, w))
    return out


def tables(m: int, k: int) -> list[tuple[int, ...]]:
    """The kept blocks of each table, in the fixed order that decides which table emits a pair."""
    return list(itertools.combinations(range(m), m - k))


def expected_candidates(n: int, m: int, k: int) -> float:
    """Candidate pairs over all tables for n uniform distinct hashes: sum_t n^2 / 2^(key bits + 1)."""
    w = [width for _, width in blocks(m)]
    return sum(n * n / 2.0 ** (sum(w[b] for b in kept) + 1) for kept in tables(m, k))


# relative costs (this machine, numpy): one hash through one table (permute + sort + scan) vs
# one candidate pair (gather, xor, popcount); see bench/dedup.py
_COST_PER_HASH, _COST_PER_CANDIDATE = 1.0, 0.3


def choose_blocks(n: int, k: int) -> int:
    """Number of blocks m minimising tables * n * (per-hash cost) + candidates * (per-pair cost).

    More blocks mean longer keys (fewer candidates) but more tables: C(m, k). For k = 4 this picks
    m = 6 (15 tables, 21-22 bit keys) from ~30k to ~25M hashes, then m = 7 (35 tables, 27-28 bits)
    up to ~1.2e9, then m = 8 (70 tables, 32 bits).
    """
    if k <= 0:
        return 1
    best = None
    for m in range(k + 1, min(BITS, k + 8) + 1):
        if math.comb(m, k) > MAX_TABLES and best is not None:
            break
        cost = len(tables(m, k)) * n * _COST_PER_HASH + expected_candidates(n, m, k) * _COST_PER_CANDIDATE
        if best is None or cost < best[0]:
            best = (cost, m)
    return best[1]


class Layout:
    """Table t of (m, k): the kept blocks moved to the top bits, the others below, order kept.

    Hamming distance is the same before and after, so candidates are verified on permuted values.
    """

    def __init__(self, m: int, k: int, t: int):
        self.m, self.k, self.t = m, k, t
        bl = blocks(m)
        kept = tables(m, k)[t]
        order = list(kept) + [b for b in range(m) if b not in kept]
        self.key_bits = sum(bl[b][1] for b in kept)
        self.key_shift = BITS - self.key_bits
        self.top_block, self.top_bits = kept[0], bl[kept[0]][1]
        moves, dst = [], BITS
        self.block_mask = np.zeros(m, dtype=np.uint64)  # block b's bits in the permuted value
        self.block_shift = {}  # block b's lowest bit in the permuted value
        for b in order:
            src, w = bl[b]
            dst -= w
            moves.append((src, dst, w))
            self.block_mask[b] = np.uint64(((1 << w) - 1) << dst)
            self.block_shift[b] = dst
        self.moves = _merge(moves)

    def permute(self, x: np.ndarray) -> np.ndarray:
        return _move(x, [(s, d, w) for s, d, w in self.moves])

    def unpermute(self, p: np.ndarray) -> np.ndarray:
        return _move(p, [(d, s, w) for s, d, w in self.moves])

    def repermute(self, other: "Layout", p: np.ndarray) -> np.ndarray:
        """Values permuted for table `other` moved into this table's layout (one pass per bit range)."""
        bl = blocks(self.m)
        moves = sorted(((other.block_shift[b], self.block_shift[b], bl[b][1]) for b in range(self.m)), reverse=True)
        return _move(p, _merge(moves))

    def sorted_values(self, hashes: np.ndarray, base: tuple | None = None) -> np.ndarray:
        """The hashes in this table's layout, sorted.

        base: (layout, its sorted values) of another table with the same top block. Re-permuted,
        those values are already grouped by the top block, so only each group needs sorting: many
        small sorts in cache rather than one over the whole array (about a third less time).
        """
        if base is not None and base[0].top_block == self.top_block:
            p = self.repermute(base[0], base[1])
            top = p >> np.uint64(BITS - self.top_bits)
            cuts = np.flatnonzero(top[1:] != top[:-1]) + 1
            del top
            if len(cuts) * 16 <= len(p):  # groups of 16 hashes or more on average
                for a, b in itertools.pairwise([0, *cuts.tolist(), len(p)]):
                    if b - a > 1:
                        p[a:b].sort()
                return p
        else:
            p = self.permute(np.asarray(hashes, dtype=np.uint64))
        p.sort()
        return p

    def agree(self, diff: np.ndarray) -> np.ndarray:
        """Bit b set where the pair (given by x ^ y of permuted values) agrees on block b."""
        out = np.zeros(len(diff), dtype=np.int64)
        for b in range(self.m):
            out |= ((diff & self.block_mask[b]) == 0).astype(np.int64) << b
        return out


def _merge(moves):
    """Join moves of adjacent bit ranges that stay adjacent (fewer passes over the array)."""
    out = []
    for s, d, w in moves:
        if out and out[-1][0] == s + w and out[-1][1] == d + w:
            ps, pd, pw = out.pop()
            s, d, w = s, d, pw + w
        out.append((s, d, w))
    return out


def _move(x: np.ndarray, moves) -> np.ndarray:
    """Bit ranges (src, dst, width) of x moved; ranges that stay put cost one mask in all."""
    stay = sum(((1 << w) - 1) << s for s, d, w in moves if s == d)
    out = np.bitwise_and(x, np.uint64(stay)) if stay else np.zeros(len(x), dtype=np.uint64)
    tmp = np.empty(len(x), dtype=np.uint64)
    for s, d, w in moves:
        if s == d:
            continue
        if s > d:
            np.right_shift(x, np.uint64(s - d), out=tmp)
        else:
            np.left_shift(x, np.uint64(d - s), out=tmp)
        np.bitwise_and(tmp, np.uint64(((1 << w) - 1) << d), out=tmp)
        np.bitwise_or(out, tmp, out=out)
    return out


def first_table(m: int, k: int) -> np.ndarray:
    """For each mask of agreeing blocks: the first table whose kept blocks all agree (-1: none)."""
    masks = np.arange(1 << m, dtype=np.int64)
    out = np.full(1 << m, -1, dtype=np.int64)
    for t, kept in reversed(list(enumerate(tables(m, k)))):
        need = sum(1 << b for b in kept)
        out[(masks & need) == need] = t
    return out


def table_pairs(hashes: np.ndarray, k: int, m: int, t: int, bucket_cap: int = DEFAULT_BUCKET_CAP
                ) -> tuple[np.ndarray, np.ndarray, dict]:
    """Pairs of distinct hashes within distance k that table t of (m, k) emits.

    hashes: distinct uint64 values. Returns (a, b, stats) with a < b (the hash values); stats counts
    candidates compared, pairs verified, pairs emitted and hot buckets scanned or skipped.
    """
    lay = Layout(m, k, t)
    return sorted_table_pairs(lay.sorted_values(hashes), lay, k, bucket_cap)


def sorted_table_pairs(p: np.ndarray, lay: Layout, k: int, bucket_cap: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """table_pairs on the table's sorted permuted values p (read, not changed)."""
    m, t = lay.m, lay.t
    first = first_table(m, k)
    n = len(p)
    stats = {"table": t, "hashes": n, "candidates": 0, "verified": 0, "pairs": 0, "largest_bucket": 0,
             "hot_buckets_scanned": 0, "hot_buckets_skipped": 0, "hot_hashes_skipped": 0}
    if n < 2:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64), stats
    shift = np.uint64(lay.key_shift)
    pos = np.int32 if n < 2**31 else np.int64
    cand = []  # positions i where p[i] and p[i+1] share the key; built in steps to bound temporaries
    for s in range(0, n - 1, _STEP):
        e = min(n - 1, s + _STEP)
        x = np.bitwise_xor(p[s + 1:e + 1], p[s:e])
        np.right_shift(x, shift, out=x)
        cand.append((np.flatnonzero(x == 0) + s).astype(pos))
    cand = np.concatenate(cand)
    found_x, found_y = [], []

    def emit(x, y, diff):  # verified pairs (distance <= k)
        stats["verified"] += len(x)
        mine = first[lay.agree(diff)] == t  # emitted by the first table they share a bucket in
        found_x.append(x[mine])
        found_y.append(y[mine])

    def keep(x, y, diff):
        ok = np.bitwise_count(diff) <= k
        emit(x[ok], y[ok], diff[ok])

    if len(cand):
        # bucket sizes, from the starts of runs of equal keys among the candidate positions
        run_start = np.flatnonzero(np.diff(cand, prepend=-2) != 1)
        run_len = np.diff(run_start, append=len(cand)) + 1  # hashes per bucket
        lo = cand[run_start]
        stats["largest_bucket"] = int(run_len.max())
        hot = run_len > min(WINDOW, bucket_cap)
        del cand, run_start
        for s, ln in zip(lo[hot].tolist(), run_len[hot].tolist()):
            if ln > bucket_cap:
                stats["hot_buckets_skipped"] += 1
                stats["hot_hashes_skipped"] += ln
                continue
            stats["hot_buckets_scanned"] += 1
            _scan(p[s:s + ln], k, keep, stats)
        lo, run_len = lo[~hot], run_len[~hot]
        # buckets grouped by size class: each size up to _EXACT_SIZES, then powers of two (padded)
        size = np.where(run_len <= _EXACT_SIZES, run_len,
                        1 << np.ceil(np.log2(np.maximum(run_len, 1))).astype(np.int64))
        by_size = np.argsort(size.astype(np.int16) if WINDOW < 1 << 14 else size, kind="stable")
        lo, run_len, size = lo[by_size], run_len[by_size], size[by_size]
        edges = np.flatnonzero(np.diff(size, prepend=0, append=0))
        for a, b in zip(edges[:-1], edges[1:]):
            padded = size[a] > _EXACT_SIZES
            _buckets(p, lo[a:b], int(size[a]), k, emit, stats, run_len[a:b] if padded else None)
    x = np.concatenate(found_x) if found_x else np.zeros(0, np.uint64)
    y = np.concatenate(found_y) if found_y else np.zeros(0, np.uint64)
    x, y = lay.unpermute(x), lay.unpermute(y)
    stats["pairs"] = len(x)
    return np.minimum(x, y), np.maximum(x, y), stats


def _buckets(p: np.ndarray, lo: np.ndarray, size: int, k: int, emit, stats: dict, sizes=None) -> None:
    """Every pair inside the buckets p[lo:lo + size] (all of one size), bucket rows at a time.

    The buckets' hashes form a (size, buckets) matrix; the pairs at offset d are one xor of two of
    its row slices, so a candidate costs an xor, a popcount and a compare, with no gather or
    compaction per candidate (what made the candidates' share grow with n). sizes: the buckets'
    own sizes when they are padded up to `size` (rare large buckets: a class per power of two
    rather than per size), whose pairs beyond them are masked out.
    """
    rows = max(1, _SCAN_CELLS // size)
    off = np.arange(size)[:, None]
    xs, ys, ds = [], [], []
    for s in range(0, len(lo), rows):
        # one column per bucket, so each operation below runs along the long axis
        if sizes is None:
            m = p[lo[None, s:s + rows] + off]
            stats["candidates"] += m.shape[1] * (size * (size - 1) // 2)
        else:
            sz = sizes[None, s:s + rows]
            m = p[lo[None, s:s + rows] + np.minimum(off, sz - 1)]
            stats["candidates"] += int((sz * (sz - 1) // 2).sum())
        for d in range(1, size):
            diff = m[d:] ^ m[:-d]
            close = np.bitwise_count(diff) <= k
            if sizes is not None:
                close &= off[d:] < sz
            i, c = np.nonzero(close)
            if len(i):
                xs.append(m[i + d, c])
                ys.append(m[i, c])
                ds.append(diff[i, c])
    if xs:  # one call for all (the first-table lookup costs a few passes of its own)
        emit(np.concatenate(xs), np.concatenate(ys), np.concatenate(ds))


def _scan(bucket: np.ndarray, k: int, keep, stats: dict) -> None:
    """Every pair of one (hot) bucket, in blocks of rows against the rest of the bucket."""
    ln = len(bucket)
    step = max(1, _SCAN_CELLS // ln)
    for r in range(0, ln - 1, step):
        rows = bucket[r:r + step]
        rest = bucket[r + 1:]
        close = np.bitwise_count(rows[:, None] ^ rest[None, :]) <= k
        # row i (global r+i) against rest column j (global r+1+j): keep j >= i, so each pair once
        close &= np.arange(len(rest))[None, :] >= np.arange(len(rows))[:, None]
        stats["candidates"] += len(rows) * (ln - 1 - r) - len(rows) * (len(rows) - 1) // 2
        i, j = np.nonzero(close)
        if len(i):
            keep(rows[i], rest[j], rows[i] ^ rest[j])


def near_pairs(hashes: np.ndarray, k: int, m: int | None = None, bucket_cap: int = DEFAULT_BUCKET_CAP
               ) -> tuple[np.ndarray, np.ndarray, dict]:
    """All pairs of distinct hashes within distance k (each once), every table in this process."""
    hashes = np.asarray(hashes, dtype=np.uint64)
    m = m or choose_blocks(len(hashes), k)
    a, b, per = [], [], []
    base = None  # tables come grouped by their first kept block: the group's first sort serves the rest
    for t in range(len(tables(m, k))):
        lay = Layout(m, k, t)
        p = lay.sorted_values(hashes, base)
        if base is None or base[0].top_block != lay.top_block:
            base = (lay, p)
        x, y, st = sorted_table_pairs(p, lay, k, bucket_cap)
        del p
        a.append(x)
        b.append(y)
        per.append(st)
    return np.concatenate(a), np.concatenate(b), sum_stats(m, k, per)


def sum_stats(m: int, k: int, per: list[dict]) -> dict:
    keys = {"candidates": "candidate_pairs", "verified": "verified_pairs", "pairs": "near_pairs",
            "hot_buckets_scanned": "hot_buckets_scanned", "hot_buckets_skipped": "hot_buckets_skipped",
            "hot_hashes_skipped": "hot_hashes_skipped"}
    out = {"blocks": m, "tables": len(tables(m, k)), **{v: sum(s[f] for s in per) for f, v in keys.items()}}
    out["largest_bucket"] = max((s["largest_bucket"] for s in per), default=0)
    return out


# --------------------------------------------------------------------------------------------
# Pair files: one table's pairs, written once (atomically) and reused by a resumed run

def loc(text: str):
    """A local path as a Path, a URI as its string (every file of dedup goes through catalog/storage)."""
    return text if cstore.is_uri(text) else Path(text)


def _fingerprint(hashes: np.ndarray) -> str:
    """Identifies the distinct-hash array a pair file was computed from (resume must not mix runs)."""
    if not len(hashes):
        return "0"
    mix = (hashes * np.uint64(0x9E3779B97F4A7C15)) ^ (hashes >> np.uint64(29))
    return f"{len(hashes)}-{int(np.bitwise_xor.reduce(mix)):016x}-{int(hashes.sum(dtype=np.uint64)):016x}"


def table_file(folder, m: int, k: int, t: int):
    return loc(cstore.join(folder, f"m{m}-k{k}-t{t:03d}.parquet"))


def run_table(hashes: np.ndarray, k: int, m: int, t: int, bucket_cap: int, folder: str, fingerprint: str
              ) -> dict:
    """One table: its pairs to FOLDER/m{m}-k{k}-t{t}.parquet (written once, atomically); its stats."""
    path = table_file(folder, m, k, t)
    st = read_table_stats(path, fingerprint, bucket_cap)
    if st is not None:
        return st  # done before a crash
    t0 = time.perf_counter()
    a, b, st = table_pairs(hashes, k, m, t, bucket_cap)
    st["seconds"] = round(time.perf_counter() - t0, 3)
    meta = {"fingerprint": fingerprint, "bucket_cap": bucket_cap, "stats": st}
    table = pa.table({"a": a, "b": b}, schema=NEAR_PAIRS).replace_schema_metadata(
        {**NEAR_PAIRS.metadata, b"humanset_dedup": json.dumps(meta).encode()})
    cstore.write_parquet_at(path, table)
    return st


def read_table_stats(path: str, fingerprint: str, bucket_cap: int) -> dict | None:
    if not cstore.exists_at(path):
        return None
    meta = json.loads((cstore.read_schema_at(path).metadata or {}).get(b"humanset_dedup", b"{}"))
    if meta.get("fingerprint") != fingerprint or meta.get("bucket_cap") != bucket_cap:
        return None  # computed from other hashes or settings: redo
    return meta["stats"]
