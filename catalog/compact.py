"""The catalog of a finished run, compacted: the per-unit parts (`catalog/samples/{unit}.parquet`, one
per unit: 10^6 of them for a crawl of 10^6 shards) and the curated shards' indexes
(`shards/{unit}-NNNNN.parquet`) copied into few large files (`catalog/compact/samples/`,
`catalog/compact/shards/`), which the `samples` and `shards` views read instead once
`catalog/compact.json` says the copy is complete.

Why: DuckDB holds ~4 KB per file for as long as a scan over many files runs (2.0.1), so a `query` over
10^6 parts would need ~4 GB before its first row; over 10^3 compacted files it needs ~4 MB. The
per-unit parts stay: they are what resume, `select` and the stats markers are keyed by. The copy is
made by tasks of `group` consecutive units each (pipeline: one Ray task a group, in parallel), each
file written atomically under a name fixed by its group's position; the marker is written last, and
removed before a run writes any part again (a resumed run with work left), so the views never read a
stale copy. A local run only: a run on an object store keeps reading its parts.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from catalog.io import atomic_path, write_json
from catalog.schema import CURATED_INDEX, SAMPLES, conform

FOLDER = "catalog/compact"
MARKER = "catalog/compact.json"
GROUP = 1000  # units per compacted file
ROW_GROUP = 65_536  # rows buffered before a row group is written (small parts are merged, not copied)


def is_compacted(run) -> bool:
    return isinstance(run, Path) and (run / MARKER).is_file()


def invalidate(run: Path) -> None:
    """The copy no longer stands for the parts: marker first, then the files."""
    (run / MARKER).unlink(missing_ok=True)
    shutil.rmtree(run / FOLDER, ignore_errors=True)


def file_name(index: int) -> str:
    return f"c-{index:06d}.parquet"


class _Sink:
    """One compacted file, written in row groups of up to ROW_GROUP rows (small parts are merged)."""

    def __init__(self, tmp, schema):
        self.schema, self.writer, self.buf, self.n, self.rows = schema, pq.ParquetWriter(tmp, schema, compression="zstd"), [], 0, 0

    def add(self, path: Path) -> None:
        table = pq.ParquetFile(path).read()  # (no dataset layer: half the time of read_table)
        table = conform(table.select([c for c in table.column_names if c in self.schema.names]), self.schema)
        if table.num_rows:
            self.buf.append(table)
            self.n += table.num_rows
            self.rows += table.num_rows
        if self.n >= ROW_GROUP:
            self.flush()

    def flush(self) -> None:
        if self.buf:
            self.writer.write_table(pa.concat_tables(self.buf))
            self.buf, self.n = [], 0

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self.writer.close()


def compact_group(run: str, index: int, unit_ids: list[str]) -> int:
    """Copy the catalog parts and the curated shards' indexes of `unit_ids` (a unit without a part or
    shards is skipped) into one file each, conformed to the current schema (older parts get the
    columns added since as nulls), one part at a time. Returns the catalog rows."""
    run_p = Path(run)
    with atomic_path(run_p / FOLDER / "samples" / file_name(index)) as s_tmp, \
            atomic_path(run_p / FOLDER / "shards" / file_name(index)) as i_tmp:
        samples, shards = _Sink(s_tmp, SAMPLES), _Sink(i_tmp, CURATED_INDEX)
        try:
            for uid in unit_ids:
                part = run_p / "catalog" / "samples" / f"{uid}.parquet"
                if part.is_file():
                    samples.add(part)
                for i in range(1 << 20):  # the unit's curated shards: {unit}-00000, -00001, ...
                    idx = run_p / "shards" / f"{uid}-{i:05d}.parquet"
                    if not idx.is_file():
                        break
                    shards.add(idx)
        finally:
            samples.close()
            shards.close()
    return samples.rows


def finish(run: Path, files: int, rows: int, units: int) -> None:
    """The marker: the copy is complete (written after every file)."""
    write_json(run / MARKER, {"files": files, "rows": rows, "units": units, "group": GROUP})


def rows_of_parts(run: Path) -> int:
    """Rows of the per-unit parts, from their footers (tests)."""
    folder = run / "catalog" / "samples"
    return sum(pq.ParquetFile(folder / n).metadata.num_rows for n in os.listdir(folder)
               if n.endswith(".parquet") and not n.startswith("."))


def marker(run: Path) -> dict:
    return json.loads((run / MARKER).read_text())
