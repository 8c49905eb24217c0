"""humanset's data contract: schemas, the shard format, atomic writers and DuckDB views.

Imports nothing else of humanset; pipeline/, render/ and training/ build on it.
"""
from catalog.duck import connect
from catalog.io import (RunLocked, atomic_path, clean_tmp, commit_together, read_json, run_lock, write_bytes,
                        write_json, write_parquet)
from catalog.schema import CURATED_INDEX, FRAMES, HDRIS, SAMPLES, SCANS, SCHEMA_VERSION, SCHEMAS, conform
from catalog.tars import ShardTruncated, TarRecord, iter_tar, readable_name, split_member, unsafe_member
from catalog.shards import (ShardWriter, index_path, list_shards, list_shard_names, open_shard_file, read_index,
                            read_member)
from catalog.storage import (ConditionalWritesUnsupported, Entry, Storage, StorageError, duckdb_connect_for, expand,
                             open_storage)

__all__ = [
    "connect", "RunLocked", "run_lock", "atomic_path", "clean_tmp", "commit_together", "read_json", "write_bytes", "write_json", "write_parquet",
    "CURATED_INDEX", "FRAMES", "HDRIS", "SAMPLES", "SCANS", "SCHEMA_VERSION", "SCHEMAS", "conform",
    "ShardTruncated", "ShardWriter", "TarRecord", "index_path", "iter_tar", "list_shards", "list_shard_names",
    "open_shard_file", "read_index",
    "read_member", "readable_name", "split_member", "unsafe_member",
    "ConditionalWritesUnsupported", "Entry", "Storage", "StorageError", "duckdb_connect_for", "expand", "open_storage",
]
