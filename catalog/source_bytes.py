"""Read a sample's original bytes back from its `source_uri`.

A source_uri is one of
    /data/crawl/img_001.jpg                    a local file
    s3://bucket/crawl/img_001.jpg              anything catalog/storage opens
    /data/crawl-00017.tar#0001234.jpg          a member of an input tar (local or URI tar)

Tars are read with the bounded reader (catalog/tars.py), never `tarfile`. A plain tar's members are
found through a per-tar index of member offsets, built once per tar from its headers and cached,
so reading many thumbnails from one tar does not rescan it; a compressed tar (.tar.gz, .tgz,
.tar.bz2, .tar.xz) is decompressed as a stream up to the member.
"""
from __future__ import annotations

import bz2
import gzip
import io
import lzma
import re
from functools import lru_cache

from catalog.storage import is_uri, open_input
from catalog.tars import ShardTruncated, iter_tar, split_member

# the tar part ends at the first '.tar#' (or a compressed tar's suffix); member names may hold '#'
_TAR_URI = re.compile(r"^(?P<tar>.+?\.(?:tar|tar\.gz|tgz|tar\.bz2|tbz2|tar\.xz|txz))#(?P<member>.+)$", re.I)
_DECOMPRESS = ((b"\x1f\x8b", lambda fh: gzip.GzipFile(fileobj=fh)), (b"BZh", bz2.BZ2File),
               (b"\xfd7zXZ", lzma.LZMAFile))  # magic bytes -> a decompressing reader of a file object


def split_source_uri(uri: str) -> tuple[str, str | None]:
    """('path or URI of the file', 'member name' or None when the source is a plain file)."""
    m = _TAR_URI.match(uri)
    return (m["tar"], m["member"]) if m else (uri, None)


@lru_cache(maxsize=64)
def _tar_members(tar: str) -> dict[str, tuple[int, int]]:
    """member name -> (data offset, size) of an uncompressed tar; reads headers only.

    A damaged tar keeps the members before the damage readable, as the curation did.
    """
    found = {}
    with open_input(tar) as raw:
        # a large read buffer turns header-seek-header into one request per MiB on object stores
        fh = io.BufferedReader(raw, buffer_size=1 << 20) if is_uri(tar) else raw
        try:  # a cap of 0 bytes reads headers only, whatever a size field claims
            for rec in iter_tar(fh, name=tar, max_member_bytes=0):
                for name, offset, size in rec.members:
                    found[name] = (offset, size)
        except ShardTruncated:
            if not found:
                raise
    return found


class _Stream:
    """A decompressing file read start to end only: iter_tar must not seek it to learn its size."""

    def __init__(self, fh):
        self.read = fh.read


def _read_compressed_member(tar: str, member: str) -> bytes:
    """One member of a compressed tar, decompressed as a stream up to it. Only members with its
    extension are read (one at a time); the others are skipped unread."""
    ext = split_member(member)[1]
    with open_input(tar) as raw:
        fh = io.BufferedReader(raw, buffer_size=1 << 20) if is_uri(tar) else raw
        magic = fh.peek(6)[:6]
        opener = next((o for m, o in _DECOMPRESS if magic.startswith(m)), None)
        stream = opener(fh) if opener else fh
        try:
            for rec in iter_tar(_Stream(stream), name=tar, image_exts=(ext,), max_sidecar_bytes=0):
                for (name, _, _), data in zip(rec.members, rec.files.values()):
                    if name == member:
                        return data
        except ShardTruncated as e:
            raise FileNotFoundError(f"{tar}: no member {member!r} before the damage ({e})") from e
    raise FileNotFoundError(f"{tar}: no member {member!r} (source {tar}#{member})")


def read_source(uri: str) -> bytes:
    """The original bytes behind a catalog row's source_uri.

    Raises FileNotFoundError naming the uri when the file or tar member is gone.
    """
    path, member = split_source_uri(uri)
    try:
        if member is None:
            with open_input(path) as fh:
                return fh.read()
        if not path.lower().endswith(".tar"):
            return _read_compressed_member(path, member)
        offsets = _tar_members(path)
        if member not in offsets:
            raise FileNotFoundError(f"{path}: no member {member!r} (source {uri})")
        offset, size = offsets[member]
        with open_input(path) as fh:
            fh.seek(offset)
            data = fh.read(size)
        if len(data) != size:
            raise FileNotFoundError(f"{uri}: tar ends inside this member ({len(data)} of {size} bytes)")
        return data
    except FileNotFoundError:
        raise
    except (OSError, ShardTruncated) as e:
        raise FileNotFoundError(f"{uri}: cannot read the source ({e})") from e
