"""humanset's data contract: schemas, the shard format, atomic writers and DuckDB views.

Imports nothing else of humanset; pipeline/, render/ and training/ build on it.
"""
from .duck import connect
from .io import atomic_path, clean_tmp, read_json, write_bytes, write_json, write_parquet
from .schema import (CURATED_INDEX, FRAMES, HDRIS, SAMPLES, SCANS, SCHEMA_VERSION, SCHEMAS,
                     conform)
from .shards import (ShardTruncated, ShardWriter, TarRecord, index_path, iter_tar, list_shards,
                     read_index, read_member, split_member, unsafe_member)

__all__ = [
    "connect", "atomic_path", "clean_tmp", "read_json", "write_bytes", "write_json", "write_parquet",
    "CURATED_INDEX", "FRAMES", "HDRIS", "SAMPLES", "SCANS", "SCHEMA_VERSION", "SCHEMAS", "conform",
    "ShardTruncated", "ShardWriter", "TarRecord", "index_path", "iter_tar", "list_shards", "read_index",
    "read_member", "split_member", "unsafe_member",
]
