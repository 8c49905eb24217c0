"""The tasks of the partitioned dedup (pipeline/dedup/partitioned.py): each reads its inputs from files under
ROOT = RUN/work/dedup/dist/{fingerprint}, writes its outputs there and, last, a marker with its
stats (ROOT/mk/...json), so a rerun answers a finished task from its marker. Every task returns
its stats with `peak_rss_mb` (VmHWM, reset at the task's start) and `ru_maxrss_mb`.

Files: one Parquet file per map-side task, whose row group q holds the rows bound for partition q
(every row group written, empty ones too, so row group q is partition q; its key-value metadata
says how many). A reduce task reads only row group q of each map file (the footer gives its
offsets: ranged reads on an object store). Per task, [row groups]:
sc/b{batch}-ph [P ranges] (number, phash), sc/b{batch}-sh [P] (number, sha256),
nr/t{first block}-from{range} [R near ranges] (phash, representative), cc/r{round}/{source} [P]
(key, value), lab/p{part} [B batches] (number, component), grp/b{batch} [P] (component, number,
area, sid, sha), ver/q{part} [B] (number, dup_of, dup_kind, size, rank).
"""
from __future__ import annotations

import gc
import resource
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import catalog.storage as cstore
from catalog.schema import VERDICTS

from pipeline.dedup import clusters as D
from pipeline.dedup.components import as_string_chunks, mix_hex
from pipeline.dedup.files import read_parts as _read, unit_ids, write_parts as _write_parts
from pipeline.dedup.ranges import range_of
from pipeline.dedup.tables import Layout, sorted_table_pairs

GOLD = np.uint64(0x9E3779B97F4A7C15)
_LOW32 = (1 << 32) - 1


# --------------------------------------------------------------------------------------------
# helpers

def part_of(x: np.ndarray, P: int) -> np.ndarray:
    """A partition in [0, P) per uint64 key, from a multiplicative mix (skewed keys spread out)."""
    if P == 1:
        return np.zeros(len(x), np.int64)
    return (((np.asarray(x).astype(np.uint64) * GOLD) >> np.uint64(32)) % np.uint64(P)).astype(np.int64)


def sha_part(arr: pa.Array, P: int) -> np.ndarray:
    """Partition of each (valid) sha256 string: one digest always lands in one range."""
    mixed = mix_hex(arr)
    if mixed is None:  # not lower-case hex: a checksum of the string (slow; never for our measure files)
        mixed = np.array([zlib.crc32(s.encode()) for s in arr.to_pylist()], np.uint64)
    return part_of(mixed, P)


def peak_rss_mb() -> float:
    """Peak resident memory of this process since reset_peak() (VmHWM), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def reset_peak() -> None:
    """Reset VmHWM (Linux), so a reused Ray worker reports this task's peak, not an earlier task's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _once(root: str, name: str, body) -> dict:
    """body() once: its stats (plus peak memory) in ROOT/mk/{name}.json, written after its files."""
    marker = cstore.join(root, "mk", f"{name}.json")
    if cstore.exists_at(marker):
        return {**cstore.read_json_at(marker), "resumed": True}
    gc.collect()  # what an earlier task on this worker left: not this task's memory
    pa.default_memory_pool().release_unused()
    reset_peak()
    t0 = time.perf_counter()
    st = body() or {}
    st.update(task_seconds=round(time.perf_counter() - t0, 3), peak_rss_mb=peak_rss_mb(), node=_node(),
              ru_maxrss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
    cstore.write_json_at(marker, st)
    return st


def _node() -> str | None:
    """The Ray node this task ran on (None outside Ray)."""
    import sys
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


def _col(t: pa.Table, name: str) -> np.ndarray:
    return t.column(name).to_numpy()


def _edges(root: str, tag: str, u: np.ndarray, v: np.ndarray, P: int) -> None:
    """Edges u - v as round 0 records, both directions, to ROOT/cc/r000/{tag} (a row group a part)."""
    key, val = np.concatenate([u, v]).astype(np.int64), np.concatenate([v, u]).astype(np.int64)
    _write_parts(root, f"cc/r000/{tag}.parquet", pa.table({"key": key, "val": val}), part_of(key, P), P)


def _batch(run: str, uids: list[str], first: int) -> tuple[pa.Table, np.ndarray]:
    """The batch's alive measured rows (MEASURE_COLUMNS) and their sample numbers."""
    with ThreadPoolExecutor(D.IO_THREADS) as pool:
        parts = list(pool.map(D.read_measured, [cstore.join(run, "work", "measure", f"{u}.parquet") for u in uids]))
    nums = [(np.int64(first + i) << np.int64(32)) | np.arange(p.num_rows, dtype=np.int64) for i, p in enumerate(parts)]
    table = pa.concat_tables(parts) if parts else D.measured_empty()
    return table, (np.concatenate(nums) if nums else np.zeros(0, np.int64))


def _batch_of(num: np.ndarray, starts: list[int]) -> np.ndarray:
    return np.searchsorted(np.asarray(starts, np.int64), num >> np.int64(32), side="right") - 1


# --------------------------------------------------------------------------------------------
# the tasks, in the order the coordinator runs them

def count_rows(run: str, units: str, c: int, uids: list[str]) -> dict:
    """Rows per unit measure file of chunk c (from the parquet footers; alive or not: an upper
    bound), written with the unit ids to UNITS/c{c}.parquet; returns the chunk's sums only."""
    def rows(u):
        store, name = cstore.locate(cstore.join(run, "work", "measure", f"{u}.parquet"))
        with store.open_input(name) as f:
            return pq.read_metadata(f).num_rows
    with ThreadPoolExecutor(D.IO_THREADS) as pool:
        counts = list(pool.map(rows, uids))
    cstore.write_parquet_at(cstore.join(units, f"c{c:06d}.parquet"),
                            pa.table({"unit": pa.array(uids, pa.string()), "rows": pa.array(counts, pa.int64())}))
    return {"units": len(uids), "rows": int(sum(counts))}


def scatter_units(run: str, root: str, b: int, units: str, first: int, end: int, P: int, starts) -> dict:
    """A batch's (number, pHash) and (number, sha256) cut into P ranges each."""
    def body():
        t, num = _batch(run, unit_ids(units, first, end), first)
        ph = t.column("phash").combine_chunks().cast(pa.uint64())
        ok = ph.is_valid().to_numpy(zero_copy_only=False)
        h = ph.fill_null(0).to_numpy()[ok]
        _write_parts(root, f"sc/b{b}-ph.parquet", pa.table({"num": num[ok], "phash": h}), part_of(h, P), P)
        sha = as_string_chunks(t.column("sha256")).combine_chunks()
        ok = sha.is_valid().to_numpy(zero_copy_only=False)
        s = sha.filter(pa.array(ok))
        _write_parts(root, f"sc/b{b}-sh.parquet", pa.table({"num": num[ok], "sha256": s}), sha_part(s, P), P)
        return {"rows": t.num_rows, "phashes": int(len(h))}
    return _once(root, f"scatter-b{b}", body)


def sha_range(root: str, j: int, B: int, P: int) -> dict:
    """Range j of the sha256 digests: each sample linked to the first (smallest number) of its digest."""
    def body():
        t = _read(root, [f"sc/b{b}-sh.parquet" for b in range(B)], j)
        t = t.sort_by([("sha256", "ascending"), ("num", "ascending")])
        num, n = _col(t, "num"), t.num_rows
        new = np.ones(n, bool)
        if n > 1:
            s = t.column("sha256")
            new[1:] = ~pc.equal(s.slice(1), s.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        first = num[np.flatnonzero(new)][np.cumsum(new) - 1]
        _edges(root, f"sha{j}", first[~new], num[~new], P)
        return {"samples": n, "edges": int((~new).sum())}
    return _once(root, f"sha-{j}", body)


def phash_range(root: str, j: int, B: int, P: int, m: int, tops: list[int], rbits: int) -> dict:
    """Range j of the pHashes: same-pHash samples linked to the smallest number (the representative);
    the distinct (pHash, representative) cut by each first block into the near search's ranges."""
    def body():
        t = _read(root, [f"sc/b{b}-ph.parquet" for b in range(B)], j)
        num, h = _col(t, "num"), _col(t, "phash")
        order = np.lexsort((num, h))
        num, h = num[order], h[order]
        new = np.ones(len(h), bool)
        new[1:] = h[1:] != h[:-1]
        rep = num[np.flatnonzero(new)][np.cumsum(new) - 1]
        _edges(root, f"ph{j}", rep[~new], num[~new], P)
        dh, dr = h[new], num[new]
        for ti, top in enumerate(tops):
            _write_parts(root, f"nr/t{ti}-from{j}.parquet", pa.table({"h": dh, "rep": dr}),
                         range_of(dh, m, top, rbits), 1 << rbits)
        return {"samples": len(h), "distinct": int(new.sum())}
    return _once(root, f"phash-{j}", body)


def near_range(root: str, t: int, r: int, P_in: int, m: int, k: int, rbits: int, ti: int, bucket_cap: int,
               P: int) -> dict:
    """Table t over near range r: its pairs of hashes as edges between their representatives."""
    def body():
        x = _read(root, [f"nr/t{ti}-from{j}.parquet" for j in range(P_in)], r)
        h, rep = _col(x, "h"), _col(x, "rep")
        del x
        order = np.argsort(h)
        h, rep = h[order], rep[order]
        lay = Layout(m, k, t)
        p = lay.sorted_values(h)
        a, b, st = sorted_table_pairs(p, lay, k, bucket_cap)
        del p
        _edges(root, f"nr{t:03d}-{r:04d}", rep[np.searchsorted(h, a)], rep[np.searchsorted(h, b)], P)
        return {**st, "range": r}
    return _once(root, f"near-t{t:03d}-r{r:04d}", body)


def _groups(key: np.ndarray, val: np.ndarray):
    """Distinct (key, value) records sorted; (key, value, group number, first-of-its-key mask)."""
    order = np.lexsort((val, key))
    key, val = key[order], val[order]
    keep = np.ones(len(key), bool)
    keep[1:] = (key[1:] != key[:-1]) | (val[1:] != val[:-1])
    key, val = key[keep], val[keep]
    head = np.ones(len(key), bool)
    head[1:] = key[1:] != key[:-1]
    return key, val, np.cumsum(head) - 1, head


def cc_round(root: str, i: int, op: str, j: int, srcs: list[str], P: int) -> dict:
    """Round i on partition j: a large-star or small-star reduce (pipeline/dedup_components._cc_step, on int64
    (key, value) records) and the map to round i + 1's partitions."""
    def body():
        x = _read(root, [f"cc/r{i - 1:03d}/{s}.parquet" for s in srcs], j)
        key, val, group, head = _groups(_col(x, "key"), _col(x, "val"))
        del x
        first = val[head][group]
        if op == "large":
            m = np.minimum(key, first)
            up = val > key
            ok, ov = val[up], m[up]
            st = {"edges": len(ok), "changes": int((ov != key[up]).sum())}
        else:
            other = val != first
            xs = np.concatenate([val[other], key[head]])
            ms = np.concatenate([first[other], val[head]])
            ok, ov = np.concatenate([xs, ms]), np.concatenate([ms, xs])
            st = {"edges": len(xs), "changes": int(other.sum())}
        _write_parts(root, f"cc/r{i:03d}/p{j}.parquet", pa.table({"key": ok, "val": ov}), part_of(ok, P), P)
        return st
    return _once(root, f"r{i:03d}-p{j}", body)


def cc_labels(root: str, last: int, j: int, P: int, starts: list[int]) -> dict:
    """Partition j of the final stars: (number, component = its smallest number) per vertex, by batch."""
    def body():
        x = _read(root, [f"cc/r{last:03d}/p{s}.parquet" for s in range(P)], j)
        key, val, group, head = _groups(_col(x, "key"), _col(x, "val"))
        k, comp = key[head], np.minimum(key[head], val[head])
        _write_parts(root, f"lab/p{j}.parquet", pa.table({"num": k, "comp": comp}), _batch_of(k, starts),
                     len(starts))
        return {"labelled": len(k)}
    return _once(root, f"labels-p{j}", body)


def attach(run: str, root: str, b: int, units: str, first: int, end: int, P: int, starts, B: int) -> dict:
    """A batch's labelled samples with what canonical selection needs, shuffled by component."""
    def body():
        lab = _read(root, [f"lab/p{j}.parquet" for j in range(P)], b)
        ln, lc = _col(lab, "num"), _col(lab, "comp")
        t, num = _batch(run, unit_ids(units, first, end), first)
        order = np.argsort(ln)
        ln, lc = ln[order], lc[order]
        pos = np.minimum(np.searchsorted(ln, num), max(len(ln) - 1, 0))
        hit = np.flatnonzero(ln[pos] == num) if len(ln) else np.zeros(0, np.int64)
        sel = pa.array(hit)
        g = pa.table({"comp": lc[pos[hit]], "num": num[hit], "area": D.pixel_area(t)[hit],
                      "sid": as_string_chunks(t.column("sample_id")).take(sel),
                      "sha": as_string_chunks(t.column("sha256")).take(sel)})
        _write_parts(root, f"grp/b{b}.parquet", g, part_of(g.column("comp").to_numpy(), P), P)
        return {"labelled": len(hit)}
    return _once(root, f"attach-b{b}", body)


def group(root: str, q: int, B: int, starts: list[int]) -> dict:
    """Partition q of the components: each member's place in its canonical order (largest area,
    then smallest sample_id), so dup_of, dup_kind, dup_cluster_size and dup_rank; back by batch."""
    def body():
        t = _read(root, [f"grp/b{b}.parquet" for b in range(B)], q)
        t = t.sort_by([("comp", "ascending"), ("area", "descending"), ("sid", "ascending")])
        comp, n = _col(t, "comp"), t.num_rows
        head = np.ones(n, bool)
        head[1:] = comp[1:] != comp[:-1]
        start = np.flatnonzero(head)
        grp = np.cumsum(head) - 1
        size = np.diff(np.r_[start, n])[grp].astype(np.int32)
        canon = start[grp]
        rank = (np.arange(n) - canon).astype(np.int32)
        dup = rank > 0
        sid, sha = t.column("sid"), t.column("sha")
        dup_of = sid.take(pa.array(np.where(dup, canon, 0))).combine_chunks() if n else pa.array([], pa.string())
        dup_of = pc.if_else(pa.array(dup), dup_of, pa.scalar(None, pa.string()))
        same = pc.equal(sha, sha.take(pa.array(canon))).fill_null(False) if n else pa.array([], pa.bool_())
        kind = pc.if_else(pa.array(dup), pc.if_else(same, "exact", "near"), pa.scalar(None, pa.string()))
        out = pa.table({"num": _col(t, "num"), "dup_of": dup_of, "dup_kind": kind, "size": size, "rank": rank})
        _write_parts(root, f"ver/q{q}.parquet", out, _batch_of(out.column("num").to_numpy(), starts), B)
        return {"members": n, "clusters": len(start)}
    return _once(root, f"group-q{q}", body)


def write_units(run: str, root: str, b: int, units: str, first: int, end: int, P: int, on: bool) -> dict:
    """A batch's verdict files, one per unit (VERDICTS: its alive rows in order); a sample without a
    verdict row is alone in its cluster (size 1, rank 0). on=False: dedup off, all verdicts null."""
    def body():
        uids = unit_ids(units, first, end)
        if on:
            v = _read(root, [f"ver/q{q}.parquet" for q in range(P)], b)
            v = v.take(pc.sort_indices(v, sort_keys=[("num", "ascending")]))
            vn = _col(v, "num")
        counts = {"duplicates": 0, "exact_duplicates": 0, "near_duplicates": 0}

        def one(i):
            u = uids[i]
            t = D.read_measured(cstore.join(run, "work", "measure", f"{u}.parquet"))
            n = t.num_rows
            sid = as_string_chunks(t.column("sample_id"))
            if not on:
                nul = pa.nulls(n, pa.string())
                out = _verdicts(sid, nul, nul, pa.nulls(n, pa.int32()), pa.nulls(n, pa.int32()))
            else:
                num = (np.int64(first + i) << np.int64(32)) | np.arange(n, dtype=np.int64)
                pos = np.minimum(np.searchsorted(vn, num), max(len(vn) - 1, 0))
                hit = (vn[pos] == num) if len(vn) else np.zeros(n, bool)
                take = pa.array(pos, mask=~hit)
                size = np.where(hit, _col(v, "size")[pos] if len(vn) else 1, 1).astype(np.int32)
                rank = np.where(hit, _col(v, "rank")[pos] if len(vn) else 0, 0).astype(np.int32)
                out = _verdicts(sid, v.column("dup_of").take(take), v.column("dup_kind").take(take),
                                pa.array(size), pa.array(rank))
            cstore.write_parquet_at(cstore.join(D.dedup_dir(run), f"{u}.parquet"), out)
            k = out.column("dup_kind")
            return (n - out.column("dup_of").null_count, int(pc.sum(pc.equal(k, "exact")).as_py() or 0),
                    int(pc.sum(pc.equal(k, "near")).as_py() or 0))
        with ThreadPoolExecutor(D.IO_THREADS) as pool:
            for d, e, nn in pool.map(one, range(len(uids))):
                counts["duplicates"] += d
                counts["exact_duplicates"] += e
                counts["near_duplicates"] += nn
        return counts
    return _once(root, f"write-b{b}", body)


def _verdicts(sample_id, dup_of, dup_kind, size, rank) -> pa.Table:
    """VERDICTS columns (dup_rank where the schema has it)."""
    cols = {"sample_id": sample_id.cast(pa.string()), "dup_of": dup_of, "dup_kind": dup_kind,
            "dup_cluster_size": size, "dup_rank": rank}
    return pa.table({f.name: cols[f.name] for f in VERDICTS}).cast(VERDICTS)
