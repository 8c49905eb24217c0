"""A bounded reader of (WebDataset) tar shards: every read is checked against the file before it is made.

Why not `tarfile`: it allocates a pax header or GNU long name of whatever size the header claims,
stops quietly at a cut header, and gives one exception for every kind of damage. This reader parses
USTAR, GNU and pax headers itself (POSIX.1-2001 layout), and
  - checks each header's checksum and size field, and a member's size against the bytes left in the
    file (seekable inputs) before reading it; pax headers and GNU long names over `max_meta_bytes`
    are skipped, never read; data is read whole only up to the caller's caps;
  - reads past zero blocks in the middle and archives appended after the first one's end (like
    `tar --ignore-zeros`): their members are whole samples;
  - counts members that are not regular files (directories, links, devices, fifos, volume labels)
    in `notes` and skips them; a sparse file is a record with `error` (its bytes are not one blob);
  - raises ShardTruncated, after yielding every whole sample before the damage, with `kind`
    not_a_tar (the first header is no tar header), truncated_tar (the file ends too early) or
    corrupt_tar (a later header or the bytes after the archive's end are not a tar header).
Nothing is ever extracted: member names are data (checked by unsafe_member, never a path to write).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator

from catalog.storage.answers import STORE_FAULTS

# the extensions of the image member of a sample, as crawls and curated shards hold them (lower case); the
# default of the curation's input.extensions (pipeline/settings.py), which a run may change
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff")
BLOCK = 512
ZERO = bytes(BLOCK)
MAX_META_BYTES = 1 << 20  # a pax header or GNU long name larger than this is skipped, not read
_CHUNK = 1 << 16
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NOT_SAMPLES = {b"1": "hardlink", b"2": "symlink", b"3": "char_device", b"4": "block_device",
                b"5": "directory", b"6": "fifo", b"V": "volume_label", b"M": "multivolume_part"}
_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ": "xz", b"\x28\xb5\x2f\xfd": "zstd"}


class ShardTruncated(Exception):
    """A tar ended early or is corrupt; raised after every whole sample before the damage was yielded.

    `key` names the sample that was being read when the damage hit (None if between samples);
    `kind` is not_a_tar, truncated_tar or corrupt_tar.
    """

    def __init__(self, message: str, key: str | None = None, kind: str = "corrupt_tar"):
        super().__init__(message)
        self.key, self.kind = key, kind


@dataclass
class TarRecord:
    key: str
    files: dict[str, bytes]  # ext -> bytes
    members: list[tuple[str, int, int]] = field(default_factory=list)  # (name, data offset, size)
    error: str | None = None  # e.g. a member escaping the shard
    skipped: dict[str, int] = field(default_factory=dict)  # ext -> size of members over max_sidecar_bytes


def split_member(name: str) -> tuple[str, str]:
    """WebDataset's split: key = path up to the first dot of the basename, ext = the rest."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext


def unsafe_member(name: str) -> str | None:
    """Why a tar member name escapes its shard or cannot be a key, or None if it is safe."""
    if not name:
        return "empty name"
    if _CONTROL.search(name):
        return "control character (NUL, newline, ...) in the name"
    if name.startswith("/") or name.startswith("\\"):
        return "absolute path"
    if ".." in re.split(r"[/\\]", name):
        return "'..' in path"
    return None


def _why(why: str) -> str:
    return f"escapes the shard ({why})" if why in ("absolute path", "'..' in path") else f"cannot be a key ({why})"


def readable_name(name: str) -> str:
    """A member name as valid text: bytes that are not UTF-8 become backslash escapes, so the name
    is stable, printable and storable."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _name(raw: bytes) -> str:
    return readable_name(raw.decode("utf-8", "surrogateescape"))


class _Reader:
    """Sequential reads with a known position; on a seekable file, skips seek and the size is known."""

    def __init__(self, fh):
        self.fh, self.pos, self.size, self._back = fh, 0, None, b""
        try:
            self.seekable = bool(fh.seekable())
        except (AttributeError, OSError, ValueError):
            self.seekable = False
        if self.seekable:
            start = fh.tell()
            fh.seek(0, 2)
            self.size = fh.tell() - start
            fh.seek(start)
            self._start = start

    def left(self) -> int | None:
        return None if self.size is None else self.size - self.pos

    def read(self, n: int) -> bytes:
        """Up to n bytes (fewer only at the end of the file); n is checked by the caller."""
        out, self._back = self._back[:n], self._back[n:]
        parts = [out]
        got = len(out)
        while got < n:
            b = self.fh.read(min(n - got, _CHUNK) if not self.seekable else n - got)
            if not b:
                break
            parts.append(b)
            got += len(b)
        self.pos += got
        return b"".join(parts) if len(parts) > 1 else parts[0]

    def skip(self, n: int) -> int:
        if self.seekable and not self._back:
            n = min(n, self.left())
            self.fh.seek(self._start + self.pos + n)
            self.pos += n
            return n
        done = 0
        while done < n:
            b = self.read(min(n - done, _CHUNK))
            if not b:
                break
            done += len(b)
        return done

    def skip_zeros(self) -> None:
        """Past a run of zero blocks, to the next block that is not all zeros (or the end)."""
        while True:
            chunk = self.read(_CHUNK)
            if not chunk:
                return
            nz = len(chunk) - len(chunk.lstrip(b"\0"))
            if nz < len(chunk):
                back = nz - nz % BLOCK
                self._back, self.pos = chunk[back:] + self._back, self.pos - (len(chunk) - back)
                return


def _number(field: bytes) -> int | None:
    """A header number: octal text (NUL/space terminated) or GNU base-256; None if malformed."""
    if field[:1] == b"\x80":
        return int.from_bytes(field[1:], "big")
    if field[:1] == b"\xff":
        return None  # negative base-256
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        return None


def _header_problem(buf: bytes) -> str | None:
    stored = _number(buf[148:156])
    plain = buf[:148] + b" " * 8 + buf[156:]
    if stored is None or (stored != sum(plain) and stored != sum(plain) - 256 * sum(b > 127 for b in plain)):
        return "header checksum does not match"  # (the second: old tars summed signed bytes)
    if _number(buf[124:136]) is None:
        return "size field is not a number"
    return None


def _pax(data: bytes) -> dict[str, bytes]:
    """Records 'LEN key=value\\n'; raises ValueError on a malformed one."""
    out, i = {}, 0
    while i < len(data):
        if data[i:].strip(b"\0") == b"":
            break
        sp = data.find(b" ", i, i + 21)
        if sp < 0 or not data[i:sp].isdigit():
            raise ValueError(f"record at byte {i} has no length")
        n = int(data[i:sp])
        rec = data[sp + 1:i + n]
        if n <= sp - i or i + n > len(data) or not rec.endswith(b"\n") or b"=" not in rec:
            raise ValueError(f"record at byte {i} is malformed")
        k, _, v = rec[:-1].partition(b"=")
        out[k.decode("utf-8", "replace")] = v
        i += n
    return out


def iter_tar(fileobj_or_path, *, name: str = "", max_member_bytes: int | None = None,
             max_sidecar_bytes: int | None = None, image_exts=(), max_meta_bytes: int = MAX_META_BYTES,
             notes: Counter | None = None) -> Iterator[TarRecord]:
    """Yield the samples of a WebDataset tar, grouping consecutive members by key.

    Members whose names escape the shard (or hold control characters), members larger than
    `max_member_bytes`, sparse files and members after a malformed or oversized pax / long-name
    header come back as records with `error` set and no bytes (never read into memory). Members
    whose extension is not in `image_exts` and larger than `max_sidecar_bytes` are not read
    (listed in `skipped`). A member whose extension the current record already holds (a repeated
    name) starts a new record with the same key: each occurrence is its own sample. Non-sample
    members and read-past oddities are counted in `notes` (e.g. notes["symlink"], notes["appended_archive"]).
    Damage raises ShardTruncated (see the module docstring) after the whole samples before it.
    """
    label = name or str(fileobj_or_path)
    own = isinstance(fileobj_or_path, (str, bytes)) or hasattr(fileobj_or_path, "__fspath__")
    fh = open(fileobj_or_path, "rb") if own else fileobj_or_path
    notes = notes if notes is not None else Counter()
    image_exts = {e.lower() for e in image_exts}
    current: TarRecord | None = None
    reading: str | None = None  # key whose member data is being read (None while reading headers)
    try:
        r = _Reader(fh)

        def damage(kind: str, why: str):
            nonlocal reading
            if reading is not None and current is not None and current.key == reading and current.files:
                reading = None  # a later member of a sample already read (its sidecar): the sample is kept
            lost = f"; sample {reading!r} was being read" if reading else ""
            return ShardTruncated(f"{label}: {why}{lost}", key=reading, kind=kind)

        def take(size: int, what: str) -> bytes:
            left = r.left()
            if left is not None and size > left:
                raise damage("truncated_tar", f"{what} declares {size} bytes, only {left} are left in the file")
            data = r.read(size)
            if len(data) != size:
                raise damage("truncated_tar", f"{what} cut short ({len(data)} of {size} bytes)")
            return data

        def skip(size: int, what: str):
            if r.skip(size) != size:
                raise damage("truncated_tar", f"{what} cut short")

        pending: dict = {}  # what a pax / long-name header says about the next member
        seen_header, after_end = False, False
        while True:
            at = r.pos
            buf = r.read(BLOCK)
            if not buf:
                if not seen_header and at == 0:
                    raise damage("not_a_tar", "not a tar (0 bytes)")
                if not after_end:
                    raise damage("truncated_tar", "no end-of-archive marker after the last member")
                break
            if len(buf) < BLOCK:
                if not seen_header and at == 0 and buf[257:262] != b"ustar":
                    raise damage("not_a_tar", f"not a tar ({len(buf)} bytes, shorter than one header)")
                raise damage("truncated_tar", f"file ends inside a header at byte {at}")
            if buf == ZERO:
                after_end = True
                r.skip_zeros()
                continue
            problem = _header_problem(buf)
            if problem:
                if not seen_header and at == 0:
                    kind = next((k for m, k in _COMPRESSED.items() if buf.startswith(m)), None)
                    raise damage("not_a_tar", f"a {kind}-compressed file, not a tar; decompress it" if kind
                                 else f"not a tar ({problem} in the first header)")
                where = "after the end-of-archive marker" if after_end else f"at byte {at}"
                if current is not None:
                    yield current
                    current = None
                raise damage("corrupt_tar", f"bytes {where} are not a tar header ({problem})")
            if after_end:
                notes["appended_archive_or_zero_blocks"] += 1
            seen_header, after_end = True, False
            kind, size = buf[156:157], _number(buf[124:136])
            meta = kind in (b"x", b"g", b"L", b"K")
            if not meta:
                size = pending.pop("size", size)
            padded = size + -size % BLOCK
            def check_size(key: str | None = None, size=size, at=at):  # before anything is read or skipped
                nonlocal reading
                if r.left() is not None and size > r.left():
                    reading = key
                    raise damage("truncated_tar", f"header at byte {at} declares {size} bytes, only {r.left()} "
                                 "are left in the file")
            if meta:  # metadata about the next member
                check_size()
                what = {b"x": "pax header", b"g": "global pax header", b"L": "GNU long name", b"K": "GNU long link"}[kind]
                if size > max_meta_bytes:
                    skip(padded, what)
                    pending = {"bad": f"{what} of {size} bytes is over the cap of {max_meta_bytes}; member skipped"}
                    continue
                data = take(size, what)
                skip(padded - size, what)
                if kind == b"L":
                    pending["path"] = data.split(b"\0", 1)[0]
                elif kind == b"x":
                    try:
                        rec = _pax(data)
                    except ValueError as e:
                        pending = {"bad": f"malformed pax header ({e}); member skipped"}
                        continue
                    if "path" in rec:
                        pending["path"] = rec["path"]
                    if "size" in rec:
                        if not rec["size"].isdigit():
                            raise damage("corrupt_tar", f"pax header at byte {at} has a size that is not a number")
                        pending["size"] = int(rec["size"])
                    if any(k.startswith("GNU.sparse") for k in rec):
                        pending["sparse"] = True
                continue
            raw = pending.pop("path", None)
            if raw is None:
                raw = buf[:100].split(b"\0", 1)[0]
                if buf[257:263] == b"ustar\x00" and buf[345:346] != b"\0":  # POSIX: prefix/name
                    raw = buf[345:500].split(b"\0", 1)[0] + b"/" + raw
            mname, bad, sparse = _name(raw), pending.pop("bad", None), pending.pop("sparse", False)
            pending = {}
            check_size(None if kind in _NOT_SAMPLES else split_member(mname)[0])
            if kind in _NOT_SAMPLES:
                notes[_NOT_SAMPLES[kind]] += 1
                skip(padded, f"member {mname!r}")
                continue
            if kind == b"S":  # old GNU sparse: extension headers follow while their last flag is set
                sparse, ext_flag = True, buf[482]
                while ext_flag:
                    ext_flag = take(BLOCK, "GNU sparse header")[504]
            elif kind not in (b"0", b"\0", b"7"):
                notes[f"type_{kind.decode('latin-1')!r}"] += 1
                skip(padded, f"member {mname!r}")
                continue
            why = unsafe_member(mname)
            key, ext = split_member(mname)
            too_big = max_member_bytes is not None and size > max_member_bytes
            error = (f"unsafe member name: member {mname!r} {_why(why)}; skipped" if why else
                     f"bad member header: member {mname!r}: {bad}" if bad else
                     f"unsupported member: member {mname!r} is a sparse file; not read" if sparse else
                     f"too large: member is {size} bytes > the cap of {max_member_bytes}; "
                     f"raise input.max_file_bytes to read it" if too_big else None)
            if error:
                if current is not None:
                    yield current
                    current = None
                yield TarRecord(key=mname if why else key, files={}, error=error, members=[(mname, r.pos, size)])
                skip(padded, f"member {mname!r}")
                continue
            if current is not None and (current.key != key or ext in current.files or ext in current.skipped):
                yield current
                current = None
            if current is None:
                current = TarRecord(key=key, files={})
            offset = r.pos
            if max_sidecar_bytes is not None and size > max_sidecar_bytes and ext.lower() not in image_exts:
                reading = key
                skip(padded, f"member {mname!r}")
                current.skipped[ext] = size
                reading = None
                continue
            reading = key
            current.files[ext] = take(size, f"member {mname!r}")
            reading = None  # the data is whole: damage in the padding loses nothing
            current.members.append((mname, offset, size))
            skip(padded - size, f"member {mname!r}")
        if current is not None:
            yield current
    except ShardTruncated:
        if current is not None and current.key != reading:  # whole before the damage
            yield current
        raise
    except STORE_FAULTS:
        raise  # the store refused or kept failing: not damage to this shard (the unit is redone)
    except OSError as e:  # the file itself failed under us (I/O error): damage at this point
        if current is not None and current.key != reading:
            yield current
        lost = f"; sample {reading!r} was being read" if reading else ""
        raise ShardTruncated(f"{label}: read failed ({type(e).__name__}: {e}){lost}", key=reading,
                             kind="truncated_tar") from e
    finally:
        if own:
            fh.close()
