"""The samples of one unit, streamed: UnitReader yields rows one at a time and records what went wrong.

A row is the dict the engine turns into its read table (ROW_FIELDS): identity, the source's own
fields (SAMPLE_SOURCE columns, typed), the image bytes, and `read_error` when the sample could not
be had (its message starts with one of decode.REASON_KINDS). Nothing about a unit raises: damage to
the container is the unit's error, "KIND: detail" with KIND in decode.UNIT_ERROR_KINDS, and every
whole sample before the damage is a row. A tar's Parquet index beside it (humanset's, or
img2dataset's with `status`) is read after the tar, a record batch at a time, and never trusted over
the tar: img2dataset's rows that never became a member are rows with reason input:download_failed,
keys the index lists that the tar lacks are rows with reason missing_member.
"""
from __future__ import annotations

import json
import logging
import os
from collections import Counter
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from catalog import SAMPLES, ShardTruncated, iter_tar
from catalog.storage import exists_at, is_uri, open_input
from catalog.storage.answers import STORE_FAULTS

from pipeline.inputs.units import Unit, sample_id
from pipeline.settings import DEFAULTS

log = logging.getLogger(__name__)

# what a reader reads by (the input section's keys; unit_io.limits_of takes them from a run's config)
DEFAULT_LIMITS = {k: getattr(DEFAULTS.input, k) for k in ("max_file_bytes", "max_sidecar_bytes", "extensions")}
READ_BUFFER = 8 << 20  # bytes per GET of a remote shard's or file's sequential read
MAX_TEXT = 8192  # a url or other text field of a sidecar or index longer than this is not a column
MAX_DETAIL = 1000  # characters of a downloader's error message kept in decode_error
# the source's own scalar fields that become typed columns (catalog/schema.py SAMPLE_SOURCE)
SOURCE_FIELDS = {"url": "url", "original_width": "original_width", "original_height": "original_height",
                 "status": "download_status", "sha256": "source_sha256"}
ROW_FIELDS = [SAMPLES.field(c) for c in ("sample_id", "source_uri", "shard", "key", "caption", "source_meta",
                                          *SOURCE_FIELDS.values())] + [
    pa.field("image", pa.binary()), pa.field("read_error", pa.string()),
    pa.field("_offset", pa.int64()), pa.field("_size", pa.int64())]


def _typed(field: str, v):
    """A sidecar value as its column's type, or None when it is not one (it stays in source_meta)."""
    if field in ("original_width", "original_height"):
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        return v if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2 ** 31 else None
    return v if isinstance(v, str) and len(v) <= MAX_TEXT else None


def _row(unit: Unit, key: str, uri: str, image: bytes | None, error: str | None = None,
         caption: str | None = None, meta: str | None = None, source: dict | None = None) -> dict:
    row = {"sample_id": sample_id(uri), "source_uri": uri, "shard": unit.unit_id, "key": key,
           "caption": caption, "source_meta": meta, "image": image, "read_error": error}
    for f, col in SOURCE_FIELDS.items():
        row[col] = _typed(f, (source or {}).get(f))
    return row


class UnitReader:
    """Iterate to get the unit's rows one at a time (image bytes included); then `.error` is the
    unit-level error string ("KIND: detail", or None) and `.notes` counts what was read past
    (tar members that are not samples, appended archives). The reader holds one sample's bytes
    (plus its sidecars) at a time. Iterate once; `.error` is final only after the last row.
    `limits`: max_file_bytes, max_sidecar_bytes and extensions (a tar member with one of these is a
    sample's image), as the input section names them; DEFAULT_LIMITS for those not given."""

    def __init__(self, unit: Unit, limits: dict | None = None):
        self.unit = unit
        self.limits = with_defaults(limits)
        self.error: str | None = None
        self.notes: Counter = Counter()
        self.rows = 0

    def __iter__(self) -> Iterator[dict]:
        try:
            rows = self._files() if self.unit.kind == "files" else self._tar()
            for row in rows:
                self.rows += 1
                yield row
        except STORE_FAULTS:
            raise  # the store refused or kept failing: the run stops with its line, the unit is redone
        except Exception as e:  # a bug here must not end the run: the unit records it
            self._fail(f"reader_error: {self.unit.uri}: {type(e).__name__}: {e}; samples before it kept")
        if self.error:
            log.warning("%s", self.error)

    def _fail(self, error: str) -> None:
        self.error = self.error or error

    # --- a chunk of a folder or manifest --------------------------------------------------------
    def _files(self) -> Iterator[dict]:
        u = self.unit
        if u.error:
            self._fail(f"unreadable_manifest: {u.error}")
            return
        for i, (key, uri) in enumerate(zip(u.keys, u.files)):
            bad = u.errors.get(str(i)) if u.errors else None
            yield _row(u, key, uri, None, bad) if bad else file_row(u, key, uri, self.limits)

    # --- a tar shard ----------------------------------------------------------------------------
    def _tar(self) -> Iterator[dict]:
        u, limits = self.unit, self.limits
        try:
            fh = open_input(u.uri, buffer_size=READ_BUFFER)
        except STORE_FAULTS:
            raise
        except Exception as e:
            self._fail(f"cannot_open_shard: {u.uri}: {type(e).__name__}: {e}")
            return
        seen: dict[str, int] = {}
        keys: set[str] = set()
        try:
            recs = iter_tar(fh, name=u.uri, max_member_bytes=limits["max_file_bytes"],
                            max_sidecar_bytes=limits["max_sidecar_bytes"], image_exts=limits["extensions"],
                            notes=self.notes)
            try:
                for rec in recs:
                    keys.add(rec.key)
                    if rec.error:
                        uri = f"{u.uri}#{rec.members[0][0]}" if rec.members else f"{u.uri}#{rec.key}"
                        yield _unique(seen, _row(u, rec.key, uri, None, rec.error))
                    else:
                        yield _unique(seen, _tar_row(u, rec, limits))
            except ShardTruncated as e:
                self._fail(f"{e.kind}: {e}")
                if e.key is not None:  # the sample being read when the damage hit is accounted for too
                    keys.add(e.key)
                    yield _unique(seen, _row(u, e.key, f"{u.uri}#{e.key}", None,
                                             f"truncated tar: input tar truncated or corrupt while reading this sample ({e.kind})"))
        finally:
            fh.close()
        yield from self._index_rows(keys, seen)

    def _index_rows(self, tar_keys: set[str], seen: dict) -> Iterator[dict]:
        """Rows for what the shard's Parquet index lists and its tar lacks; checks they agree."""
        u = self.unit
        index = _index_uri(u.uri)
        try:
            if index is None or not exists_at(index):
                return
            fh = open_input(index)
        except STORE_FAULTS:
            raise
        except Exception as e:
            self._fail(f"bad_index: {u.uri}: the Parquet index beside the tar cannot be read "
                       f"({type(e).__name__}: {e}); the tar's samples are kept")
            return
        with fh:
            try:
                pf = pq.ParquetFile(fh)
            except STORE_FAULTS:
                raise
            except Exception as e:
                self._fail(f"bad_index: {u.uri}: the Parquet index beside the tar cannot be read "
                           f"({type(e).__name__}: {e}); the tar's samples are kept")
                return
            yield from self._check_index(pf, tar_keys, seen)

    def _check_index(self, pf: pq.ParquetFile, tar_keys: set[str], seen: dict) -> Iterator[dict]:
        u = self.unit
        names = set(pf.schema_arrow.names)
        img2 = {"key", "status"} <= names
        if "key" not in names or not (img2 or "members" in names):
            self._fail(f"bad_index: {u.uri}: the Parquet beside the tar is neither a humanset index (key, members) "
                       f"nor img2dataset's (key, status); has {', '.join(sorted(names)[:12])}")
            return
        cols = [c for c in ("key", "status", "error_message", *SOURCE_FIELDS) if c in names and (img2 or c == "key")]
        missing = extra = 0
        listed: set[str] = set()
        try:
            for batch in pf.iter_batches(batch_size=1024, columns=list(dict.fromkeys(cols))):
                for rec in batch.to_pylist():
                    key = rec.get("key")
                    if not isinstance(key, str) or not key or len(key) > MAX_TEXT:
                        extra += 1
                        continue
                    listed.add(key)
                    if key in tar_keys:
                        continue
                    status = rec.get("status") if img2 else "success"
                    if status != "success":
                        detail = str(rec.get("error_message") or "no error message")[:MAX_DETAIL]
                        yield _unique(seen, _row(u, key, f"{u.uri}#{key}", None,
                                                 f"download failed: {str(status)[:100]}: {detail}", source=rec))
                    else:  # listed as downloaded, not in the tar: lost (damage) or the index lies
                        missing += 1
                        yield _unique(seen, _row(u, key, f"{u.uri}#{key}", None,
                                                 "missing member: the shard's index lists this key, its tar does not "
                                                 "hold it", source=rec if img2 else None))
        except STORE_FAULTS:
            raise
        except Exception as e:
            self._fail(f"bad_index: {u.uri}: the Parquet index beside the tar is corrupt "
                       f"({type(e).__name__}: {e}); rows read before it kept")
            return
        unlisted = len(tar_keys - listed)
        if missing or unlisted or extra:
            self._fail(f"index_mismatch: {u.uri}: the Parquet index and the tar disagree: {missing} keys listed "
                       f"as stored are not in the tar, {unlisted} tar keys are not listed, {extra} index rows "
                       "have no usable key")


def _unique(seen: dict, row: dict) -> dict:
    # a name repeated in one tar: the n-th occurrence (n >= 2) is its own sample, 'URI@n'
    n = seen[row["source_uri"]] = seen.get(row["source_uri"], 0) + 1
    if n > 1:
        row.update(source_uri=f"{row['source_uri']}@{n}", key=f"{row['key']}@{n}")
        row["sample_id"] = sample_id(row["source_uri"])
    return row


def _index_uri(tar_uri: str) -> str | None:
    """Where a tar's Parquet index would be (same name, .parquet); None for a name without .tar."""
    return tar_uri[:-4] + ".parquet" if tar_uri.endswith(".tar") else None


def with_defaults(limits: dict | None) -> dict:
    """A reader's limits with DEFAULT_LIMITS for those not given (extensions: a tuple, lower case)."""
    out = {**DEFAULT_LIMITS, **(limits or {})}
    out["extensions"] = tuple(e.lower().lstrip(".") for e in out["extensions"])
    return out


def read_unit(unit: Unit, limits: dict | None = None) -> tuple[list[dict], str | None]:
    """All samples of a unit as rows (with the image bytes), plus the unit-level error if any
    (a thin wrapper over UnitReader, for callers that want the whole unit at once)."""
    reader = UnitReader(unit, limits)
    rows = list(reader)
    return rows, reader.error


def file_row(unit: Unit, key: str, uri: str, limits: dict) -> dict:
    cap = limits["max_file_bytes"]
    try:
        if unit.root and not is_uri(uri):
            real, root = os.path.realpath(uri), os.path.realpath(unit.root)
            if os.path.commonpath([real, root]) != root:
                return _row(unit, key, uri, None, f"symlink outside input: {key} points outside the input "
                                                  f"folder (to {real}); not read")
        with open_input(uri, buffer_size=READ_BUFFER) as fh:
            data = fh.read(cap + 1)
        if len(data) > cap:
            return _row(unit, key, uri, None, f"too large: file is over the cap of {cap} bytes; "
                                              "raise input.max_file_bytes to read it")
        return _row(unit, key, uri, data)
    except STORE_FAULTS:
        raise
    except Exception as e:  # one file never stops its unit: any failure is this sample's row
        return _row(unit, key, uri, None, f"cannot read file: {type(e).__name__}: {e}")


def _text(data: bytes | None, cap: int) -> str | None:
    if data is None or len(data) > cap:
        return None
    return data.decode("utf-8", "replace")


def _tar_row(unit: Unit, rec, limits: dict) -> dict:
    cap = limits["max_sidecar_bytes"]
    img_ext = next((e for e in rec.files if e.lower() in limits["extensions"]), None)
    # sidecars over the cap are not read (the sample stays); a json too deep to parse gives no fields
    caption = _text(rec.files.get("txt"), cap)
    meta_s = _text(rec.files.get("json"), cap)
    source = {}
    if meta_s:
        try:
            meta = json.loads(meta_s)
            source = meta if isinstance(meta, dict) else {}
        except (ValueError, RecursionError):
            pass
    if caption is None and isinstance(source.get("caption"), str):
        caption = source["caption"]
    if img_ext is None:
        have = sorted(rec.files) + [f"{e} (over the sidecar cap)" for e in sorted(rec.skipped)]
        return _row(unit, rec.key, f"{unit.uri}#{rec.key}", None,
                    f"no image member: key {rec.key!r} has {', '.join(have) or 'no members'}", caption, meta_s, source)
    row = _row(unit, rec.key, f"{unit.uri}#{rec.key}.{img_ext}", rec.files[img_ext], None, caption, meta_s, source)
    # where the image lies in the tar (a record holds each extension once, members in files' order)
    _, row["_offset"], row["_size"] = rec.members[list(rec.files).index(img_ext)]
    return row


def read_members(unit: Unit, spans: dict[str, tuple[int, int]]) -> dict[str, bytes] | None:
    """The bytes at (offset, size) in a local tar, per sample id: a second read of a shard that seeks
    to the measured members instead of parsing the tar again (the caller checks each against its
    measured sha256). None for a shard this cannot seek in (remote); {} if it cannot be opened."""
    if unit.kind != "tar" or is_uri(unit.uri):
        return None
    out = {}
    try:
        with open_input(unit.uri) as fh:
            size = os.fstat(fh.fileno()).st_size
            for sid, (offset, n) in sorted(spans.items(), key=lambda kv: kv[1][0]):
                if offset < 0 or n < 0 or offset + n > size:  # the shard shrank: never read past it
                    continue
                fh.seek(offset)
                data = fh.read(n)
                if len(data) == n:
                    out[sid] = data
    except STORE_FAULTS:
        raise
    except OSError as e:
        log.warning("%s: cannot read the shard again (%s); its samples are rejected as source_changed", unit.uri, e)
    return out


__all__ = ["DEFAULT_LIMITS", "ROW_FIELDS", "SOURCE_FIELDS", "UnitReader", "read_members", "read_unit", "with_defaults"]
