"""A synthetic curation catalog for the `humanset stats` / `query` / `report` / `select` benchmarks
(bench/stats.py, bench/stats_parts.py).

Rows conform to catalog.SAMPLES, with realistic columns: crawl-like sizes and formats, ~1.5% decode
errors, duplicate clusters, 0..N person boxes per image and a cascade of stage decisions (later stages
leave rows they never saw null). person_keypoints stay null to keep the files small (stats never read
them). `chunk` makes rows start..start+n; `generate` writes a whole run's catalog and manifest.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import catalog  # noqa: E402

STAGES = ["decode", "size", "dedup", "person", "text", "watermark", "art"]
CONFIG = {"stages": STAGES, "size": {"min_short_side": 300, "max_aspect": 3.0}, "dedup": {"max_distance": 4},
          "person": {"min_score": 0.9, "min_box_px": 300, "box_rule": "longer_side"},
          "text": {"max_area_frac": 0.05}, "watermark": {"max_score": 0.8}, "art": {"max_score": 0.5}}
ROWS_PER_SHARD = 1000
DECODE_ERRORS = ["truncated: image file is truncated", "unidentified: cannot identify image file",
                 "bomb: image has more than 178956970 pixels", "empty: the file has 0 bytes"]
HEX = np.array([f"{i:02x}".encode() for i in range(256)], dtype="S2")


def _hex(rng, n: int, nbytes: int) -> pa.Array:
    raw = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    return pa.array(HEX[raw].view(f"S{2 * nbytes}").ravel()).cast(pa.string())


def _strings(values: list[str], idx: np.ndarray) -> pa.Array:
    return pc.take(pa.array(values), pa.array(idx))


def _null_where(arr: pa.Array, mask: np.ndarray) -> pa.Array:
    return pc.if_else(pa.array(mask), pa.scalar(None, arr.type), arr)


def _list(offsets: np.ndarray, values: pa.Array, null: np.ndarray | None = None) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values,
                                    mask=pa.array(null) if null is not None else None)


def chunk(rng: np.random.Generator, start: int, n: int) -> pa.Table:
    """Rows start..start+n of the synthetic catalog."""
    row = np.arange(start, start + n)
    shard_no = row // ROWS_PER_SHARD
    shard = pc.binary_join_element_wise("crawl-", pc.utf8_lpad(pa.array(shard_no).cast(pa.string()), 6, "0"),
                                        ".tar", "")
    key = pc.utf8_lpad(pa.array(row % ROWS_PER_SHARD).cast(pa.string()), 9, "0")
    uri = pc.binary_join_element_wise("s3://crawl/", shard, "#", key, ".jpg", "")
    sample_id = _hex(rng, n, 12)

    # decode: sizes like a web crawl (log-normal around 800 px), a few failures
    bad = rng.random(n) < 0.015
    long_side = np.clip(rng.lognormal(np.log(900), 0.5, n), 32, 12000)
    aspect = np.clip(rng.lognormal(np.log(1.4), 0.25, n), 1.0, 6.0)
    landscape = rng.random(n) < 0.6
    short = np.maximum(1, long_side / aspect)
    width = np.where(landscape, long_side, short).astype(np.int32)
    height = np.where(landscape, short, long_side).astype(np.int32)
    short_side = np.minimum(width, height)
    aspect = (np.maximum(width, height) / short_side).astype(np.float32)
    fmt = rng.choice(4, n, p=[0.85, 0.08, 0.05, 0.02])

    # dedup sees what decode and size passed; ~4% of those point at a canonical row of the same chunk
    size_fail = ~bad & ((short_side < 300) | (aspect > 3.0))
    is_dup = (rng.random(n) < 0.04) & ~bad & ~size_fail
    canon = rng.integers(0, n, n)
    # a duplicate's canonical is a row dedup saw and kept, never itself a duplicate
    canon = np.where(is_dup[canon] | bad[canon] | size_fail[canon], np.arange(n), canon)
    is_dup &= canon != np.arange(n)
    cluster = 1 + np.bincount(canon[is_dup], minlength=n)
    cluster_size = np.where(is_dup, cluster[canon], cluster).astype(np.int32)

    # person: 0..N boxes, scores from a detector-like mixture, box sides relative to the image
    n_persons = np.where(rng.random(n) < 0.35, 0, rng.geometric(0.45, n)).astype(np.int32)
    n_persons = np.minimum(n_persons, 40)
    total = int(n_persons.sum())
    offsets = np.concatenate([[0], np.cumsum(n_persons)])
    owner = np.repeat(np.arange(n), n_persons)
    scores = np.where(rng.random(total) < 0.6, rng.beta(12, 1, total), rng.beta(2, 3, total)).astype(np.float32)
    bh = (rng.beta(2, 2, total) * height[owner]).astype(np.float32)
    bw = (bh * rng.uniform(0.3, 0.7, total)).astype(np.float32)
    x1 = (rng.random(total) * np.maximum(1, width[owner] - bw)).astype(np.float32)
    y1 = (rng.random(total) * np.maximum(1, height[owner] - bh)).astype(np.float32)
    boxes = np.stack([x1, y1, x1 + bw, y1 + bh], axis=1).ravel()
    longer = np.maximum(bw, bh)
    passes = (scores >= 0.9) & (longer >= 300)
    n_pass = np.bincount(owner, weights=passes, minlength=n).astype(np.int32)
    score_max = _segment_max(scores, offsets, n)
    box_max = _segment_max(longer, offsets, n)
    any_pass_score = np.bincount(owner, weights=scores >= 0.9, minlength=n) > 0

    text = rng.beta(0.6, 20, n).astype(np.float32)
    watermark = np.where(rng.random(n) < 0.03, rng.beta(8, 2, n), rng.beta(0.5, 6, n)).astype(np.float32)
    art = rng.beta(0.7, 6, n).astype(np.float32)

    # the cascade: the first failing stage rejects; stages after it never see the row
    fails = np.stack([bad, size_fail, is_dup, n_pass == 0,
                      text > 0.05, watermark > 0.8, art > 0.5], axis=1)
    first = np.where(fails.any(axis=1), fails.argmax(axis=1), len(STAGES))
    keep = first == len(STAGES)
    seen = lambda stage: first >= STAGES.index(stage)  # noqa: E731

    reasons = ["decode:" + e.split(":")[0] for e in DECODE_ERRORS] + [
        "size:short_side<300", "size:aspect>3.0", "dedup:exact_duplicate", "dedup:near_duplicate",
        "person:no_person", "person:score<0.9", "person:box<300px", "text:area_frac>0.05",
        "watermark:score>0.8", "art:score>0.5"]
    derr = rng.choice(len(DECODE_ERRORS), n, p=[0.55, 0.35, 0.05, 0.05])
    dup_exact = rng.random(n) < 0.6
    person_why = np.where(n_persons == 0, 8, np.where(~any_pass_score, 9, 10))
    why = np.select([first == 0, first == 1, first == 2, first == 3, first == 4, first == 5, first == 6],
                    [derr, np.where(short_side < 300, 4, 5), np.where(dup_exact, 6, 7), person_why,
                     11, 12, 13], -1)
    reason = pc.if_else(pa.array(keep), pa.scalar(None, pa.string()), _strings(reasons, np.maximum(why, 0)))
    reason_off = np.concatenate([[0], np.cumsum(~keep)])
    stage_len = np.minimum(first + 1, len(STAGES))
    stage_off = np.concatenate([[0], np.cumsum(stage_len)])
    stage_idx = np.arange(stage_off[-1]) - np.repeat(stage_off[:-1], stage_len)

    person_seen = seen("person")
    boxes_arr = pa.FixedSizeListArray.from_arrays(pa.array(boxes), 4)
    t = {
        "sample_id": sample_id, "source_uri": uri, "shard": shard, "key": key,
        "file_bytes": pa.array((width.astype(np.int64) * height * rng.uniform(0.15, 0.5, n)).astype(np.int64)),
        "sha256": _hex(rng, n, 32),
        "format": _null_where(_strings(["JPEG", "PNG", "WEBP", "GIF"], fmt), bad),
        "mode": _null_where(_strings(["RGB"], np.zeros(n, np.int64)), bad),
        "width": pa.array(width, mask=bad), "height": pa.array(height, mask=bad),
        "exif_orientation": pa.array(np.ones(n, np.int16), mask=bad),
        "n_frames": pa.array(np.ones(n, np.int32), mask=bad),
        "decode_error": _null_where(_strings(DECODE_ERRORS, derr), ~bad),
        "short_side": pa.array(short_side, mask=bad), "aspect": pa.array(aspect, mask=bad),
        "phash": pa.array(rng.integers(0, 2**63, n, dtype=np.uint64), mask=~seen("dedup")),
        "dup_of": pc.if_else(pa.array(is_dup), pc.take(sample_id, pa.array(canon)), pa.scalar(None, pa.string())),
        "dup_kind": _null_where(_strings(["exact", "near"], np.where(dup_exact, 0, 1)), ~is_dup),
        "dup_cluster_size": pa.array(cluster_size, mask=~seen("dedup")),
        "person_boxes": _list(offsets, boxes_arr, ~person_seen),
        "person_scores": _list(offsets, pa.array(scores), ~person_seen),
        "n_persons": pa.array(n_persons, mask=~person_seen),
        "person_score_max": pa.array(score_max, mask=~person_seen | (n_persons == 0)),
        "person_box_max_px": pa.array(box_max, mask=~person_seen | (n_persons == 0)),
        "person_n_pass": pa.array(n_pass, mask=~person_seen),
        "text_area_frac": pa.array(text, mask=~seen("text")),
        "text_n_boxes": pa.array((text > 0.01).astype(np.int32) * 3, mask=~seen("text")),
        "watermark_score": pa.array(watermark, mask=~seen("watermark")),
        "art_score": pa.array(art, mask=~seen("art")),
        "art_label": _null_where(_strings(["photo", "painting"], (art > 0.5).astype(np.int64)), ~seen("art")),
        "keep": pa.array(keep),
        "reject_reason": reason,
        "reject_reasons": _list(reason_off, pc.drop_null(reason)),
        "scored_stages": _list(stage_off, _strings(STAGES, stage_idx)),
    }
    return catalog.conform(pa.table(t), catalog.SAMPLES)


def _segment_max(values: np.ndarray, offsets: np.ndarray, n: int) -> np.ndarray:
    """Max of each row's list (rows without items get -inf; they are masked anyway)."""
    out = np.full(n, -np.inf, np.float32)
    nonempty = offsets[1:] > offsets[:-1]
    if values.size:
        out[nonempty] = np.maximum.reduceat(values, offsets[:-1][nonempty])
    return out


def generate(run: Path, rows: int, chunk_rows: int, seed: int) -> float:
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    folder = run / "catalog" / "samples"
    for i, start in enumerate(range(0, rows, chunk_rows)):
        n = min(chunk_rows, rows - start)
        catalog.write_parquet(folder / f"part-{i:05d}.parquet", chunk(rng, start, n))
        print(f"generated {start + n:,}/{rows:,} rows", file=sys.stderr, flush=True)
    catalog.write_json(run / "manifest.json", {
        "config": CONFIG, "stages": STAGES, "skipped_stages": {}, "funnel": [], "inputs": ["s3://crawl/"],
        "started": None, "finished": None, "versions": {"bench": "synthetic"}, "bench_rows": rows})
    return time.perf_counter() - t0
