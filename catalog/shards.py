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
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from catalog.io import atomic_path, commit, tmp_name
from catalog.schema import conform

_KEY_RE = re.compile(r"^[^.]+$")


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
        from catalog.storage import Storage
        # a folder on an object store (a catalog.Storage that is not posix): each tar is one open_output
        # (on S3 a streamed multipart upload: parts go up while the next members are written; the object
        # appears only when the tar closes), its index after it; locally, temp + fsync + rename as always
        self.store = folder if isinstance(folder, Storage) and not folder.posix else None
        self.folder = Path(folder.base if isinstance(folder, Storage) else folder) if self.store is None else None
        self.prefix = prefix
        self.schema = schema
        self.max_count, self.max_bytes = max_count, max_bytes
        self.index = 0
        self.written: list[str] = []
        self._writing = False

    def _open(self):
        self._name = f"{self.prefix}-{self.index:05d}.tar"
        if self.store is not None:
            self._out = self.store.open_output(self._name)
            self._fh = self._out.__enter__()
        else:
            self.folder.mkdir(parents=True, exist_ok=True)
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
        if self.store is not None:
            self._out.__exit__(None, None, None)  # the upload completes: the tar's object, whole; then its index
            self.store.write_parquet(self._name[:-4] + ".parquet", conform(self._rows, self.schema))
            self.written.append(self._name)
            self._writing = False
            self.index += 1
            return
        self._fh.close()
        commit(self._tmp, self.folder / self._name)
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

    def __exit__(self, exc_type, exc=None, tb=None):
        if exc_type is None:
            self.close()
        elif self._writing:  # leave nothing that looks whole
            if self.store is not None:
                self._out.__exit__(exc_type, exc, tb)  # the upload is aborted: nothing under the name
            else:
                self._fh.close()
                Path(self._tmp).unlink(missing_ok=True)
            self._writing = False


def list_shards(folder) -> list[Path]:
    """Complete shards in `folder` (a tar with its index), sorted by name."""
    folder = Path(folder)
    return sorted(p.with_suffix(".tar") for p in folder.glob("*.parquet") if p.with_suffix(".tar").exists())


def list_shard_names(folder) -> list[str]:
    """Names of the complete shards (a tar with its index) in a local folder or under a URI
    (s3://bucket/runs/r1/shards: one streamed listing), sorted."""
    from catalog.storage import is_uri, storage_for
    if not is_uri(os.fspath(folder)):
        return [p.name for p in list_shards(folder)]
    tars, indexes = set(), set()
    for e in storage_for(os.fspath(folder)).list():
        if "/" not in e.path and not e.path.startswith("."):
            (tars if e.path.endswith(".tar") else indexes if e.path.endswith(".parquet") else set()).add(e.path)
    return sorted(t for t in tars if t[:-4] + ".parquet" in indexes)


def open_shard_file(folder, name: str):
    """A random-access binary file of one file of a shard folder, local or on an object store (where
    each read of a member is one ranged GET: no copy of the shard on local disk)."""
    from catalog.storage import is_uri, storage_for
    if is_uri(os.fspath(folder)):
        return storage_for(os.fspath(folder)).open_input(name)
    return open(Path(folder) / name, "rb")


def read_index(folder) -> pa.Table:
    """The concatenated Parquet index of every shard in `folder` (empty table if none)."""
    files = [str(index_path(p)) for p in list_shards(folder)]
    if not files:
        raise FileNotFoundError(f"{folder}: no shards (tar + parquet index) found")
    return pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")
