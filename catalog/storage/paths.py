"""Files named by a URI or a local path, over catalog/storage/factory.py: what pipeline/ passes around.

`storage_for(uri)` keeps one Storage per URI per process (a worker opens each bucket's client once);
`locate(uri)` splits a file's URI into its folder's Storage and its name; the `*_at` helpers read and
write one file so named (local: the atomic writers; object stores: whole objects); `join` builds
`root/part` for either (a pathlib.Path would fold `s3://`); `run_root` is a RUN's canonical name, `absolute` what a run records of a path the user gave.
`is_uri` and `local_path` are the one test of "local or not" and the one way from `file://` to a
path; `open_input` is the one way to open a file named by either for reading.
"""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

from catalog.storage.answers import GaveUp, StoreRefused
from catalog.storage.base import Storage
from catalog.storage.core import scrub
from catalog.storage.factory import open_storage


def is_uri(text: str | os.PathLike) -> bool:
    """True for a URI of an object store or memory:// (file:// and plain paths are local)."""
    text = os.fspath(text)
    return "://" in text and not text.startswith("file://")


def local_path(text: str | os.PathLike) -> str:
    """The path of a local file: a plain path as it is, a file:// URI without its scheme."""
    return os.fspath(text).removeprefix("file://")


def open_input(uri_or_path: str | os.PathLike, buffer_size: int | None = None):
    """A binary file for reading what a local path or a URI names (a context manager).

    Without `buffer_size`: random access (seek, read; on a store also read_at(n, offset) and size(),
    each read one ranged request). With it: a sequential stream that reads `buffer_size` bytes a
    request on a store (a shard read start to end in a few large GETs). Local files are plain
    `open(path, "rb")` either way. A missing file raises FileNotFoundError naming the URI."""
    text = os.fspath(uri_or_path)
    if not is_uri(text):
        return open(local_path(text), "rb")
    store, name = locate(text)
    if buffer_size is None:
        return store.open_input(name)
    try:  # Storage.open_stream: the bytes as stored; on S3 one streamed GET resumed where a fault cuts it
        # (catalog/storage/objectfile.py), a store that refuses or keeps failing raised as it is
        return store.open_stream(name, buffer_size=buffer_size)
    except FileNotFoundError:
        raise FileNotFoundError(f"{text}: no such file") from None
    except (StoreRefused, GaveUp):
        raise
    except OSError as e:
        raise OSError(f"{text}: cannot open: {scrub(str(e))}") from None


_OPEN: dict[str, Storage] = {}


def storage_for(uri_or_path: str | os.PathLike) -> Storage:
    """open_storage, kept per process for URIs (a worker opens each bucket's client once)."""
    text = os.fspath(uri_or_path)
    if not is_uri(text):
        return open_storage(text)
    store = _OPEN.get(text)
    if store is None:
        if len(_OPEN) > 256:
            _OPEN.clear()
        store = _OPEN[text] = open_storage(text)
    return store


def locate(uri_or_path: str | os.PathLike) -> tuple[Storage, str]:
    """(the Storage of a file's folder, the file's name): how one file of a URI or path is opened."""
    text = local_path(uri_or_path)
    folder, _, name = text.rstrip("/").rpartition("/")
    if not name:
        raise ValueError(f"{text}: names no file")
    if folder.endswith(":/"):  # s3://bucket (no key part)
        raise ValueError(f"{text}: names a bucket, not a file")
    if not folder:
        folder = "/" if text.startswith("/") else "."
    return storage_for(folder), name


def join(root: str | os.PathLike, *parts: str) -> str:
    """`root/part/...` for a local folder or a URI (a string: a pathlib.Path would fold `s3://`)."""
    text = os.fspath(root).rstrip("/")
    return "/".join([text, *(p.strip("/") for p in parts if p)])


# one file named by a URI or path (what pipeline/ passes around for files of a RUN)
def write_parquet_at(uri, table: pa.Table) -> None:
    store, name = locate(uri)
    store.write_parquet(name, table)


def write_bytes_at(uri, data: bytes) -> None:
    store, name = locate(uri)
    store.write_bytes(name, data)


def write_json_at(uri, obj) -> None:
    store, name = locate(uri)
    store.write_json(name, obj)


def read_json_at(uri):
    store, name = locate(uri)
    return store.read_json(name)


def exists_at(uri) -> bool:
    store, name = locate(uri)
    return store.exists(name)


def read_table_at(uri, **kw) -> pa.Table:
    store, name = locate(uri)
    try:
        return pq.read_table(store.fs_path(name), filesystem=store.fs, **kw)
    except FileNotFoundError:
        raise FileNotFoundError(f"{store.uri_of(name)}: no such file") from None


def read_schema_at(uri) -> pa.Schema:
    store, name = locate(uri)
    with store.open_input(name) as f:
        return pq.read_schema(f)


def run_root(output: str | os.PathLike) -> str:
    """A run folder's canonical name: an absolute local path, or the URI without a trailing '/'."""
    text = os.fspath(output)
    if is_uri(text):
        return open_storage(text).uri
    return os.path.abspath(os.path.expanduser(local_path(text)))


def absolute(path_or_uri: str | os.PathLike) -> str:
    """What a run records of a path the user gave: a URI as it is (a trailing `/` kept: it means a
    prefix), a local path made absolute and normal (`~` expanded, `crawl/` and `crawl` alike), so the
    record works from any directory. Special words (`anny`, `builtin`) are the caller's to keep."""
    text = os.fspath(path_or_uri)
    if not text or is_uri(text) or text.startswith("file://"):
        return text
    return os.path.abspath(os.path.expanduser(text))
