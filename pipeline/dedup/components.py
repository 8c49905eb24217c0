"""Clusters of pipeline/dedup/clusters.py: links between samples and their connected components.

Exact links (same sha256, same pHash) and the near pairs go through one numpy union-find in this
process (`components`); when the near pairs would not fit it, `ray_components` first reduces them
on Ray to one link per distinct hash (large-star / small-star rounds). Method and memory: the
docstring of pipeline/dedup/clusters.py, step 3.
"""
from __future__ import annotations

import logging
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import catalog.storage as cstore

from pipeline.dedup.tables import MAX_DISTANCE, near_pairs

log = logging.getLogger("humanset.dedup")


# --------------------------------------------------------------------------------------------
# Samples -> components (pure: arrays in, arrays out)

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
