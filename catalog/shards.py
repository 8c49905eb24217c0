"""The one shard format of humanset: a WebDataset tar plus a Parquet index of the same rows.

    OUT/{prefix}-00000.tar      {key}.jpg (original bytes), {key}.json (sidecar), ...
    OUT/{prefix}-00000.parquet  one row per key: key, shard, members (name, offset, size), extra columns

Keys contain no dots, so WebDataset splits `{key}.{ext}` the way we wrote it. The tar is renamed into
place first, the index second: an index on disk means its tar is whole.
"""
from __future__ import annotations

import json
import os
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from .io import atomic_path, tmp_name
from .schema import conform

_KEY_RE = re.compile(r"^[^.]+$")


def split_member(name: str) -> tuple[str, str]:
    """WebDataset's split: key = path up to the first dot of the basename, ext = the rest."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext


def unsafe_member(name: str) -> str | None:
    """Why a tar member name escapes its shard, or None if it is safe."""
    if name.startswith("/") or name.startswith("\\"):
        return "absolute path"
    parts = re.split(r"[/\\]", name)
    if ".." in parts:
        return "'..' in path"
    return None


class ShardTruncated(Exception):
    """A tar ended early or is corrupt after some members were read.

    `key` names the sample that was being read when the damage hit (None if between samples).
    """

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


@dataclass
class TarRecord:
    key: str
    files: dict[str, bytes]  # ext -> bytes
    members: list[tuple[str, int, int]] = field(default_factory=list)  # (name, data offset, size)
    error: str | None = None  # e.g. a member escaping the shard


def readable_name(name: str) -> str:
    """A member name as valid text: bytes that are not UTF-8 (tarfile keeps them as surrogates)
    become backslash escapes, so the name is stable, printable and storable."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def iter_tar(fileobj_or_path, *, name: str = "", max_member_bytes: int | None = None) -> Iterator[TarRecord]:
    """Yield the samples of a WebDataset tar, grouping consecutive members by key.

    Members whose names escape the shard come back as records with `error` set and no bytes, and
    so do members larger than `max_member_bytes` (never read into memory). Names that are not
    UTF-8 are made readable with backslash escapes. A member whose extension the current record
    already holds (a repeated name) starts a new record with the same key: each occurrence is its
    own sample.
    A truncated or corrupt tar raises ShardTruncated after yielding every complete sample before
    the damage (the sample being read when the damage hit is reported in the exception). A cut
    inside a header is only detectable on a seekable file (trailing bytes that are not zeros).
    """
    label = name or str(fileobj_or_path)
    if isinstance(fileobj_or_path, (str, os.PathLike)):
        fh = open(fileobj_or_path, "rb")
        own = True
    else:
        fh, own = fileobj_or_path, False
    current: TarRecord | None = None
    reading: str | None = None  # key whose member data is being read (None while reading headers)
    try:
        try:
            seekable = fh.seekable() if hasattr(fh, "seekable") else False
            tf = tarfile.open(fileobj=fh, mode="r:" if seekable else "r|")
        except tarfile.TarError as e:
            raise ShardTruncated(f"{label}: not a readable tar ({e})") from e
        try:
            for m in tf:
                if not m.isfile():
                    continue
                mname = readable_name(m.name)
                why = unsafe_member(mname)
                too_big = max_member_bytes is not None and m.size > max_member_bytes
                if why or too_big:
                    if current is not None:
                        yield current
                        current = None
                    error = (f"unsafe member name: member {mname!r} escapes the shard ({why}); skipped" if why else
                             f"too large: member is {m.size} bytes > the cap of {max_member_bytes}; "
                             f"raise input.max_file_bytes to read it")
                    yield TarRecord(key=mname if why else split_member(mname)[0], files={}, error=error,
                                    members=[(mname, m.offset_data, m.size)])
                    continue
                key, ext = split_member(mname)
                reading = key
                if seekable and not m.issparse():  # straight from the file: tarfile's next() seeks back
                    fh.seek(m.offset_data)
                    data = fh.read(m.size)
                else:
                    data = tf.extractfile(m).read()
                if len(data) != m.size:
                    raise tarfile.ReadError(f"member {mname} cut short")
                reading = None
                if current is not None and (current.key != key or ext in current.files):
                    yield current
                    current = None
                if current is None:
                    current = TarRecord(key=key, files={})
                current.files[ext] = data
                current.members.append((mname, m.offset_data, m.size))
            if seekable:  # tarfile stops quietly at a cut header; what follows the last member must be zeros
                fh.seek(tf.offset)
                rest = fh.read(1 << 20)
                if rest.strip(b"\0"):
                    raise tarfile.ReadError(f"{len(rest)} bytes after the last whole member are not a tar header")
                if not rest:
                    raise tarfile.ReadError("no end-of-archive marker after the last member")
        except (tarfile.TarError, EOFError, OSError, ValueError) as e:
            # members read whole before the damage are kept; the sample hit by it is reported
            if current is not None and current.key != reading:
                yield current
            lost = f"; sample {reading!r} was being read" if reading else ""
            raise ShardTruncated(f"{label}: tar is truncated or corrupt ({e}){lost}", key=reading) from e
        if current is not None:
            yield current
    finally:
        if own:
            fh.close()


def index_path(tar_path) -> Path:
    """The Parquet index beside a shard: only the trailing `.tar` changes (a unit id may hold `.tar`)."""
    tar_path = Path(tar_path)
    if tar_path.suffix != ".tar":
        raise ValueError(f"{tar_path}: a shard's name ends in .tar")
    return tar_path.with_suffix(".parquet")


def read_member(tar_path, offset: int, size: int) -> bytes:
    """Random access to one member's bytes through the index's offsets."""
    with open(tar_path, "rb") as fh:
        fh.seek(offset)
        return fh.read(size)


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644  # mtime 0: reproducible bytes
    return info


_HEADER = _tarinfo("", 0).tobuf(tarfile.USTAR_FORMAT, tarfile.ENCODING, "surrogateescape")


def member_header(name: str, size: int) -> bytes:
    """The USTAR header tarfile writes for a regular member (mode 0644, mtime 0), byte for byte,
    from a template: only the name, the size and the checksum differ between members, and
    tarfile's general builder costs a good part of a small image's write."""
    raw = name.encode(tarfile.ENCODING, "surrogateescape")
    if len(raw) > 100 or size >= 8 ** 11:  # a prefix field or a huge size: tarfile's builder
        return _tarinfo(name, size).tobuf(tarfile.USTAR_FORMAT, tarfile.ENCODING, "surrogateescape")
    buf = bytearray(_HEADER)
    buf[0:100] = raw.ljust(100, b"\0")
    buf[124:136] = b"%011o\0" % size
    buf[148:156] = b" " * 8  # the checksum counts its own field as spaces
    buf[148:155] = b"%06o\0" % sum(buf)
    return bytes(buf)


class ShardWriter:
    """Writes rolling shards `{prefix}-NNNNN.tar` + `.parquet` into `folder`, each atomically.

    `add(key, files, row)`: files maps extension -> bytes (or a json-able dict for 'json');
    `row` holds the index columns beyond key/shard/members. Returns the shard's name.
    """

    def __init__(self, folder, prefix: str, schema: pa.Schema, max_count: int = 10_000,
                 max_bytes: int = 1 << 30):
        self.folder = Path(folder)
        self.prefix = prefix
        self.schema = schema
        self.max_count, self.max_bytes = max_count, max_bytes
        self.index = 0
        self.written: list[str] = []
        self._writing = False

    def _open(self):
        self.folder.mkdir(parents=True, exist_ok=True)
        self._name = f"{self.prefix}-{self.index:05d}.tar"
        self._tmp = tmp_name(self.folder / self._name)
        self._fh = open(self._tmp, "wb")
        self._writing = True  # its bytes are what tarfile writes (USTAR), each header built once
        self._offset = 0
        self._rows, self._bytes = [], 0

    def add(self, key: str, files: dict, row: dict | None = None) -> str:
        if not _KEY_RE.match(key):
            raise ValueError(f"shard key {key!r} must not contain dots")
        if not self._writing:
            self._open()
        members = []
        for ext, data in files.items():
            if isinstance(data, (dict, list)):
                data = json.dumps(data, sort_keys=True, default=str).encode()
            member = f"{key}.{ext}"
            header = member_header(member, len(data))
            pad = -len(data) % tarfile.BLOCKSIZE
            self._fh.write(header)
            self._fh.write(data)
            self._fh.write(tarfile.NUL * pad)
            offset = self._offset + len(header)
            self._offset = offset + len(data) + pad
            members.append({"name": member, "offset": offset, "size": len(data)})
            self._bytes += len(data)
        self._rows.append({**(row or {}), "key": key, "shard": self._name, "members": members})
        name = self._name
        if len(self._rows) >= self.max_count or self._bytes >= self.max_bytes:
            self._finish()
        return name

    def _finish(self):
        # end of archive as tarfile writes it: two zero blocks, then zeros up to a whole record
        end = self._offset + 2 * tarfile.BLOCKSIZE
        self._fh.write(tarfile.NUL * (2 * tarfile.BLOCKSIZE + -end % tarfile.RECORDSIZE))
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        os.replace(self._tmp, self.folder / self._name)
        table = conform(self._rows, self.schema)
        with atomic_path(index_path(self.folder / self._name)) as tmp:
            pq.write_table(table, tmp, compression="zstd")
        self.written.append(self._name)
        self._writing = False
        self.index += 1

    def close(self) -> list[str]:
        if self._writing:
            self._finish()
        return self.written

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is None:
            self.close()
        elif self._writing:  # leave nothing that looks whole
            self._fh.close()
            Path(self._tmp).unlink(missing_ok=True)
            self._writing = False


def list_shards(folder) -> list[Path]:
    """Complete shards in `folder` (a tar with its index), sorted by name."""
    folder = Path(folder)
    return sorted(p.with_suffix(".tar") for p in folder.glob("*.parquet") if p.with_suffix(".tar").exists())


def read_index(folder) -> pa.Table:
    """The concatenated Parquet index of every shard in `folder` (empty table if none)."""
    files = [str(index_path(p)) for p in list_shards(folder)]
    if not files:
        raise FileNotFoundError(f"{folder}: no shards (tar + parquet index) found")
    return pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")
