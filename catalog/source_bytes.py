"""Read a sample's original bytes back from its `source_uri`.

A source_uri is one of
    /data/crawl/img_001.jpg                    a local file
    s3://bucket/crawl/img_001.jpg              anything pyarrow.fs.FileSystem.from_uri opens
    /data/crawl-00017.tar#0001234.jpg          a member of an input tar (local or URI tar)

Tar members are found through a per-tar index of member offsets, built once per tar and cached,
so reading many thumbnails from one tar does not rescan it.
"""
from __future__ import annotations

import io
import re
import tarfile
from functools import lru_cache

# the tar part ends at the first '.tar#' (or a compressed tar's suffix); member names may hold '#'
_TAR_URI = re.compile(r"^(?P<tar>.+?\.(?:tar|tar\.gz|tgz|tar\.bz2|tbz2|tar\.xz|txz))#(?P<member>.+)$", re.I)


def split_source_uri(uri: str) -> tuple[str, str | None]:
    """('path or URI of the file', 'member name' or None when the source is a plain file)."""
    m = _TAR_URI.match(uri)
    return (m["tar"], m["member"]) if m else (uri, None)


def is_uri(path: str) -> bool:
    return "://" in path


def _open(path: str):
    """A seekable binary file for a local path or a pyarrow-filesystem URI."""
    if is_uri(path) and not path.startswith("file://"):
        from catalog.storage import locate
        store, name = locate(path)  # the storage layer's client, endpoint and retries
        return store.open_input(name)
    return open(path.removeprefix("file://"), "rb")


@lru_cache(maxsize=64)
def _tar_members(tar: str) -> dict[str, tuple[int, int]]:
    """member name -> (data offset, size) of an uncompressed tar; reads headers only.

    A damaged tar keeps the members before the damage readable, as the curation did.
    """
    from catalog.tars import ShardTruncated, iter_tar
    found = {}
    with _open(tar) as raw:
        # a large read buffer turns header-seek-header into one request per MiB on object stores
        fh = io.BufferedReader(raw, buffer_size=1 << 20) if is_uri(tar) else raw
        try:  # the bounded reader: a cap of 0 bytes reads headers only, whatever a size field claims
            for rec in iter_tar(fh, name=tar, max_member_bytes=0):
                for name, offset, size in rec.members:
                    found[name] = (offset, size)
        except ShardTruncated as e:
            if not found:
                raise tarfile.TarError(f"not a readable tar ({e})") from e
    return found


def _read_compressed_member(tar: str, member: str) -> bytes:
    with _open(tar) as fh, tarfile.open(fileobj=fh, mode="r|*") as tf:
        for m in tf:
            if m.name == member and m.isfile():
                return tf.extractfile(m).read()
    raise FileNotFoundError(f"{tar}: no member {member!r} (source {tar}#{member})")


def read_source(uri: str) -> bytes:
    """The original bytes behind a catalog row's source_uri.

    Raises FileNotFoundError naming the uri when the file or tar member is gone.
    """
    path, member = split_source_uri(uri)
    try:
        if member is None:
            with _open(path) as fh:
                return fh.read()
        if not path.lower().endswith(".tar"):
            return _read_compressed_member(path, member)
        offsets = _tar_members(path)
        if member not in offsets:
            raise FileNotFoundError(f"{path}: no member {member!r} (source {uri})")
        offset, size = offsets[member]
        with _open(path) as fh:
            fh.seek(offset)
            data = fh.read(size)
        if len(data) != size:
            raise FileNotFoundError(f"{uri}: tar ends inside this member ({len(data)} of {size} bytes)")
        return data
    except FileNotFoundError:
        raise
    except (OSError, tarfile.TarError) as e:
        raise FileNotFoundError(f"{uri}: cannot read the source ({e})") from e
