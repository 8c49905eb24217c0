"""The catalog of a finished run, compacted: the per-unit parts (`catalog/samples/{unit}.parquet`, one
per unit: 10^6 of them for a crawl of 10^6 shards) copied into few large files (`catalog/compact/`),
which the views read instead once `catalog/compact.json` says the copy is complete.

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

from .io import atomic_path, write_json
from .schema import SAMPLES, conform

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


def compact_group(run: str, index: int, unit_ids: list[str]) -> int:
    """Copy the parts of `unit_ids` (a unit with no part is skipped: it has no rows) into one file,
    conformed to the current SAMPLES schema (older parts get the columns added since as nulls), one
    part at a time, in row groups of up to ROW_GROUP rows. Returns its rows."""
    run_p = Path(run)
    out = run_p / FOLDER / file_name(index)
    rows, buf, n_buf = 0, [], 0
    with atomic_path(out) as tmp:
        writer = pq.ParquetWriter(tmp, SAMPLES, compression="zstd")
        try:
            for uid in unit_ids:
                part = run_p / "catalog" / "samples" / f"{uid}.parquet"
                if not part.is_file():
                    continue
                table = pq.ParquetFile(part).read()  # (no dataset layer: half the time of read_table)
                table = conform(table.select([c for c in table.column_names if c in SAMPLES.names]), SAMPLES)
                if table.num_rows:
                    buf.append(table)
                    n_buf += table.num_rows
                    rows += table.num_rows
                if n_buf >= ROW_GROUP:
                    writer.write_table(pa.concat_tables(buf))
                    buf, n_buf = [], 0
            if buf:
                writer.write_table(pa.concat_tables(buf))
        finally:
            writer.close()
    return rows


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
