"""decode: facts from the bytes - format, size after EXIF orientation, mode, sha256, decode error."""
from __future__ import annotations

import hashlib

import pyarrow as pa

from ..imageio import ImageError, probe
from .base import Stage


class DecodeStage(Stage):
    name = "decode"
    phase = "measure"
    reads = ("image", "read_error")
    writes = ("file_bytes", "sha256", "format", "mode", "width", "height", "exif_orientation",
              "n_frames", "decode_error", "_thumb")
    default_batch_size = 64

    def measure(self, batch):
        max_pixels = self.cfg.get("max_pixels")
        out = {c: [] for c in self.writes}
        for data, read_error in zip(batch["image"], batch["read_error"]):
            info, error = {}, read_error
            if data is not None:
                out_sha, out_len = hashlib.sha256(data).hexdigest(), len(data)
                try:
                    info = probe(data, max_pixels=max_pixels)
                except ImageError as e:
                    error = str(e)
            else:
                out_sha, out_len = None, None
            out["file_bytes"].append(out_len)
            out["sha256"].append(out_sha)
            for c in ("format", "mode", "width", "height", "exif_orientation", "n_frames"):
                out[c].append(info.get(c))
            out["_thumb"].append(info.get("thumb"))
            out["decode_error"].append(error or (None if data is not None else "no bytes"))
        return out

    def reject(self, table: pa.Table):
        return [_kind(e) if e else None for e in table.column("decode_error").to_pylist()]


def _kind(error: str) -> str:
    """Short reason for the funnel; the full message stays in decode_error."""
    return error.split(":", 1)[0].split("(")[0].strip().replace(" ", "_")
