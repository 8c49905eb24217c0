"""Atomic writers: write to a temporary name in the same folder, then rename into place.

A crash leaves at most a `*.tmp-*` file, never a half file under the final name.
"""
from __future__ import annotations

import json
import os
import uuid
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def tmp_name(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path; on success fsync and rename it to `path`, on error remove it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(path)
    try:
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_bytes(path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(data)


def write_json(path, obj) -> None:
    write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())


def write_parquet(path, table: pa.Table) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def read_json(path):
    return json.loads(Path(path).read_text())


def clean_tmp(folder: str | os.PathLike) -> int:
    """Remove temporary files a crashed writer left in `folder` (recursively); return how many."""
    n = 0
    for p in Path(folder).rglob(".*.tmp-*"):
        p.unlink(missing_ok=True)
        n += 1
    return n
