"""Inputs of a curation run, cut into units, and the samples of one unit.

Three kinds of input, each cut into units (the resume and stats granularity):
  - a WebDataset shard `*.tar` (img2dataset style: {key}.jpg, {key}.json, optional {key}.txt, and an
    optional `*.parquet` of the same name beside it), or a folder holding such shards: one unit each;
  - a folder of image files: units of `input.files_per_unit` files in sorted path order;
  - a Parquet manifest (`*.parquet` that is not a shard index) with a column of file paths/URIs
    (`path`, `uri`, `url` or `filepath`; any pyarrow file-system URI): units of that many rows.
Every sample gets sample_id = blake2b-96(source_uri), so the same input gives the same ids.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from catalog import ShardTruncated, iter_tar

log = logging.getLogger(__name__)

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff")
MANIFEST_COLUMNS = ("path", "uri", "url", "filepath", "file")


class InputError(Exception):
    """An input the run cannot use at all (missing path, unknown layout): stops before any work."""


def sample_id(source_uri: str) -> str:
    return hashlib.blake2b(source_uri.encode(), digest_size=12).hexdigest()


def _is_uri(p: str) -> bool:
    return "://" in p


def open_input(uri: str):
    """Binary input stream for a local path or any pyarrow file-system URI (s3://, gs://, hdfs://)."""
    if _is_uri(uri) and not uri.startswith("file://"):
        fs, path = pafs.FileSystem.from_uri(uri)
        return fs.open_input_stream(path)
    return open(uri.removeprefix("file://"), "rb")


@dataclass
class Unit:
    """A piece of input processed as one: one tar, or a chunk of a folder or manifest."""
    unit_id: str
    kind: str  # "tar" | "files"
    uri: str  # the tar, the folder or the manifest
    files: list[str] = field(default_factory=list)  # kind "files": sample URIs
    keys: list[str] = field(default_factory=list)  # kind "files": key per file
    root: str = ""  # a folder's files must resolve inside this folder (symlinks may not leave it)

    def to_dict(self) -> dict:
        return asdict(self)

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


def list_units(inputs: list[str], files_per_unit: int = 1000, exts=IMAGE_EXTS) -> tuple[list[Unit], int]:
    """Cut the inputs into units; also return how many repeated listings were dropped.

    Raises InputError naming the input for anything unusable."""
    exts = tuple(e.lower().lstrip(".") for e in exts)
    units: list[Unit] = []
    for inp in inputs:
        if _is_uri(inp) and not inp.startswith("file://"):
            if inp.endswith(".tar"):
                units.append(Unit(Path(inp).stem, "tar", inp))
            elif inp.endswith(".parquet"):
                units += _manifest_units(inp, files_per_unit)
            else:
                raise InputError(f"--input {inp}: remote inputs must be a .tar shard or a .parquet manifest")
            continue
        p = Path(inp.removeprefix("file://"))
        if not p.exists():
            raise InputError(f"--input {inp}: no such file or directory; check the path "
                             "(inputs are a folder of images or shards, a .tar shard, or a .parquet manifest)")
        if p.is_file():
            if p.suffix == ".tar":
                units.append(Unit(p.stem, "tar", str(p.resolve())))
            elif p.suffix == ".parquet":
                units += _manifest_units(str(p.resolve()), files_per_unit)
            else:
                raise InputError(f"--input {inp}: a single file must be a .tar shard or a .parquet "
                                 "manifest; pass its folder to curate loose images")
            continue
        tars = sorted(t for t in p.glob("*.tar") if t.is_file())
        if tars:
            units += [Unit(t.stem, "tar", str(t.resolve())) for t in tars]
        manifests = [m for m in sorted(p.glob("*.parquet")) if m.is_file() and not _is_shard_index(m)]
        for m in manifests:
            units += _manifest_units(str(m.resolve()), files_per_unit)
        root = p.resolve()
        # symlinks are listed as they are (not resolved): one that leaves the folder becomes a row
        # with a read error when read, never a refusal to run
        loose = sorted(f.relative_to(p) for f in p.rglob("*")
                       if (f.is_file() or f.is_symlink()) and f.suffix.lower().lstrip(".") in exts)
        if loose:
            name = root.name or "files"
            for i in range(0, len(loose), files_per_unit):
                chunk = [str(root / f) for f in loose[i:i + files_per_unit]]
                units.append(Unit(_chunk_id(name, i // files_per_unit, chunk), "files", str(root),
                                  files=chunk, keys=[str(f) for f in loose[i:i + files_per_unit]],
                                  root=str(root)))
        if not (tars or manifests or loose):
            raise InputError(f"--input {inp}: no .tar shards, .parquet manifests or images "
                             f"({', '.join(exts)}) found in this folder")
    units, repeated = _drop_repeats(units)
    # unit ids name files in RUN/: make them unique, keeping the readable stem
    seen: dict[str, int] = {}
    for u in units:
        seen[u.unit_id] = seen.get(u.unit_id, 0) + 1
    for u in units:
        if seen[u.unit_id] > 1:
            u.unit_id = f"{u.unit_id}-{hashlib.blake2b(u.uri.encode(), digest_size=4).hexdigest()}"
    return units, repeated


def _drop_repeats(units: list[Unit]) -> tuple[list[Unit], int]:
    """A source listed twice (same tar, same file) is one sample: keep its first listing."""
    seen: set[str] = set()
    out, repeats = [], 0
    for u in units:
        if u.kind == "tar":
            if u.uri in seen:
                repeats += 1
                continue
            seen.add(u.uri)
            out.append(u)
            continue
        keep = [(k, f) for k, f in zip(u.keys, u.files) if f not in seen and not seen.add(f)]
        repeats += len(u.files) - len(keep)
        if keep:
            u.keys, u.files = [k for k, _ in keep], [f for _, f in keep]
            out.append(u)
    if repeats:
        log.warning("%d inputs were listed more than once; each is curated once", repeats)
    return out, repeats


def _manifest_units(uri: str, files_per_unit: int) -> list[Unit]:
    if _is_uri(uri):
        fs, path = pafs.FileSystem.from_uri(uri)
        table = pq.read_table(path, filesystem=fs)
    else:
        table = pq.read_table(uri)
    col = next((c for c in MANIFEST_COLUMNS if c in table.column_names), None)
    if col is None:
        raise InputError(f"--input {uri}: manifest has no column of file paths; expected one of "
                         f"{', '.join(MANIFEST_COLUMNS)} (has {', '.join(table.column_names)})")
    files = [str(x) for x in table.column(col).to_pylist()]
    base = Path(uri).parent
    out = []
    stem = Path(uri).stem
    for i in range(0, len(files), files_per_unit):
        chunk = files[i:i + files_per_unit]
        resolved = [f if _is_uri(f) else os.path.normpath(f if os.path.isabs(f) else base / f) for f in chunk]
        out.append(Unit(_chunk_id(stem, i // files_per_unit, resolved), "files", uri, files=resolved,
                        keys=[str(i + j) for j in range(len(chunk))]))
    return out


DEFAULT_LIMITS = {"max_file_bytes": 256 << 20, "max_sidecar_bytes": 1 << 20}


def _row(unit: Unit, key: str, uri: str, image: bytes | None, error: str | None = None,
         caption: str | None = None, meta: str | None = None) -> dict:
    return {"sample_id": sample_id(uri), "source_uri": uri, "shard": unit.unit_id, "key": key,
            "caption": caption, "source_meta": meta, "image": image, "read_error": error}


def read_unit(unit: Unit, limits: dict | None = None) -> tuple[list[dict], str | None]:
    """All samples of a unit as rows (with the image bytes), plus a unit-level error if any.

    Never raises for bad samples: a sample that cannot be read is a row with read_error set, its
    message starting with a fixed kind (see pipeline/stages/decode.py). A truncated tar returns
    the samples before the damage and the error.
    """
    limits = {**DEFAULT_LIMITS, **(limits or {})}
    if unit.kind == "files":
        return [_file_row(unit, key, uri, limits) for key, uri in zip(unit.keys, unit.files)], None
    return _read_tar(unit, limits)


def _file_row(unit: Unit, key: str, uri: str, limits: dict) -> dict:
    cap = limits["max_file_bytes"]
    try:
        if unit.root and not _is_uri(uri):
            real, root = os.path.realpath(uri), os.path.realpath(unit.root)
            if os.path.commonpath([real, root]) != root:
                return _row(unit, key, uri, None, f"symlink outside input: {key} points outside the input "
                                                  f"folder (to {real}); not read")
        with open_input(uri) as fh:
            data = fh.read(cap + 1)
        if len(data) > cap:
            return _row(unit, key, uri, None, f"too large: file is over the cap of {cap} bytes; "
                                              "raise input.max_file_bytes to read it")
        return _row(unit, key, uri, data)
    except Exception as e:  # one file never stops its unit: any failure is this sample's row
        return _row(unit, key, uri, None, f"cannot read file: {type(e).__name__}: {e}")


def _read_tar(unit: Unit, limits: dict) -> tuple[list[dict], str | None]:
    rows, unit_error = [], None
    try:
        fh = open_input(unit.uri)
    except Exception as e:
        return [], f"cannot open shard {unit.uri}: {e}"
    seen: dict[str, int] = {}

    def add(row: dict):
        # a name repeated in one tar: the n-th occurrence (n >= 2) is its own sample, 'URI@n'
        n = seen[row["source_uri"]] = seen.get(row["source_uri"], 0) + 1
        if n > 1:
            row.update(source_uri=f"{row['source_uri']}@{n}", key=f"{row['key']}@{n}")
            row["sample_id"] = sample_id(row["source_uri"])
        rows.append(row)

    try:
        for rec in iter_tar(fh, name=unit.uri, max_member_bytes=limits["max_file_bytes"]):
            if rec.error:
                uri = f"{unit.uri}#{rec.members[0][0]}" if rec.members else f"{unit.uri}#{rec.key}"
                add(_row(unit, rec.key, uri, None, rec.error))
                continue
            add(_tar_row(unit, rec, limits))
    except ShardTruncated as e:
        unit_error = str(e)
        if e.key is not None:  # the sample being read when the damage hit is accounted for too
            add(_row(unit, e.key, f"{unit.uri}#{e.key}", None,
                     "truncated tar: input tar truncated while reading this sample"))
        log.warning("%s", unit_error)
    except Exception as e:  # anything else the tar reader raises ends the unit, not the run
        unit_error = f"{unit.uri}: tar reading failed ({type(e).__name__}: {e}); samples before it kept"
        log.warning("%s", unit_error)
    finally:
        fh.close()
    return rows, unit_error


def _text(data: bytes | None, cap: int) -> str | None:
    if data is None or len(data) > cap:
        return None
    return data.decode("utf-8", "replace")


def _tar_row(unit: Unit, rec, limits: dict) -> dict:
    cap = limits["max_sidecar_bytes"]
    img_ext = next((e for e in rec.files if e.lower() in IMAGE_EXTS), None)
    # sidecars over the cap are dropped (the sample stays); a json too deep to parse gives no caption
    caption = _text(rec.files.get("txt"), cap)
    meta_s = _text(rec.files.get("json"), cap)
    if caption is None and meta_s:
        try:
            c = json.loads(meta_s).get("caption")
            caption = c if isinstance(c, str) else None
        except (ValueError, AttributeError, RecursionError):
            pass
    if img_ext is None:
        return _row(unit, rec.key, f"{unit.uri}#{rec.key}", None,
                    f"no image member: key {rec.key!r} has {', '.join(sorted(rec.files))}", caption, meta_s)
    return _row(unit, rec.key, f"{unit.uri}#{rec.key}.{img_ext}", rec.files[img_ext], None, caption, meta_s)
