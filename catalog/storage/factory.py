"""The storage factory (catalog/storage/__init__.py is the facade): `open_storage(uri_or_path)` dispatches a
path or URI to the Storage class of its scheme (each class opens itself: `from_uri`), `expand` names
the shards a pattern names, `duckdb_connect_for` gives DuckDB a store's file system."""
from __future__ import annotations

import os
from collections.abc import Iterator

from catalog.storage import globs
from catalog.storage.base import PYARROW_SCHEMES, LocalStorage, Storage
from catalog.storage.core import is_local_scheme, remote_parts, split_uri
from catalog.storage.memory import MemoryStorage
from catalog.storage.s3 import S3Storage

_REMOTE: dict[str, type[Storage]] = {"s3": S3Storage, "s3a": S3Storage, **{s: Storage for s in PYARROW_SCHEMES}}


def open_storage(uri_or_path: str | os.PathLike) -> Storage:
    """The Storage rooted at a local path or a URI (file://, memory://, s3://, gs://, hdfs://)."""
    text = os.fspath(uri_or_path)
    scheme = split_uri(text).scheme.lower()  # refuses credentials in the URI first
    if is_local_scheme(scheme):
        return LocalStorage.from_uri(text)
    if scheme == "memory":
        return MemoryStorage.from_uri(text)
    remote_parts(text)  # a bucket or host is named
    kind = _REMOTE.get(scheme)
    if kind is None:
        raise ValueError(f"{text}: unsupported storage scheme {scheme!r}; use a local path, file://, s3://, "
                         "gs://, hdfs:// or memory://")
    return kind.from_uri(text)


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
