"""The base classes of the storage layer (catalog/storage/__init__.py is the facade): `Storage`, over any
pyarrow file system (gs://, hdfs://; the backends of catalog/storage/memory.py and s3.py
subclass it), and `LocalStorage` (temp + fsync + rename writes, create_once by link(2), the run lock
by flock). Each class reopens itself from a URI (`from_uri`); a pickled Storage is its class and
its URI, so no client or secret travels (catalog/storage/factory.py dispatches a URI to its class).
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

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from catalog.storage import globs
from catalog import io as cio
from catalog.storage.core import (ConditionalWritesUnsupported, Entry, StorageError, clean_rel, is_local_scheme,
                                  remote_parts, scrub, split_uri)
from catalog.storage.lock import LEASE_S, Held, object_run_lock

SPOOL_BYTES = 64 << 20  # open_output on object stores keeps this much in memory, then spills to a temp file
PYARROW_SCHEMES = ("gs", "gcs", "hdfs")  # the stores a plain Storage opens through pyarrow.fs


class Storage:
    """A folder or object-store prefix; see catalog/storage/__init__.py. Build one with open_storage()."""
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
        return type(self).from_uri, (self.uri,)  # standard credential chain; no client or secret is pickled

    @classmethod
    def from_uri(cls, uri: str) -> "Storage":
        """The store pyarrow.fs opens for a gs://, gcs:// or hdfs:// URI."""
        parts = remote_parts(uri)
        scheme = parts.scheme.lower()
        if scheme not in PYARROW_SCHEMES:
            raise ValueError(f"{uri}: a plain Storage opens {', '.join(s + '://' for s in PYARROW_SCHEMES)} only")
        try:
            fs, base = pafs.FileSystem.from_uri(f"{scheme}://{parts.netloc}/")
        except (OSError, pa.ArrowException) as e:
            raise StorageError(f"{scheme}://{parts.netloc}: cannot open: {scrub(str(e))}") from None
        key = parts.path.strip("/")
        base = (base.rstrip("/") + "/" + key).rstrip("/") if key else base.rstrip("/")
        store = cls(f"{scheme}://{parts.netloc}/{key}".rstrip("/"), fs, base)
        store.scheme = scheme
        return store

    # paths
    def fs_path(self, path: str = "") -> str:
        """The path to hand to pyarrow (`filesystem=storage.fs`) and Ray Data for `path`."""
        rel = clean_rel(path)
        return f"{self.base}/{rel}" if rel else self.base

    def uri_of(self, path: str = "") -> str:
        rel = clean_rel(path)
        return f"{self.uri}/{rel}" if rel else self.uri

    def child(self, path: str) -> "Storage":
        rel = clean_rel(path)
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
        """A sequential reader (read, readline; a context manager), `buffer_size` bytes a request; the
        bytes as stored (pyarrow's default would decompress a name ending in .gz, .bz2, ...)."""
        try:
            return io.BufferedReader(self.fs.open_input_stream(self.fs_path(path), compression=None,
                                                               buffer_size=buffer_size))
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
                # the bytes as given: pyarrow's default would compress a name ending in .gz, .bz2, ...
                with self.fs.open_output_stream(self.fs_path(path), compression=None) as out:
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
        rel = clean_rel(prefix)
        for entry in self._under(rel + "/" if rel else ""):
            if suffix is None or entry.path.endswith(suffix):
                yield entry

    def glob(self, pattern: str) -> Iterator[str]:
        """Relative paths matching `pattern`: brace lists/ranges expand lazily, without a request per
        name (as webdataset does: a missing shard fails when it is read); `*`, `?`, `[..]` and `**`
        match existing files, from one listing of the pattern's literal prefix."""
        for one in globs.braceexpand(pattern):
            one = clean_rel(one)
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
    def run_lock(self, force: bool = False, lease_s: float = LEASE_S, heartbeat_s: float | None = None):
        """Exclusive lock on this run folder; see catalog/storage/lock.py."""
        with object_run_lock(self, force=force, lease_s=lease_s, heartbeat_s=heartbeat_s) as handle:
            yield handle

    def fsspec(self):
        """An fsspec file system over this store (what DuckDB's register_filesystem takes)."""
        from fsspec.implementations.arrow import ArrowFSWrapper

        class _Wrapped(ArrowFSWrapper):
            protocol = (self.scheme,)
            # not in fsspec's instance cache: its fork hook clears that cache in every forked child
            # (a DataLoader worker), dropping our store's client there, whose threads did not fork:
            # the child hangs. The caller (a DuckDB connection) holds the instance for its lifetime.
            cachable = False
        return _Wrapped(self.fs)


class LocalStorage(Storage):
    posix = True

    @classmethod
    def from_uri(cls, uri: str) -> "LocalStorage":
        """A local path or a file:///abs/path URI; the root is the absolute path."""
        text = os.fspath(uri)
        parts = split_uri(text)
        scheme = parts.scheme.lower()
        if not is_local_scheme(scheme):
            raise ValueError(f"{text}: not a local path or file:// URI")
        if scheme == "file" and parts.netloc not in ("", "localhost"):
            raise ValueError(f"{text}: file:// URIs name a local path (file:///abs/path)")
        local = os.path.abspath(os.path.expanduser(parts.path if scheme == "file" else text))
        return cls("file://" + local if scheme == "file" else local, pafs.LocalFileSystem(), local)

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
    def run_lock(self, force: bool = False, lease_s: float = LEASE_S, heartbeat_s: float | None = None):
        """flock on ROOT/.lock (catalog/io.py): dies with its process, so nothing is ever stale."""
        with cio.run_lock(self.base):
            yield Held(self.uri_of(".lock"))
