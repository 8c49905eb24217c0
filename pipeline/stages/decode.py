"""decode: facts from the bytes - format, size after EXIF orientation, mode, sha256, decode error.

Every failure to read or decode one sample is that sample's `decode_error`, whose message starts
with one of a fixed set of kinds (REASON_KINDS); the kind alone is the reject reason, the detail
(file names, the decoder's words) stays in decode_error.
"""
from __future__ import annotations

import hashlib

import pyarrow as pa

from pipeline.inputs.images import ImageError, probe
from pipeline.settings import DEFAULTS
from pipeline.stages.base import Stage

# kind -> what it means. Input: the source never had bytes for this sample (reported under the
# 'input' reason prefix, first in the funnel); reading: the sample's bytes could not be had;
# decoding: they are no image.
REASON_KINDS = {
    "download_failed": "the downloader (img2dataset's index beside the shard) records no bytes for this URL",
    "cannot_read_file": "the file could not be opened or read",
    "symlink_outside_input": "a symlink in an input folder points outside it (not followed)",
    "too_large": "file or tar member over input.max_file_bytes (never read into memory)",
    "unsafe_member_name": "a tar member whose path escapes the shard (absolute or '..')",
    "truncated_tar": "the input tar ends or is corrupt inside this sample",
    "missing_member": "a key the shard's Parquet index lists as stored that its tar does not hold",
    "bad_member_header": "a tar member after a pax or GNU long-name header that is malformed or over the cap",
    "unsupported_member": "a tar member of a type read as no sample (a sparse file)",
    "bad_manifest_row": "a manifest value that is null, not a string, empty or over 8192 characters",
    "no_image_member": "a tar key with sidecars but no image member",
    "no_bytes": "no bytes were read for this sample",
    "source_changed": "the bytes read to write the shard differ from the measured ones (sha256)",
    "worker_crash": "the worker processing this sample died (segfault, OOM) every time it was tried",
    "empty_file": "0 bytes",
    "not_an_image": "bytes no decoder recognises",
    "decompression_bomb": "declares more pixels than decode.max_pixels",
    "unreadable_header": "a recognised format whose header the decoder rejects",
    "truncated_or_corrupt_pixel_data": "the header reads but the pixel data does not decode",
    "decoder_error": "any other exception raised by a decoder",
}


INPUT_KINDS = ("download_failed",)  # reasons of the 'input' prefix (pipeline/decide.py)

# unit-level errors ("KIND: detail", pipeline/inputs/reading.py UnitReader.error): kind -> what it means.
# The unit's whole samples before the damage are curated; its stats marker records the error.
UNIT_ERROR_KINDS = {
    "cannot_open_shard": "the shard could not be opened (missing, permission, object store)",
    "not_a_tar": "the file is no tar: its first header is not one (random bytes, compressed, empty)",
    "truncated_tar": "the tar ends early: inside a header, a member or before its end-of-archive marker",
    "corrupt_tar": "a header after the first (checksum, size field) or the bytes after the archive's end are no tar",
    "bad_index": "the Parquet index beside the tar cannot be read or is neither humanset's nor img2dataset's",
    "index_mismatch": "the Parquet index beside the tar and the tar disagree on the keys they hold",
    "unreadable_manifest": "the manifest could not be read past some row; the rows after it are not in the run",
    "reader_error": "any other failure while reading the unit (a bug: please report it)",
}


def unit_error_kind(error: str) -> str:
    """The fixed kind of a unit-level error string ('KIND: detail')."""
    head = error.split(":", 1)[0].strip()
    return head if head in UNIT_ERROR_KINDS else "reader_error"


def error_kind(error: str) -> str:
    """The fixed kind of a read or decode error message ('kind words: detail')."""
    head = error.split(":", 1)[0].split("(")[0].strip().replace(" ", "_")
    return head if head in REASON_KINDS else "decoder_error"


def decode_one(data: bytes, max_pixels: int | None) -> tuple[dict, str | None]:
    """(probe facts, None) or ({}, error message); never raises for any bytes."""
    try:
        return probe(data, max_pixels=max_pixels), None
    except ImageError as e:
        return {}, str(e)
    except Exception as e:  # a decoder's own bug (IndexError, TypeError, ...) is this sample's reason
        return {}, f"decoder error: {type(e).__name__}: {e}"


class DecodeStage(Stage):
    name = "decode"
    phase = "measure"
    reads = ("image", "read_error")
    writes = ("file_bytes", "sha256", "format", "mode", "width", "height", "exif_orientation",
              "n_frames", "decode_error", "_thumb")
    default_batch_size = DEFAULTS.decode.batch_size

    def measure(self, batch):
        max_pixels = self.cfg.get("max_pixels", DEFAULTS.decode.max_pixels)  # null in the config: no limit
        out = {c: [] for c in self.writes}
        for data, read_error in zip(batch["image"], batch["read_error"]):
            info, error = {}, read_error
            if data is not None:
                out_sha, out_len = hashlib.sha256(data).hexdigest(), len(data)
                info, error = decode_one(data, max_pixels)
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
        """The kind of each decode error (decide reports INPUT_KINDS under the 'input' prefix)."""
        return [_kind(e) if e else None for e in table.column("decode_error").to_pylist()]


def input_reason(error: str | None) -> str | None:
    """The reason kind of a sample the source never had bytes for (INPUT_KINDS), else None."""
    if not error:
        return None
    kind = error_kind(error)
    return kind if kind in INPUT_KINDS else None


def _kind(error: str) -> str:
    """Short reason for the funnel, one of REASON_KINDS; the full message stays in decode_error."""
    return error_kind(error)
