"""Arrow column helpers shared by the stage adapter, the unit I/O and isolation (no Ray here).

A unit's block carries its counters (seconds per stage, read error, crashes) in its schema
metadata under UNIT_META, never in rows.
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from catalog import SAMPLES

UNIT_META = b"humanset.unit"  # block schema metadata: the unit and its counters

# stage-to-stage columns that never reach the catalog
INTERNAL_TYPES = {"_thumb": pa.binary(), "image": pa.binary(), "_alive": pa.bool_()}


def typed(col: str, values: list) -> pa.Array:
    """A list of Python values as the Arrow array of `col`'s declared type."""
    return pa.array(values, type=INTERNAL_TYPES[col] if col in INTERNAL_TYPES else SAMPLES.field(col).type)


def set_column(table: pa.Table, col: str, arr) -> pa.Table:
    """`table` with column `col` replaced by `arr` (appended when it is new)."""
    idx = table.schema.get_field_index(col)
    return table.set_column(idx, col, arr) if idx >= 0 else table.append_column(col, arr)


def flag(batch: pa.Table, col: str, default: bool) -> np.ndarray:
    """A boolean column as numpy, nulls as `default`."""
    return pc.fill_null(batch.column(col), default).to_numpy(zero_copy_only=False).astype(bool)


def scatter(values: pa.Array, idx: np.ndarray, n: int) -> pa.Array:
    """values for rows idx of an n-row batch; null elsewhere."""
    if len(idx) == n:
        return values
    pos = np.full(n, -1, np.int64)
    pos[idx] = np.arange(len(idx))
    return values.take(pa.array(pos, mask=pos < 0))


def append_name(lists: pa.Array, todo: np.ndarray, name: str) -> pa.Array:
    """list<string> column with `name` appended on rows where todo (a null list becomes [name]), once: a row
    scored again by the stage (a fallback round of a --score-all run) does not list it twice."""
    lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    n = len(lists)
    listed = pc.fill_null(pc.equal(pc.list_flatten(lists), name), False).to_numpy(zero_copy_only=False)
    if listed.any():
        has = np.zeros(n, bool)
        has[pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)[listed]] = True
        todo = todo & ~has
    old_len = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    new_len = old_len + todo
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(new_len, out=offsets[1:])
    flat = pc.list_flatten(lists)
    parent = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False).astype(np.int64)
    old_starts = np.zeros(n + 1, np.int64)
    np.cumsum(old_len, out=old_starts[1:])
    src = np.empty(offsets[-1], np.int64)
    src[offsets[parent] + np.arange(len(parent)) - old_starts[parent]] = np.arange(len(parent))
    src[(offsets[:-1] + old_len)[todo]] = len(flat)
    values = pa.concat_arrays([flat.cast(pa.string()), pa.array([name], pa.string())]).take(pa.array(src))
    mask = pa.array(~todo & np.asarray(lists.is_null().to_numpy(zero_copy_only=False), bool))
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values, mask=mask,
                                    type=SAMPLES.field("scored_stages").type)


def unit_meta(table: pa.Table) -> dict:
    """The counters a unit's block carries (see UNIT_META)."""
    raw = (table.schema.metadata or {}).get(UNIT_META)
    return json.loads(raw) if raw else {"seconds": {}}


def with_meta(table: pa.Table, meta: dict) -> pa.Table:
    return table.replace_schema_metadata({UNIT_META: json.dumps(meta).encode()})


def add_seconds(meta: dict, name: str, seconds: float, cpu_seconds: float | None = None) -> None:
    """A step's wall seconds on the unit (and, when given, the CPU seconds of its process: every
    thread of it, e.g. an ONNX Runtime session's; under load the steadier figure)."""
    meta.setdefault("seconds", {})
    meta["seconds"][name] = round(meta["seconds"].get(name, 0.0) + seconds, 4)
    if cpu_seconds is not None:
        cpu = meta.setdefault("cpu_seconds", {})
        cpu[name] = round(cpu.get(name, 0.0) + cpu_seconds, 4)
