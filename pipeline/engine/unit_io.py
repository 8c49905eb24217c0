"""Worker side of a curation run: one unit read, measured, scored and written in bounded memory.

Phase 1 (`measure_unit`) streams the unit's samples from the source in batches of at most
`engine.max_batch_bytes` of image bytes: each batch goes through the measure stages (decode,
size, pHash) and leaves only its measurements, which are written as RUN/work/measure/{unit}.parquet
(MEASURE schema, the unit's counters in its metadata). Phase 3 (`read_for_score`) starts from
those measurements and the run's dedup verdicts, with no image bytes: each model stage fetches the
bytes of the rows it scores batch by batch (pipeline/engine/adapter.py, pipeline/inputs/fetch.py), and
`finish_unit` fetches the kept rows' bytes as it appends them to the curated shards, then writes
the catalog part and, last, the stats marker RUN/stats/{unit}.json, the unit's completion proof.
Memory per worker: one batch of image bytes plus ~1 KB of measurements per sample of the unit.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import catalog
import catalog.storage as cst
from catalog import CURATED_INDEX, SAMPLES
from catalog.storage import retry, storage_for
from catalog.schema import MEASURE

from pipeline.dedup import clusters as dedup_mod
from pipeline.dedup import fallback
from pipeline.engine.adapter import run_on_unit
from pipeline.engine.columns import add_seconds, flag, set_column, typed, unit_meta, with_meta
from pipeline.inputs.fetch import ByteSource
from pipeline.settings import DEFAULTS
from pipeline.inputs.reading import DEFAULT_LIMITS, ROW_FIELDS, UnitReader, read_unit
from pipeline.inputs.units import Unit
from pipeline.stages import Stage, build_stages
from pipeline.stages.decode import unit_error_kind

log = logging.getLogger("humanset.curate")

_READ_FIELDS = list(ROW_FIELDS) + [pa.field("_alive", pa.bool_()), SAMPLES.field("scored_stages")]
MEMBER_SPAN = ("_offset", "_size")  # a tar sample's image member: phase 3 reads it back without parsing the tar
READ_SCHEMA = pa.schema(_READ_FIELDS)
SUMMARY_SCHEMA = pa.schema([("unit_id", pa.string()), ("inputs", pa.int64()), ("kept", pa.int64()),
                            ("isolated", pa.bool_()), ("fault", pa.string()), ("pass", pa.string())])
DEFAULT_MAX_BATCH_BYTES = DEFAULTS.engine.max_batch_bytes  # its setting's default (pipeline/settings.py)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_store(run) -> catalog.Storage:
    """The Storage of a RUN (a local folder, or a URI: s3://bucket/runs/r1); every file of the run
    is written through it: write-once objects under deterministic names on object stores, temp +
    fsync + rename locally."""
    return storage_for(os.fspath(run))


def _loc(run, *parts: str):
    """A file of the RUN: a Path for a local RUN, a URI string for one on an object store."""
    text = cst.join(run, *parts)
    return text if cst.is_uri(text) else Path(text)


def listing_path(run):
    return _loc(run, "units.jsonl")


MEASURE_DIR, STATS_DIR, SAMPLES_DIR = "work/measure", "stats", "catalog/samples"


def measure_path(run, unit_id: str):
    """Phase 1's file of a unit: its measurements, with the unit's counters in its metadata."""
    return _loc(run, MEASURE_DIR, f"{unit_id}.parquet")


COUNTERS = b"humanset.counters"  # the measure file's metadata key for the unit's phase-1 counters


def marker_path(run, unit_id: str):
    return _loc(run, STATS_DIR, f"{unit_id}.json")


def summary(unit_id: str, inputs: int, kept: int | None = None, isolated: bool = False,
            fault: str | None = None, pass_: str | None = None) -> pa.Table:
    """A unit's one-row summary for the driver; `pass_`: the phase-3 pass it ends (fallback rounds)."""
    return pa.Table.from_pylist([{"unit_id": unit_id, "inputs": inputs, "kept": kept, "isolated": isolated,
                                  "fault": fault, "pass": pass_}], schema=SUMMARY_SCHEMA)


def limits_of(cfg: dict) -> dict:
    """What the unit reader reads by, from the config's input section (reading.DEFAULT_LIMITS' keys)."""
    inp = cfg.get("input", {})
    return {k: list(inp.get(k, v)) if k == "extensions" else int(inp.get(k, v)) for k, v in DEFAULT_LIMITS.items()}


def max_batch_bytes(cfg: dict) -> int:
    return int(cfg.get("engine", {}).get("max_batch_bytes") or DEFAULT_MAX_BATCH_BYTES)


def reset_peak_rss() -> None:
    """Start a new peak-RSS window for this process (Linux: VmHWM is reset by clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def peak_rss_mb() -> float | None:
    """This process's peak RSS since the last reset_peak_rss (VmHWM), in MB; None off Linux."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def _node_id() -> str | None:
    """The Ray node this worker runs on (recorded in the stats marker), None outside Ray (a process
    that has not imported Ray is no Ray worker: the local executor's workers do not pay its import)."""
    ray = sys.modules.get("ray")
    if ray is None:
        return None
    try:
        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:  # noqa: BLE001 - a missing id must never fail a unit
        return None


# --------------------------------------------------------------------------------------------
# Phase 1

def read_table(rows: list[dict], meta: dict) -> pa.Table:
    for r in rows:
        r["_alive"] = True
    return with_meta(pa.Table.from_pylist(rows, schema=READ_SCHEMA), meta)


def measured_only(table: pa.Table) -> pa.Table:
    """A batch's measurements as MEASURE rows: no bytes, no stage-to-stage columns."""
    return catalog.conform(table.select([c for c in table.column_names if c in MEASURE.names]), MEASURE)


def batches_by_bytes(rows, max_bytes: int):
    """Rows grouped into lists holding at most max_bytes of image bytes (at least one row each)."""
    batch, size = [], 0
    for r in rows:
        n = len(r.get("image") or b"")
        if batch and size + n > max_bytes:
            yield batch
            batch, size = [], 0
        batch.append(r)
        size += n
    if batch:
        yield batch


def iter_rows(unit: Unit, limits: dict) -> tuple:
    """(rows iterator, function giving the unit error once the iterator is used up)."""
    reader = UnitReader(unit, limits)
    return iter(reader), lambda: reader.error


def measure_unit(run: Path, unit: Unit, stages: list[Stage], limits: dict, score_all: bool,
                 max_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> pa.Table:
    """Phase 1 of one unit, streamed: read a batch, measure it, keep its measurements; write the
    unit's measure files. Returns the unit's summary."""
    reset_peak_rss()
    before = retry.snapshot()
    meta = {"unit": unit.brief().to_dict(), "seconds": {}}
    rows, error_of = iter_rows(unit, limits)
    parts, t_read, t0 = [], 0.0, time.perf_counter()
    c_read, c0 = 0.0, time.process_time()
    for batch in batches_by_bytes(rows, max_bytes):
        t_read += time.perf_counter() - t0
        c_read += time.process_time() - c0
        table = read_table(batch, meta)
        del batch
        for s in stages:
            table = run_on_unit(s, table, score_all)
        meta = unit_meta(table)
        parts.append(measured_only(table))
        del table
        t0, c0 = time.perf_counter(), time.process_time()
    t_read += time.perf_counter() - t0
    c_read += time.process_time() - c0
    add_seconds(meta, "read", t_read, c_read)
    meta["unit_error"] = error_of()
    measured = pa.concat_tables(parts) if parts else MEASURE.empty_table()
    meta["peak_rss_mb"] = {"measure": peak_rss_mb()}
    meta["store"] = retry.since(before)  # the unit's retries in this phase, its stages' included
    return write_measure(run, unit.unit_id, measured, meta)


def read_for_measure(unit: Unit, limits: dict) -> pa.Table:
    """Phase 1 input of a whole unit at once, bytes included (in-process tests and tools)."""
    t0 = time.perf_counter()
    rows, unit_error = read_unit(unit, limits)
    table = read_table(rows, {"unit": unit.brief().to_dict(), "unit_error": unit_error, "seconds": {}})
    meta = unit_meta(table)
    meta["seconds"]["read"] = round(time.perf_counter() - t0, 4)
    return with_meta(table, meta)


def write_measure(run: Path, unit_id: str, measured: pa.Table, meta: dict) -> pa.Table:
    """The unit's phase-1 file (one file, one fsync: its counters ride in the Parquet metadata)."""
    counters = {k: meta.get(k) for k in ("unit_error", "seconds", "cpu_seconds", "worker_crashes", "isolated",
                                         "peak_rss_mb", "store")}
    schema_meta = {**(measured.schema.metadata or {}), COUNTERS: json.dumps(counters).encode()}
    run_store(run).write_parquet(f"{MEASURE_DIR}/{unit_id}.parquet", measured.replace_schema_metadata(schema_meta))
    return summary(unit_id, measured.num_rows, isolated=bool(meta.get("isolated")))


def finish_measure(run: Path, table: pa.Table) -> pa.Table:
    """Write the phase-1 files of a unit measured as one table; return its summary."""
    meta = unit_meta(table)
    return write_measure(run, meta["unit"]["unit_id"], measured_only(table), meta)


# --------------------------------------------------------------------------------------------
# Phase 3

def read_measure(run: Path, unit_id: str) -> tuple[pa.Table, dict]:
    """A unit's phase-1 file: its rows (MEASURE schema; a file of any humanset version reads, the
    columns it lacks are null) and its counters."""
    t = cst.read_table_at(measure_path(run, unit_id))
    counters = json.loads((t.schema.metadata or {}).get(COUNTERS) or b"{}")
    return catalog.conform(t.select([c for c in t.column_names if c in MEASURE.names]), MEASURE), counters


def measured_table(run: Path, unit_id: str, t: pa.Table | None = None) -> pa.Table:
    """Phase-1 rows of a unit joined with the run's dedup verdicts; `_alive` after dedup."""
    if t is None:
        t = read_measure(run, unit_id)[0]
    verdicts = dedup_mod.read_verdicts(run, unit_id)
    cols = ("dup_of", "dup_kind", "dup_cluster_size", "dup_rank")
    if verdicts.num_rows:
        pos = pc.index_in(t.column("sample_id"), value_set=verdicts.column("sample_id"))
        for col in cols:
            t = set_column(t, col, verdicts.column(col).take(pos))
    else:
        for col in cols:
            t = set_column(t, col, pa.nulls(t.num_rows, SAMPLES.field(col).type))
    alive = pc.and_(pc.fill_null(t.column("_alive"), False), pc.is_null(t.column("dup_kind")))
    return set_column(with_dup_scored(t, alive), "_alive", alive)


def with_dup_scored(t: pa.Table, alive) -> pa.Table:
    """dup_scored as the model stages start: a dedup candidate (a row with a verdict) goes on to them
    when it is unique or its cluster's canonical (`alive`: measured alive and no dup_kind); null for
    a row that was no candidate. `humanset select` sets it the same way after a reclustering."""
    return set_column(t, "dup_scored", pc.if_else(pc.is_valid(t.column("dup_rank")), alive, pa.scalar(None, pa.bool_())))


def read_for_score(run: Path, unit: Unit, limits: dict, score_all: bool, cfg: dict | None = None) -> pa.Table:
    """Phase 3 input: the unit's measurements and verdicts, without image bytes (each stage reads
    back the bytes of the rows it scores, checked against their measured sha256). With fallbacks,
    a later round's or the write pass's input (pipeline/dedup/fallback.py)."""
    if fallback.round_of(cfg) == fallback.WRITE:
        return fallback.read_final(run_store(run), unit, cfg)
    if fallback.round_of(cfg):
        return fallback.read_round(run_store(run), unit, cfg)
    t0, c0 = time.perf_counter(), time.process_time()
    reset_peak_rss()
    before = retry.snapshot()
    measured, counters = read_measure(run, unit.unit_id)
    table = measured_table(run, unit.unit_id, measured)
    seconds = dict(counters.get("seconds") or {})
    seconds["read_2"] = round(time.perf_counter() - t0, 4)
    cpu = dict(counters.get("cpu_seconds") or {})
    cpu["read_2"] = round(time.process_time() - c0, 4)
    return with_meta(table, {"unit": unit.brief().to_dict(), "limits": limits,
                             "unit_error": counters.get("unit_error"), "seconds": seconds, "cpu_seconds": cpu,
                             "worker_crashes": counters.get("worker_crashes") or 0, "source_changed": 0,
                             "isolated": bool(counters.get("isolated")),
                             "peak_rss_mb": dict(counters.get("peak_rss_mb") or {}),
                             "store": retry.total([counters.get("store"), retry.since(before)])})


SIDECAR = ("sample_id", "source_uri", "key", "caption", "width", "height", "person_boxes", "person_scores",
           "person_keypoints")
INDEX_EXTRA = ("sample_id", "source_uri", "format", "width", "height", "sha256", "n_persons")


def add_curated(w: catalog.ShardWriter, kept: pa.Table, images) -> None:
    """Append kept rows to a curated shard writer: {sample_id}.{ext} original bytes + .json sidecar.
    `images` maps sample_id -> bytes."""
    cols = set(SIDECAR) | set(INDEX_EXTRA)  # only what the shards hold leaves Arrow, row by row
    for r in kept.select([c for c in kept.column_names if c in cols]).to_pylist():
        ext = (r["format"] or "bin").lower().replace("jpeg", "jpg")
        sidecar = {k: r[k] for k in SIDECAR if r.get(k) is not None}
        w.add(r["sample_id"], {ext: images[r["sample_id"]], "json": sidecar}, {k: r.get(k) for k in INDEX_EXTRA})


def curated_writer(folder, unit_id: str, cfg: dict) -> catalog.ShardWriter:
    out = cfg["output"]
    return catalog.ShardWriter(folder, unit_id, CURATED_INDEX, max_count=out["shard_max_count"],
                               max_bytes=out["shard_max_bytes"])


def write_curated(folder: Path, unit_id: str, kept: pa.Table, images: dict[str, bytes], cfg: dict) -> list[str]:
    """Curated shards of one unit from bytes in memory (`humanset select`)."""
    with curated_writer(folder, unit_id, cfg) as w:
        add_curated(w, kept, images)
    return w.written


def _batch_rows(table: pa.Table, max_bytes: int):
    """Slices of `table` whose file_bytes add up to at most max_bytes (at least one row each)."""
    sizes = pc.fill_null(table.column("file_bytes"), 0).to_numpy(zero_copy_only=False).astype(np.int64) \
        if "file_bytes" in table.column_names else np.zeros(table.num_rows, np.int64)
    start, acc = 0, 0
    for i, n in enumerate(sizes):
        if i > start and acc + n > max_bytes:
            yield table.slice(start, i - start)
            start, acc = i, 0
        acc += n
    if start < table.num_rows:
        yield table.slice(start, table.num_rows - start)


def _write_kept(run: Path, u: Unit, table: pa.Table, meta: dict, cfg: dict) -> tuple[list[str], list[int]]:
    """Stream the kept rows' bytes into the curated shards, a batch at a time, each checked against
    its measured sha256. Returns the shards written and the rows whose bytes changed (not written)."""
    keep = flag(table, "keep", False)
    changed: list[int] = []
    idx = np.flatnonzero(keep)
    if not len(idx):
        return [], changed
    kept = table.take(pa.array(idx, pa.int64()))
    off = 0
    with curated_writer(run_store(run).child("shards"), u.unit_id, cfg) as w, ByteSource(u, meta.get("limits") or {}) as src:
        for part in _batch_rows(kept, max_batch_bytes(cfg)):
            images, why = src.fetch(part)
            good = [i for i, p in enumerate(why) if p is None]
            changed += [int(idx[off + i]) for i, p in enumerate(why) if p is not None]
            ids = part.column("sample_id").to_pylist()
            add_curated(w, part.take(pa.array(good, pa.int64())), {ids[i]: images[i] for i in good})
            off += part.num_rows
            del images
    if changed:
        log.warning("unit %s: %d samples changed since they were measured (rejected as source_changed)",
                    u.unit_id, len(changed))
    return w.written, changed


def finish_unit(run: Path, table: pa.Table, cfg: dict) -> pa.Table:
    """Decide, write the unit's curated shards and catalog part, then its stats marker (last). A
    scoring round with fallbacks keeps the unit's scored rows instead (pipeline/dedup/fallback.py)."""
    from pipeline.decide import decide
    r = fallback.round_of(cfg)
    if r not in (None, fallback.WRITE) and not (r == 0 and fallback.final_after_round_0(table)):
        return summary(fallback.write_scored(run_store(run), table, cfg), table.num_rows, pass_=str(r))
    meta = unit_meta(table)
    u = Unit.from_dict(meta["unit"])
    meta.setdefault("limits", limits_of(cfg))
    t0, c0 = time.perf_counter(), time.process_time()
    before = retry.snapshot()
    stages = build_stages(cfg)
    table = decide(table, stages)
    written, changed = _write_kept(run, u, table, meta, cfg)
    if changed:  # their bytes were never written: rejected as source_changed, the rest decided as before
        errors = table.column("decode_error").to_pylist()
        for i in changed:
            errors[i] = "source changed: the bytes read back differ from the ones measured"
        table = decide(set_column(table, "decode_error", typed("decode_error", errors)), stages)
    samples = catalog.conform(table.select([c for c in table.column_names if c in SAMPLES.names]), SAMPLES)
    store = run_store(run)
    store.write_parquet(f"{SAMPLES_DIR}/{u.unit_id}.parquet", samples)
    vc = pc.value_counts(table.column("reject_reason").drop_null()).to_pylist() if table.num_rows else []
    reasons = {d["values"]: d["counts"] for d in vc}
    kept = int(pc.sum(pc.cast(table.column("keep"), pa.int64())).as_py() or 0) if table.num_rows else 0
    seconds = dict(meta.get("seconds") or {})
    seconds["write"] = round(time.perf_counter() - t0, 4)
    cpu = dict(meta.get("cpu_seconds") or {})
    cpu["write"] = round(time.process_time() - c0, 4)
    unit_error = meta.get("unit_error")
    peak = dict(meta.get("peak_rss_mb") or {})
    peak["write"] = peak_rss_mb()  # the worker's peak since this unit's phase-3 read (same process when
    # its stages are tasks: Ray Data fuses them; a model stage's actor is a process of its own)
    stats = {"unit": u.unit_id, "source": u.uri, "inputs": table.num_rows, "kept": kept,
             "rejected": dict(sorted(reasons.items())), "shards": written, "unit_error": unit_error,
             "unit_error_kind": unit_error_kind(unit_error) if unit_error else None,
             "worker_crashes": meta.get("worker_crashes") or 0,
             "source_changed": (meta.get("source_changed") or 0) + len(changed),
             "isolated": bool(meta.get("isolated")), "seconds": seconds, "cpu_seconds": cpu, "actor_setup": meta.get("actor_setup") or {},
             "node_id": _node_id(), "peak_rss_mb": peak, "finished": now(),
             "store": retry.total([meta.get("store"), retry.since(before)])}  # what the store made us retry
    store.write_json(f"{STATS_DIR}/{u.unit_id}.json", stats)  # last: the unit's only proof it is done
    return summary(u.unit_id, table.num_rows, kept, bool(meta.get("isolated")), pass_=None if r is None else str(r))
