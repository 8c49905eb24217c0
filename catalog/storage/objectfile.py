"""Reads of an object that survive a cut body: a GET whose connection drops mid-body is resumed
from the byte reached with a ranged GET (If-Match on the object's tag, so a changed object is an
error, never a splice), under the storage retry policy (catalog/storage/retry.py).

A backend hands in `open_at(start, end, tag) -> (tag, size, chunks)`: one GET of bytes [start, end)
(end None: to the end), its answer's tag and the object's size, and an iterator over the body. Here:
- `read_all(...)`: the bytes of a range (read_bytes, read_range);
- `ObjectFile`: a random-access file (read_at, read, seek, tell, size; a context manager), one
  ranged GET per read as pyarrow's S3 file does; pyarrow.parquet, tarfile and the shard readers
  take it (`pyarrow.PythonFile` wraps it where a NativeFile is needed);
- `ObjectStream`: a sequential reader over ONE streamed GET of the object (io.RawIOBase; wrap it in
  io.BufferedReader), resumed where it was cut: a shard read front to back costs one request.
"""
from __future__ import annotations

import io
from typing import Callable, Iterator

from catalog.storage import answers, retry

OpenAt = Callable[[int, "int | None", "str | None"], "tuple[str | None, int, Iterator]"]


class _Progress:
    """Bytes received by the current try, so a fault after some of them counts as a resumed read."""

    def __init__(self):
        self.at_try = 0
        self.got = 0

    def fault(self, exc, verdict) -> None:
        if self.got > self.at_try:
            retry.COUNTS.add("resumed_reads")
        self.at_try = self.got


def read_all(open_at: OpenAt, uri: str, start: int = 0, end: int | None = None, tag: str | None = None,
             what: str = "read") -> tuple[bytes, str | None, int]:
    """(the bytes of [start, end), the object's tag, its size), resumed from the byte reached."""
    parts: list = []
    p = _Progress()
    state = {"tag": tag, "size": 0}

    def once():
        lo = start + p.got
        if end is not None and lo >= end:
            return
        got_tag, size, chunks = open_at(lo, end, state["tag"] if p.got else tag)
        state["tag"], state["size"] = state["tag"] or got_tag, size
        for chunk in chunks:
            parts.append(chunk)
            p.got += len(chunk)
        stop = size if end is None else min(end, size)
        if start + p.got < stop:
            raise answers.CutBody(f"{uri}: the body ended at byte {start + p.got} of {stop}")

    retry.attempt(what, uri, once, on_fault=p.fault)
    data = parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else b"".join(parts)
    return bytes(data), state["tag"], state["size"]


class ObjectFile:
    """A random-access file over ranged reads (the NativeFile calls our readers use): `read_range(start,
    end)` is the backend's resumed ranged GET (S3Storage._read with the tag seen at open)."""

    def __init__(self, read_range: Callable[[int, int], bytes], uri: str, size: int):
        self._read_range, self.uri, self._size = read_range, uri, size
        self._pos = 0
        self.closed = False

    def size(self) -> int:
        return self._size

    def read_at(self, nbytes: int, offset: int) -> bytes:
        self._check()
        end = min(self._size, offset + max(0, nbytes))
        if offset >= end:
            return b""
        return self._read_range(offset, end)

    def read(self, nbytes: int = -1) -> bytes:
        end = self._size if nbytes is None or nbytes < 0 else min(self._size, self._pos + nbytes)
        data = self.read_at(end - self._pos, self._pos)
        self._pos += len(data)
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        memoryview(b)[:len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"{self.uri}: seek before the start")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def _check(self) -> None:
        if self.closed:
            raise ValueError(f"{self.uri}: read of a closed file")

    def close(self) -> None:
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ObjectStream(io.RawIOBase):
    """One streamed GET of a whole object, read front to back; a cut body is resumed at the byte
    reached (a ranged GET, If-Match on the tag), so a fault costs one more request, not a re-read."""

    def __init__(self, open_at: OpenAt, uri: str):
        super().__init__()
        self._open_at, self.uri = open_at, uri
        self._tag, self._size, self._pos = None, None, 0
        self._chunks: Iterator | None = None
        self._rest = memoryview(b"")
        self._conn_got = 0  # bytes the current GET delivered: a cut after some is a resumed read
        retry.attempt("read", self.uri, self._connect, on_fault=self._fault)  # a missing object fails
        # here, as opening a local file does

    def _connect(self) -> None:
        tag, size, chunks = self._open_at(self._pos, None, self._tag)
        self._tag, self._size, self._chunks, self._conn_got = self._tag or tag, size, iter(chunks), 0

    def _fault(self, exc, verdict) -> None:
        if self._conn_got:
            retry.COUNTS.add("resumed_reads")
        self._chunks = None

    def readable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._pos

    def readinto(self, b) -> int:
        want = len(b)
        if want == 0 or self._pos >= self._size:
            return 0
        while not len(self._rest):
            data = self._next_chunk()
            if data is None:
                return 0
            self._rest = memoryview(data).cast("B")
        n = min(want, len(self._rest))
        memoryview(b).cast("B")[:n] = self._rest[:n]
        self._rest = self._rest[n:]
        self._pos += n
        return n

    def _next_chunk(self):
        def once():
            if self._chunks is None:  # resumed: a ranged GET from the byte reached
                self._connect()
            try:
                chunk = next(self._chunks)
            except StopIteration:
                if self._pos < self._size:
                    raise answers.CutBody(f"{self.uri}: the body ended at byte {self._pos} of {self._size}") from None
                return None
            self._conn_got += len(chunk)
            return chunk

        return retry.attempt("read", self.uri, once, on_fault=self._fault)

    def close(self) -> None:
        self._chunks = None
        super().close()
