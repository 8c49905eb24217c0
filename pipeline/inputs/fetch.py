"""Image bytes read back from the source, a batch at a time (phase 3, after measure and dedup).

A unit's block carries no image bytes after phase 1: each stage that reads `image` fetches the
bytes of the rows it scores, batch by batch, and the writer fetches the kept rows' bytes as it
appends them to the curated shards, so a worker holds one batch of bytes, never a whole shard.
A tar's members are read at the offsets phase 1 measured (one open file, seeks; ranged reads on
a remote file system); a folder's files by path. Every read is checked against the sha256
measured in phase 1: bytes that differ are never used (the row becomes `source_changed`). A tar
rewritten since (its members moved) is parsed again, once per unit, for the new offsets.
"""
from __future__ import annotations

import hashlib
import logging

import pyarrow as pa

from catalog.storage import is_uri, open_input
from catalog.storage.answers import STORE_FAULTS

from pipeline.inputs.reading import UnitReader, file_row, with_defaults
from pipeline.inputs.units import Unit

log = logging.getLogger("humanset.curate")
COALESCE_GAP = 64 << 10  # bytes of other members a ranged read of a remote tar may span to join two reads
COALESCE_MAX = 16 << 20  # the most one such read fetches


def source_changed(data: bytes | None, measured: str | None) -> str | None:
    """Why bytes read back cannot be used (None when they are the measured ones)."""
    if data is None:
        return "source changed: the sample can no longer be read"
    now = hashlib.sha256(data).hexdigest()
    return None if now == measured else f"source changed: sha256 {now} now, {measured} when measured"


class ByteSource:
    """Reads sample bytes of one unit back from its source; use as a context manager."""

    def __init__(self, unit: Unit, limits: dict):
        self.unit, self.limits = unit, with_defaults(limits)
        self._fh = None
        self._reparsed: dict[str, tuple[int, int]] | None = None  # sample_id -> span after a rewrite

    def __enter__(self) -> "ByteSource":
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def close(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                pass
            self._fh = None

    def _span_bytes(self, offset: int, size: int) -> bytes | None:
        if self._fh is None:  # random access: on a store each read_at is one ranged GET
            self._fh = open_input(self.unit.uri)
        if hasattr(self._fh, "read_at"):
            data = self._fh.read_at(size, offset)
        else:
            self._fh.seek(offset)
            data = self._fh.read(size)
        return bytes(data) if len(data) == size else None

    def _tar_bytes(self, sid: str, offset, size) -> bytes | None:
        try:
            if self._reparsed is not None:
                span = self._reparsed.get(sid)
                return self._span_bytes(*span) if span else None
            return None if offset is None else self._span_bytes(offset, size)
        except STORE_FAULTS:
            raise  # the store refused or kept failing: not a changed source
        except OSError as e:
            log.warning("%s: cannot read the shard again (%s); its samples are rejected as source_changed",
                        self.unit.uri, e)
            return None

    def _reparse(self) -> None:
        """The tar's members moved: parse it again for their offsets (one sample's bytes at a time)."""
        self._reparsed = {r["sample_id"]: (r["_offset"], r["_size"]) for r in UnitReader(self.unit, self.limits)
                          if r.get("_offset") is not None}

    def _coalesced(self, offsets: list, sizes: list) -> dict[int, bytes]:
        """Row -> its member's bytes for a remote tar, read with one ranged GET per run of members
        that lie close together in the file (the shard's members between them, sidecars, are at most
        COALESCE_GAP bytes; a run at most COALESCE_MAX): a batch of kept samples of one shard is a few
        requests, not one per sample. Local files read member by member (a seek is free)."""
        if not is_uri(self.unit.uri):
            return {}
        rows = sorted((o, n, i) for i, (o, n) in enumerate(zip(offsets, sizes))
                      if o is not None and n is not None and o >= 0 and n >= 0)
        out: dict[int, bytes] = {}
        k = 0
        while k < len(rows):
            start, end, j = rows[k][0], rows[k][0] + rows[k][1], k + 1
            while j < len(rows) and rows[j][0] - end <= COALESCE_GAP and rows[j][0] + rows[j][1] - start <= COALESCE_MAX:
                end, j = max(end, rows[j][0] + rows[j][1]), j + 1
            try:
                blob = self._span_bytes(start, end - start)
            except STORE_FAULTS:
                raise
            except OSError:
                blob = None
            if blob is not None:
                for o, n, i in rows[k:j]:
                    out[i] = blob[o - start:o - start + n]
            k = j
        return out

    def fetch(self, table: pa.Table) -> tuple[list[bytes | None], list[str | None]]:
        """The bytes of every row of `table` (columns sample_id, source_uri, key, sha256 and, for a
        tar, _offset/_size) and, per row, why they could not be used (None: checked, fine)."""
        cols = {c: table.column(c).to_pylist() if c in table.column_names else [None] * table.num_rows
                for c in ("sample_id", "source_uri", "key", "sha256", "_offset", "_size")}
        images: list[bytes | None] = []
        why: list[str | None] = []
        spans = self._coalesced(cols["_offset"], cols["_size"]) if self.unit.kind == "tar" else {}
        for i, sid in enumerate(cols["sample_id"]):
            if self.unit.kind == "tar":
                data = spans.get(i) if i in spans and self._reparsed is None else \
                    self._tar_bytes(sid, cols["_offset"][i], cols["_size"][i])
                if source_changed(data, cols["sha256"][i]) and self._reparsed is None:
                    self._reparse()
                    data = self._tar_bytes(sid, None, None)
            else:
                data = file_row(self.unit, cols["key"][i], cols["source_uri"][i], self.limits)["image"]
            problem = source_changed(data, cols["sha256"][i])
            images.append(None if problem else data)
            why.append(problem)
        return images, why
