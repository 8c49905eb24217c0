"""A small synthetic curation run with real image bytes, for the stats / report / query tests.

Photos from scikit-image are encoded to JPEG and written to an input tar (plus two loose files in a
folder), catalog rows conforming to catalog.SAMPLES record decisions consistent with the manifest's
thresholds, and kept samples go to curated shards through catalog.ShardWriter.
"""
from __future__ import annotations

import hashlib
import io
import random
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

import catalog

PHOTOS = ["astronaut", "coffee", "chelsea", "rocket", "camera", "hubble_deep_field", "retina"]

CONFIG = {
    "stages": ["decode", "size", "dedup", "person", "text", "watermark", "art"],
    "size": {"min_short_side": 300, "max_aspect": 3.0},
    "dedup": {"max_distance": 4, "exact": True},
    "person": {"min_score": 0.9, "min_box_px": 300, "box_rule": "longer_side"},
    "text": {"max_area_frac": 0.05},
    "watermark": {"max_score": 0.8},
    "art": {"max_score": 0.5, "weights": None},
}
STAGES = ["decode", "size", "dedup", "person", "text", "watermark"]


def _photo(name: str) -> Image.Image:
    import skimage.data

    return Image.fromarray(np.asarray(getattr(skimage.data, name)())).convert("RGB")


def _jpeg(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=80)
    return buf.getvalue()


def _fit(img: Image.Image, short: int) -> Image.Image:
    s = short / min(img.size)
    return img.resize((max(1, round(img.width * s)), max(1, round(img.height * s))))


def _boxes(rng: random.Random, w: int, h: int, n: int, side: float, score: float):
    boxes, scores = [], []
    for _ in range(n):
        bw, bh = min(w - 1, side * 0.6), min(h - 1, side)
        x1, y1 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
        boxes.append([x1, y1, x1 + bw, y1 + bh])
        scores.append(score - rng.uniform(0, 0.02))
    return boxes, scores


# the fate of sample i: (reject_reason or None, persons passing when kept)
FATES = [
    (None, 1), ("size:short_side<300", 0), (None, 2), ("person:no_person", 0), ("decode:truncated", 0),
    (None, 3), ("dedup:exact_duplicate", 0), ("person:score<0.9", 0), (None, 1), ("text:area_frac>0.05", 0),
    (None, 5), ("decode:unidentified", 0), (None, 4), ("watermark:score>0.8", 0), (None, 7),
    ("person:box<300px", 0),
]


def make_run(root, n: int = 48, seed: int = 0, person_score: str | None = None) -> tuple[Path, list[dict]]:
    """Write RUN = root/'run' and return (RUN, the catalog rows). `person_score` (calibrated | raw) sets
    the config's person.score and stores person_score_calibrated (the highest raw score scaled down
    below a 310 px box, so a small person's calibrated score fails where its raw one passes); None
    writes a run from before person.score existed."""
    rng = random.Random(seed)
    run = Path(root) / "run"
    inputs = Path(root) / "inputs"
    (inputs / "loose").mkdir(parents=True, exist_ok=True)
    photos = {name: _photo(name) for name in PHOTOS}
    rows, data_of = [], {}
    tar_path = inputs / "crawl-00000.tar"
    with tarfile.open(tar_path, "w") as tar:
        for i in range(n):
            reason, n_pass = FATES[i % len(FATES)]
            stage = reason.split(":")[0] if reason else None
            img = photos[PHOTOS[i % len(PHOTOS)]]
            img = _fit(img, 200 if stage == "size" else rng.choice([320, 400, 480]))
            data = _jpeg(img)
            if reason == "decode:truncated":
                data = data[: len(data) // 3]
            elif reason == "decode:unidentified":
                data = b"<html>not an image</html>"
            elif stage == "dedup":
                data = data_of[rows[-1]["sample_id"]] if rows and rows[-1]["decode_error"] is None else data
            key = f"{i:06d}"
            loose = i % 11 == 10  # a few samples come from a plain folder instead of the tar
            if loose:
                path = inputs / "loose" / f"{key}.jpg"
                path.write_bytes(data)
                uri, shard = str(path), "loose-00000"
            else:
                info = tarfile.TarInfo(f"{key}.jpg")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                uri, shard = f"{tar_path}#{key}.jpg", "crawl-00000.tar"
            sid = hashlib.blake2b(uri.encode(), digest_size=12).hexdigest()
            data_of[sid] = data
            row = {"sample_id": sid, "source_uri": uri, "shard": shard, "key": key,
                   "file_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                   "dup_cluster_size": 1, "keep": reason is None, "reject_reason": reason,
                   "reject_reasons": [reason] if reason else [], "scored_stages": ["decode"]}
            if stage == "decode":
                row["decode_error"] = ("truncated: image file is truncated (12 bytes not processed)"
                                       if reason.endswith("truncated") else
                                       "unidentified: cannot identify image file")
                rows.append(row)
                continue
            w, h = img.size
            row.update(format="JPEG", mode="RGB", width=w, height=h, exif_orientation=1, n_frames=1,
                       short_side=min(w, h), aspect=max(w, h) / min(w, h),
                       phash=rng.getrandbits(63), decode_error=None)
            row["scored_stages"] = STAGES[:STAGES.index(stage) + 1] if stage else list(STAGES)
            if stage == "dedup":
                prev = rows[-1]
                row.update(dup_of=prev["sample_id"], dup_kind="exact", dup_cluster_size=2)
                prev["dup_cluster_size"] = 2
            if "person" in row["scored_stages"]:
                if reason == "person:no_person":
                    boxes, scores = [], []
                elif reason == "person:score<0.9":
                    boxes, scores = _boxes(rng, w, h, 2, 320, 0.6)
                elif reason == "person:box<300px":
                    boxes, scores = _boxes(rng, w, h, 1, 120, 0.97)
                else:
                    boxes, scores = _boxes(rng, w, h, n_pass, 310, 0.99)
                    extra_b, extra_s = _boxes(rng, w, h, 1, 80, 0.5)  # a weak detection that fails
                    boxes, scores = boxes + extra_b, scores + extra_s
                row.update(person_boxes=boxes, person_scores=scores, n_persons=len(boxes),
                           person_score_max=max(scores, default=None),
                           person_box_max_px=max((max(b[2] - b[0], b[3] - b[1]) for b in boxes), default=None),
                           person_n_pass=n_pass)
                if reason == "person:score<0.9" or (reason is None and n_pass == 1 and i % 2 == 0):
                    # the second look read the top box: it failed the person rule there, passed it here
                    row.update(person_look_box=0, person_look_score=0.1 if reason else 0.6)
                if person_score is not None:
                    row["person_score_calibrated"] = max(
                        (v * min(1.0, max(b[2] - b[0], b[3] - b[1]) / 310) for b, v in zip(boxes, scores)), default=0.0)
            if "text" in row["scored_stages"]:
                row["text_area_frac"] = 0.2 if stage == "text" else rng.uniform(0, 0.04)
                row["text_n_boxes"] = 3 if stage == "text" else 0
            if "watermark" in row["scored_stages"]:
                row["watermark_score"] = 0.95 if stage == "watermark" else rng.uniform(0, 0.5)
            rows.append(row)
    with catalog.ShardWriter(run / "shards", "humanset", catalog.CURATED_INDEX, max_count=10) as w:
        for r in rows:
            if r["keep"]:
                w.add(f"s{r['key']}", {"jpg": data_of[r["sample_id"]], "json": {"sample_id": r["sample_id"]}},
                      {k: r.get(k) for k in ("sample_id", "source_uri", "format", "width", "height", "sha256",
                                              "n_persons")})
    catalog.write_parquet(run / "catalog" / "samples" / "part-00000.parquet", catalog.conform(rows, catalog.SAMPLES))
    catalog.write_json(run / "manifest.json", {
        "config": CONFIG if person_score is None else {**CONFIG, "person": {**CONFIG["person"], "score": person_score}},
        "stages": STAGES, "skipped_stages": {"art": "no OpenCLIP weights configured"},
        "funnel": [], "inputs": [str(tar_path), str(inputs / "loose")],
        "started": "2026-01-01T00:00:00Z", "finished": "2026-01-01T00:01:00Z", "versions": {"humanset": "test"}})
    return run, rows
