"""Expected candidates per hash per table: real photo pHashes against uniform 64-bit hashes.

Real: random crops (35-100% of each side) of the photos shipped in scikit-image and ultralytics,
rescaled 0.5-2x, half of them mirrored, hashed as the pipeline does (grey, LANCZOS to 32x32,
pipeline.stages.dedup.phash64_thumbs, which is imagehash.phash bit for bit: checked here on a
sample). Identical pHashes are collapsed first, as run_dedup does. For each table of a layout
(m blocks, k = 4) the candidates are the pairs of distinct hashes with equal keys; per hash per table
that is (n - 1) / 2 x the key collision probability, so the measured probability carries to any n.
Cross-source candidates (two crops of different photos) are what unrelated images of a crawl cost;
same-source ones are crops of one photo, i.e. real near-copies.

Against: uniform hashes and "balanced" ones (the DC bit fixed, exactly 32 ones among the other 63,
the median rule's shape) at the same n and layouts. Also the per-task rates of one table task
(table_pairs on uniform hashes, fresh process: seconds, peak RSS above its start), from which
docs/dedup.md projects 1e9 hashes on 64 nodes x 32 cores x 256 GB. Prints one JSON object.

    python research/dedup/candidates.py --n 200000 --rate-n 4000000 16000000
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.dedup.tables import Layout, choose_blocks, tables  # noqa: E402

PHOTOS = {"skimage": ("data", ["astronaut.png", "camera.png", "coffee.png", "chelsea.png", "rocket.jpg",
                               "motorcycle_left.png", "motorcycle_right.png", "hubble_deep_field.jpg",
                               "retina.jpg", "coins.png", "moon.png", "page.png", "brick.png", "grass.png",
                               "gravel.png", "ihc.png"]),
          "ultralytics": ("assets", ["bus.jpg", "zidane.jpg"])}
SOURCE_SIDE = 256  # photos are reduced to this many px a side first (the decode stage drafts to >= 256)
K = 4


def shipped_photos() -> dict[str, Path]:
    out = {}
    for pkg, (sub, names) in PHOTOS.items():
        spec = importlib.util.find_spec(pkg)  # located without importing (ultralytics patches PIL)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(list(spec.submodule_search_locations)[0]) / sub
        out.update({n: root / n for n in names if (root / n).is_file()})
    return out


def photo_hashes(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, float]:
    """(pHashes, source photo index, share equal to imagehash.phash on a 300-image check)."""
    from PIL import Image

    from pipeline.stages.dedup import phash64, phash64_thumbs
    photos = shipped_photos()
    if len(photos) < 8:
        raise SystemExit(f"only {len(photos)} shipped photos found: install scikit-image and ultralytics")
    srcs = []
    for p in photos.values():
        im = Image.open(p).convert("L")
        im.thumbnail((SOURCE_SIDE, SOURCE_SIDE), Image.Resampling.LANCZOS)
        srcs.append(im)
    rng = np.random.default_rng(seed)
    which = rng.integers(0, len(srcs), n)
    thumbs, checks = [], []
    for i, s in enumerate(which):
        im = srcs[s]
        w, h = im.size
        cw, ch = (np.array([w, h]) * rng.uniform(0.35, 1.0, 2)).astype(int).clip(8)
        x, y = rng.integers(0, w - cw + 1), rng.integers(0, h - ch + 1)
        c = im.crop((int(x), int(y), int(x + cw), int(y + ch)))
        f = rng.uniform(0.5, 2.0)
        c = c.resize((max(8, int(cw * f)), max(8, int(ch * f))), Image.Resampling.BILINEAR)
        if rng.random() < 0.5:
            c = c.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        if i < 300:
            checks.append(phash64(c))
        thumbs.append(c.resize((32, 32), Image.Resampling.LANCZOS).tobytes())
    hashes = np.array(phash64_thumbs(thumbs), dtype=np.uint64)
    agree = float(np.mean(hashes[:len(checks)] == np.array(checks, dtype=np.uint64)))
    return hashes, which, agree


def balanced(n: int, rng) -> np.ndarray:
    """DC bit (the top bit) set, exactly 32 ones among the other 63 bits, uniformly placed."""
    out = np.full(n, np.uint64(1) << np.uint64(63), dtype=np.uint64)
    for a in range(0, n, 1 << 16):
        b = min(n, a + (1 << 16))
        ones = np.argsort(rng.random((b - a, 63)), axis=1)[:, :32].astype(np.uint64)
        out[a:b] |= np.bitwise_or.reduce(np.uint64(1) << ones, axis=1)
    return out


def collisions(h: np.ndarray, m: int, src: np.ndarray | None = None) -> list[dict]:
    """Per table of (m, K): candidate pairs (equal keys) among distinct h; cross-source if src given."""
    out = []
    for t in range(len(tables(m, K))):
        lay = Layout(m, K, t)
        key = lay.permute(h) >> np.uint64(lay.key_shift)
        _, c = np.unique(key, return_counts=True)
        row = {"t": t, "key_bits": lay.key_bits, "candidates": int((c * (c - 1) // 2).sum())}
        if src is not None:
            _, cs = np.unique(key * np.uint64(64) + src.astype(np.uint64), return_counts=True)
            row["cross_source"] = row["candidates"] - int((cs * (cs - 1) // 2).sum())
        out.append(row)
    return out


def summary(h: np.ndarray, m: int, src=None) -> dict:
    n = len(h)
    rows = collisions(h, m, src)
    pairs = n * (n - 1) / 2
    out = {"m": m, "tables": len(rows), "key_bits": sorted({r["key_bits"] for r in rows}),
           "candidates": sum(r["candidates"] for r in rows)}
    out["per_hash_per_table"] = out["candidates"] / n / len(rows)
    out["collision_prob_per_table"] = out["candidates"] / pairs / len(rows)
    out["uniform_formula_per_hash_per_table"] = float(np.mean([(n - 1) / 2 / 2.0 ** r["key_bits"] for r in rows]))
    if src is not None:
        cross = sum(r["cross_source"] for r in rows)
        out["cross_source_candidates"] = cross
        out["cross_source_per_hash_per_table"] = cross / n / len(rows)
        out["cross_source_collision_prob_per_table"] = cross / pairs / len(rows)
    return out


def _vm_hwm_mb() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss it is not inherited across exec)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _table_task(n: int, m: int, seed: int) -> dict:
    """One (table, range) task on n uniform distinct hashes, as pipeline.dedup.ranges runs it."""

    from pipeline.dedup.ranges import range_table
    h = np.unique(np.random.default_rng(seed).integers(0, 2**64, n, dtype=np.uint64, endpoint=False))
    base = _vm_hwm_mb()
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        st = range_table(K, m, 0, 0, 0, 20_000, d, "bench", h)
    peak = _vm_hwm_mb()
    return {"n": len(h), "m": m, "seconds": st["seconds"], "ns_per_hash": round(st["seconds"] / len(h) * 1e9, 1),
            "candidates": int(st["candidates"]), "peak_traced_mb": st["peak_traced_mb"],
            "traced_bytes_per_hash": round(st["peak_traced_mb"] * 2**20 / len(h), 1),
            "rss_above_input_mb": round(peak - base, 1), "rss_peak_mb": round(peak, 1)}


def table_rates(sizes: list[int]) -> list[dict]:
    ctx = mp.get_context("spawn")  # a fresh process per task
    out = []
    for n in sizes:
        for m in (7, 6):
            with ctx.Pool(1) as pool:
                out.append(pool.apply(_table_task, (n, m, 1)))
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200_000, help="photo crops to hash (default 200000)")
    ap.add_argument("--rate-n", type=int, nargs="*", default=[4_000_000, 16_000_000],
                    help="uniform hashes for the one-task rates (none: skip)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    h, src, agree = photo_hashes(args.n, args.seed)
    hash_s = time.perf_counter() - t0
    uniq, first = np.unique(h, return_index=True)
    src_u = src[first]
    n = len(uniq)
    rng = np.random.default_rng(args.seed + 1)
    uni = np.unique(rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False))
    bal = np.unique(balanced(n, rng))
    bits = ((uniq[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)).astype(np.float32)
    ones = bits.sum(axis=1)
    res = {"photos": len(shipped_photos()), "hashes": args.n, "distinct": n, "hash_seconds": round(hash_s, 1),
           "equal_to_imagehash": agree, "popcount_mean": float(ones.mean()),
           "popcount_share_32": float(np.mean(ones == 32)),
           "dc_bit_ones_share": float(bits[:, 63].mean()),
           "bit_ones_share_min_max": [float(bits[:, :63].mean(0).min()), float(bits[:, :63].mean(0).max())],
           "layouts": {}}
    for m in sorted({choose_blocks(n, K), 6, 7, 8}):
        real = summary(uniq, m, src_u)
        u, b = summary(uni, m), summary(bal, m)
        res["layouts"][f"m{m}"] = {
            "photo": real, "uniform": u, "balanced": b,
            "photo_over_uniform": real["candidates"] / max(1, u["candidates"]),
            "photo_cross_source_over_uniform": real["cross_source_candidates"] / max(1, u["candidates"]),
            "balanced_over_uniform": b["candidates"] / max(1, u["candidates"])}
    if args.rate_n:
        res["table_task"] = table_rates(args.rate_n)
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
