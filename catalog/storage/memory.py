"""memory:// for catalog/storage/__init__.py: fsspec's in-process memory file system, shared by every Storage
of this process (unit tests). Its conditional writes are exact: one process lock guards them all."""
from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Iterator

import pyarrow.fs as pafs

from catalog.storage.base import Storage
from catalog.storage.core import Entry, split_uri

_MEM_LOCK = threading.Lock()
_MEM_TAGS: dict[str, tuple[str, float]] = {}


class MemoryStorage(Storage):
    """fsspec's in-process memory file system (shared by every Storage of this process): unit tests."""
    scheme = "memory"

    def __init__(self, uri: str, mfs, base: str):
        super().__init__(uri, pafs.PyFileSystem(pafs.FSSpecHandler(mfs)), base)
        self.mfs = mfs

    @classmethod
    def from_uri(cls, uri: str) -> "MemoryStorage":
        """memory://NAME/path: a folder of the process's memory file system."""
        from fsspec.implementations.memory import MemoryFileSystem
        parts = split_uri(uri)
        if parts.scheme.lower() != "memory":
            raise ValueError(f"{uri}: not a memory:// URI")
        base = "/" + (parts.netloc + parts.path).strip("/")
        return cls(f"memory://{base.lstrip('/')}", MemoryFileSystem(), base)

    def _under(self, raw: str) -> Iterator[Entry]:
        folder = raw.rsplit("/", 1)[0] if "/" in raw else ""
        cut = len(self.base) + 1
        found = self.mfs.find(self.fs_path(folder), detail=True) if self.mfs.exists(self.fs_path(folder)) else {}
        for p, info in sorted(found.items()):
            p = "/" + p.lstrip("/")
            if info["type"] == "file" and p[cut:].startswith(raw):
                yield Entry(p[cut:], info["size"])

    def _put_tagged(self, path: str, data: bytes) -> str:
        tag = hashlib.md5(data + uuid.uuid4().bytes).hexdigest()
        self.mfs.pipe_file(self.fs_path(path), data)
        _MEM_TAGS[self.fs_path(path)] = (tag, time.time())
        return tag

    def _create(self, path: str, data: bytes) -> str | None:
        with _MEM_LOCK:
            return None if self.mfs.exists(self.fs_path(path)) else self._put_tagged(path, data)

    def _stat(self, path: str):
        with _MEM_LOCK:
            if not self.mfs.exists(self.fs_path(path)):
                return None
            tag, when = _MEM_TAGS.get(self.fs_path(path), ("untagged", time.time()))
            return tag, time.time() - when

    def _replace_if(self, path: str, data: bytes, tag: str) -> str | None:
        with _MEM_LOCK:
            now = _MEM_TAGS.get(self.fs_path(path))
            return self._put_tagged(path, data) if now and now[0] == tag else None

    def _delete_if(self, path: str, tag: str) -> bool:
        with _MEM_LOCK:
            now = _MEM_TAGS.get(self.fs_path(path))
            if not now or now[0] != tag:
                return False
            self.mfs.rm_file(self.fs_path(path))
            del _MEM_TAGS[self.fs_path(path)]
            return True

    def fsspec(self):
        return self.mfs
