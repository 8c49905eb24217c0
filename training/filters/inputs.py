"""What train-filter reads: clean photos (runs, shards, tars or image files, bounded) and the scene text
the text stage read in a curation run."""
from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from PIL import Image

import catalog

from catalog.tars import IMAGE_EXTS
from training.image_decode import decode_image

log = logging.getLogger(__name__)


def _shrink(img, max_side: int) -> np.ndarray:
    if max(img.size) > max_side:
        f = max_side / max(img.size)
        img = img.resize((max(1, round(img.width * f)), max(1, round(img.height * f))), Image.LANCZOS)
    return np.asarray(img, np.uint8)


def _image_member(members, prefer: str | None) -> tuple[str, int, int] | None:
    members = [(m["name"], m["offset"], m["size"]) if isinstance(m, dict) else tuple(m) for m in members or []]
    if prefer:
        for m in members:
            if m[0].endswith(prefer):
                return m
    for m in members:
        if catalog.split_member(m[0])[1].lower() in IMAGE_EXTS:
            return m
    return None


def read_photos(path, max_images: int, max_side: int, seed: int = 0, prefer: str | None = None,
                what: str = "--images") -> list[np.ndarray]:
    """Up to `max_images` decoded RGB photos (longer side <= max_side) from a curation or render run, a
    folder of indexed shards, a folder of WebDataset tars, or a folder of image files. Shards are visited
    in a seeded order and only `max_images` are kept, so memory does not grow with the crawl."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {path}: no such file or folder; pass a curation run, its shards/ folder, "
                                f"a folder of WebDataset tars, or a folder of images")
    if (path / "shards").is_dir():
        path = path / "shards"
    out: list[np.ndarray] = []
    bad = 0

    def take(data: bytes, where: str) -> bool:
        nonlocal bad
        try:
            out.append(_shrink(decode_image(data), max_side))
        except Exception as e:  # one bad file never stops the run
            bad += 1
            log.warning("%s: skipped, does not decode (%s: %s)", where, type(e).__name__, e)
        return len(out) >= max_images

    rng = np.random.default_rng(seed)
    indexed = catalog.list_shards(path) if path.is_dir() else []
    if indexed:
        for i in rng.permutation(len(indexed)):
            tar = indexed[int(i)]
            index = pq.read_table(tar.with_suffix(".parquet"))
            cols = index.column_names
            rows = index.select([c for c in ("key", "members", "error") if c in cols]).to_pylist()
            for r in rows:
                if r.get("error"):
                    continue
                m = _image_member(r.get("members"), prefer)
                if m and take(catalog.read_member(tar, m[1], m[2]), f"{tar.name} key {r['key']}"):
                    break
            if len(out) >= max_images:
                break
    elif path.is_file() or sorted(path.glob("*.tar")):
        tars = [path] if path.is_file() else sorted(path.glob("*.tar"))
        for i in rng.permutation(len(tars)):
            tar = tars[int(i)]
            try:
                for rec in catalog.iter_tar(tar):
                    exts = [e for e in rec.files if prefer and ("." + e).endswith(prefer)]
                    exts = exts or [e for e in rec.files if e.lower() in IMAGE_EXTS]
                    if exts and take(rec.files[exts[0]], f"{tar.name} key {rec.key}"):
                        break
            except catalog.ShardTruncated as e:
                log.warning("%s", e)
            if len(out) >= max_images:
                break
    else:
        files = sorted(p for p in path.rglob("*") if p.suffix.lower().lstrip(".") in IMAGE_EXTS)
        for i in rng.permutation(len(files)):
            if take(files[int(i)].read_bytes(), str(files[int(i)])):
                break
    if bad:
        log.warning("%s %s: %d image(s) did not decode and were skipped", what, path, bad)
    if not out:
        raise ValueError(f"{what} {path}: no decodable image found (a curation run, shards, tars or image files)")
    return out


WATERMARK_LIKE = re.compile(r"\(c\)|\u00a9|copyright|www\.|https?:|\.(com|net|org)\b|stock|photo", re.IGNORECASE)


def read_scene_text(images, limit: int = 2000) -> list[str]:
    """What the text stage read in a curation run (signs, captions), for the scene-text hard negatives;
    empty when --images is not a run with a catalog. At most `limit` strings, read by DuckDB."""
    run = Path(images)
    if not (run / "catalog").is_dir():
        return []
    try:
        con = catalog.connect(run)
        rows = con.sql("SELECT s FROM (SELECT unnest(text_strings) AS s FROM samples WHERE text_n_boxes > 0) "
                       f"WHERE length(trim(s)) > 1 LIMIT {int(limit)}").fetchall()
    except Exception as e:  # an old catalog without the text columns: the synthetic words do
        log.info("scene text from %s not used (%s)", run, e)
        return []
    # strings that read like a watermark (the text stage also reads those) are no scene-text negatives
    return [str(r[0]).strip() for r in rows if not WATERMARK_LIKE.search(str(r[0]))]


def read_inputs(cfg) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The photos (and, for the art filter, the render frames) a FilterConfig names, shrunk for the generators."""
    side = int(cfg.generator_px * 1.5)
    photos = read_photos(cfg.images, cfg.max_images, side, cfg.seed)
    renders = []
    if cfg.filter == "art" and cfg.renders:
        renders = read_photos(cfg.renders, max(8, cfg.max_images // 5), side, cfg.seed, prefer=".rgb.png",
                              what="--renders")
    return photos, renders
