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


# decode_error (or the reader's read_error) message prefix -> reason kind. Reasons are fixed words:
# a message can quote a file or member name from the data, which must never reach a reason, a
# plot label or a SQL string. The full message stays in decode_error.
ERROR_KINDS = (
    ("empty file", "empty_file"),
    ("decompression bomb", "decompression_bomb"),
    ("not an image", "not_an_image"),
    ("unreadable header", "unreadable_header"),
    ("truncated or corrupt pixel data", "truncated_or_corrupt_pixel_data"),
    ("no bytes", "no_bytes"),
    ("cannot read file", "cannot_read_file"),
    ("no image member", "no_image_member"),
    ("member ", "unsafe_member"),
    ("input tar truncated", "input_tar_truncated"),
)
OTHER_KIND = "other_error"


def _kind(error: str) -> str:
    """The fixed reason kind of a decode or read error message."""
    return next((kind for prefix, kind in ERROR_KINDS if error.startswith(prefix)), OTHER_KIND)
