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

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Unit":
        return cls(**d)


def _is_shard_index(path: Path) -> bool:
    return path.suffix == ".parquet" and path.with_suffix(".tar").exists()


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
        tars = sorted(p.glob("*.tar"))
        if tars:
            units += [Unit(t.stem, "tar", str(t.resolve())) for t in tars]
        manifests = [m for m in sorted(p.glob("*.parquet")) if not _is_shard_index(m)]
        for m in manifests:
            units += _manifest_units(str(m.resolve()), files_per_unit)
        loose = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower().lstrip(".") in exts)
        if loose:
            root = p.resolve()
            name = root.name or "files"
            for i in range(0, len(loose), files_per_unit):
                chunk = loose[i:i + files_per_unit]
                units.append(Unit(f"{name}-{i // files_per_unit:05d}", "files", str(root),
                                  files=[str(f.resolve()) for f in chunk],
                                  keys=[str(f.resolve().relative_to(root)) for f in chunk]))
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
        out.append(Unit(f"{stem}-{i // files_per_unit:05d}", "files", uri, files=resolved,
                        keys=[str(i + j) for j in range(len(chunk))]))
    return out


def _row(unit: Unit, key: str, uri: str, image: bytes | None, error: str | None = None,
         caption: str | None = None, meta: str | None = None) -> dict:
    return {"sample_id": sample_id(uri), "source_uri": uri, "shard": unit.unit_id, "key": key,
            "caption": caption, "source_meta": meta, "image": image, "read_error": error}


def read_unit(unit: Unit) -> tuple[list[dict], str | None]:
    """All samples of a unit as rows (with the image bytes), plus a unit-level error if any.

    Never raises for bad samples: a sample that cannot be read is a row with read_error set.
    A truncated tar returns the samples before the damage and the error.
    """
    if unit.kind == "files":
        rows = []
        for key, uri in zip(unit.keys, unit.files):
            try:
                with open_input(uri) as fh:
                    rows.append(_row(unit, key, uri, fh.read()))
            except (OSError, ValueError) as e:
                rows.append(_row(unit, key, uri, None, f"cannot read file: {e}"))
        return rows, None
    return _read_tar(unit)


def _read_tar(unit: Unit) -> tuple[list[dict], str | None]:
    rows, unit_error = [], None
    try:
        fh = open_input(unit.uri)
    except (OSError, ValueError) as e:
        return [], f"cannot open shard {unit.uri}: {e}"
    try:
        for rec in iter_tar(fh, name=unit.uri):
            if rec.error:
                rows.append(_row(unit, rec.key, f"{unit.uri}#{rec.key}", None, rec.error))
                continue
            rows.append(_tar_row(unit, rec))
    except ShardTruncated as e:
        unit_error = str(e)
        if e.key is not None:  # the sample being read when the damage hit is accounted for too
            rows.append(_row(unit, e.key, f"{unit.uri}#{e.key}", None,
                             "input tar truncated while reading this sample"))
        log.warning("%s", unit_error)
    finally:
        fh.close()
    return rows, unit_error


def _tar_row(unit: Unit, rec) -> dict:
    img_ext = next((e for e in rec.files if e.lower() in IMAGE_EXTS), None)
    meta = rec.files.get("json")
    caption = rec.files.get("txt")
    caption = caption.decode("utf-8", "replace") if caption is not None else None
    meta_s = meta.decode("utf-8", "replace") if meta is not None else None
    if caption is None and meta_s:
        try:
            c = json.loads(meta_s).get("caption")
            caption = c if isinstance(c, str) else None
        except (ValueError, AttributeError):
            pass
    if img_ext is None:
        return _row(unit, rec.key, f"{unit.uri}#{rec.key}", None,
                    f"no image member for key {rec.key!r} (has: {', '.join(sorted(rec.files))})",
                    caption, meta_s)
    return _row(unit, rec.key, f"{unit.uri}#{rec.key}.{img_ext}", rec.files[img_ext], None, caption, meta_s)


def iter_unit_images(unit: Unit, wanted: set[str]) -> Iterator[tuple[str, bytes]]:
    """(sample_id, bytes) for the wanted samples of a unit, reading it once (for shard writing)."""
    rows, _ = read_unit(unit)
    for r in rows:
        if r["sample_id"] in wanted and r["image"] is not None:
            yield r["sample_id"], r["image"]
