"""Inputs of a curation run, cut into units (pipeline/inputs/listing.py lists them, pipeline/inputs/reading.py reads them).

Three kinds of input, each cut into units (the resume and stats granularity):
  - a WebDataset shard `*.tar` (img2dataset style: {key}.jpg, {key}.json, optional {key}.txt, and an
    optional `*.parquet` of the same name beside it), or a folder holding such shards: one unit each;
  - a folder of image files: units of `input.files_per_unit` files in sorted path order;
  - a Parquet manifest (`*.parquet` that is not a shard index) with a column of file paths/URIs
    (`path`, `uri`, `url` or `filepath`; any pyarrow file-system URI): units of that many rows.
Every sample gets sample_id = blake2b-96(source_uri), so the same input gives the same ids.
Listing is streamed (write_listing): the inputs are walked and cut as they go, each unit written out
at once; repeated listings and files added since are found with sorts on disk, in bounded memory.
"""
from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Iterator

import pyarrow.parquet as pq

import catalog
import catalog.storage
from catalog.storage.answers import GaveUp, StoreRefused

from pipeline.inputs import shards as shard_inputs

log = logging.getLogger(__name__)

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff")
MANIFEST_COLUMNS = ("path", "uri", "url", "filepath", "file")


class InputError(Exception):
    """An input the run cannot use at all (missing path, unknown layout): stops before any work."""


def sample_id(source_uri: str) -> str:
    return hashlib.blake2b(source_uri.encode(), digest_size=12).hexdigest()


def is_uri(p: str) -> bool:
    return "://" in p


def open_input(uri: str):
    """Binary input stream for a local path or any URI catalog/storage/__init__.py opens (s3://, gs://,
    hdfs://, memory://): remote reads go through one buffered stream (a few large GETs)."""
    if is_uri(uri) and not uri.startswith("file://"):
        store, name = catalog.storage.locate(uri)
        try:  # S3: one streamed GET, resumed where a fault cuts it (catalog/storage/objectfile.py)
            return store.open_stream(name, buffer_size=READ_BUFFER)
        except FileNotFoundError:
            raise FileNotFoundError(f"{uri}: no such file") from None
        except (StoreRefused, GaveUp):
            raise
        except OSError as e:
            raise OSError(f"{uri}: cannot open: {catalog.storage.scrub(str(e))}") from None
    return open(uri.removeprefix("file://"), "rb")


READ_BUFFER = 8 << 20  # bytes per GET of a remote shard's sequential read


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


def _is_shard_index(path: Path) -> bool:
    return path.suffix == ".parquet" and path.with_suffix(".tar").exists()


def _chunk_id(name: str, i: int, files: list[str]) -> str:
    """A chunk's id names its position and its content, so a listing that changed is never taken
    for the old one."""
    h = hashlib.blake2b("\n".join(files).encode("utf-8", "backslashreplace"), digest_size=4).hexdigest()
    return f"{name}-{i:05d}-{h}"


# --------------------------------------------------------------------------------------------
# Listing, streamed: inputs are walked in a stable order and cut into units as they go, so the
# driver never holds more than one unit's files (plus one directory's names while it sorts them).

def _walk(root: str, exts: tuple[str, ...]) -> Iterator[str]:
    """Paths (relative to root) of the image files under root, in sorted path order, one directory
    at a time (os.scandir, entries sorted by name: depth-first by name is sorted path order; a
    stack, not recursion, so any depth is walked). Symlinks are listed as they are, never followed:
    one that leaves the folder is a row with a read error when read, never a refusal to run."""
    stack = [("", _entries(root, ""))]
    while stack:
        rel, entries = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            continue
        name, is_dir, is_file = entry
        path = f"{rel}/{name}" if rel else name
        if is_dir:
            stack.append((path, _entries(root, path)))
        elif is_file and os.path.splitext(name)[1].lower().lstrip(".") in exts:
            yield path


def _entries(root: str, rel: str) -> Iterator[tuple[str, bool, bool]]:
    """(name, is a directory, is a file or a symlink) of one directory's entries, sorted by name."""
    folder = os.path.join(root, rel) if rel else root
    try:
        with os.scandir(folder) as it:
            return iter(sorted((e.name, e.is_dir(follow_symlinks=False), e.is_symlink() or e.is_file()) for e in it))
    except OSError as e:
        log.warning("%s: cannot list this folder (%s); its files are not in the run", folder, e)
        return iter(())


def chunks(items: Iterator, size: int) -> Iterator[list]:
    chunk = []
    for x in items:
        chunk.append(x)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _folder_units(root: Path, files_per_unit: int, exts: tuple[str, ...]) -> Iterator[Unit]:
    name, base = root.name or "files", str(root)
    for i, keys in enumerate(chunks(_walk(base, exts), files_per_unit)):
        files = [os.path.join(base, k) for k in keys]
        yield Unit(_chunk_id(name, i, files), "files", str(root), files=files, keys=keys, root=str(root))


def _manifest_file(uri: str) -> pq.ParquetFile:
    if is_uri(uri) and not uri.startswith("file://"):
        store, name = catalog.storage.locate(uri)
        return pq.ParquetFile(store.open_input(name))
    return pq.ParquetFile(uri.removeprefix("file://"))


def _manifest_column(uri: str) -> str:
    names = _manifest_file(uri).schema_arrow.names
    col = next((c for c in MANIFEST_COLUMNS if c in names), None)
    if col is None:
        raise InputError(f"--input {uri}: manifest has no column of file paths; expected one of "
                         f"{', '.join(MANIFEST_COLUMNS)} (has {', '.join(names)})")
    return col


MAX_URI_CHARS = 8192  # a manifest value longer than this is no path (a row with reason bad_manifest_row)


def _manifest_value(x, row: int) -> tuple[str | None, str | None]:
    """(path, None) for a usable manifest value, else (None, why it is not one)."""
    if x is None:
        return None, f"bad manifest row: row {row} is null"
    if not isinstance(x, str):
        return None, f"bad manifest row: row {row} is not a string ({type(x).__name__})"
    if not x or len(x) > MAX_URI_CHARS or "\0" in x:
        what = "empty" if not x else "holds a NUL byte" if len(x) <= MAX_URI_CHARS else \
            f"{len(x)} characters long (over {MAX_URI_CHARS})"
        return None, f"bad manifest row: row {row} is {what}"
    return x, None


def _manifest_units(uri: str, files_per_unit: int) -> Iterator[Unit]:
    """A manifest's rows, read a record batch at a time, in units of files_per_unit rows. A row that
    is no path is a source named 'MANIFEST#rowN' whose sample is a read error; a manifest that
    cannot be read to its end gives one last unit with a unit-level error."""
    col = _manifest_column(uri)
    remote = is_uri(uri) and not uri.startswith("file://")
    base = uri.rsplit("/", 1)[0] if remote else str(Path(uri.removeprefix("file://")).parent)
    stem = _stem(uri).removesuffix(".parquet")
    failed: list[str] = []

    def rows():
        try:
            for b in _manifest_file(uri).iter_batches(batch_size=min(files_per_unit, 4096), columns=[col]):
                yield from b.column(0).to_pylist()
        except (StoreRefused, GaveUp):
            raise
        except Exception as e:  # a corrupt row group: the rows before it are listed
            failed.append(f"{uri}: manifest unreadable after the rows listed ({type(e).__name__}: {e})")

    i, start = -1, 0
    for i, chunk in enumerate(chunks(rows(), files_per_unit)):
        resolved, errors = [], {}
        for j, x in enumerate(chunk):
            path, why = _manifest_value(x, start + j)
            if why:
                errors[str(j)] = why
                resolved.append(f"{uri}#row{start + j}")
            else:
                resolved.append(path if is_uri(path) else shard_inputs.join(base, path) if remote
                                else os.path.normpath(os.path.join(base, path)))
        yield Unit(_chunk_id(stem, i, resolved), "files", uri, files=resolved,
                   keys=[str(start + j) for j in range(len(chunk))], errors=errors)
        start += len(chunk)
    if failed:
        where = f"{uri}#unreadable-after-row{start}"
        yield Unit(_chunk_id(stem, i + 1, [where]), "files", uri, files=[where], keys=[where.rpartition("#")[2]],
                   error=failed[0])


def _input_parts(inputs: list[str], exts: tuple[str, ...], check_only: bool = False) -> Iterator[tuple[str, str]]:
    """(kind, uri) of every tar, manifest and image folder the inputs name, in listing order, one
    at a time (a prefix of 10^6 shards is listed page by page, never held).

    Raises InputError naming the input for anything unusable; looks only as far as the first image
    of a folder and the first shard of a prefix, pattern or list. With check_only, only that look."""
    for inp in inputs:
        local = not is_uri(inp) or inp.startswith("file://")
        exists = local and Path(inp.removeprefix("file://")).exists()
        if not exists or (Path(inp.removeprefix("file://")).is_file() and inp.endswith((".txt", ".parquet"))):
            try:
                shards = shard_inputs.shards_of(inp, literal=exists)
                if shards is not None:
                    if check_only:
                        shard_inputs.first_or_refuse(inp, shards)
                    else:
                        yield from (("tar", s) for s in shards)
                    continue
            except shard_inputs.ShardInputError as e:
                raise InputError(str(e)) from None
            except (StoreRefused, GaveUp):
                raise  # the store's own line (its URI, the cause, the fix): exit 3, not a bad --input
            except (OSError, ValueError) as e:
                raise InputError(f"--input {inp}: cannot be listed or read ({catalog.storage.scrub(str(e))}); "
                                 "check the URI and the store's credentials") from None
        if not local:
            if inp.endswith(".tar"):
                yield ("tar", inp)
            elif inp.endswith(".parquet"):
                _manifest_column(inp)
                yield ("manifest", inp)
            else:
                raise InputError(f"--input {inp}: not a shard, a list of shards (.txt) or a manifest (.parquet)")
            continue
        p = Path(inp.removeprefix("file://"))
        if not p.exists():
            raise InputError(f"--input {inp}: no such file or directory; check the path "
                             "(inputs are a folder of images or shards, a .tar shard, a .txt list of shards, "
                             "a pattern such as crawl/{00000..00099}.tar, or a .parquet manifest)")
        if p.is_file():
            if p.suffix == ".tar":
                yield ("tar", str(p.resolve()))
            elif p.suffix == ".parquet":
                _manifest_column(str(p.resolve()))
                yield ("manifest", str(p.resolve()))
            else:
                raise InputError(f"--input {inp}: a single file must be a .tar shard, a .txt list of shards or "
                                 "a .parquet manifest; pass its folder to curate loose images")
            continue
        tars = [("tar", str(t.resolve())) for t in sorted(p.glob("*.tar")) if t.is_file()]
        manifests = [("manifest", str(m.resolve())) for m in sorted(p.glob("*.parquet"))
                     if m.is_file() and not _is_shard_index(m)]
        for _, m in manifests:
            _manifest_column(m)
        has_images = next(_walk(str(p.resolve()), exts), None) is not None
        if not (tars or manifests or has_images):
            raise InputError(f"--input {inp}: no .tar shards, .parquet manifests or images "
                             f"({', '.join(exts)}) found in this folder")
        yield from tars + manifests + ([("folder", str(p.resolve()))] if has_images else [])


def check_inputs(inputs: list[str], exts=IMAGE_EXTS) -> None:
    """Refuse unusable inputs (InputError naming the input) before anything is written."""
    for _ in _input_parts(inputs, tuple(e.lower().lstrip(".") for e in exts), check_only=True):
        pass


def iter_units(inputs: list[str], files_per_unit: int = 1000, exts=IMAGE_EXTS) -> Iterator[Unit]:
    """The inputs' units in listing order, one at a time (before repeated listings are dropped and
    unit ids made unique: write_listing does both)."""
    exts = tuple(e.lower().lstrip(".") for e in exts)
    for kind, uri in _input_parts(inputs, exts):
        if kind == "tar":
            yield Unit(_stem(uri), "tar", str(uri), bytes=getattr(uri, "size", 0) or _size(uri))
        elif kind == "manifest":
            yield from _manifest_units(uri, files_per_unit)
        else:
            yield from _folder_units(Path(uri), files_per_unit, exts)


def _size(uri: str) -> int:
    """A local shard's size in bytes (one stat); 0 for a remote one (a prefix's listing says it)."""
    if is_uri(uri) and not uri.startswith("file://"):
        return 0
    try:
        return os.stat(uri.removeprefix("file://")).st_size
    except OSError:
        return 0


def _stem(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1].removesuffix(".tar")


def unit_sources(u: Unit) -> list[str]:
    return [u.uri] if u.kind == "tar" else u.files
