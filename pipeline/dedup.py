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

import itertools
import json
import logging
import math
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq  # noqa: F401 (read through catalog.storage; tests patch pq.read_table here)
import pyarrow.compute as pc

import catalog.storage as cstore
from catalog.schema import MEASURE, NEAR_PAIRS, VERDICTS

from .settings import DEFAULTS

log = logging.getLogger("humanset.dedup")

BITS = 64
WINDOW = 256  # buckets up to this size: compared as matrices of same-size buckets; larger: blocked scan
DEFAULT_BUCKET_CAP = DEFAULTS.dedup.bucket_cap  # its setting's default (pipeline/settings.py)
MAX_TABLES = 500  # choose_blocks never picks more tables than this (unless k needs it)
MAX_DISTANCE = 32  # beyond half the bits a "near" pHash pair is no longer a duplicate
RAY_MIN_HASHES = 100_000  # fewer distinct hashes: the tables run in this process (a task costs more)
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
# Samples -> components -> verdicts (pure: arrays in, arrays out)

def _union_find(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Root per node after unioning every (a[i], b[i]); path halving, vectorised over edges."""
    return _union_find_owned(n, [a, b])


def _union_find_owned(n: int, edges: list) -> np.ndarray:
    """_union_find of edges = [a, b], emptied so the arrays are freed as soon as they are used up."""
    parent = np.arange(n, dtype=np.int64)

    def find(x):
        while True:
            p = parent[x]
            gp = parent[p]
            if np.array_equal(p, gp):
                return p
            parent[x] = gp
            x = gp

    b, a = edges.pop(), edges.pop()
    while len(a):
        ra = find(a)
        del a
        rb = find(b)
        del b
        diff = ra != rb
        ra, rb = ra[diff], rb[diff]
        del diff
        if not len(ra):
            break
        lo = np.minimum(ra, rb)
        hi = np.maximum(ra, rb, out=rb)
        del ra, rb
        parent[hi] = lo  # several edges may write the same hi: others are redone next round
        a, b = lo, hi
    return find(np.arange(n, dtype=np.int64))


_HEX = np.full(256, 255, dtype=np.uint8)
_HEX[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10, dtype=np.uint8)
_HEX[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16, dtype=np.uint8)
_MIX = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 1], dtype=np.uint64)
_CHUNK = 1 << 18  # rows per step when parsing digests (about 200 bytes of temporaries each)


def as_string_chunks(col) -> pa.ChunkedArray:
    """A string column as chunks (no copy of the whole column when it already is one)."""
    col = col if isinstance(col, pa.ChunkedArray) else pa.chunked_array([col])
    return col if col.type == pa.string() else col.cast(pa.string())


def sha_key(arr: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, bool]:
    """(key, valid, exact): one uint64 per sha256 string; equal strings get equal keys.

    Lower-case hex digests (what the decode stage writes) are mixed down from all 256 bits, chunk
    by chunk; the rare equal key of two different digests is caught by _sha_links (exact=False).
    Any other strings are numbered by Arrow's dictionary encoding (exact=True).
    """
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    key = np.zeros(len(arr), dtype=np.uint64)
    out, hexes = 0, True
    for chunk in arr.chunks:
        present = chunk if not chunk.null_count else chunk.filter(chunk.is_valid())
        mixed = mix_hex(present) if hexes else None
        if mixed is None:
            hexes = False
            break
        rows = np.flatnonzero(valid[out:out + len(chunk)]) + out
        key[rows] = mixed
        out += len(chunk)
    if hexes:
        return key, valid, False
    key[valid] = pc.dictionary_encode(arr.filter(arr.is_valid()).combine_chunks()).indices.to_numpy().astype(np.uint64)
    return key, valid, True


def mix_hex(present: pa.Array) -> np.ndarray | None:
    """64-char lower-case hex strings (no nulls) -> one uint64 each from all 256 bits; else None."""
    if not len(present):
        return np.zeros(0, dtype=np.uint64)
    if not (pc.binary_length(present).to_numpy() == 64).all():
        return None
    off = int(np.frombuffer(present.buffers()[1], np.int32)[present.offset])
    raw = np.frombuffer(present.buffers()[2], np.uint8)[off:off + 64 * len(present)].reshape(-1, 64)
    mixed = np.empty(len(present), dtype=np.uint64)
    for s in range(0, len(present), _CHUNK):
        nib = _HEX[raw[s:s + _CHUNK]]
        if (nib == 255).any():
            return None
        words = np.ascontiguousarray((nib[:, 0::2] << 4) | nib[:, 1::2]).view(">u8").astype(np.uint64)
        mixed[s:s + _CHUNK] = np.bitwise_xor.reduce(words * _MIX, axis=1)
    return mixed


def _sha_links(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Links (first sample of the group, sample) between samples with one sha256."""
    arr = as_string_chunks(arr)
    key, valid, exact = sha_key(arr)
    nodes = np.flatnonzero(valid)
    order = nodes[np.argsort(key[nodes])]
    k = key[order]
    same = k[1:] == k[:-1]
    if not exact and same.any():
        i = np.flatnonzero(same)
        equal = pc.equal(arr.take(pa.array(order[i])), arr.take(pa.array(order[i + 1])))
        if not equal.to_numpy(zero_copy_only=False).all():  # two digests on one key: number the strings
            key[valid] = pc.dictionary_encode(
                arr.filter(arr.is_valid()).combine_chunks()).indices.to_numpy().astype(np.uint64)
            order = nodes[np.argsort(key[nodes])]
            k = key[order]
            same = k[1:] == k[:-1]
    new = np.ones(len(order), dtype=bool)
    new[1:] = ~same
    first = order[np.flatnonzero(new)][np.cumsum(new) - 1]
    ok = first != order
    return first[ok], order[ok]


def components(phash: pa.Array, sha256, max_distance: int | None = 4, exact: bool = True,
               near=None) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Component root per sample, plus the near search's counts.

    near(distinct_hashes, k) -> (a, b, stats) finds the near pairs; default `near_pairs` here.
    """
    if max_distance is not None and max_distance > MAX_DISTANCE:
        raise ValueError(f"dedup.max_distance={max_distance}: at most {MAX_DISTANCE} of 64 bits "
                         f"(beyond that unrelated images match); the usual value is 4")
    n = len(phash)
    ea, eb, stats = [], [], {"distinct_hashes": 0}
    if exact:
        a, b = _sha_links(sha256)
        ea.append(a)
        eb.append(b)
    if max_distance is not None and max_distance >= 0:
        ph = phash.combine_chunks() if isinstance(phash, pa.ChunkedArray) else phash
        ph = ph.cast(pa.uint64())
        nodes = np.flatnonzero(ph.is_valid().to_numpy(zero_copy_only=False))
        values = ph.fill_null(0).to_numpy()[nodes]
        order = np.argsort(values)
        values = values[order]
        new = np.ones(len(values), dtype=bool)
        new[1:] = values[1:] != values[:-1]
        head = np.flatnonzero(new)
        distinct = values[head]
        rep = nodes[order[head]]  # one sample per distinct hash
        del values, new
        a = np.repeat(rep, np.diff(np.r_[head, len(order)]))
        same = a != nodes[order]
        ea.append(a[same])
        eb.append(nodes[order][same])
        del a, same, order
        stats["distinct_hashes"] = len(distinct)
        if max_distance > 0 and len(distinct) > 1:
            x, y, st = (near or near_pairs)(distinct, int(max_distance))
            stats.update(st)
            ea.append(rep[np.searchsorted(distinct, x)])
            del x
            eb.append(rep[np.searchsorted(distinct, y)])
            del y
    edges = [np.concatenate(e) if e else np.zeros(0, np.int64) for e in (ea, eb)]
    del ea, eb
    return _union_find_owned(n, edges), stats


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


# --------------------------------------------------------------------------------------------
# Components of the near pairs on Ray, when they would not fit this process (dedup.components_memory)
#
# Vertices are positions in the sorted distinct-hash array; an edge record is one uint64,
# key << 32 | value (so at most 2^32 distinct hashes), kept in Ray's object store in `parts`
# partitions by key. The alternating algorithm of Kiveris et al., "Connected components in
# MapReduce and beyond" (SoCC 2014): large-star (every vertex links its larger neighbours to the
# smallest of its neighbourhood) and small-star (every vertex links its smaller neighbours and
# itself to the smallest of them) until a large-star and the small-star after it change no edge;
# the graph is then one star per component around its smallest vertex. O(log n) rounds in
# practice (chains included), each a shuffle of the edges; this process holds per round only the
# partitions' object references and counts. The result comes back as one edge per non-centre
# vertex (vertex, centre): at most one per distinct hash, which the union-find over
# samples takes like any other link, so the clusters equal those of the union-find over all pairs.

PAIR_BYTES = 48  # memory per near pair in the in-process union-find at its peak (measured 21-42)
DEFAULT_COMPONENTS_MEMORY = DEFAULTS.dedup.components_memory  # its setting's default (pipeline/settings.py)
MAX_PARTS = 256  # partitions of the edges on Ray (each a reduce task per round)
_LOW = np.uint64(0xFFFFFFFF)
_HI = np.uint64(32)


def _pack(key: np.ndarray, val: np.ndarray) -> np.ndarray:
    return (key.astype(np.uint64) << _HI) | val.astype(np.uint64)


def _split(rec: np.ndarray, parts: int) -> list[np.ndarray]:
    """Edge records cut into `parts` partitions by a hash of their key."""
    if parts == 1:
        return [rec]
    p = (((rec >> _HI) * np.uint64(0x9E3779B97F4A7C15)) >> _HI) % np.uint64(parts)
    order = np.argsort(p, kind="stable")
    return np.split(rec[order], np.cumsum(np.bincount(p.astype(np.int64), minlength=parts))[:-1])


def _groups(inputs) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(key, value, group number, first-of-its-key mask) of the distinct records, sorted by key, value."""
    rec = np.unique(np.concatenate(inputs)) if len(inputs) else np.zeros(0, np.uint64)
    key, val = rec >> _HI, rec & _LOW
    head = np.ones(len(key), dtype=bool)
    head[1:] = key[1:] != key[:-1]
    return key, val, np.cumsum(head) - 1, head


def _cc_load(path: str, distinct: np.ndarray, parts: int) -> list:
    """One table's pair file -> records for the first large-star (both directions), by partition."""
    p = cstore.read_table_at(path)
    a = np.searchsorted(distinct, p.column("a").to_numpy())
    b = np.searchsorted(distinct, p.column("b").to_numpy())
    return [*_split(np.concatenate([_pack(a, b), _pack(b, a)]), parts), {"edges": len(a), "changes": 0}]


def _cc_step(op: str, parts: int, *inputs) -> list:
    """One reduce of the alternating algorithm on one partition, and the map of the next one.

    op "large": records (u; v) for both directions of every edge; emits (v, m(u)) for each v > u,
    m(u) the smallest of u and its neighbours, as small-star input (larger end; smaller end).
    op "small": records (u; v) with v < u; m = smallest v; emits (x, m) for every other x among the
    v and u itself, as large-star input (both directions). changes: edges that are not kept as they
    were (zero in both ops, one after the other: every component is a star around its minimum).
    """
    key, val, group, head = _groups(inputs)
    first = val[head][group]  # smallest neighbour (value) per record's key
    if op == "large":
        m = np.minimum(key, first)
        up = val > key
        v, mv = val[up], m[up]
        out = _pack(v, mv)  # v > u >= m: key is the larger end
        st = {"edges": len(out), "changes": int((mv != key[up]).sum())}
    else:
        other = val != first
        centre = key[head]  # each key u once, linked to its smallest neighbour
        x = np.concatenate([val[other], centre])
        m = np.concatenate([first[other], val[head]])
        out = np.concatenate([_pack(x, m), _pack(m, x)])
        st = {"edges": len(x), "changes": int(other.sum())}
    return [*_split(out, parts), st]


def _cc_labels(*inputs) -> tuple[np.ndarray, np.ndarray]:
    """(vertex, centre) for the non-centre vertices of one partition of the final stars."""
    key, val, group, head = _groups(inputs)
    k, first = key[head], val[head]
    leaf = first < k
    return k[leaf], first[leaf]


def ray_components(files: list, distinct: np.ndarray, parts: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """Near pairs (pair files of hash values) -> one (hash, component's smallest hash) per other hash.

    Iterative on Ray: this process holds object references and per-round counts, never the pairs.
    """
    import ray
    if len(distinct) >= 1 << 32:
        raise ValueError(f"dedup: {len(distinct)} distinct pHashes; the components on Ray number them in 32 bits "
                         f"(at most {1 << 32}); raise dedup.components_memory to build them in this process")
    parts = max(1, int(parts))
    t0 = time.perf_counter()
    ref = ray.put(distinct)
    load = ray.remote(num_cpus=1, num_returns=parts + 1)(_cc_load)
    step = ray.remote(num_cpus=1, num_returns=parts + 1)(_cc_step)
    outs = [load.remote(str(f), ref, parts) for f in files]
    op, rounds, large_changes = "large", 0, None
    while True:
        outs = [step.remote(op, parts, *[o[j] for o in outs]) for j in range(parts)]
        st = ray.get([o[-1] for o in outs])
        rounds += 1
        changes, left = sum(s["changes"] for s in st), sum(s["edges"] for s in st)
        log.info("dedup: components round %d (%s-star): %d edges, %d changed", rounds, op, left, changes)
        if op == "large":
            large_changes, op = changes, "small"
        elif large_changes == 0 and changes == 0:
            break
        else:
            op = "large"
    labels = ray.remote(num_cpus=1)(_cc_labels)
    v, c = [], []
    for x, y in ray.get([labels.remote(*[o[j] for o in outs]) for j in range(parts)]):
        v.append(x)
        c.append(y)
    del outs
    v = np.concatenate(v).astype(np.int64) if v else np.zeros(0, np.int64)
    c = np.concatenate(c).astype(np.int64) if c else np.zeros(0, np.int64)
    stats = {"components": "ray", "component_rounds": rounds, "component_partitions": parts,
             "component_seconds": round(time.perf_counter() - t0, 3)}
    return distinct[v], distinct[c], stats


# --------------------------------------------------------------------------------------------
# Run level: the interface the engine calls (RUN/work/measure -> RUN/work/dedup/{unit}.parquet).

VERDICT_SCHEMA = VERDICTS
MEASURE_COLUMNS = ["sample_id", "sha256", "phash", "width", "height", "_alive"]


def loc(text: str):
    """A local path as a Path, a URI as its string (every file of dedup goes through catalog/storage)."""
    return text if cstore.is_uri(text) else Path(text)


def dedup_dir(run):
    """RUN/work/dedup: a Path for a local RUN, a URI string for one on an object store."""
    return loc(cstore.join(run, "work", "dedup"))


def pairs_dir(run):
    return loc(cstore.join(dedup_dir(run), "pairs"))


def is_done(run) -> bool:
    """True once run_dedup finished for this RUN (its marker is written last)."""
    return cstore.exists_at(cstore.join(dedup_dir(run), "_done.json"))


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


def _run_tables(hashes: np.ndarray, k: int, m: int, bucket_cap: int, folder: Path) -> list[dict]:
    """Every table, as Ray tasks when Ray is up (the hash array put in the object store once)."""
    fp = _fingerprint(hashes)
    todo = list(range(len(tables(m, k))))
    try:
        import ray
        use_ray = ray.is_initialized()
    except ImportError:
        use_ray = False
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
    try:
        import ray
        return int(ray.cluster_resources().get("CPU", 1)) if ray.is_initialized() else None
    except ImportError:
        return None


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
    from .sources import iter_listing
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
