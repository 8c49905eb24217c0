"""One storage layer for local folders and object stores: `open_storage(uri_or_path)` -> Storage.

A Storage is rooted at a folder or URI (`/data/run`, `file:///data/run`, `s3://bucket/runs/r1`,
`gs://bucket/x`, `hdfs://namenode:8020/x`, `memory://name/x` for tests); every method takes a path
relative to that root ("units/00001.json", never absolute, never with ".."). Data moves through
pyarrow.fs; on S3 through obstore, with pyarrow's S3 client built only when `.fs` is asked for
(catalog/storage_s3.py). Credentials: the standard AWS chain; endpoint: `AWS_ENDPOINT_URL`.

- Local: writes are temp + fsync + rename (catalog/io.py), create_once is link(2), the run lock is
  flock (io.run_lock).
- Object stores: an object appears whole or not at all (open_output uploads only if its block
  succeeds), so a failed writer leaves nothing under the final name. Names are deterministic: a
  retried task rewrites the same object.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from . import globs, io as cio

SPOOL_BYTES = 64 << 20  # open_output on object stores keeps this much in memory, then spills to a temp file
_SECRET_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


class StorageError(OSError):
    """A storage request failed; the message names the URI and never holds a credential."""


class ConditionalWritesUnsupported(StorageError):
    """This store (or backend) cannot create an object only if it is absent."""


class Entry(NamedTuple):
    path: str  # relative to the Storage root
    size: int


def scrub(text: str) -> str:
    """Remove any credential value of the environment from a message (defence in depth)."""
    for var in _SECRET_VARS:
        value = os.environ.get(var)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


def _clean_rel(path: str) -> str:
    path = str(path).replace("\\", "/")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if path.startswith("/") or ".." in parts or "\x00" in path:
        raise ValueError(f"{path!r}: a storage path is relative to its root, without '..' or a leading '/'")
    return "/".join(parts)


class Storage:
    """A folder or object-store prefix; see the module docstring. Build one with open_storage()."""
    scheme = "file"
    posix = False  # True where writes are rename-atomic and the lock is flock

    def __init__(self, uri: str, fs: pafs.FileSystem, base: str):
        self.uri, self.fs, self.base = uri.rstrip("/") or uri, fs, base.rstrip("/") or base
        self._conditional: bool | None = None

    def __repr__(self):
        return f"{type(self).__name__}({self.uri!r})"

    def __str__(self):
        return self.uri

    def __reduce__(self):  # to a Ray task or another process: reopened there from its URI and the
        return open_storage, (self.uri,)  # standard credential chain; no client or secret is pickled

    # paths
    def fs_path(self, path: str = "") -> str:
        """The path to hand to pyarrow (`filesystem=storage.fs`) and Ray Data for `path`."""
        rel = _clean_rel(path)
        return f"{self.base}/{rel}" if rel else self.base

    def uri_of(self, path: str = "") -> str:
        rel = _clean_rel(path)
        return f"{self.uri}/{rel}" if rel else self.uri

    def child(self, path: str) -> "Storage":
        rel = _clean_rel(path)
        twin = type(self).__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin.uri, twin.base, twin._conditional = self.uri_of(rel), self.fs_path(rel), None
        return twin

    def _err(self, what: str, path: str, e: Exception) -> StorageError:
        return StorageError(f"{self.uri_of(path)}: {what} failed: {scrub(str(e))}")

    # reads
    def open_input(self, path: str):
        """A random-access file (seek, read, read_at(n, offset), size); use it as a context manager."""
        try:
            return self.fs.open_input_file(self.fs_path(path))
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.uri_of(path)}: no such file") from None
        except OSError as e:
            raise self._err("open", path, e) from None

    def open_stream(self, path: str, buffer_size: int = 1 << 20):
        """A sequential reader (read, readline; a context manager), `buffer_size` bytes a request."""
        try:
            return io.BufferedReader(self.fs.open_input_stream(self.fs_path(path), buffer_size=buffer_size))
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.uri_of(path)}: no such file") from None
        except OSError as e:
            raise self._err("open", path, e) from None

    def read_bytes(self, path: str) -> bytes:
        with self.open_input(path) as f:
            return f.read()

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """`length` bytes from `offset` (a ranged GET; many members of one shard: open_input + read_at)."""
        with self.open_input(path) as f:
            return f.read_at(length, offset)

    def read_json(self, path: str):
        return json.loads(self.read_bytes(path))

    def exists(self, path: str) -> bool:
        try:
            return self.fs.get_file_info(self.fs_path(path)).type != pafs.FileType.NotFound
        except OSError as e:
            raise self._err("stat", path, e) from None

    def size(self, path: str) -> int:
        try:
            info = self.fs.get_file_info(self.fs_path(path))
        except OSError as e:
            raise self._err("stat", path, e) from None
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"{self.uri_of(path)}: no such file")
        return info.size

    # writes
    @contextmanager
    def open_output(self, path: str):
        """A binary file to write; the object appears under `path` only if the block succeeds."""
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
            yield spool
            spool.seek(0)
            try:
                with self.fs.open_output_stream(self.fs_path(path)) as out:
                    shutil.copyfileobj(spool, out, 8 << 20)
            except OSError as e:
                raise self._err("write", path, e) from None

    def write_bytes(self, path: str, data: bytes) -> None:
        with self.open_output(path) as f:
            f.write(data)

    def write_json(self, path: str, obj) -> None:
        self.write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())

    def write_parquet(self, path: str, table: pa.Table) -> None:
        with self.open_output(path) as f:
            pq.write_table(table, f, compression="zstd")

    def delete(self, path: str, missing_ok: bool = True) -> None:
        try:
            self.fs.delete_file(self.fs_path(path))
        except FileNotFoundError:
            if not missing_ok:
                raise FileNotFoundError(f"{self.uri_of(path)}: no such file") from None
        except OSError as e:
            raise self._err("delete", path, e) from None

    # listing
    def _under(self, raw: str) -> Iterator[Entry]:
        """Files whose relative path starts with the string `raw` (a folder "a/b/" or part of a name)."""
        folder = raw.rsplit("/", 1)[0] if "/" in raw else ""
        sel = pafs.FileSelector(self.fs_path(folder), recursive=True, allow_not_found=True)
        try:
            infos = self.fs.get_file_info(sel)  # pyarrow lists a whole tree at once (gs, hdfs)
        except OSError as e:
            raise self._err("list", folder, e) from None
        cut = len(self.base) + 1
        for info in infos:
            rel = info.path[cut:]
            if info.type == pafs.FileType.File and rel.startswith(raw):
                yield Entry(rel, info.size)

    def list(self, prefix: str = "", suffix: str | None = None) -> Iterator[Entry]:
        """Every file under the folder `prefix` (recursively), streamed page by page where the store
        pages (S3: 1,000 keys a request); S3 yields key order, local folders directory order."""
        rel = _clean_rel(prefix)
        for entry in self._under(rel + "/" if rel else ""):
            if suffix is None or entry.path.endswith(suffix):
                yield entry

    def glob(self, pattern: str) -> Iterator[str]:
        """Relative paths matching `pattern`: brace lists/ranges expand lazily, without a request per
        name (as webdataset does: a missing shard fails when it is read); `*`, `?`, `[..]` and `**`
        match existing files, from one listing of the pattern's literal prefix."""
        for one in globs.braceexpand(pattern):
            one = _clean_rel(one)
            if not globs.has_wildcard(one):
                yield one
                continue
            rx = globs.wildcard_regex(one)
            for entry in self._under(globs.literal_prefix(one)):
                if rx.match(entry.path):
                    yield entry.path

    # conditional writes (the lock's primitives); backends override
    def _create(self, path: str, data: bytes) -> str | None:
        raise ConditionalWritesUnsupported(f"{self.uri}: this store has no create-only write in humanset")

    def _stat(self, path: str) -> tuple[str, float] | None:
        """(version tag, age in seconds by the store's own clock), None if absent."""
        raise ConditionalWritesUnsupported(f"{self.uri}: this store has no versioned stat in humanset")

    def _replace_if(self, path: str, data: bytes, tag: str) -> str | None:
        raise ConditionalWritesUnsupported(f"{self.uri}: this store has no compare-and-swap in humanset")

    def _delete_if(self, path: str, tag: str) -> bool:
        raise ConditionalWritesUnsupported(f"{self.uri}: this store has no conditional delete in humanset")

    def create_once(self, path: str, data: bytes) -> bool:
        """Create `path` holding `data` only if nothing is there: True if this call created it."""
        return self._create(path, bytes(data)) is not None

    def supports_conditional_writes(self) -> bool:
        """Probe (once per Storage) that a second create-only write of one name is refused: some
        S3-compatible stores ignore `If-None-Match` and would let two runs take one lock."""
        if self._conditional is None:
            probe = f".probe-{uuid.uuid4().hex}"
            try:
                first = self._create(probe, b"probe")
                self._conditional = first is not None and self._create(probe, b"again") is None
            except ConditionalWritesUnsupported:
                self._conditional = False
            finally:
                self.delete(probe)
        return self._conditional

    @contextmanager
    def run_lock(self, force: bool = False, lease_s: float = 120.0, heartbeat_s: float | None = None):
        """Exclusive lock on this run folder; see catalog/storage_lock.py."""
        from .storage_lock import object_run_lock
        with object_run_lock(self, force=force, lease_s=lease_s, heartbeat_s=heartbeat_s) as handle:
            yield handle

    def fsspec(self):
        """An fsspec file system over this store (what DuckDB's register_filesystem takes)."""
        from fsspec.implementations.arrow import ArrowFSWrapper
        class _Wrapped(ArrowFSWrapper):
            protocol = (self.scheme,)
        return _Wrapped(self.fs)


class LocalStorage(Storage):
    posix = True

    @contextmanager
    def open_output(self, path: str):
        with cio.atomic_path(self.fs_path(path)) as tmp, open(tmp, "wb") as f:
            yield f

    def write_bytes(self, path: str, data: bytes) -> None:
        cio.write_bytes(self.fs_path(path), data)

    def write_json(self, path: str, obj) -> None:
        cio.write_json(self.fs_path(path), obj)

    def write_parquet(self, path: str, table: pa.Table) -> None:
        cio.write_parquet(self.fs_path(path), table)

    def _under(self, raw: str) -> Iterator[Entry]:
        folder = raw.rsplit("/", 1)[0] if "/" in raw else ""
        stack = [self.fs_path(folder)]
        cut = len(self.base) + 1
        while stack:  # one directory's entries at a time, never the whole tree
            try:
                it = os.scandir(stack.pop())
            except (FileNotFoundError, NotADirectoryError):
                continue
            with it:
                for d in it:
                    rel = d.path[cut:]
                    if d.is_dir(follow_symlinks=False):
                        if raw.startswith(rel + "/") or (rel + "/").startswith(raw):
                            stack.append(d.path)
                    elif d.is_file() and rel.startswith(raw) and not cio.TMP_RE.match(d.name):
                        yield Entry(rel, d.stat().st_size)

    def _create(self, path: str, data: bytes) -> str | None:
        final = self.fs_path(path)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        tmp = cio.tmp_name(final)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, final)  # atomic, complete content, refused if the name exists
            except FileExistsError:
                return None
            return "created"
        finally:
            tmp.unlink(missing_ok=True)

    @contextmanager
    def run_lock(self, force: bool = False, lease_s: float = 120.0, heartbeat_s: float | None = None):
        """flock on ROOT/.lock (catalog/io.py): dies with its process, so nothing is ever stale."""
        from .storage_lock import Held
        with cio.run_lock(self.base):
            yield Held(self.uri_of(".lock"))


def open_storage(uri_or_path: str | os.PathLike) -> Storage:
    """The Storage rooted at a local path or a URI (file://, memory://, s3://, gs://, hdfs://)."""
    text = os.fspath(uri_or_path)
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if "@" in parts.netloc:  # s3://KEY:SECRET@bucket: never echo it
        raise ValueError(f"{scheme}://...: credentials in a URI are refused; use the standard provider chain "
                         "(environment variables, a profile, or an instance role)")
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        local = parts.path if scheme == "file" else text
        if scheme == "file" and parts.netloc not in ("", "localhost"):
            raise ValueError(f"{text}: file:// URIs name a local path (file:///abs/path)")
        local = os.path.abspath(os.path.expanduser(local))
        return LocalStorage("file://" + local if scheme == "file" else local, pafs.LocalFileSystem(), local)
    if scheme == "memory":
        from fsspec.implementations.memory import MemoryFileSystem

        from .storage_mem import MemoryStorage
        base = "/" + (parts.netloc + parts.path).strip("/")
        return MemoryStorage(f"memory://{base.lstrip('/')}", MemoryFileSystem(), base)
    if not parts.netloc:
        raise ValueError(f"{text}: a {scheme}:// URI names a bucket or host ({scheme}://NAME/path)")
    if scheme in ("s3", "s3a"):
        from .storage_s3 import S3Storage
        return S3Storage(parts.netloc, parts.path.strip("/"))
    if scheme in ("gs", "gcs", "hdfs"):
        try:
            fs, base = pafs.FileSystem.from_uri(f"{scheme}://{parts.netloc}/")
        except (OSError, pa.ArrowException) as e:
            raise StorageError(f"{scheme}://{parts.netloc}: cannot open: {scrub(str(e))}") from None
        key = parts.path.strip("/")
        base = (base.rstrip("/") + "/" + key).rstrip("/") if key else base.rstrip("/")
        store = Storage(f"{scheme}://{parts.netloc}/{key}".rstrip("/"), fs, base)
        store.scheme = scheme
        return store
    raise ValueError(f"{text}: unsupported storage scheme {scheme!r}; use a local path, file://, s3://, "
                     "gs://, hdfs:// or memory://")


def expand(pattern: str | os.PathLike) -> Iterator[str]:
    """Full URIs (or local paths) a shard pattern names: `s3://b/crawl/{00000..09999}.tar`, `.../*.tar`,
    or every file under a prefix that ends with `/` (streamed, as Storage.list)."""
    text = os.fspath(pattern)
    if text.endswith("/") and "{" not in text and not globs.has_wildcard(text):  # a prefix: all under it
        store = open_storage(text)
        yield from (store.uri_of(e.path) for e in store.list())
        return
    first = globs.literal_prefix(text.split("{", 1)[0])
    root = first.rsplit("/", 1)[0] if "/" in first else "."
    if root.endswith(":/") or root.endswith(":"):  # s3://bucket with the pattern in the bucket name
        raise ValueError(f"{text}: put the pattern after the bucket (s3://bucket/prefix/*.tar)")
    store = open_storage(root)
    rest = text[len(root):].lstrip("/")
    for rel in store.glob(rest):
        yield store.uri_of(rel)


def duckdb_connect_for(uri: str | os.PathLike, con=None):
    """A DuckDB connection that reads `uri`'s store: local paths as they are; object stores through
    this layer registered as an fsspec file system (DuckDB's httpfs is not used: see docs/storage.md).
    Then `read_parquet('s3://bucket/run/catalog/*.parquet')` works as a local glob does."""
    import duckdb
    store = open_storage(uri)
    con = con if con is not None else duckdb.connect()
    if not isinstance(store, LocalStorage) and store.scheme not in con.list_filesystems():
        con.register_filesystem(store.fsspec())  # one per scheme: the file system is not per bucket
    return con


# one file named by a URI or path, and run roots (catalog/storage_paths.py)
from .storage_paths import (exists_at, is_uri, join, locate, read_json_at, read_schema_at,  # noqa: E402,F401
                            read_table_at, run_root, storage_for, write_bytes_at, write_json_at, write_parquet_at)
