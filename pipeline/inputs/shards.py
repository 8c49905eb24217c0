"""Shard inputs at crawl scale: the shards a prefix, a pattern, a list (.txt) or a shard manifest
names, each streamed one shard URI at a time (pipeline/inputs/kinds.py decides which an --input is).

Local or on any store catalog/storage/__init__.py opens (s3://, gs://, hdfs://, memory://):
  - a prefix: `s3://bucket/crawl/` (or a URI that is no file): every `.tar` under it, listed page by
    page, in key order;
  - a pattern, as webdataset users write them: `s3://bucket/crawl/{00000..09999}.tar` (brace lists
    and ranges expand lazily, one name at a time, no request per name) or `.../*.tar`, `**`;
  - a `.txt` with one shard URI (or path, relative to the .txt's folder) per line; blank lines and
    lines starting with `#` are skipped;
  - a Parquet file with a `shard` column (one shard URI or relative path per row).
So the listing streams into RUN/units.jsonl and no list of every shard is ever held. A `.tar` name
in any of them is a unit; other names under a prefix (the shards' own `.parquet` indexes, `.json`
stats of img2dataset) are not inputs and are passed over.
"""
from __future__ import annotations

import os
from typing import Iterator

from catalog.storage import expand, is_uri, local_path, locate, storage_for

from pipeline.inputs.manifests import open_parquet

SHARD_COLUMN = "shard"
LIST_BUFFER = 1 << 20  # bytes per read of a .txt list of shards


def join(base: str, name: str) -> str:
    """A shard named in a list: a URI or an absolute path as is, else relative to the list's folder."""
    if "://" in name or name.startswith("/"):
        return name
    return f"{base.rstrip('/')}/{name}" if is_uri(base) else os.path.normpath(os.path.join(base, name))


def _folder(uri: str) -> str:
    """The folder of a list of shards: what the relative names in it are relative to."""
    return os.path.dirname(local_path(uri))


class Listed(str):
    """A shard's URI that carries its size in bytes as the store's listing gave it (the engine packs
    small shards into one task by it; no request per shard to learn it)."""
    size: int = 0


def prefix_shards(uri: str) -> Iterator[str]:
    store = storage_for(uri.rstrip("/"))
    for e in store.list(suffix=".tar"):
        listed = Listed(store.uri_of(e.path))
        listed.size = int(e.size or 0)
        yield listed


def pattern_shards(pattern: str) -> Iterator[str]:
    for uri in expand(pattern):
        if uri.endswith(".tar"):
            yield uri


def txt_shards(uri: str) -> Iterator[str]:
    """The shards a .txt lists, streamed a line at a time (Storage.open_stream: on S3 obstore's
    reader, so a driver that lists never builds pyarrow's S3 client)."""
    base = _folder(uri)
    store, name = locate(uri)
    with store.open_stream(name, LIST_BUFFER) as fh:
        rest = b""
        while True:
            chunk = fh.read(LIST_BUFFER)
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop() if chunk else b""
            for raw in lines:
                line = raw.decode("utf-8", "replace").strip()
                if line and not line.startswith("#"):
                    yield join(base, line)
            if not chunk:
                return


def is_shard_manifest(names: list[str]) -> bool:
    """A Parquet schema with a `shard` column that is no shard's own index (those have `members`)."""
    return SHARD_COLUMN in names and "members" not in names


def manifest_shards(uri: str) -> Iterator[str]:
    base = _folder(uri)
    with open_parquet(uri) as pf:
        for b in pf.iter_batches(batch_size=4096, columns=[SHARD_COLUMN]):
            for x in b.column(0).to_pylist():
                if isinstance(x, str) and x.strip():
                    yield join(base, x.strip())
