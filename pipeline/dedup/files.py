"""The partitioned dedup's work files (pipeline/dedup/partitioned.py, dedup_dist_tasks.py).

Shuffle files: a map-side task writes ONE Parquet file per output whose row group q holds the rows
bound for partition q (every row group written, empty ones too; the key-value metadata says how
many), and a reduce task reads only row group q of each map file: the footer (~40 KB at 256 row
groups, statistics off) and that row group, ranged reads on an object store. So a step writes one
file per task, not one per (task, partition).

Count files: UNITS/c{chunk}.parquet, (unit, rows) for COUNT_CHUNK units each in run order, written by
the count tasks; a batch task reads its own unit id range back (unit_ids), so the coordinator never
holds the run's unit ids.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import catalog.storage as cstore

from pipeline.dedup import clusters as D

COUNT_CHUNK = 2000  # units one count task reads the footers of, and one count file holds
_PARTS_KEY = b"humanset.partitions"


def write_parts(root: str, name: str, table: pa.Table, part: np.ndarray, P: int) -> None:
    """table's rows cut by `part` into ONE file ROOT/name whose row group q holds partition q's rows
    (empty row groups for empty partitions), streamed to the store as it is written."""
    order = np.argsort(part, kind="stable")
    cuts = np.searchsorted(part[order], np.arange(P + 1))
    table = table.take(pa.array(order)).replace_schema_metadata({_PARTS_KEY: str(P).encode()})
    store, rel = cstore.locate(cstore.join(root, name))
    with store.open_output(rel) as f, pq.ParquetWriter(f, table.schema, compression="zstd",
                                                       write_statistics=False) as w:
        for q in range(P):
            n = int(cuts[q + 1] - cuts[q])
            w.write_table(table.slice(int(cuts[q]), n), row_group_size=max(n, 1))


def read_part(path: str, q: int) -> pa.Table:
    """Row group q (partition q) of a file write_parts wrote: its footer, then that row group only."""
    store, rel = cstore.locate(path)
    with store.open_input(rel) as f:
        pf = pq.ParquetFile(f)
        n = pf.metadata.metadata.get(_PARTS_KEY) if pf.metadata.metadata else None
        if n is None or int(n) != pf.num_row_groups or not 0 <= q < pf.num_row_groups:
            raise ValueError(f"{path}: not a partitioned work file with a row group {q} (partitions {n}, "
                             f"row groups {pf.num_row_groups}); remove {path.rsplit('/', 2)[0]} and rerun")
        return pf.read_row_group(q)


def read_parts(root: str, names, q: int) -> pa.Table:
    """Partition q of the map files `names`, D.IO_THREADS files at a time."""
    with ThreadPoolExecutor(D.IO_THREADS) as pool:
        parts = list(pool.map(lambda n: read_part(cstore.join(root, n), q), names))
    return pa.concat_tables(parts)


def unit_ids(units: str, a: int, b: int) -> list[str]:
    """Unit ids a..b-1 (their run order), from the count files under `units` (COUNT_CHUNK a file):
    a batch task reads its own range, so the coordinator never holds the run's unit ids."""
    out: list[str] = []
    for c in range(a // COUNT_CHUNK, (b - 1) // COUNT_CHUNK + 1) if b > a else ():
        col = cstore.read_table_at(cstore.join(units, f"c{c:06d}.parquet"), columns=["unit"]).column("unit")
        lo, hi = max(a - c * COUNT_CHUNK, 0), min(b - c * COUNT_CHUNK, len(col))
        out += col.slice(lo, hi - lo).to_pylist()
    if len(out) != b - a:
        raise RuntimeError(f"{units}: count files hold {len(out)} of units {a}..{b - 1}; rerun the dedup")
    return out
