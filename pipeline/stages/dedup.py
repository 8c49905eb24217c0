"""dedup: per sample, a 64-bit pHash (of the decode stage's thumbnail); across the run, clusters
by sha256 and pHash distance.

The per-sample part runs here; the clustering runs once over the whole run (pipeline/dedup.py)
and fills dup_of / dup_kind / dup_cluster_size.
"""
from __future__ import annotations

import imagehash
import numpy as np
import pyarrow as pa
from PIL import Image

from ..images import THUMB
from .base import Stage


def phash64(image: Image.Image) -> int:
    """imagehash.phash (DCT of a 32x32 grey image, 8x8 low frequencies) as an unsigned int."""
    bits = imagehash.phash(image).hash.flatten()
    return int(np.packbits(bits.astype(np.uint8)).view(">u8")[0])



class DedupStage(Stage):
    name = "dedup"
    phase = "measure"
    reads = ("_thumb", "decode_error")
    writes = ("phash",)
    default_batch_size = 64

    def measure(self, batch):
        """From the grey thumbnail the decode stage left (no second decode of the image)."""
        out = []
        for thumb, err in zip(batch["_thumb"], batch["decode_error"]):
            if err or thumb is None:
                out.append(None)
                continue
            out.append(phash64(Image.frombytes("L", (THUMB, THUMB), thumb)))
        return {"phash": out}

    def reject(self, table: pa.Table):
        kinds = table.column("dup_kind").to_pylist()
        return [f"{k}_duplicate" if k else None for k in kinds]
