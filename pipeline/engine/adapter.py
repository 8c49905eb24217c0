"""The stage adapter: the one place a stage becomes a Ray Data operation.

A stage is data (pipeline/stages/base.py); `apply_stage` turns it into `map_batches` over the
engine's blocks: a task for a stateless stage, an actor pool for a stateful one (its model loads
once per actor). One block is one unit; `run_on_unit` cuts it into the stage's batches and, for a
stage that reads `image`, fetches those rows' bytes from the source batch by batch
(pipeline/inputs/fetch.py), so no block ever carries a unit's image bytes between stages.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from catalog.storage import retry
from pipeline.engine.columns import add_seconds, append_name, flag, scatter, set_column, typed, unit_meta, with_meta
from pipeline.engine.errors import RunError
from pipeline.inputs.fetch import ByteSource
from pipeline.inputs.units import Unit
from pipeline.stages import Stage

log = logging.getLogger("humanset.curate")

ACTOR_NICE = 10  # model actors' CPU priority below the engine's tasks (nice +10; GPUs are not affected)
local_cores: int | None = None  # set by engine.init_ray when it starts a local Ray with extra logical CPUs


def _todo(stage: Stage, batch: pa.Table, score_all: bool) -> np.ndarray:
    """Rows this stage measures: every row in phase 1; afterwards the decodable rows still alive
    (every decodable row with score_all)."""
    todo = np.ones(batch.num_rows, dtype=bool)
    if stage.phase != "measure":
        todo &= pc.is_null(batch.column("decode_error")).to_numpy(zero_copy_only=False).astype(bool)
        if not score_all:
            todo &= flag(batch, "_alive", False)
    return todo


def run_stage(stage: Stage, batch: pa.Table, score_all: bool) -> pa.Table:
    """Measure the rows this stage should see and merge its columns into the batch.

    Rows the stage does not see get nulls. Afterwards `_alive` drops rows this stage rejects.
    Columns are assembled with Arrow kernels: no Python loop over rows here.
    """
    n = batch.num_rows
    todo = _todo(stage, batch, score_all)
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
        batch = set_column(batch, col, scatter(typed(col, got), idx, n))
    batch = set_column(batch, "scored_stages", append_name(batch.column("scored_stages"), todo, stage.name))
    if stage.name != "dedup":  # dedup's verdict needs the whole run; it is applied in phase 3
        rejected = pc.is_valid(pa.array(stage.reject(batch), pa.string()))
        alive = pc.and_(pc.fill_null(batch.column("_alive"), False), pc.invert(rejected))
        batch = set_column(batch, "_alive", alive)
    return batch


def _error_column(stage: Stage) -> str:
    return next((c for c in stage.writes if c.endswith("_error")), "decode_error")


def _byte_source(stage: Stage, table: pa.Table, meta: dict) -> ByteSource | None:
    """A reader of the unit's bytes when this stage reads `image` and the block carries none."""
    if "image" not in stage.reads or "image" in table.column_names or "unit" not in meta:
        return None
    return ByteSource(Unit.from_dict(meta["unit"]), meta.get("limits") or {})


def attach_images(part: pa.Table, src: ByteSource, todo: np.ndarray) -> tuple[pa.Table, int]:
    """`part` with the `image` bytes of rows `todo` read back from the source; a row whose bytes
    changed since phase 1 gets decode_error 'source changed: ...' and leaves the cascade.
    Returns the table and how many rows changed."""
    idx = np.flatnonzero(todo)
    images: list[bytes | None] = [None] * part.num_rows
    changed = 0
    if len(idx):
        got, why = src.fetch(part.take(pa.array(idx, pa.int64())))
        errors = part.column("decode_error").to_pylist()
        alive = flag(part, "_alive", False)
        for i, data, problem in zip(idx, got, why):
            images[i] = data
            if problem:
                errors[i], alive[i] = problem, False
                changed += 1
        if changed:
            part = set_column(part, "decode_error", typed("decode_error", errors))
            part = set_column(part, "_alive", pa.array(alive, pa.bool_()))
    return set_column(part, "image", pa.array(images, pa.binary())), changed


def run_on_unit(stage: Stage, table: pa.Table, score_all: bool) -> pa.Table:
    """Run a stage over a unit's block in stage.batch_size batches; time it per unit.

    A batch whose stage raises is re-run row by row; a row that still raises gets the message in
    the stage's error column (decode_error for stages without one) and leaves the cascade."""
    if "fault" in table.column_names:  # a unit's summary (finished early, or a fault): passes through
        return table
    meta = unit_meta(table)
    t0, c0 = time.perf_counter(), time.process_time()
    before = retry.snapshot()
    step = max(1, stage.batch_size)
    src = _byte_source(stage, table, meta)
    fetch_s, fetch_cpu, parts = 0.0, 0.0, []
    try:
        for off in range(0, table.num_rows, step):
            part = table.slice(off, step)
            if src is not None:
                t1, c1 = time.perf_counter(), time.process_time()
                part, changed = attach_images(part, src, _todo(stage, part, score_all))
                fetch_s += time.perf_counter() - t1
                fetch_cpu += time.process_time() - c1
                if changed:
                    meta["source_changed"] = (meta.get("source_changed") or 0) + changed
                    log.warning("unit %s: %d samples changed since they were measured (rejected as "
                                "source_changed)", meta.get("unit", {}).get("unit_id"), changed)
            try:
                out = run_stage(stage, part, score_all)
            except Exception as e:
                if isinstance(e, RunError):
                    raise
                log.warning("stage %s raised on a batch of unit %s (%s: %s); retrying its samples one by one",
                            stage.name, meta.get("unit", {}).get("unit_id"), type(e).__name__, e)
                out = pa.concat_tables([_run_row(stage, part.slice(i, 1), score_all) for i in range(part.num_rows)],
                                       promote_options="default")
            parts.append(out.drop_columns(["image"]) if src is not None else out)
    finally:
        if src is not None:
            src.close()
    out = pa.concat_tables(parts, promote_options="default") if parts else run_stage(stage, table, score_all)
    add_seconds(meta, stage.name, time.perf_counter() - t0 - fetch_s, time.process_time() - c0 - fetch_cpu)
    if src is not None:
        add_seconds(meta, "read_2", fetch_s, fetch_cpu)
    meta["store"] = retry.total([meta.get("store"), retry.since(before)])  # its byte fetches' retries
    return with_meta(out, meta)


def _run_row(stage: Stage, row: pa.Table, score_all: bool) -> pa.Table:
    try:
        return run_stage(stage, row, score_all)
    except Exception as e:
        if isinstance(e, RunError):
            raise
        for col in stage.writes:
            row = set_column(row, col, typed(col, [None]))
        col = _error_column(stage)
        row = set_column(row, col, typed(col, [f"decoder error: stage {stage.name} raised {type(e).__name__}: {e}"]))
        return set_column(row, "_alive", pa.array([False], pa.bool_()))


_TASK_STAGES: dict[str, Stage] = {}


def stage_instance(name: str, cfg: dict) -> Stage:
    """A stateless stage, set up once per worker process."""
    key = json.dumps([name, cfg], sort_keys=True, default=str)
    if key not in _TASK_STAGES:
        from pipeline.stages import stage_class
        _TASK_STAGES[key] = stage_class(name)(cfg)
        _TASK_STAGES[key].setup()
    return _TASK_STAGES[key]


def _task_fn(batch: pa.Table, name: str, cfg: dict, score_all: bool, storage: dict | None = None) -> pa.Table:
    """Ray Data task: stateless stages, one instance per worker process."""
    if storage is not None:
        retry.configure(storage)  # the run's storage.retry_* for its byte fetches (a remote worker's too)
    return run_on_unit(stage_instance(name, cfg), batch, score_all)


class _ActorFn:
    """Ray Data actor: stateful stages load their models once per actor.

    `name` is one stage, or a list of consecutive stages fused into one pool (`StageGroup`): a unit
    then goes through all of them in this process, in cascade order, with no hand-off between pools.
    When the actor started and when each model was ready (epoch seconds) ride in each unit's
    counters (`actor_setup`), so a run shows whether set-up sat on its critical path."""

    def __init__(self, name: str | list[str], cfg: dict | list[dict], score_all: bool, storage: dict | None = None):
        names, cfgs = ([name], [cfg]) if isinstance(name, str) else (list(name), list(cfg))
        t0 = time.time()
        if storage is not None:
            retry.configure(storage)  # the run's storage.retry_* for its byte fetches
        try:  # the tasks that feed the models (measure, read, write) keep the cores first: actors
            os.nice(ACTOR_NICE)  # started early load their models in the CPU measure leaves idle
        except OSError:
            pass
        from pipeline.stages import stage_class
        self.stages, self.setup_spans = [], {}
        for n, c in zip(names, cfgs):
            stage = stage_class(n)(c)
            stage.setup()
            self.stages.append(stage)
            self.setup_spans[n] = [round(t0, 3), round(time.time(), 3)]
        self.score_all = score_all
        if "torch" in sys.modules:  # torch threads = the actor's CPUs (ONNX Runtime stages set theirs)
            import torch
            torch.set_num_threads(max(1, int(round(self.stages[0].resources.num_cpus))))

    def __call__(self, batch: pa.Table) -> pa.Table:
        out = batch
        for stage in self.stages:
            out = run_on_unit(stage, out, self.score_all)
        meta = unit_meta(out)
        meta.setdefault("actor_setup", {}).update(self.setup_spans)
        return with_meta(out, meta)


class StageGroup:
    """Consecutive model stages that run in one actor pool (engine.fuse_model_stages): each actor loads
    every model of the group and takes a unit through all of them. On CPUs this spares a hand-off of
    every unit between pools and lets the cores balance themselves: one pool per stage leaves the cores
    of a stage whose pool is idle to nobody while the slowest stage's pool is the critical path (and
    scales up only by starting more actors, seconds of set-up each)."""

    stateful = True

    def __init__(self, stages: list[Stage]):
        self.stages = list(stages)
        self.name = "+".join(s.name for s in stages)
        self.resources = stages[0].resources
        self.concurrency = stages[0].concurrency


def _fusable(a: Stage, b: Stage) -> bool:
    return (a.stateful and b.stateful and a.resources == b.resources and a.concurrency == b.concurrency
            and not a.resources.num_gpus)


def fuse_stages(stages: list[Stage], fuse: bool = True) -> list["Stage | StageGroup"]:
    """The score phase's operations: runs of consecutive model stages with the same resources and
    concurrency (on CPUs) as one StageGroup each with `fuse`; every other stage alone. GPU stages are
    never fused: a GPU pool is sized by its GPUs, and its stage's batches by its memory."""
    if not fuse:
        return list(stages)
    out: list = []
    run: list[Stage] = []
    for s in stages:
        if run and not _fusable(run[-1], s):
            out.append(run[0] if len(run) == 1 else StageGroup(run))
            run = []
        if s.stateful and not s.resources.num_gpus:
            run.append(s)
        else:
            out.append(s)
    if run:
        out.append(run[0] if len(run) == 1 else StageGroup(run))
    return out


def group_pool_size(stage: "Stage | StageGroup", cpus: float) -> int | None:
    """The fixed size of a StageGroup's pool on a local Ray of `cpus` cores (one actor per core at the
    group's resources), or None where its pool is sized as any stage's (a cluster, a set concurrency)."""
    if not (isinstance(stage, StageGroup) and local_cores and stage.concurrency in (None, "auto")):
        return None
    return max(1, int(cpus // max(stage.resources.num_cpus, 1e-3)))


def _pool(stage: Stage, units: int | None = None):
    """Ray Data's actor pool for a stateful stage: `concurrency` N is a fixed pool, [min, max] an
    autoscaling one; unset (or "auto"), it autoscales from 1 to as many actors as the cluster's
    CPUs (GPUs for a GPU stage) can hold at the stage's resources. A StageGroup on a local Ray is
    a fixed pool of one actor per core, or per unit of the pipeline (`units`) when fewer: it is the
    whole cascade, and Ray Data's autoscaler adds an actor only once units queue up, which a small
    run's few units never do."""
    import ray

    c = stage.concurrency
    if isinstance(c, int):
        return ray.data.ActorPoolStrategy(size=c)
    res, total = stage.resources, ray.cluster_resources()
    cpus = total.get("CPU", 1)
    if local_cores:  # a local Ray counts more logical CPUs than cores: autoscale to the cores
        cpus = min(cpus, local_cores)
    if res.num_gpus:
        fit = max(1, int(total.get("GPU", 0) // res.num_gpus))
    else:
        fit = max(1, int(cpus // max(res.num_cpus, 1e-3)))
    size = group_pool_size(stage, cpus)
    if size is not None:
        return ray.data.ActorPoolStrategy(size=max(1, min(size, units or size)))
    if isinstance(c, tuple):  # [min, max]; a null max means "what the cluster holds"
        lo = int(c[0] or 1)
        return ray.data.ActorPoolStrategy(min_size=lo, max_size=max(lo, int(c[1]) if c[1] else fit))
    return ray.data.ActorPoolStrategy(min_size=1, max_size=fit)


def apply_stage(ds, stage: "Stage | StageGroup", score_all: bool, retries: int = 2, storage: dict | None = None,
                units: int | None = None):
    """`stage` (or a StageGroup) as a Ray Data operation on `ds` (one block = one unit; batch_size=None);
    `units`: how many units the pipeline has, when known (a fused pool starts no more actors).

    `storage` is the run's `storage` section: its retry policy is made the worker's (a stage's
    config is its own section only).

    A worker that dies is retried `retries` times, then the unit's block is dropped and the
    driver re-runs the unit sample by sample (pipeline/engine/isolate.py)."""
    res = stage.resources
    kw = dict(batch_size=None, batch_format="pyarrow", num_cpus=res.num_cpus)
    if res.num_gpus:
        kw["num_gpus"] = res.num_gpus
    if res.memory_gb:
        kw["memory"] = int(res.memory_gb * 2**30)
    if stage.stateful:
        group = stage.stages if isinstance(stage, StageGroup) else None
        name, cfg = ([s.name for s in group], [s.cfg for s in group]) if group else (stage.name, stage.cfg)
        return ds.map_batches(_ActorFn, fn_constructor_kwargs=dict(name=name, cfg=cfg,
                              score_all=score_all, storage=storage), compute=_pool(stage, units),
                              max_restarts=retries, max_task_retries=retries, **kw)
    return ds.map_batches(_task_fn, fn_kwargs=dict(name=stage.name, cfg=stage.cfg, score_all=score_all,
                                                    storage=storage),
                          max_retries=retries, **kw)
