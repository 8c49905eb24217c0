"""dedup: per sample, a 64-bit pHash (of the decode stage's thumbnail); across the run, clusters
by sha256 and pHash distance.

The per-sample part runs here; the clustering runs once over the whole run (pipeline/dedup/clusters.py)
and fills dup_of / dup_kind / dup_cluster_size.
"""
from __future__ import annotations

import imagehash
import numpy as np
import pyarrow as pa
from PIL import Image

from pipeline.inputs.images import THUMB
from pipeline.stages.base import Stage


def phash64(image: Image.Image) -> int:
    """imagehash.phash (DCT of a 32x32 grey image, 8x8 low frequencies) as an unsigned int."""
    bits = imagehash.phash(image).hash.flatten()
    return int(np.packbits(bits.astype(np.uint8)).view(">u8")[0])



def phash64_thumbs(thumbs: list[bytes]) -> list[int]:
    """phash64 of THUMBxTHUMB grey thumbnails, all at once: imagehash.phash's steps (its resize of
    a THUMB-sided image is a copy) - scipy.fftpack DCT along rows then columns, the 8x8 low
    frequencies above their median - on a stack, without a Python call per image. Bit for bit
    phash64's hash (tests/pipeline/dedup/test_phash.py)."""
    if not thumbs:
        return []
    import scipy.fftpack
    px = np.frombuffer(b"".join(thumbs), np.uint8).reshape(len(thumbs), THUMB, THUMB)
    low = scipy.fftpack.dct(scipy.fftpack.dct(px, axis=1), axis=2)[:, :8, :8].reshape(len(thumbs), 64)
    bits = np.packbits(low > np.median(low, axis=1, keepdims=True), axis=1)
    return [int(h) for h in bits.view(">u8").ravel()]


class DedupStage(Stage):
    name = "dedup"
    phase = "measure"
    reads = ("_thumb", "decode_error")
    writes = ("phash",)
    default_batch_size = 64

    def measure(self, batch):
        """From the grey thumbnail the decode stage left (no second decode of the image)."""
        out = [None] * len(batch["_thumb"])
        todo = [i for i, (thumb, err) in enumerate(zip(batch["_thumb"], batch["decode_error"]))
                if not err and thumb is not None]
        for i, h in zip(todo, phash64_thumbs([batch["_thumb"][i] for i in todo])):
            out[i] = h
        return {"phash": out}

    def reject(self, table: pa.Table):
        kinds = table.column("dup_kind").to_pylist()
        scored = (table.column("dup_scored").to_pylist() if "dup_scored" in table.column_names
                  else [None] * len(kinds))
        # a member the model stages scored (a fallback) carries its own reason, not the duplicate's
        return [f"{k}_duplicate" if k and not s else None for k, s in zip(kinds, scored)]
