import numpy as np
import pyarrow as pa
import pytest

from pipeline.dedup import bands, cluster


def test_bands_cover_all_bits():
    for k in range(0, 9):
        b = bands(k)
        assert len(b) == k + 1 and sum(w for _, w in b) == 64
        assert sorted(s for s, _ in b)[0] == 0


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
    n = len(hashes)
    t = pa.table({"sample_id": [f"{i:04d}" for i in range(n)], "sha256": [str(i) for i in range(n)],
                  "phash": pa.array(hashes, pa.uint64()), "width": [10] * n, "height": [10] * n})
    got = cluster(t, max_distance=4).to_pylist()
    truth = _brute_force(hashes, 4)
    # same partition: i and j share a canonical iff brute force puts them together
    canon = [r["dup_of"] or r["sample_id"] for r in got]
    for i in range(n):
        for j in range(i + 1, n):
            assert (canon[i] == canon[j]) == (truth[i] == truth[j])


def test_canonical_is_largest_then_smallest_id_and_kinds():
    t = pa.table({"sample_id": ["c", "a", "b", "d"], "sha256": ["x", "x", "y", "z"],
                  "phash": pa.array([5, 5, 7, 0xFFFFFFFF00000000], pa.uint64()),
                  "width": [100, 100, 200, 50], "height": [100, 100, 200, 50]})
    got = {r["sample_id"]: r for r in cluster(t, max_distance=4).to_pylist()}
    assert got["b"]["dup_of"] is None and got["b"]["dup_cluster_size"] == 3  # largest resolution
    assert got["a"]["dup_of"] == "b" and got["a"]["dup_kind"] == "near"
    assert got["c"]["dup_of"] == "b" and got["c"]["dup_kind"] == "near"
    assert got["d"]["dup_of"] is None and got["d"]["dup_cluster_size"] == 1


def test_exact_duplicates_without_phash():
    t = pa.table({"sample_id": ["a", "b"], "sha256": ["x", "x"], "phash": pa.array([None, None], pa.uint64()),
                  "width": [1, 1], "height": [1, 1]})
    got = cluster(t).to_pylist()
    assert got[1]["dup_of"] == "a" and got[1]["dup_kind"] == "exact"
