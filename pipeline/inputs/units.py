"""A unit: the piece of input processed as one (one tar, or a chunk of a folder or manifest), and
the identities every input shares: sample_id = blake2b-96(source_uri), so the same input gives the
same ids; a chunk's id names its position and its content.

What an --input names and how it is cut into units: pipeline/inputs/kinds.py; the listing of a run's
units: pipeline/inputs/listing.py; reading a unit's samples: pipeline/inputs/reading.py.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields
from typing import Iterator


class InputError(Exception):
    """An input the run cannot use at all (missing path, unknown layout): stops before any work."""


def sample_id(source_uri: str) -> str:
    return hashlib.blake2b(source_uri.encode(), digest_size=12).hexdigest()


@dataclass
class Unit:
    """A piece of input processed as one: one tar, or a chunk of a folder or manifest."""
    unit_id: str
    kind: str  # "tar" | "files"
    uri: str  # the tar, the folder or the manifest
    files: list[str] = field(default_factory=list)  # kind "files": sample URIs
    keys: list[str] = field(default_factory=list)  # kind "files": key per file
    root: str = ""  # a folder's files must resolve inside this folder (symlinks may not leave it)
    offset: int = -1  # a unit listed without its files: its line's offset in RUN/units.jsonl
    count: int = 0  # ... and how many sources it has
    errors: dict[str, str] = field(default_factory=dict)  # kind "files": file index -> why it is no source
    error: str = ""  # the listing could not read the rest of this unit's input (a unit-level error)
    bytes: int = 0  # kind "tar": the shard's size when the listing saw it (0: not known); the engine
    # packs small units into one task by it

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}  # asdict would deep-copy the file lists
        if self.offset < 0:  # a listing line: the unit with its files
            del d["offset"], d["count"]
        for k in ("errors", "error", "bytes"):  # written only when set: listings stay as they were
            if not d[k]:
                del d[k]
        return d

    def brief(self) -> "Unit":
        """The unit without its files (what the driver holds and hands to the workers)."""
        return Unit(self.unit_id, self.kind, self.uri, root=self.root, offset=self.offset, count=self.count,
                    error=self.error, bytes=self.bytes)

    @classmethod
    def from_dict(cls, d: dict) -> "Unit":
        return cls(**d)


def unit_sources(u: Unit) -> list[str]:
    return [u.uri] if u.kind == "tar" else u.files


def chunk_id(name: str, i: int, files: list[str]) -> str:
    """A chunk's id names its position and its content, so a listing that changed is never taken
    for the old one."""
    h = hashlib.blake2b("\n".join(files).encode("utf-8", "backslashreplace"), digest_size=4).hexdigest()
    return f"{name}-{i:05d}-{h}"


def chunks(items: Iterator, size: int) -> Iterator[list]:
    chunk = []
    for x in items:
        chunk.append(x)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def stem(uri: str) -> str:
    """A tar's or manifest's name without its folder and without .tar: a unit id's readable part."""
    return uri.rstrip("/").rsplit("/", 1)[-1].removesuffix(".tar")
