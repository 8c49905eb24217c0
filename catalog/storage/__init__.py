"""One storage layer for local folders and object stores: `open_storage(uri_or_path)` -> Storage.

A Storage is rooted at a folder or URI (`/data/run`, `file:///data/run`, `s3://bucket/runs/r1`,
`gs://bucket/x`, `hdfs://namenode:8020/x`, `memory://name/x` for tests); every method takes a path
relative to that root ("units/00001.json", never absolute, never with ".."). Data moves through
pyarrow.fs; on S3 through obstore, with pyarrow's S3 client built only when `.fs` is asked for
(catalog/storage/s3.py). Credentials: the standard AWS chain; endpoint: `AWS_ENDPOINT_URL`.

- Local: writes are temp + fsync + rename (catalog/io.py), create_once is link(2), the run lock is
  flock (io.run_lock).
- Object stores: an object appears whole or not at all (open_output uploads only if its block
  succeeds), so a failed writer leaves nothing under the final name. Names are deterministic: a
  retried task rewrites the same object.

Requests to an object store go through one retry policy (catalog/storage/retry.py, the
`storage.retry_*` settings; what an answer means: answers.py): transient answers are retried with
backoff, cut reads resume from the byte reached (objectfile.py), writes survive a lost answer, a
permanent refusal is one line (StoreRefused).

The modules, each importing only those above it (no module imports this facade):
core.py (errors, Entry, scrub, path and URI checks) -> answers.py -> retry.py -> objectfile.py,
lock.py (the run lock on object stores) -> base.py (Storage, LocalStorage; globs.py: shard patterns)
-> memory.py, s3.py (the backends; arrowfs.py: the pyarrow file system over a backend's requests)
-> factory.py (open_storage, expand, duckdb_connect_for) -> paths.py (files named by a URI, run
roots, open_input). Import from here: `from catalog.storage import open_storage, ...`.
"""
from catalog.storage.answers import GaveUp, StoreRefused
from catalog.storage.base import SPOOL_BYTES, LocalStorage, Storage
from catalog.storage.core import ConditionalWritesUnsupported, Entry, StorageError, scrub
from catalog.storage.factory import duckdb_connect_for, expand, open_storage
from catalog.storage.paths import (exists_at, is_uri, join, local_path, locate, open_input, read_json_at,
                                   read_schema_at, read_table_at, run_root, storage_for, write_bytes_at,
                                   write_json_at, write_parquet_at)
from catalog.storage.retry import StorageSettings

__all__ = [
    "GaveUp", "StoreRefused", "StorageSettings",
    "SPOOL_BYTES", "LocalStorage", "Storage", "ConditionalWritesUnsupported", "Entry", "StorageError", "scrub",
    "duckdb_connect_for", "expand", "open_storage", "exists_at", "is_uri", "join", "local_path", "locate", "open_input", "read_json_at",
    "read_schema_at", "read_table_at", "run_root", "storage_for", "write_bytes_at", "write_json_at",
    "write_parquet_at",
]
