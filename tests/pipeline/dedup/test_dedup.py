"""Dedup clustering: permuted block tables against brute force, against the band join it
replaced, and run_dedup's per-table files (resume) and Ray tasks."""
import json
import os

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.dedup import clusters as dedup, components as dedup_components, tables as dedup_tables
from pipeline.dedup.tables import Layout, blocks, choose_blocks, expected_candidates, first_table, near_pairs, tables
from pipeline.dedup.clusters import cluster, cluster_stats, run_dedup


def _hashes(seed: int, n_centres=60, copies=600, skewed=900, fixed_bits=10):
    """Uniform centres, noisy copies (0-7 flipped bits: pairs in and out of k=4) and skewed hashes
    (flips among a few fixed bits around 3 centres: buckets far larger than the rest)."""
    rng = np.random.default_rng(seed)
    centres = rng.integers(0, 2**64, n_centres, dtype=np.uint64, endpoint=False).tolist()
    out = list(centres)
    for _ in range(copies):
        h = centres[rng.integers(0, n_centres)]
        for b in rng.choice(64, rng.integers(0, 8), replace=False):
            h ^= 1 << int(b)
        out.append(h)
    fixed = rng.choice(64, fixed_bits, replace=False)
    hot = rng.integers(0, 2**64, 3, dtype=np.uint64, endpoint=False).tolist()
    for _ in range(skewed):
        h = hot[rng.integers(0, 3)]
        for b in rng.choice(fixed, rng.integers(0, 6), replace=False):
            h ^= 1 << int(b)
        out.append(h)
    return out


def _brute_pairs(distinct: np.ndarray, k: int) -> set:
    out = set()
    for i in range(len(distinct) - 1):
        j = np.flatnonzero(np.bitwise_count(distinct[i] ^ distinct[i + 1:]) <= k) + i + 1
        out.update((int(distinct[i]), int(x)) for x in distinct[j])
    return {(min(a, b), max(a, b)) for a, b in out}


def _brute_force(phashes, k):
    n = len(phashes)
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x
    for i in range(n):
        for j in range(i + 1, n):
            if bin(phashes[i] ^ phashes[j]).count("1") <= k:
                parent[find(j)] = find(i)
    return [find(i) for i in range(n)]


# ---- tables ---------------------------------------------------------------------------------

def test_blocks_cover_all_bits():
    for m in range(1, 21):
        b = blocks(m)
        assert len(b) == m and sum(w for _, w in b) == 64
        assert b[-1][0] == 0 and all(s1 == s2 + w2 for (s1, _), (s2, w2) in zip(b, b[1:]))
    with pytest.raises(ValueError):
        blocks(0)


@pytest.mark.parametrize("m,k", [(5, 4), (6, 4), (7, 4), (8, 4), (4, 3), (9, 2)])
def test_layout_permutes_bits_and_keeps_distance(m, k):
    rng = np.random.default_rng(m * 10 + k)
    x = rng.integers(0, 2**64, 1000, dtype=np.uint64, endpoint=False)
    y = x ^ (np.uint64(1) << rng.integers(0, 64, 1000).astype(np.uint64))
    for t in range(len(tables(m, k))):
        lay = Layout(m, k, t)
        px, py = lay.permute(x), lay.permute(y)
        assert (lay.unpermute(px) == x).all()
        assert (np.bitwise_count(px ^ py) == np.bitwise_count(x ^ y)).all()
        # the key (top bits) is exactly the kept blocks
        kept_mask = sum(((1 << w) - 1) << s for b, (s, w) in enumerate(blocks(m)) if b in tables(m, k)[t])
        assert lay.key_bits == bin(kept_mask).count("1")
        same_key = (px >> np.uint64(lay.key_shift)) == (py >> np.uint64(lay.key_shift))
        assert (same_key == (((x ^ y) & np.uint64(kept_mask)) == 0)).all()


def test_first_table_is_the_first_whose_blocks_all_agree():
    for m, k in [(6, 4), (7, 3), (5, 1)]:
        first, tabs = first_table(m, k), tables(m, k)
        for mask in range(1 << m):
            want = next((t for t, kept in enumerate(tabs) if all(mask >> b & 1 for b in kept)), -1)
            assert first[mask] == want


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("m", [5, 6, 7, 8])
def test_near_pairs_equal_brute_force_each_pair_once(seed, m):
    distinct = np.unique(np.array(_hashes(seed), np.uint64))
    truth = _brute_pairs(distinct, 4)
    a, b, st = near_pairs(distinct, 4, m)
    got = list(zip(a.tolist(), b.tolist()))
    assert len(got) == len(set(got)), "a pair was emitted by two tables"
    assert set(got) == truth
    assert st["near_pairs"] == len(truth) and st["tables"] == len(tables(m, 4))


@pytest.mark.parametrize("window", [2, 16])
def test_blocked_scan_of_hot_buckets_equals_brute_force(monkeypatch, window):
    monkeypatch.setattr(dedup_tables, "WINDOW", window)
    monkeypatch.setattr(dedup_tables, "_SCAN_CELLS", 1000)  # several blocks per bucket
    distinct = np.unique(np.array(_hashes(3), np.uint64))
    a, b, st = near_pairs(distinct, 4, 6)
    assert st["hot_buckets_scanned"] > 0 and st["hot_buckets_skipped"] == 0
    got = list(zip(a.tolist(), b.tolist()))
    assert len(got) == len(set(got)) and set(got) == _brute_pairs(distinct, 4)


@pytest.mark.parametrize("exact_sizes", [2, 5])
def test_padded_bucket_classes_equal_brute_force(monkeypatch, exact_sizes):
    monkeypatch.setattr(dedup_tables, "_EXACT_SIZES", exact_sizes)  # most buckets padded to a power of two
    monkeypatch.setattr(dedup_tables, "_SCAN_CELLS", 64)  # several row steps per class
    distinct = np.unique(np.array(_hashes(6), np.uint64))
    a, b, st = near_pairs(distinct, 4, 6)
    got = list(zip(a.tolist(), b.tolist()))
    assert len(got) == len(set(got)) and set(got) == _brute_pairs(distinct, 4)
    monkeypatch.setattr(dedup_tables, "_EXACT_SIZES", 1000)
    assert near_pairs(distinct, 4, 6)[2]["candidate_pairs"] == st["candidate_pairs"]  # padding is not counted


def test_sorted_values_from_a_base_table_equal_a_full_sort():
    h = np.random.default_rng(1).integers(0, 2**64, 20_000, dtype=np.uint64, endpoint=False)
    for m, k in [(6, 4), (7, 4), (3, 1)]:
        base = None
        for t in range(len(tables(m, k))):
            lay = Layout(m, k, t)
            p = lay.sorted_values(h, base)
            assert np.array_equal(p, np.sort(lay.permute(h))), (m, k, t)
            if base is None or base[0].top_block != lay.top_block:
                base = (lay, p)


@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_other_distances_equal_brute_force(k):
    distinct = np.unique(np.array(_hashes(9, copies=300, skewed=300), np.uint64))
    a, b, st = near_pairs(distinct, k)  # blocks chosen from n
    got = list(zip(a.tolist(), b.tolist()))
    assert len(got) == len(set(got)) and set(got) == _brute_pairs(distinct, k)
    assert st["blocks"] > k


def test_scan_in_small_steps_equals_brute_force(monkeypatch):
    monkeypatch.setattr(dedup_tables, "_STEP", 7)  # steps end inside buckets
    distinct = np.unique(np.array(_hashes(5), np.uint64))
    a, b, _ = near_pairs(distinct, 4, 5)
    got = list(zip(a.tolist(), b.tolist()))
    assert len(got) == len(set(got)) and set(got) == _brute_pairs(distinct, 4)


def test_buckets_over_the_cap_are_skipped_and_counted():
    distinct = np.unique(np.array(_hashes(4), np.uint64))
    truth = _brute_pairs(distinct, 4)
    a, b, st = near_pairs(distinct, 4, 6, bucket_cap=40)
    got = set(zip(a.tolist(), b.tolist()))
    assert st["hot_buckets_skipped"] > 0 and st["hot_hashes_skipped"] > 40 * st["hot_buckets_skipped"]
    assert got < truth  # never a wrong pair; the missing ones are counted above
    t, stats = cluster_stats(_table(distinct.tolist()), 4, bucket_cap=40)
    assert stats["hot_buckets_skipped"] > 0 and stats["hot_hashes_skipped"] > 0  # reported by cluster too


def test_candidate_count_matches_the_model_on_uniform_hashes():
    distinct = np.unique(np.random.default_rng(5).integers(0, 2**64, 200_000, dtype=np.uint64, endpoint=False))
    for m in (5, 6):
        _, _, st = near_pairs(distinct, 4, m)
        exp = expected_candidates(len(distinct), m, 4)
        assert abs(st["candidate_pairs"] - exp) < 0.05 * exp + 100, (m, st["candidate_pairs"], exp)


def test_choose_blocks_grows_with_n():
    ms = [choose_blocks(n, 4) for n in (10**3, 10**6, 10**8, 10**10)]
    assert ms == sorted(ms) and ms[0] >= 5 and ms[-1] > ms[0]
    assert choose_blocks(10**6, 0) == 1


# ---- samples -> clusters --------------------------------------------------------------------

def _table(hashes, sha=None, area=None):
    n = len(hashes)
    return pa.table({"sample_id": [f"{i:05d}" for i in range(n)],
                     "sha256": sha if sha is not None else [str(i) for i in range(n)],
                     "phash": pa.array(hashes, pa.uint64()),
                     "width": area if area is not None else [10] * n, "height": [10] * n})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_near_duplicate_clusters_equal_brute_force(seed):
    rng = np.random.default_rng(seed)
    centres = rng.integers(0, 2**63, 30, dtype=np.uint64).tolist()
    hashes = []
    for _ in range(300):  # noisy copies: 0-8 flipped bits, so some pairs are in and some out of k=4
        h = centres[rng.integers(0, len(centres))]
        for b in rng.choice(64, rng.integers(0, 9), replace=False):
            h ^= 1 << int(b)
        hashes.append(h)
    hashes += _hashes(seed, n_centres=5, copies=20, skewed=200, fixed_bits=8)  # a hot bucket
    n = len(hashes)
    got = cluster(_table(hashes), max_distance=4).to_pylist()
    truth = _brute_force(hashes, 4)
    # same partition: i and j share a canonical iff brute force puts them together
    canon = np.array([r["dup_of"] or r["sample_id"] for r in got])
    truth = np.array(truth)
    for i in range(n):
        assert ((canon == canon[i]) == (truth == truth[i])).all()


def test_canonical_is_largest_then_smallest_id_and_kinds():
    t = pa.table({"sample_id": ["c", "a", "b", "d"], "sha256": ["x", "x", "y", "z"],
                  "phash": pa.array([5, 5, 7, 0xFFFFFFFF00000000], pa.uint64()),
                  "width": [100, 100, 200, 50], "height": [100, 100, 200, 50]})
    got = {r["sample_id"]: r for r in cluster(t, max_distance=4).to_pylist()}
    assert got["b"]["dup_of"] is None and got["b"]["dup_cluster_size"] == 3  # largest resolution
    assert got["a"]["dup_of"] == "b" and got["a"]["dup_kind"] == "near"
    assert got["c"]["dup_of"] == "b" and got["c"]["dup_kind"] == "near"
    assert got["d"]["dup_of"] is None and got["d"]["dup_cluster_size"] == 1
    # dup_rank: the canonical order (largest area, then smallest id); 0 for the canonical and a unique one
    assert [got[s]["dup_rank"] for s in "bacd"] == [0, 1, 2, 0]


def test_exact_duplicates_without_phash():
    t = pa.table({"sample_id": ["a", "b"], "sha256": ["x", "x"], "phash": pa.array([None, None], pa.uint64()),
                  "width": [1, 1], "height": [1, 1]})
    got = cluster(t).to_pylist()
    assert got[1]["dup_of"] == "a" and got[1]["dup_kind"] == "exact"


def test_sha256_links_hex_other_strings_and_key_collisions(monkeypatch):
    def links(values):
        a, b = dedup_components._sha_links(pa.array(values, pa.string()))
        return {tuple(sorted(p)) for p in zip(a.tolist(), b.tolist())}
    digest = [f"{i:064x}" for i in range(3)]  # hex that differs only in its last bits
    assert links([digest[0], digest[1], digest[0], None, digest[2], digest[1]]) == {(0, 2), (1, 5)}
    assert links(["x", "ABAB", "x", None]) == {(0, 2)}  # not lower-case hex: numbered by Arrow
    # two different digests on one key: caught by comparing the strings
    monkeypatch.setattr(dedup_components, "sha_key", lambda arr: (np.zeros(len(arr), np.uint64),
                                                                 arr.is_valid().to_numpy(zero_copy_only=False), False))
    assert links([digest[0], digest[1], digest[0], digest[1]]) == {(0, 2), (1, 3)}


def _band_join_cluster(samples: pa.Table, max_distance: int = 4, exact: bool = True) -> pa.Table:
    """The implementation this one replaced (k+1 pigeonhole bands joined in DuckDB), as reference."""
    def bands(k, bits=64):
        n = k + 1
        widths = [bits // n + (1 if i < bits % n else 0) for i in range(n)]
        out, shift = [], bits
        for w in widths:
            shift -= w
            out.append((shift, w))
        return out
    con = duckdb.connect()
    con.register("s0", samples)
    con.execute("CREATE TEMP TABLE s AS SELECT row_number() OVER (ORDER BY sample_id) - 1 AS i, "
                "sample_id, sha256, phash, coalesce(width, 0)::BIGINT * coalesce(height, 0) AS area FROM s0")
    n = con.execute("SELECT count(*) FROM s").fetchall()[0][0]
    edges = []
    if exact:
        edges.append("SELECT min(i) OVER (PARTITION BY sha256) AS a, i AS b FROM s WHERE sha256 IS NOT NULL")
    if max_distance is not None and max_distance >= 0:
        edges.append("SELECT min(i) OVER (PARTITION BY phash) AS a, i AS b FROM s WHERE phash IS NOT NULL")
        if max_distance > 0:
            con.execute("CREATE TEMP TABLE h AS SELECT phash, min(i) AS i FROM s "
                        "WHERE phash IS NOT NULL GROUP BY phash")
            for shift, width in bands(max_distance):
                band = f"((phash >> {shift}) & {(1 << width) - 1}::UBIGINT)"
                edges.append(
                    f"SELECT x.i AS a, y.i AS b FROM (SELECT i, phash, {band} AS band FROM h) x "
                    f"JOIN (SELECT i, phash, {band} AS band FROM h) y "
                    f"ON x.band = y.band AND x.phash < y.phash "
                    f"WHERE bit_count(xor(x.phash, y.phash)) <= {int(max_distance)}")
    e = con.execute(" UNION ".join(f"({q})" for q in edges)).fetchnumpy()
    root = dedup_components._union_find(n, e["a"].astype(np.int64), e["b"].astype(np.int64))
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


def _realistic(n: int, seed: int) -> pa.Table:
    """n samples: uniform hashes, 5% near-copies (0-4 bits), 1% skewed, 1% byte copies (same
    sha256), 0.5% without a pHash; areas with ties so the sample_id tie-break matters."""
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False)
    near = rng.choice(n, n // 20, replace=False)
    src = rng.integers(0, n, len(near))
    h[near] = h[src]
    for _ in range(4):
        on = near[rng.random(len(near)) < 0.6]
        h[on] ^= np.uint64(1) << rng.integers(0, 64, len(on)).astype(np.uint64)
    skew = rng.choice(n, n // 100, replace=False)
    fixed = rng.choice(64, 12, replace=False).astype(np.uint64)
    h[skew] = rng.integers(0, 2**64, 4, dtype=np.uint64, endpoint=False)[rng.integers(0, 4, len(skew))]
    for _ in range(4):
        on = skew[rng.random(len(skew)) < 0.5]
        h[on] ^= np.uint64(1) << fixed[rng.integers(0, 12, len(on))]
    sha = np.array([f"{x:064x}" for x in rng.integers(0, 2**63, n)])
    copy = rng.choice(n, n // 100, replace=False)
    orig = rng.integers(0, n, len(copy))
    sha[copy], h[copy] = sha[orig], h[orig]
    ph = pa.array(h, mask=rng.random(n) < 0.005)
    side = rng.integers(1, 4, n) * 100
    return pa.table({"sample_id": [f"s{x:07d}" for x in rng.permutation(n)], "sha256": sha, "phash": ph,
                     "width": side, "height": side})


@pytest.mark.parametrize("seed", [0, 1])
def test_equals_the_band_join_it_replaced_on_100k(seed):
    t = _realistic(100_000, seed)
    ours, st = cluster_stats(t, 4)
    assert st["near_pairs"] > 1000 and st["hot_buckets_skipped"] == 0
    ref = _band_join_cluster(t, 4)
    assert ours.num_rows == ref.num_rows == t.num_rows
    for col in ("sample_id", "dup_of", "dup_kind", "dup_cluster_size"):
        assert ours.column(col).combine_chunks().equals(ref.column(col).combine_chunks()), col
    for exact, k in [(False, 4), (True, None), (True, 0), (True, 2)]:
        small = t.slice(0, 20_000)
        ref = _band_join_cluster(small, k, exact)
        assert cluster(small, k, exact).select(ref.column_names).equals(ref), (exact, k)


# ---- run level ------------------------------------------------------------------------------

UNITS = ["u0", "u1", "u2"]


@pytest.fixture
def measured_run(tmp_path):
    t = _realistic(6000, 7)
    alive = np.random.default_rng(8).random(t.num_rows) > 0.05
    t = t.append_column("_alive", pa.array(alive))
    for i, u in enumerate(UNITS):
        (tmp_path / "work" / "measure").mkdir(parents=True, exist_ok=True)
        pq.write_table(t.slice(i * 2000, 2000), tmp_path / "work" / "measure" / f"{u}.parquet")
    return tmp_path, t.filter(t.column("_alive")).drop_columns(["_alive"])


def _verdicts(run):
    return pa.concat_tables([dedup.read_verdicts(run, u) for u in UNITS]).sort_by("sample_id")


CFG = {"dedup": {"max_distance": 4, "exact": True, "blocks": 6}}  # 15 tables


def test_run_dedup_writes_unit_verdicts_equal_to_cluster(measured_run):
    run, alive = measured_run
    st = run_dedup(run, UNITS, CFG)
    assert dedup.is_done(run) and json.loads((run / "work/dedup/_done.json").read_text()) == st
    assert st["candidates"] == alive.num_rows and st["duplicates"] > 100
    got = _verdicts(run)
    assert got.equals(cluster(alive, 4).cast(dedup.VERDICT_SCHEMA))
    # each unit's file holds exactly its own alive samples
    for u in UNITS:
        own = pq.read_table(run / "work/measure" / f"{u}.parquet")
        own = own.filter(own.column("_alive")).column("sample_id").to_pylist()
        assert dedup.read_verdicts(run, u).column("sample_id").to_pylist() == own
    assert len(list(dedup.pairs_dir(run).glob("*.parquet"))) == st["tables"]


def test_run_dedup_resumes_per_table(measured_run):
    run, _ = measured_run
    st = run_dedup(run, UNITS, CFG)
    clean = _verdicts(run)
    files = sorted(dedup.pairs_dir(run).glob("*.parquet"))
    lost, stale = files[3], files[5]
    lost.unlink()  # a table that never finished
    meta = json.loads(pq.read_schema(stale).metadata[b"humanset_dedup"])
    pq.write_table(pa.table({"a": pa.array([1], pa.uint64()), "b": pa.array([2], pa.uint64())}).replace_schema_metadata(
        {"humanset_dedup": json.dumps({**meta, "fingerprint": "other-hashes"})}), stale)  # from other inputs
    (run / "work/dedup/_done.json").unlink()
    for u in UNITS:
        (run / "work/dedup" / f"{u}.parquet").unlink()
    before = {f: os.stat(f).st_mtime_ns for f in files if f not in (lost, stale)}
    st2 = run_dedup(run, UNITS, CFG)
    assert lost.exists() and {f: os.stat(f).st_mtime_ns for f in before} == before  # only the two redone
    assert _verdicts(run).equals(clean)
    assert {k: v for k, v in st2.items() if k != "seconds"} == {k: v for k, v in st.items() if k != "seconds"}


def test_run_dedup_disabled_or_empty(measured_run):
    run, alive = measured_run
    st = run_dedup(run, UNITS, {"stages": ["decode", "size"], "dedup": {}})
    got = _verdicts(run)
    assert got.num_rows == alive.num_rows and got.column("dup_of").null_count == got.num_rows
    assert st["duplicates"] == 0


def test_run_dedup_tables_as_ray_tasks(measured_run, ray_local, monkeypatch):
    run, alive = measured_run
    monkeypatch.setattr(dedup, "RAY_MIN_HASHES", 0)
    calls = []
    real = ray_local.put
    monkeypatch.setattr(ray_local, "put", lambda x, **kw: calls.append(len(x)) or real(x, **kw))
    st = run_dedup(run, UNITS, {"dedup": {**CFG["dedup"], "blocks": 5}})  # 5 tasks
    assert st["tables"] == 5 and len(list(dedup.pairs_dir(run).glob("m5-k4-t*.parquet"))) == 5
    assert calls == [st["distinct_hashes"]]  # the hash array went to the object store once
    assert _verdicts(run).equals(cluster(alive, 4).cast(dedup.VERDICT_SCHEMA))


# ---- components on Ray (over dedup.components_memory) ----------------------------------------

def _alternate(a, b, parts):
    """ray_components' rounds with the same step functions, run in this process: (vertex, centre), rounds."""
    outs = [dedup_components._split(np.concatenate([dedup_components._pack(a, b), dedup_components._pack(b, a)]), parts)]
    op, rounds, large = "large", 0, None
    while True:
        outs = [dedup_components._cc_step(op, parts, *[o[j] for o in outs]) for j in range(parts)]
        changes = sum(o[-1]["changes"] for o in outs)
        rounds += 1
        if op == "small" and large == 0 and changes == 0:
            break
        op, large = ("small", changes) if op == "large" else ("large", large)
    got = [dedup_components._cc_labels(*[o[j] for o in outs]) for j in range(parts)]
    return np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got]), rounds


@pytest.mark.parametrize("shape", ["chain", "stars", "random"])
def test_alternating_stars_give_the_union_find_components(shape):
    rng = np.random.default_rng(len(shape))
    n = 5000
    if shape == "chain":  # one path through every vertex in random order: label propagation's worst case
        order = rng.permutation(n)
        a, b = order[:-1], order[1:]
    elif shape == "stars":  # centres with many leaves, the centres chained; some vertices alone
        centre = rng.integers(0, 40, n)
        a, b = np.r_[centre, np.arange(39)], np.r_[np.arange(n), np.arange(1, 40)]
        keep = rng.random(len(a)) < 0.9
        a, b = a[keep], b[keep]
    else:
        a, b = rng.integers(0, n, 3000), rng.integers(0, n, 3000)
    v, c, rounds = _alternate(a.astype(np.int64), b.astype(np.int64), 4)
    assert (c < v).all() and len(np.unique(v)) == len(v)  # one centre per non-centre vertex
    truth = dedup_components._union_find(n, a.astype(np.int64), b.astype(np.int64))
    assert (truth[v] == truth[c]).all()
    got = dedup_components._union_find(n, v, c)  # the star links alone give the same partition
    assert np.array_equal(np.unique(np.c_[got, truth], axis=0)[:, 0], np.unique(got)) and \
        len(np.unique(got)) == len(np.unique(truth))
    assert (got == np.arange(n))[np.isin(np.arange(n), np.r_[a, b], invert=True)].all()
    assert rounds <= 4 * np.log2(n)  # O(log n) rounds, not O(diameter)


def _chains_and_stars(seed: int) -> pa.Table:
    """Long chains (random walks of 1-bit steps: the worst case for label propagation), stars
    (a centre and copies 1-4 bits away), exact copies, byte copies and uniform hashes."""
    rng = np.random.default_rng(seed)
    hashes = []
    for length in (400, 150, 60):  # chain vertices land in random order among the distinct hashes
        h = int(rng.integers(0, 2**63))
        for _ in range(length):
            h ^= 1 << int(rng.integers(0, 64))
            hashes.append(h)
    for _ in range(4):
        c = int(rng.integers(0, 2**63))
        hashes.append(c)
        for _ in range(60):
            h = c
            for b in rng.choice(64, rng.integers(1, 5), replace=False):
                h ^= 1 << int(b)
            hashes.append(h)
    hashes += rng.integers(0, 2**63, 200).tolist()
    hashes += [hashes[i] for i in rng.integers(0, len(hashes), 40)]  # same pHash
    n = len(hashes)
    sha = [f"{x:064x}" for x in rng.integers(0, 2**63, n)]
    for i, j in rng.integers(0, n, (20, 2)):
        sha[i] = sha[j]  # same bytes
    order = rng.permutation(n)
    return pa.table({"sample_id": [f"s{i:05d}" for i in order], "sha256": sha, "phash": pa.array(hashes, pa.uint64()),
                     "width": rng.integers(1, 4, n) * 100, "height": [100] * n,
                     "_alive": pa.array(np.ones(n, bool))})


def test_components_on_ray_equal_union_find_and_brute_force(tmp_path, ray_local, monkeypatch):
    t = _chains_and_stars(11)
    (tmp_path / "a/work/measure").mkdir(parents=True)
    for i, u in enumerate(UNITS):
        pq.write_table(t.slice(i * 500, 500), tmp_path / "a/work/measure" / f"{u}.parquet")
    import shutil
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    cfg = {"dedup": {"max_distance": 4, "blocks": 5}}  # 5 pair files
    st_driver = run_dedup(tmp_path / "a", UNITS, cfg)
    assert st_driver["components"] == "driver"

    monkeypatch.setattr(dedup, "MAX_PARTS", 3)
    real_read = dedup.pq.read_table
    monkeypatch.setattr(dedup.pq, "read_table", lambda p, *a, **kw: (
        pytest.fail(f"the driver read a pair file: {p}") if "pairs" in str(p) else real_read(p, *a, **kw)))
    st = run_dedup(tmp_path / "b", UNITS, {"dedup": {**cfg["dedup"], "components_memory": 1}})
    assert st["components"] == "ray" and st["component_partitions"] == 3
    assert st["component_rounds"] >= 4  # chains take several rounds
    assert st["near_pairs"] == st_driver["near_pairs"] > 1000
    for u in UNITS:  # the verdict files are the union-find path's
        assert dedup.read_verdicts(tmp_path / "b", u).equals(dedup.read_verdicts(tmp_path / "a", u))

    got = pa.concat_tables([dedup.read_verdicts(tmp_path / "b", u) for u in UNITS])
    canon = np.array([r["dup_of"] or r["sample_id"] for r in got.to_pylist()])
    h = t.column("phash").to_pylist()
    truth = np.array(_brute_force(h, 4))
    sha = t.column("sha256").to_pylist()
    first = {}
    for i, s in enumerate(sha):  # brute force knows no sha256: link byte copies by hand
        first.setdefault(s, i)
    for i, s in enumerate(sha):
        a, b = truth[first[s]], truth[i]
        if a != b:
            truth[truth == b] = a
    for i in range(len(h)):
        assert ((canon == canon[i]) == (truth == truth[i])).all()
    assert (got.column("dup_cluster_size").to_numpy() >= 400).sum() >= 400  # the long chain is one cluster
