"""Parquet inputs: a manifest of image files (a column of file paths/URIs: `path`, `uri`, `url`,
`filepath` or `file`; any pyarrow file-system URI), cut into units of `input.files_per_unit` rows,
read a record batch at a time; and `open_parquet`, how every Parquet input is opened (manifests,
shard manifests, a shard's index beside its tar).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import pyarrow.parquet as pq

from catalog.storage import is_uri, local_path, open_input
from catalog.storage.answers import STORE_FAULTS

from pipeline.inputs.units import InputError, Unit, chunk_id, chunks, stem

MANIFEST_COLUMNS = ("path", "uri", "url", "filepath", "file")
MAX_URI_CHARS = 8192  # a manifest value longer than this is no path (a row with reason bad_manifest_row)


@contextmanager
def open_parquet(uri: str):
    """A Parquet file named by a local path or a URI, closed when the block ends."""
    with open_input(uri) as fh:
        yield pq.ParquetFile(fh)


def manifest_column(uri: str) -> str:
    """The manifest's column of file paths; InputError naming the manifest when it has none."""
    with open_parquet(uri) as pf:
        names = pf.schema_arrow.names
    col = next((c for c in MANIFEST_COLUMNS if c in names), None)
    if col is None:
        raise InputError(f"--input {uri}: manifest has no column of file paths; expected one of "
                         f"{', '.join(MANIFEST_COLUMNS)} (has {', '.join(names)})")
    return col


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


def _resolve(base: str, remote: bool, path: str) -> str:
    """A manifest row as a source URI: a URI (file:// too) as it is, else relative to the manifest's
    folder (a local one normalised; an absolute local path too)."""
    if "://" in path:
        return path
    if remote:
        return path if path.startswith("/") else f"{base.rstrip('/')}/{path}"
    return os.path.normpath(os.path.join(base, path))


def manifest_units(uri: str, files_per_unit: int) -> Iterator[Unit]:
    """A manifest's rows, read a record batch at a time, in units of files_per_unit rows. A row that
    is no path is a source named 'MANIFEST#rowN' whose sample is a read error; a manifest that
    cannot be read to its end gives one last unit with a unit-level error."""
    col = manifest_column(uri)
    remote = is_uri(uri)
    base = uri.rsplit("/", 1)[0] if remote else os.path.dirname(local_path(uri))
    name = stem(uri).removesuffix(".parquet")
    failed: list[str] = []

    def rows():
        try:
            with open_parquet(uri) as pf:
                for b in pf.iter_batches(batch_size=min(files_per_unit, 4096), columns=[col]):
                    yield from b.column(0).to_pylist()
        except STORE_FAULTS:
            raise  # the store refused or kept failing: not a corrupt manifest
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
                resolved.append(_resolve(base, remote, path))
        yield Unit(chunk_id(name, i, resolved), "files", uri, files=resolved,
                   keys=[str(start + j) for j in range(len(chunk))], errors=errors)
        start += len(chunk)
    if failed:
        where = f"{uri}#unreadable-after-row{start}"
        yield Unit(chunk_id(name, i + 1, [where]), "files", uri, files=[where], keys=[where.rpartition("#")[2]],
                   error=failed[0])
