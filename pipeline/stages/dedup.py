"""dedup: per sample, a 64-bit pHash; across the run, clusters by sha256 and pHash distance.

The per-sample part runs here; the clustering runs once over the whole run (pipeline/dedup.py)
and fills dup_of / dup_kind / dup_cluster_size.
"""
from __future__ import annotations

import imagehash
import numpy as np
import pyarrow as pa
from PIL import Image

from ..imageio import ImageError, load_rgb
from .base import Stage


def phash64(data: bytes) -> int:
    """imagehash.phash (DCT of a 32x32 grey image, 8x8 low frequencies) as an unsigned int."""
    rgb, _ = load_rgb(data, max_side=256)  # phash looks at 32x32: a draft decode is plenty
    bits = imagehash.phash(Image.fromarray(rgb)).hash.flatten()
    return int(np.packbits(bits.astype(np.uint8)).view(">u8")[0])


class DedupStage(Stage):
    name = "dedup"
    phase = "measure"
    reads = ("image", "decode_error")
    writes = ("phash",)
    default_batch_size = 64

    def measure(self, batch):
        out = []
        for data, err in zip(batch["image"], batch["decode_error"]):
            if err or data is None:
                out.append(None)
                continue
            try:
                out.append(phash64(data))
            except ImageError:
                out.append(None)
        return {"phash": out}

    def reject(self, table: pa.Table):
        kinds = table.column("dup_kind").to_pylist()
        return [f"{k}_duplicate" if k else None for k in kinds]
