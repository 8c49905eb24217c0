"""The curation engine: stages as data, turned into Ray Data operations in this one place.

One Ray Data block is one input unit, all the way through. The read function emits one block
per unit; every stage runs on whole blocks (map_batches with batch_size=None, sub-batched inside
by the stage's batch_size); DataContext.target_max_block_size is lifted so blocks are never split;
a last map_batches writes the unit's outputs on the worker and returns a one-row summary. Image
bytes never reach the driver: it holds the unit listing and the summaries of units in flight.
Per-unit counters (seconds per stage, the unit's read error, worker crashes) ride in the block's
schema metadata, never in rows.

A run has three phases, each resumable:
  1. measure (per unit): read -> decode -> size -> pHash; the worker writes
     RUN/work/measure/{unit}.parquet (no bytes) after {unit}.json (its counters).
  2. dedup (whole run, once every unit is measured): pipeline/dedup.run_dedup, in a Ray task ->
     RUN/work/dedup/{unit}.parquet verdicts (a pure function of phase 1, so reruns agree).
  3. score + write (per unit): the second and last read of the source (a tar's images at their
     measured offsets, no second parse); bytes whose sha256 differs from phase 1's are rejected as
     source_changed and never written. Model stages see only
     survivors (all with --score-all); then the worker writes RUN/catalog/samples/{unit}.parquet,
     the curated shards RUN/shards/{unit}-NNNNN.tar|.parquet and last RUN/stats/{unit}.json,
     the unit's completion marker. With engine.start_actors_early (auto: large runs) this pipeline starts
     executing with the run, its units held at a gate the driver opens after dedup: the model
     stages' actors start and load their models while phases 1 and 2 run, which leave them their CPUs.
The unit listing is streamed into RUN/units.jsonl on the first run (the driver keeps each unit's
id and line offset, never its files); a rerun uses it (inputs added since are reported, not
curated). RUN/.lock keeps a second run out. A worker that dies on a unit is retried
`engine.max_retries` times; then the unit runs again with each sample alone in a child process
(pipeline/isolate.py), and a sample that kills its process is rejected as decode:worker_crash.
Final counts and the funnel come from DuckDB over the catalog.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import sys
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import catalog
from catalog import CURATED_INDEX, SAMPLES

from . import console
from . import dedup as dedup_mod
from .config import load_config
from .sources import (DEFAULT_LIMITS, Unit, check_inputs, count_new, load_unit, read_listing, read_members, read_unit,
                      write_listing)
from .stages import Stage, build_stages

log = logging.getLogger("humanset.curate")

UNIT_META = b"humanset.unit"  # block schema metadata: the unit and its counters
TEST_CRASH_ENV = "HUMANSET_TEST_CRASH_URI"  # test only: a worker decoding a source_uri with this text dies


class RunError(Exception):
    """The run cannot go on (bad config for this RUN, a model that does not load, ...)."""


# --------------------------------------------------------------------------------------------
# Stage application: one function for task stages, one class for actor-pool stages.

# stage-to-stage columns that never reach the catalog
INTERNAL_TYPES = {"_thumb": pa.binary()}


def _typed(col: str, values: list) -> pa.Array:
    return pa.array(values, type=INTERNAL_TYPES[col] if col in INTERNAL_TYPES else SAMPLES.field(col).type)


def _set(table: pa.Table, col: str, arr) -> pa.Table:
    idx = table.schema.get_field_index(col)
    return table.set_column(idx, col, arr) if idx >= 0 else table.append_column(col, arr)


def _flag(batch: pa.Table, col: str, default: bool) -> np.ndarray:
    return pc.fill_null(batch.column(col), default).to_numpy(zero_copy_only=False).astype(bool)


def _scatter(values: pa.Array, idx: np.ndarray, n: int) -> pa.Array:
    """values for rows idx of an n-row batch; null elsewhere."""
    if len(idx) == n:
        return values
    pos = np.full(n, -1, np.int64)
    pos[idx] = np.arange(len(idx))
    return values.take(pa.array(pos, mask=pos < 0))


def _append_name(lists: pa.Array, todo: np.ndarray, name: str) -> pa.Array:
    """list<string> column with `name` appended on rows where todo (a null list becomes [name])."""
    lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    n = len(lists)
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


def run_stage(stage: Stage, batch: pa.Table, score_all: bool) -> pa.Table:
    """Measure the rows this stage should see and merge its columns into the batch.

    Measure stages see every row. Score stages see rows still alive (all decodable rows with
    score_all); other rows get nulls. Afterwards `_alive` drops rows this stage rejects.
    Columns are assembled with Arrow kernels: no Python loop over rows here.
    """
    n = batch.num_rows
    todo = np.ones(n, dtype=bool)
    if stage.phase != "measure":
        todo &= pc.is_null(batch.column("decode_error")).to_numpy(zero_copy_only=False).astype(bool)
        if not score_all:
            todo &= _flag(batch, "_alive", False)
    idx = np.flatnonzero(todo)
    if len(idx):
        wanted = [c for c in set(stage.reads) | {"sample_id"} if c in batch.column_names]
        sub = batch.select(wanted)  # select first: take copies, and the image bytes are big
        sub = sub.take(pa.array(idx, pa.int64())) if len(idx) < n else sub
        result = stage.measure(sub.to_pydict())
    else:
        result = {c: [] for c in stage.writes}
    for col in stage.writes:
        got = result.get(col, [None] * len(idx))
        if len(got) != len(idx):
            raise RunError(f"stage {stage.name} returned {len(got)} values of {col} for {len(idx)} rows")
        batch = _set(batch, col, _scatter(_typed(col, got), idx, n))
    batch = _set(batch, "scored_stages", _append_name(batch.column("scored_stages"), todo, stage.name))
    if stage.name != "dedup":  # dedup's verdict needs the whole run; it is applied in phase 3
        rejected = pc.is_valid(pa.array(stage.reject(batch), pa.string()))
        alive = pc.and_(pc.fill_null(batch.column("_alive"), False), pc.invert(rejected))
        batch = _set(batch, "_alive", alive)
    return batch


_TASK_STAGES: dict[str, Stage] = {}


def _task_fn(batch: pa.Table, name: str, cfg: dict, score_all: bool) -> pa.Table:
    """Ray Data task: stateless stages, one instance per worker process."""
    key = json.dumps([name, cfg], sort_keys=True, default=str)
    if key not in _TASK_STAGES:
        from .stages import stage_class
        _TASK_STAGES[key] = stage_class(name)(cfg)
        _TASK_STAGES[key].setup()
    return run_on_unit(_TASK_STAGES[key], batch, score_all)


ACTOR_NICE = 10  # model actors' CPU priority below the engine's tasks (nice +10; GPUs are not affected)


class _ActorFn:
    """Ray Data actor: stateful stages load their model once per actor.

    When the actor started and when its model was ready (epoch seconds) ride in each unit's
    counters (`actor_setup`), so a run shows whether set-up sat on its critical path."""

    def __init__(self, name: str, cfg: dict, score_all: bool):
        t0 = time.time()
        try:  # the tasks that feed the models (measure, read, write) keep the cores first: actors
            os.nice(ACTOR_NICE)  # started early load their models in the CPU measure leaves idle
        except OSError:
            pass
        from .stages import stage_class
        self.stage = stage_class(name)(cfg)
        self.stage.setup()
        self.score_all = score_all
        if "torch" in sys.modules:  # torch threads = the actor's CPUs (ONNX Runtime stages set theirs)
            import torch
            torch.set_num_threads(max(1, int(round(self.stage.resources.num_cpus))))
        self.setup_span = [round(t0, 3), round(time.time(), 3)]

    def __call__(self, batch: pa.Table) -> pa.Table:
        out = run_on_unit(self.stage, batch, self.score_all)
        meta = unit_meta(out)
        meta.setdefault("actor_setup", {})[self.stage.name] = self.setup_span
        return with_meta(out, meta)


def _pool(stage: Stage):
    """Ray Data's actor pool for a stateful stage: `concurrency` N is a fixed pool, [min, max] an
    autoscaling one; unset (or "auto"), it autoscales from 1 to as many actors as the cluster's
    CPUs (GPUs for a GPU stage) can hold at the stage's resources."""
    import ray

    c = stage.concurrency
    if isinstance(c, int):
        return ray.data.ActorPoolStrategy(size=c)
    res, total = stage.resources, ray.cluster_resources()
    cpus = total.get("CPU", 1)
    if _local_cores:  # a local Ray counts more logical CPUs than cores: autoscale to the cores
        cpus = min(cpus, _local_cores)
    if res.num_gpus:
        fit = max(1, int(total.get("GPU", 0) // res.num_gpus))
    else:
        fit = max(1, int(cpus // max(res.num_cpus, 1e-3)))
    if isinstance(c, tuple):  # [min, max]; a null max means "what the cluster holds"
        lo = int(c[0] or 1)
        return ray.data.ActorPoolStrategy(min_size=lo, max_size=max(lo, int(c[1]) if c[1] else fit))
    return ray.data.ActorPoolStrategy(min_size=1, max_size=fit)


def apply_stage(ds, stage: Stage, score_all: bool, retries: int = 2):
    """The one place a stage becomes a Ray Data operation.

    One block is one unit (batch_size=None); run_on_unit cuts it into stage.batch_size batches.
    A worker that dies is retried `retries` times, then the unit's block is dropped and the
    driver re-runs the unit sample by sample (pipeline/isolate.py)."""
    res = stage.resources
    kw = dict(batch_size=None, batch_format="pyarrow", num_cpus=res.num_cpus)
    if res.num_gpus:
        kw["num_gpus"] = res.num_gpus
    if res.memory_gb:
        kw["memory"] = int(res.memory_gb * 2**30)
    if stage.stateful:
        return ds.map_batches(_ActorFn, fn_constructor_kwargs=dict(name=stage.name, cfg=stage.cfg,
                              score_all=score_all), compute=_pool(stage),
                              max_restarts=retries, max_task_retries=retries, **kw)
    return ds.map_batches(_task_fn, fn_kwargs=dict(name=stage.name, cfg=stage.cfg, score_all=score_all),
                          max_retries=retries, **kw)



# --------------------------------------------------------------------------------------------
# A unit's block: per-unit counters in its schema metadata; stages applied to the whole unit.

def unit_meta(table: pa.Table) -> dict:
    raw = (table.schema.metadata or {}).get(UNIT_META)
    return json.loads(raw) if raw else {"seconds": {}}


def with_meta(table: pa.Table, meta: dict) -> pa.Table:
    return table.replace_schema_metadata({UNIT_META: json.dumps(meta).encode()})


def _error_column(stage: Stage) -> str:
    return next((c for c in stage.writes if c.endswith("_error")), "decode_error")


def run_on_unit(stage: Stage, table: pa.Table, score_all: bool) -> pa.Table:
    """Run a stage over a unit's block in stage.batch_size batches; time it per unit.

    A batch whose stage raises is re-run row by row; a row that still raises gets the message in
    the stage's error column (decode_error for stages without one) and leaves the cascade."""
    meta = unit_meta(table)
    _test_crash_hook(stage, table)
    t0 = time.perf_counter()
    step = max(1, stage.batch_size)
    parts = []
    for off in range(0, table.num_rows, step):
        part = table.slice(off, step)
        try:
            parts.append(run_stage(stage, part, score_all))
        except Exception as e:
            if isinstance(e, RunError):
                raise
            log.warning("stage %s raised on a batch of unit %s (%s: %s); retrying its samples one by one",
                        stage.name, meta.get("unit", {}).get("unit_id"), type(e).__name__, e)
            parts += [_run_row(stage, part.slice(i, 1), score_all) for i in range(part.num_rows)]
    out = pa.concat_tables(parts, promote_options="default") if parts else run_stage(stage, table, score_all)
    meta.setdefault("seconds", {})
    meta["seconds"][stage.name] = round(meta["seconds"].get(stage.name, 0.0) + time.perf_counter() - t0, 4)
    return with_meta(out, meta)


def _run_row(stage: Stage, row: pa.Table, score_all: bool) -> pa.Table:
    try:
        return run_stage(stage, row, score_all)
    except Exception as e:
        if isinstance(e, RunError):
            raise
        for col in stage.writes:
            row = _set(row, col, _typed(col, [None]))
        col = _error_column(stage)
        row = _set(row, col, _typed(col, [f"decoder error: stage {stage.name} raised {type(e).__name__}: {e}"]))
        return _set(row, "_alive", pa.array([False], pa.bool_()))


def _test_crash_hook(stage: Stage, table: pa.Table) -> None:
    """Test only: with HUMANSET_TEST_CRASH_URI set, the process running stage
    HUMANSET_TEST_CRASH_STAGE (default decode) on that sample dies, the way a segfault in a native
    decoder kills it."""
    marker = os.environ.get(TEST_CRASH_ENV)
    if (marker and stage.name == os.environ.get(TEST_CRASH_ENV.replace("URI", "STAGE"), "decode")
            and "source_uri" in table.column_names):
        if any(marker in (u or "") for u in table.column("source_uri").to_pylist()):
            os._exit(77)


# --------------------------------------------------------------------------------------------
# Worker side: read a unit into one block, write a unit's outputs, return a one-row summary.

_READ_FIELDS = [SAMPLES.field(c) for c in ("sample_id", "source_uri", "shard", "key", "caption", "source_meta")] + [
    pa.field("image", pa.binary()), pa.field("read_error", pa.string()), pa.field("_alive", pa.bool_()),
    SAMPLES.field("scored_stages"), pa.field("_offset", pa.int64()), pa.field("_size", pa.int64())]
MEMBER_SPAN = ("_offset", "_size")  # a tar sample's image member: phase 3 reads it back without parsing the tar
READ_SCHEMA = pa.schema(_READ_FIELDS)
SUMMARY_SCHEMA = pa.schema([("unit_id", pa.string()), ("inputs", pa.int64()), ("kept", pa.int64()),
                            ("isolated", pa.bool_())])


def _one_unit(batch: pa.Table, run: Path) -> Unit:
    """The block's unit with its files, read from its line of RUN/units.jsonl (the driver hands
    out units without their files)."""
    items = batch.column("unit").to_pylist()
    if len(items) != 1:  # from_items makes one block per unit; anything else is a bug here
        raise RunError(f"engine: a block holds {len(items)} units, expected 1")
    return load_unit(Unit.from_dict(json.loads(items[0])), listing_path(run))


def listing_path(run: Path) -> Path:
    return run / "units.jsonl"


def _summary(unit_id: str, inputs: int, kept: int | None = None, isolated: bool = False) -> pa.Table:
    return pa.Table.from_pylist([{"unit_id": unit_id, "inputs": inputs, "kept": kept, "isolated": isolated}],
                                schema=SUMMARY_SCHEMA)


def _measure_paths(run: Path, unit_id: str) -> tuple[Path, Path]:
    d = run / "work" / "measure"
    return d / f"{unit_id}.parquet", d / f"{unit_id}.json"


def read_for_measure(unit: Unit, limits: dict) -> pa.Table:
    """Phase 1 input: every sample of the unit with its bytes (the first read of the source)."""
    t0 = time.perf_counter()
    rows, unit_error = read_unit(unit, limits)
    for r in rows:
        r["_alive"] = True
    table = pa.Table.from_pylist(rows, schema=READ_SCHEMA)
    del rows  # the bytes live once, in the table
    return with_meta(table, {"unit": unit.brief().to_dict(), "unit_error": unit_error,
                             "seconds": {"read": round(time.perf_counter() - t0, 4)}})


def finish_measure(run: Path, table: pa.Table) -> pa.Table:
    """Write the unit's phase-1 file (no bytes) after its counters; return the unit's summary."""
    meta = unit_meta(table)
    unit_id = meta["unit"]["unit_id"]
    keep = [c for c in table.column_names if c in SAMPLES.names or c == "_alive" or c in MEMBER_SPAN]
    pq_path, json_path = _measure_paths(run, unit_id)
    catalog.write_json(json_path, {k: meta.get(k) for k in ("unit_error", "seconds", "worker_crashes", "isolated")})
    catalog.write_parquet(pq_path, table.select(keep).replace_schema_metadata(None))
    return _summary(unit_id, table.num_rows, isolated=bool(meta.get("isolated")))


def _measure_block(batch: pa.Table, run: str, limits: dict) -> pa.Table:
    unit = _one_unit(batch, Path(run))
    table = read_for_measure(unit, limits)
    if table.num_rows == 0:  # Ray Data drops empty blocks: an empty unit is finished here
        finish_measure(Path(run), table)
    return table


def _finish_measure_block(batch: pa.Table, run: str) -> pa.Table:
    return finish_measure(Path(run), batch)


def _measured_table(run: Path, unit_id: str) -> pa.Table:
    """Phase-1 rows of a unit joined with the run's dedup verdicts; `_alive` after dedup."""
    t = pq.read_table(_measure_paths(run, unit_id)[0])
    dup = {r["sample_id"]: r for r in dedup_mod.read_verdicts(run, unit_id).to_pylist()}
    ids = t.column("sample_id").to_pylist()
    for col in ("dup_of", "dup_kind", "dup_cluster_size"):
        t = _set(t, col, _typed(col, [dup.get(i, {}).get(col) for i in ids]))
    alive = [a and k is None for a, k in zip(t.column("_alive").to_pylist(), t.column("dup_kind").to_pylist())]
    return _set(t, "_alive", pa.array(alive, pa.bool_()))


def _spans(table: pa.Table, need: set[str]) -> dict[str, tuple[int, int]] | None:
    """(offset, size) of each needed sample's image in its tar; None unless every one has it."""
    if not set(MEMBER_SPAN) <= set(table.column_names):
        return None
    cols = [table.column(c).to_pylist() for c in ("sample_id",) + MEMBER_SPAN]
    spans = {sid: (off, size) for sid, off, size in zip(*cols) if sid in need and off is not None}
    return spans if len(spans) == len(need) else None


def read_for_score(run: Path, unit: Unit, limits: dict, score_all: bool) -> pa.Table:
    """Phase 3 input: the unit's measurements and verdicts, with the bytes of the samples that go
    on (the second and last read of the source), each checked against its measured sha256."""
    import hashlib
    t0 = time.perf_counter()
    table = _measured_table(run, unit.unit_id)
    counters = catalog.read_json(_measure_paths(run, unit.unit_id)[1])
    ids = table.column("sample_id").to_pylist()
    shas = table.column("sha256").to_pylist()
    errors = table.column("decode_error").to_pylist()
    alive = table.column("_alive").to_pylist()
    need = {sid for sid, a, e in zip(ids, alive, errors) if (a or score_all) and e is None}
    images: dict[str, bytes] = {}
    verified: set[str] = set()
    if need:
        spans = _spans(table, need)
        fast = read_members(unit, spans) if spans is not None else None
        if fast:  # a tar's members read where they were measured; those whose bytes still match are done
            sha_of = dict(zip(ids, shas))
            verified = {sid for sid, data in fast.items() if hashlib.sha256(data).hexdigest() == sha_of[sid]}
            images = {sid: fast[sid] for sid in verified}
            del fast
        if len(verified) < len(need):  # a folder's files, a remote or rewritten shard: read it all again
            rows, _ = read_unit(unit, limits)
            images.update({r["sample_id"]: r["image"] for r in rows
                           if r["sample_id"] in need and r["sample_id"] not in verified and r["image"] is not None})
            del rows
    changed = 0
    for i, sid in enumerate(ids):
        if sid not in need or sid in verified:
            continue
        data = images.get(sid)
        if data is None or hashlib.sha256(data).hexdigest() != shas[i]:
            images.pop(sid, None)  # the new bytes are never written
            errors[i] = ("source changed: the sample can no longer be read" if data is None else
                         f"source changed: sha256 {hashlib.sha256(data).hexdigest()} now, {shas[i]} when measured")
            alive[i] = False
            changed += 1
    if changed:
        log.warning("unit %s: %d samples changed since they were measured (rejected as source_changed)",
                    unit.unit_id, changed)
    table = _set(table, "decode_error", _typed("decode_error", errors))
    table = _set(table, "_alive", pa.array(alive, pa.bool_()))
    table = table.append_column("image", pa.array([images.get(s) for s in ids], pa.binary()))
    seconds = dict(counters.get("seconds") or {})
    seconds["read_2"] = round(time.perf_counter() - t0, 4)
    return with_meta(table, {"unit": unit.brief().to_dict(), "unit_error": counters.get("unit_error"),
                             "seconds": seconds, "worker_crashes": counters.get("worker_crashes") or 0,
                             "source_changed": changed, "isolated": bool(counters.get("isolated"))})


SIDECAR = ("sample_id", "source_uri", "key", "caption", "width", "height", "person_boxes", "person_scores",
           "person_keypoints")
INDEX_EXTRA = ("sample_id", "source_uri", "format", "width", "height", "sha256", "n_persons")


def write_curated(folder: Path, unit_id: str, kept: pa.Table, images: dict[str, bytes], cfg: dict) -> list[str]:
    """Curated shards of one unit: {sample_id}.{ext} original bytes + {sample_id}.json sidecar."""
    out = cfg["output"]
    with catalog.ShardWriter(folder, unit_id, CURATED_INDEX, max_count=out["shard_max_count"],
                             max_bytes=out["shard_max_bytes"]) as w:
        cols = set(SIDECAR) | set(INDEX_EXTRA)  # only what the shards hold leaves Arrow, row by row
        for r in kept.select([c for c in kept.column_names if c in cols]).to_pylist():
            ext = (r["format"] or "bin").lower().replace("jpeg", "jpg")
            sidecar = {k: r[k] for k in SIDECAR if r.get(k) is not None}
            w.add(r["sample_id"], {ext: images[r["sample_id"]], "json": sidecar}, {k: r.get(k) for k in INDEX_EXTRA})
    return w.written


def finish_unit(run: Path, table: pa.Table, cfg: dict) -> pa.Table:
    """Decide, write the unit's curated shards and catalog part, then its stats marker (last)."""
    from .decide import decide
    meta = unit_meta(table)
    u = Unit.from_dict(meta["unit"])
    t0 = time.perf_counter()
    table = decide(table, build_stages(cfg))
    kept = table.filter(table.column("keep"))
    images = dict(zip(kept.column("sample_id").to_pylist(), kept.column("image").to_pylist())) if kept.num_rows else {}
    written = write_curated(run / "shards", u.unit_id, kept, images, cfg) if kept.num_rows else []
    samples = catalog.conform(table.select([c for c in table.column_names if c in SAMPLES.names]), SAMPLES)
    catalog.write_parquet(run / "catalog" / "samples" / f"{u.unit_id}.parquet", samples)
    reasons: dict[str, int] = {}
    for r in table.column("reject_reason").to_pylist():
        if r:
            reasons[r] = reasons.get(r, 0) + 1
    seconds = dict(meta.get("seconds") or {})
    seconds["write"] = round(time.perf_counter() - t0, 4)
    stats = {"unit": u.unit_id, "source": u.uri, "inputs": table.num_rows, "kept": kept.num_rows,
             "rejected": dict(sorted(reasons.items())), "shards": written, "unit_error": meta.get("unit_error"),
             "worker_crashes": meta.get("worker_crashes") or 0, "source_changed": meta.get("source_changed") or 0,
             "isolated": bool(meta.get("isolated")), "seconds": seconds, "actor_setup": meta.get("actor_setup") or {},
             "finished": _now()}
    catalog.write_json(run / "stats" / f"{u.unit_id}.json", stats)
    return _summary(u.unit_id, table.num_rows, kept.num_rows, bool(meta.get("isolated")))


def _score_block(batch: pa.Table, run: str, limits: dict, score_all: bool, cfg: dict) -> pa.Table:
    unit = _one_unit(batch, Path(run))
    table = read_for_score(Path(run), unit, limits, score_all)
    if table.num_rows == 0:  # Ray Data drops empty blocks: an empty unit is finished here
        finish_unit(Path(run), table, cfg)
    return table


def _finish_unit_block(batch: pa.Table, run: str, cfg: dict) -> pa.Table:
    return finish_unit(Path(run), batch, cfg)


# --------------------------------------------------------------------------------------------
# Driver side: one Ray Data pipeline per phase; summaries only.

def task_poll(seconds: float) -> None:
    """Make Ray Data's scheduling loop notice a finished task within `seconds`.

    Its loop waits (ray.wait) for *all* running tasks or 0.1 s, whichever comes first, before it
    hands a freed CPU the next block. With unit tasks of 0.3-1.5 s on two CPUs that kept a core idle
    10-30% of the time (bench/scale.py). The wait is a module constant of Ray Data's executor with no
    public setting; where a Ray version lacks it, nothing changes."""
    try:
        from ray.data._internal.execution import streaming_executor_state as state
    except ImportError:
        return
    if isinstance(getattr(state, "WAIT_FOR_TASK_COMPLETION_TIMEOUT_S", None), (int, float)):
        state.WAIT_FOR_TASK_COMPLETION_TIMEOUT_S = float(seconds)


@contextmanager
def _unit_blocks(ray, cpus: float | None = None):
    """Data context of the engine's datasets: blocks never split (one block = one unit), a block
    whose task failed after its retries is dropped instead of aborting (its unit is redone).
    With `cpus`, the datasets built in it use at most that many (others are held by actors)."""
    import copy
    ctx = ray.data.DataContext.get_current()
    old = (ctx.target_max_block_size, ctx.max_errored_blocks, ctx.execution_options)
    ctx.target_max_block_size, ctx.max_errored_blocks = None, -1
    if cpus is not None:  # a new options object: datasets built before keep theirs
        ctx.execution_options = copy.copy(ctx.execution_options)
        ctx.execution_options.resource_limits = ctx.execution_options.resource_limits.copy(cpu=cpus)
    try:
        yield ctx
    finally:
        ctx.target_max_block_size, ctx.max_errored_blocks, ctx.execution_options = old


def _units_ds(units: list[Unit]):
    import ray
    return ray.data.from_items([{"unit": json.dumps(u.to_dict())} for u in units], override_num_blocks=len(units))


def _drain(batches, total: int, desc: str, progress: bool) -> dict:
    """Consume a phase's summaries (one row per unit): counts only, nothing per sample."""
    got = {"units": 0, "inputs": 0, "kept": 0}
    with console.progress(total, desc, enabled=progress) as bar:
        for batch in batches:
            got["units"] += batch.num_rows
            got["inputs"] += int(pc.sum(batch.column("inputs")).as_py() or 0)
            got["kept"] += int(pc.sum(batch.column("kept")).as_py() or 0)
            bar.update(batch.num_rows)
    return got


def _limits(cfg: dict) -> dict:
    inp = cfg.get("input", {})
    return {k: int(inp.get(k, v)) for k, v in DEFAULT_LIMITS.items()}


def _retries(cfg: dict) -> int:
    return int(cfg.get("engine", {}).get("max_retries", 2))


def _measure(run: Path, units: list[Unit], stages: list[Stage], cfg: dict, score_all: bool, progress: bool,
             cpus: float | None = None):
    import ray
    retries = _retries(cfg)
    with _unit_blocks(ray, cpus):
        ds = _units_ds(units).map_batches(_measure_block, fn_kwargs=dict(run=str(run), limits=_limits(cfg)),
                                          batch_size=None, batch_format="pyarrow", max_retries=retries)
        for s in stages:
            ds = apply_stage(ds, s, score_all, retries)
        ds = ds.map_batches(_finish_measure_block, fn_kwargs=dict(run=str(run)), batch_size=None,
                            batch_format="pyarrow", max_retries=retries)
        _drain(ds.iter_batches(batch_format="pyarrow", batch_size=None), len(units), "measure", progress)
    failed = [u for u in units if not _measure_paths(run, u.unit_id)[0].exists()]
    if failed:
        _isolate(run, failed, "measure", cfg, score_all, progress)


def _score_ds(run: Path, units: list[Unit], stages: list[Stage], cfg: dict, score_all: bool, gate=None):
    """Phase 3 as one Ray Data pipeline; with a gate, its units wait for the gate to open first."""
    import ray
    retries = _retries(cfg)
    with _unit_blocks(ray):  # a Dataset keeps the context it was built in
        ds = _units_ds(units)
        if gate is not None:  # one zero-CPU task at a time waits (no CPU or worker per unit held); once
            # the gate is open a unit passes in a few milliseconds, far below its work downstream
            ds = ds.map_batches(_after_gate, fn_kwargs=dict(gate=gate[0], token=gate[1]), batch_size=None,
                                batch_format="pyarrow", num_cpus=0, compute=ray.data.TaskPoolStrategy(size=1))
        ds = ds.map_batches(_score_block, fn_kwargs=dict(run=str(run), limits=_limits(cfg),
                            score_all=score_all, cfg=cfg), batch_size=None, batch_format="pyarrow",
                            max_retries=retries)
        for s in stages:
            ds = apply_stage(ds, s, score_all, retries)
        return ds.map_batches(_finish_unit_block, fn_kwargs=dict(run=str(run), cfg=cfg), batch_size=None,
                              batch_format="pyarrow", max_retries=retries)


def _score_and_write(run: Path, units: list[Unit], stages: list[Stage], cfg: dict, score_all: bool,
                     progress: bool, early: "_EarlyScore | None" = None):
    if early is not None:
        _drain(early.open(), len(units), "score+write", progress)
    else:
        ds = _score_ds(run, units, stages, cfg, score_all)
        _drain(ds.iter_batches(batch_format="pyarrow", batch_size=None), len(units), "score+write", progress)
    failed = [u for u in units if not (run / "stats" / f"{u.unit_id}.json").exists()]
    if failed:
        _isolate(run, failed, "score", cfg, score_all, progress)


# Phase 3 started ahead of time: Ray Data creates an actor pool's actors (and each loads its model)
# when the pipeline starts executing, so the score pipeline starts with the run, its units held at
# a gate that the driver opens once dedup is done. Model set-up then overlaps measure and dedup.

class _Gate:
    """Ray actor (no CPU): the score phase's units wait in wait() until the driver calls open()."""

    def __init__(self):
        import asyncio
        self._opened, self._go = asyncio.Event(), False

    async def open(self, go: bool) -> None:
        self._go = go
        self._opened.set()

    async def wait(self) -> bool:
        await self._opened.wait()
        return self._go


_OPEN_GATES: set[str] = set()  # in a worker: gates seen open, so later units pass without asking


def _after_gate(batch: pa.Table, gate, token: str) -> pa.Table:
    """Ray Data task: a unit passes once its run's dedup is done; none pass if the run stopped."""
    if token not in _OPEN_GATES:
        import ray
        if not ray.get(gate.wait.remote()):
            return batch.slice(0, 0)  # an empty block: the unit goes no further
        _OPEN_GATES.add(token)
    return batch


class _EarlyScore:
    """The score phase's pipeline, executing in a driver thread from the start of the run."""

    def __init__(self, run: Path, units: list[Unit], stages: list[Stage], cfg: dict, score_all: bool):
        import queue
        import threading
        import uuid

        import ray
        self._actor_cpus = actor_cpus(cfg)
        self._gate = ray.remote(num_cpus=0, max_restarts=0)(_Gate).remote()
        self._ds = _score_ds(run, units, stages, cfg, score_all, gate=(self._gate, uuid.uuid4().hex))
        self._out: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._execute, name="humanset-score", daemon=True)
        self._thread.start()

    def _execute(self) -> None:
        try:  # starting the execution starts the actor pools; summaries come once the gate opens
            for batch in self._ds.iter_batches(batch_format="pyarrow", batch_size=None):
                self._out.put(batch)
        except BaseException as e:  # handed to the driver's thread when it drains
            self._out.put(e)
        self._out.put(None)

    def measure_cpus(self) -> float:
        """CPUs left to phase 1 while the pools' first actors hold theirs (cpu_shortfall keeps it >= 1)."""
        import ray
        return max(1.0, ray.cluster_resources().get("CPU", 1) - self._actor_cpus)

    def open(self):
        """Let the units through; yields their summaries as they are written."""
        import ray
        ray.get(self._gate.open.remote(True))
        while (item := self._out.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
        self._thread.join()

    def abort(self) -> None:
        """The run stopped before phase 3: no unit passes; the pipeline ends and frees its actors."""
        import ray
        try:
            ray.get(self._gate.open.remote(False), timeout=30)
        except Exception as e:  # the run's own error is the one to report
            log.debug("score gate: %s", e)
        self._thread.join(timeout=60)


def _run_dedup(run: Path, unit_ids: list[str], cfg: dict) -> dict:
    """Phase 2 in one Ray task on a worker, which starts the near-search tables as tasks of its own:
    its per-sample arrays (sample ids, hashes, areas, the union-find; see pipeline/dedup.py) never
    enter the driver, which holds the unit ids and gets the counts back. The task resumes from
    the files a crashed attempt left (per table, then the verdicts), so it is retried like a unit."""
    import ray
    task = ray.remote(num_cpus=1, max_retries=_retries(cfg))(dedup_mod.run_dedup)
    return ray.get(task.remote(str(run), unit_ids, cfg))


def _start_actors_early(cfg: dict, stages: list[Stage], units_to_measure: int) -> bool:
    """engine.start_actors_early: true, false, or auto (early when measure has at least
    engine.early_min_units units, enough work for the actors' set-up to hide behind)."""
    eng = cfg.get("engine", {})
    mode = eng.get("start_actors_early", "auto")
    if mode == "auto":
        mode = units_to_measure >= int(eng.get("early_min_units", 16))
    return bool(mode) and any(s.stateful for s in stages)


def _isolate(run: Path, units: list[Unit], phase: str, cfg: dict, score_all: bool, progress: bool):
    """Units whose workers kept dying: redo each with every sample alone in a child process."""
    import ray

    from .isolate import isolate_unit
    log.warning("%d units failed in %s after %d retries: running their samples one at a time",
                len(units), phase, _retries(cfg))
    task = ray.remote(num_cpus=1, max_retries=0)(isolate_unit)
    env = {k: v for k, v in os.environ.items() if k == TEST_CRASH_ENV}
    refs = [task.remote(str(run), u.to_dict(), phase, cfg, score_all, _limits(cfg), env) for u in units]
    with console.progress(len(refs), f"{phase} (isolated)", enabled=progress) as bar:
        while refs:
            ready, refs = ray.wait(refs, num_returns=1)
            try:
                summary = ray.get(ready[0])
            except Exception as e:
                raise RunError(f"a unit failed even with its samples run one at a time: {e}") from e
            log.warning("unit %s: %d worker crashes isolated", summary["unit_id"], summary["worker_crashes"])
            bar.update(1)


# --------------------------------------------------------------------------------------------

def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _versions() -> dict:
    import importlib.metadata as md
    out = {"python": platform.python_version()}
    for pkg in ("humanset", "ray", "pyarrow", "duckdb", "pillow", "imagehash", "torch", "ultralytics",
                "rapidocr", "timm", "open_clip_torch"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def loopback_only() -> None:
    """Keep a single-machine Ray on 127.0.0.1: by default Ray swaps loopback for the machine's
    network address. Set before the cluster starts; its processes inherit the variable."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if "ray" in sys.modules:
        import ray._private.ray_constants as rc
        rc.ENABLE_RAY_CLUSTER = False


def actor_cpus(cfg: dict, configured: bool = False) -> float:
    """CPUs the model stages' actor pools hold at their minimum size (they hold them for the run):
    of the stages that run, or with `configured` of every model stage the config lists (a stage
    skipped for want of weights may run in a later curation on the same Ray)."""
    total = 0.0
    for s in build_stages(cfg):
        if s.stateful and (configured or s.enabled) and s.name in cfg.get("stages", [s.name]):
            c = s.concurrency
            low = c if isinstance(c, int) else int(c[0] or 1) if isinstance(c, tuple) else 1
            total += low * s.resources.num_cpus
    return total


_local_cores: int | None = None  # set when init_ray starts a local Ray with extra logical CPUs


def cpu_shortfall(cluster_cpus: float, cfg: dict) -> str | None:
    """Why a cluster of `cluster_cpus` CPUs cannot run this config's pipeline, or None."""
    need = actor_cpus(cfg) + 1
    if cluster_cpus >= need:
        return None
    return (f"the Ray cluster has {cluster_cpus:g} CPUs; the model stages' actors hold {need - 1:g} and reading "
            "and writing need at least one more, so the run would wait forever: give the cluster more CPUs "
            "(ray.num_cpus for a local run), or lower resources.num_cpus / concurrency of the person, text, "
            "watermark and art stages")


def init_ray(cfg: dict):
    """Connect to the cluster this driver runs in (ray submit / ray job submit), else start one here.

    The model stages' actors hold their CPUs for the whole run, and the engine's read and write
    steps need at least one more: with fewer, the pipeline waits forever. A local cluster is started
    with enough logical CPUs (more than the cores of a small machine: the read and write steps are
    light); a cluster without them is refused with what to change."""
    global _local_cores
    address = cfg.get("ray", {}).get("address")
    local = address is None and not os.environ.get("RAY_ADDRESS") and not Path(
        "/tmp/ray/ray_current_cluster").exists()
    if local:
        loopback_only()
    import ray
    console.quiet_ray()
    if ray.is_initialized():
        short = cpu_shortfall(ray.cluster_resources().get("CPU", 0), cfg)
        if short:
            raise RunError(short)
        return
    kw = dict(include_dashboard=False, log_to_driver=True, logging_level=logging.WARNING)
    if local:  # a private single-node cluster, reachable on loopback only
        console.token_auth_notice()
        num_cpus = cfg.get("ray", {}).get("num_cpus")
        if not num_cpus:
            _local_cores = os.cpu_count() or 1
            num_cpus = max(_local_cores, int(np.ceil(actor_cpus(cfg, configured=True))) + 2)
        ray.init(num_cpus=num_cpus, **kw)
    else:
        ray.init(address=address or "auto", **{k: v for k, v in kw.items() if k != "include_dashboard"})
    res = ray.cluster_resources()
    short = cpu_shortfall(res.get("CPU", 0), cfg)
    if short:
        raise RunError(short)
    log.info("ray: %s, %g CPU, %g GPU", "private local cluster on 127.0.0.1 (token authentication on)" if local
             else f"cluster at {address or 'auto'}", res.get("CPU", 0), res.get("GPU", 0))


def _load_units(run: Path, inputs: list[str], cfg: dict, repeated: int) -> tuple[list[Unit], int, int]:
    """The run's units (without their files): listed into RUN/units.jsonl by the first run, streaming,
    and read back from it by every rerun.

    Returns (units, repeated listings dropped, inputs found now that are not in the saved listing)."""
    path, inp = listing_path(run), cfg["input"]
    if not path.exists():
        units, repeated = write_listing(inputs, path, inp["files_per_unit"], inp["extensions"])
        return units, repeated, 0
    units = read_listing(path)
    new = count_new(inputs, path, inp["files_per_unit"], inp["extensions"])
    if new:
        log.warning("%d inputs appeared since this run started; they are not in this run "
                    "(curate them into a new --output)", new)
    return units, repeated, new


def curate(inputs: list[str], output: str, config: dict | None = None, score_all: bool = False,
           progress: bool = True) -> dict:
    """Run (or finish) a curation run. Returns the manifest."""
    cfg = config or load_config()
    run = Path(output).absolute()  # workers write into it, from their own working directories
    # unusable inputs are refused, naming the input, before anything is written; the listing itself
    # is streamed into RUN/units.jsonl under the lock
    check_inputs(inputs, cfg["input"]["extensions"])
    try:
        with catalog.run_lock(run):
            return _curate_locked(run, inputs, cfg, score_all, progress)
    except catalog.RunLocked as e:
        raise RunError(str(e)) from e


def _curate_locked(run: Path, inputs: list[str], cfg: dict, score_all: bool, progress: bool) -> dict:
    manifest_path = run / "manifest.json"
    manifest = {"config": cfg, "inputs": [str(i) for i in inputs], "score_all": score_all}
    if manifest_path.exists():
        old = catalog.read_json(manifest_path)
        if old.get("config") != cfg or old.get("inputs") != manifest["inputs"] or old.get("score_all") != score_all:
            raise RunError(f"{run}: holds a run with other inputs or config; resume it with the same "
                           "command, or pass a new --output")
        manifest["started"] = old.get("started")
        repeated = int(old.get("repeated_inputs") or 0)
        log.info("resuming %s", run)
    else:
        manifest["started"] = _now()
        repeated = 0
    removed = catalog.clean_tmp(run)
    if removed:
        log.info("removed %d temporary files left by an interrupted run", removed)
    t0 = time.perf_counter()
    units, repeated, new = _load_units(run, inputs, cfg, repeated)
    seconds = {"listing": round(time.perf_counter() - t0, 2)}  # this invocation's phases (wall)
    stages = build_stages(cfg)
    skipped = {s.name: s.skip_reason() for s in stages if not s.enabled}
    for name, why in skipped.items():
        log.warning("stage %s skipped: %s", name, why)
    active = [s for s in stages if s.enabled]
    manifest.update(stages=[s.name for s in active], skipped_stages=skipped, versions=_versions(),
                    stage_info={s.name: s.info() for s in active if s.info()},  # e.g. watermark's method
                    status="running", units=len(units), repeated_inputs=repeated, not_in_this_run=new)
    catalog.write_json(manifest_path, manifest)

    done = {u.unit_id for u in units if (run / "stats" / f"{u.unit_id}.json").exists()}
    todo = [u for u in units if u.unit_id not in done]
    to_measure = [u for u in todo if not _measure_paths(run, u.unit_id)[0].exists()]
    log.info("%d units: %d done, %d to measure, %d to write", len(units), len(done), len(to_measure), len(todo))
    measure_stages = [s for s in active if s.phase == "measure"]
    score_stages = [s for s in active if s.phase == "score"]
    cfg_active = dict(cfg, stages=[s.name for s in active])

    if todo:
        init_ray(cfg)  # Ray Data's own progress off: ours (console.progress) counts units
        task_poll(float(cfg.get("engine", {}).get("task_poll_s", 0.01)))
        t_start = time.time()
        timeline = manifest["timeline"] = {"start": round(t_start, 3)}
        # model actors load while phases 1 and 2 run (engine.start_actors_early)
        early = (_EarlyScore(run, todo, score_stages, cfg_active, score_all)
                 if _start_actors_early(cfg, score_stages, len(to_measure)) else None)
        try:
            if to_measure:  # with early actors, measure leaves their CPUs to them
                t0 = time.perf_counter()
                _measure(run, to_measure, measure_stages, cfg_active, score_all, progress,
                         early.measure_cpus() if early is not None else None)
                seconds["measure"] = round(time.perf_counter() - t0, 2)
            timeline["measured"] = round(time.time(), 3)
            if not dedup_mod.is_done(run):
                t0 = time.perf_counter()
                st = _run_dedup(run, [u.unit_id for u in units], cfg_active)
                seconds["dedup"] = round(time.perf_counter() - t0, 2)
                log.info("dedup: %d of %d candidates are duplicates (%.2f s)", st["duplicates"], st["candidates"],
                         seconds["dedup"])
            timeline["deduped"] = round(time.time(), 3)
        except BaseException:
            if early is not None:
                early.abort()
            raise
        t0 = time.perf_counter()
        _score_and_write(run, todo, score_stages, cfg_active, score_all, progress, early)
        seconds["score_write"] = round(time.perf_counter() - t0, 2)
        timeline["scored"] = round(time.time(), 3)
        log.info("processed %d units in %.1f s", len(todo), time.time() - t_start)

    missing = [u.unit_id for u in units if not (run / "stats" / f"{u.unit_id}.json").exists()]
    if missing:
        raise RunError(f"{len(missing)} units have no stats marker after the run (e.g. {missing[0]}); "
                       "rerun the same command to finish them")
    counts, n_inputs, n_kept = _reason_counts(run)
    manifest.update(status="complete", finished=_now(), funnel=funnel_from_counts(counts, n_inputs, manifest["stages"]),
                    counts={"inputs": n_inputs, "kept": n_kept}, seconds=seconds)
    catalog.write_json(manifest_path, manifest)
    return manifest


def _reason_counts(run: Path) -> tuple[dict[str, int], int, int]:
    """Rejections per stage (first reason), inputs and kept, by DuckDB over the catalog."""
    import duckdb
    from catalog.duck import parts_sql
    con = duckdb.connect()
    rows = con.execute(f"SELECT split_part(reject_reason, ':', 1) AS stage, count(*) FROM "
                       f"{parts_sql(run, 'samples')} GROUP BY 1").fetchall()
    counts = {stage: n for stage, n in rows if stage is not None}
    n_inputs = sum(n for _, n in rows)
    return counts, n_inputs, sum(n for stage, n in rows if stage is None)


def funnel_from_counts(rejected: dict[str, int], n_inputs: int, stage_names: list[str]) -> list[dict]:
    """inputs -> survivors after each stage -> kept (decide.funnel's shape, from grouped counts)."""
    rows, alive = [], n_inputs
    for name in stage_names:
        out = alive - rejected.get(name, 0)
        rows.append({"stage": name, "in": alive, "out": out})
        alive = out
    unknown = sum(n for s, n in rejected.items() if s not in stage_names)
    if unknown:
        rows.append({"stage": "other", "in": alive, "out": alive - unknown})
    return rows
