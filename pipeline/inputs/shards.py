"""Shard inputs at crawl scale: a prefix, a pattern, a list of shards (.txt) or a shard manifest.

`--input` names shards in any of these forms, local or on any store catalog/storage/__init__.py opens
(s3://, gs://, hdfs://, memory://):
  - a prefix: `s3://bucket/crawl/` (or a URI that is no file: every `.tar` under it, listed page by
    page, in key order);
  - a pattern, as webdataset users write them: `s3://bucket/crawl/{00000..09999}.tar` (brace lists
    and ranges expand lazily, one name at a time, no request per name) or `.../*.tar`, `**`;
  - a `.txt` with one shard URI (or path, relative to the .txt's folder) per line; blank lines and
    lines starting with `#` are skipped;
  - a Parquet file with a `shard` column (one shard URI or relative path per row).
Each yields `("tar", uri)` pairs one at a time, so the listing streams into RUN/units.jsonl and no
list of every shard is ever held. A `.tar` name in any of them is a unit; other names under a prefix
(the shards' own `.parquet` indexes, `.json` stats of img2dataset) are not inputs and are passed over.
"""
from __future__ import annotations

import os
from typing import Iterator

import pyarrow.parquet as pq

from catalog.storage import globs
from catalog.storage import is_uri, locate, storage_for

SHARD_COLUMN = "shard"


class ShardInputError(Exception):
    """An input that names no usable shard (sources.InputError wraps it with the input's name)."""


def is_pattern(text: str) -> bool:
    return "{" in text or globs.has_wildcard(text)


def is_prefix(text: str) -> bool:
    """A remote input that is a folder of shards: ends with '/', or has no file suffix we read."""
    if not is_uri(text) or is_pattern(text):
        return False
    return text.endswith("/") or not text.rsplit("/", 1)[-1].endswith((".tar", ".parquet", ".txt"))


def join(base: str, name: str) -> str:
    """A shard named in a list: a URI or an absolute path as is, else relative to the list's folder."""
    if "://" in name or name.startswith("/"):
        return name
    return f"{base.rstrip('/')}/{name}" if is_uri(base) else os.path.normpath(os.path.join(base, name))


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
    from catalog.storage import expand
    for uri in expand(pattern):
        if uri.endswith(".tar"):
            yield uri


def txt_shards(uri: str) -> Iterator[str]:
    """The shards a .txt lists, streamed a line at a time."""
    store, name = locate(uri)
    base = uri.removeprefix("file://").rsplit("/", 1)[0]
    with store.open_stream(name, 1 << 20) as fh:
        rest = b""
        while True:
            chunk = fh.read(1 << 20)
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop() if chunk else b""
            for raw in lines:
                line = raw.decode("utf-8", "replace").strip()
                if line and not line.startswith("#"):
                    yield join(base, line)
            if not chunk:
                return


def open_parquet(uri: str) -> pq.ParquetFile:
    store, name = locate(uri)
    return pq.ParquetFile(store.open_input(name))


def is_shard_manifest(uri: str) -> bool:
    """A Parquet with a `shard` column that is no shard's own index (those have `members`)."""
    names = open_parquet(uri).schema_arrow.names
    return SHARD_COLUMN in names and "members" not in names


def manifest_shards(uri: str) -> Iterator[str]:
    base = uri.removeprefix("file://").rsplit("/", 1)[0]
    for b in open_parquet(uri).iter_batches(batch_size=4096, columns=[SHARD_COLUMN]):
        for x in b.column(0).to_pylist():
            if isinstance(x, str) and x.strip():
                yield join(base, x.strip())


def shards_of(inp: str, literal: bool = False) -> Iterator[str] | None:
    """The shards one --input names when it is a prefix, pattern, .txt or shard manifest; None when
    it is none of these (a local folder, a single .tar, a manifest of image files). `literal`: the
    input is an existing file (never read as a pattern)."""
    if not literal and is_pattern(inp):
        return pattern_shards(inp)
    if not literal and is_prefix(inp):
        return prefix_shards(inp)
    if inp.endswith(".txt"):
        return txt_shards(inp)
    if inp.endswith(".parquet") and is_shard_manifest(inp):
        return manifest_shards(inp)
    return None


def first_or_refuse(inp: str, shards: Iterator[str]) -> None:
    """Refuse an input that names no shard at all (looks at its first entry only)."""
    if next(iter(shards), None) is None:
        what = ("no file matches this pattern" if is_pattern(inp) else "no .tar shard under this prefix"
                if is_prefix(inp) else "lists no shard")
        raise ShardInputError(f"--input {inp}: {what}; check the URI (a prefix ends with '/', a pattern "
                              "uses {00000..00099} or *, a .txt has one shard URI a line)")
