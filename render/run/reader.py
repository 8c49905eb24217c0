"""A finished render run read for export (render/export.py, render/export_coco.py): `RunReader.open` is the
one place a path of OUT is opened (OUT may be a URI, s3://bucket/runs/synth: read through
catalog.storage, each shard as one buffered stream); shards are streamed member by member with
catalog.iter_tar, one frame in memory at a time.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Iterator

import numpy as np

import catalog
from catalog.storage import is_uri, storage_for

from render.run import output as outfmt

log = logging.getLogger("render.export")  # the name export's warnings have always had

FRAME_KEY = re.compile(r"^[0-9A-Za-z_-]{1,64}$")  # keys become file names: nothing else is trusted


class ExportError(ValueError):
    """Bad input or a conflicting earlier export; the message names the file and the fix."""


class RunReader:
    """A render run OUT, read shard by shard. `open` is the only function that opens a file of OUT."""

    def __init__(self, out):
        self.out = str(out)
        self.store = storage_for(self.out) if is_uri(self.out) else None  # s3://... through catalog.storage

    def open(self, rel: str, stream: bool = False):
        if self.store is None:
            return open(os.path.join(self.out, rel), "rb")
        if stream:  # a whole shard read front to back: buffered 8 MiB GETs, not one request per header
            try:  # S3: one streamed GET, resumed where a fault cuts it
                return self.store.open_stream(rel, buffer_size=8 << 20)
            except FileNotFoundError:
                raise FileNotFoundError(f"{self.store.uri_of(rel)}: no such file") from None
        return self.store.open_input(rel)

    def shards(self) -> list[str]:
        """Whole shards ('shards/render-NNNNN.tar'): a tar with its Parquet index (catalog's rule)."""
        if self.store is not None:
            return [f"shards/{n}" for n in catalog.list_shard_names(self.store.uri_of("shards"))]
        return [f"shards/{p.name}" for p in catalog.list_shards(Path(self.out) / "shards")]

    def manifest(self) -> dict:
        """OUT/render.json, or {} for a folder of render shards without one (e.g. generated test frames)."""
        try:
            with self.open("render.json") as fh:
                return json.load(fh)
        except FileNotFoundError:
            return {}

    def keys(self, shard: str) -> list[str]:
        """The frames a shard holds, from its index (the tar is not read)."""
        import pyarrow.parquet as pq
        with self.open(shard[:-len(".tar")] + ".parquet") as fh:
            return pq.read_table(fh, columns=["key"]).column("key").to_pylist()

    def frames(self, shard: str) -> Iterator[catalog.TarRecord]:
        with self.open(shard, stream=True) as fh:
            yield from catalog.iter_tar(fh, name=f"{self.out}/{shard}")


def run_fingerprint(manifest: dict) -> str | None:
    """Which render run an export came from (seed, sources, config), so a rerun never mixes two runs."""
    if not manifest:
        return None
    same = {k: manifest.get(k) for k in ("seed", "scans", "hdris", "config")}
    return hashlib.blake2b(json.dumps(same, sort_keys=True).encode(), digest_size=8).hexdigest()


def frame_arrays(rec: catalog.TarRecord, need=("rgb.png", "mask.png", "json")) -> tuple[dict, np.ndarray] | str:
    """(sidecar json, mask) of a record, or the reason it is skipped ('missing ...', 'empty_mask')."""
    missing = [m for m in need if m not in rec.files]
    if rec.error or missing:
        return rec.error or f"missing members {missing}"
    meta = json.loads(rec.files["json"])
    mask = outfmt.load_png(rec.files["mask.png"])
    if mask.ndim != 2 or not (mask > 0).any():
        return "empty_mask"  # Sapiens' loaders take the person's box from the mask and fail on an empty one
    return meta, mask


def frame_records(reader: RunReader, done, progress: bool, what: str) -> Iterator[tuple[str, catalog.TarRecord]]:
    """(shard, record) for every frame not yet `done(key)`, with a progress bar over all frames.
    A shard whose frames are all done is not opened."""
    from tqdm import tqdm
    shards = reader.shards()
    if not shards:
        raise ExportError(f"{reader.out}/shards: no render shards (render-NNNNN.tar with its .parquet index); "
                          f"pass a render run (humanset render --output OUT) after at least one shard finished")
    keys = {s: reader.keys(s) for s in shards}
    total = sum(len(k) for k in keys.values())
    finished = sum(done(k) for ks in keys.values() for k in ks if FRAME_KEY.match(k))
    bar = tqdm(total=total, initial=finished, desc=what, unit="frame",
               disable=not (progress and sys.stderr.isatty()))
    with bar:
        for shard in shards:
            if all(FRAME_KEY.match(k) and done(k) for k in keys[shard]):
                continue
            for rec in reader.frames(shard):
                if not FRAME_KEY.match(rec.key):
                    log.warning("%s/%s: member key %r is not a frame key; skipped", reader.out, shard, rec.key)
                    continue
                if done(rec.key):
                    continue
                yield shard, rec
                bar.update(1)
