"""The Ray Data side of a run's phases: the functions each block (one bundle of units) runs on a
worker, the packing of small units into bundles, and the datasets of phases 1 and 3.

A block is one bundle: one unit, or several small consecutive units (engine.bundle_bytes and
engine.bundle_units, by the listing's shard sizes), run one after the other in one task, their files
committed with one sync (catalog.commit_together). Ray's cost per task (~8 ms of driver CPU per phase
on 2 cores) is then paid per bundle. Phase 3 with model stages keeps one unit a block (its rows flow
through the stages' operators); without them a bundle is read and written in the one task.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

import catalog
from catalog.storage import retry

from pipeline.engine.adapter import apply_stage, fuse_stages
from pipeline.engine.columns import unit_meta, with_meta
from pipeline.config import section
from pipeline.settings import DEFAULTS
from pipeline.engine.errors import RunError, environment_fault
from pipeline.inputs.units import Unit
from pipeline.inputs.listing import load_unit
from pipeline.stages import Stage, build_stages
from pipeline.engine.unit_io import (finish_unit, limits_of, listing_path, max_batch_bytes, measure_unit,
                                     read_for_score, summary)

DEFAULT_BUNDLE_BYTES = DEFAULTS.engine.bundle_bytes  # its setting's default (pipeline/settings.py)
DEFAULT_BUNDLE_UNITS = DEFAULTS.engine.bundle_units  # its setting's default (pipeline/settings.py)
ESTIMATED_FILE_BYTES = 256 << 10  # a loose file's bytes for bundling (a folder's listing does not stat)


def _units_of(batch: pa.Table, run: str) -> list[Unit]:
    """The block's units with their files, read from their lines of RUN/units.jsonl (the driver
    hands out units without their files). A block is one bundle: one unit, or several small ones."""
    items = batch.column("units").to_pylist()
    if len(items) != 1:  # one block per bundle; anything else is a bug here
        raise RunError(f"engine: a block holds {len(items)} bundles, expected 1")
    return [load_unit(Unit.from_dict(d), listing_path(run)) for d in json.loads(items[0])]


@contextmanager
def _faults_reported(run: str, unit_id: str, out: list):
    """A fault of the environment becomes the unit's summary (the driver stops the run with its
    line); anything else propagates (retried, then isolated, as a fault of the data)."""
    try:
        yield
    except Exception as e:
        fault = environment_fault(e, run)
        if fault is None:
            raise
        out.append(summary(unit_id, 0, fault=fault))


def _faulted(out: list) -> bool:
    return out[-1].column("fault")[0].as_py() is not None


def _each_unit(batch: pa.Table, run: str, work) -> pa.Table:
    """work(unit) -> summary for each unit of the block's bundle, one after the other, their files
    committed together (one sync for the bundle; a unit's files count once it finished). A fault of
    the environment ends the bundle with its summary (the driver stops the run on it); anything
    else propagates (the task is retried, then its unfinished units isolated)."""
    out: list = []
    units = _units_of(batch, run)
    try:
        with catalog.commit_together() as commits:
            for unit in units:
                with _faults_reported(run, unit.unit_id, out):
                    out.append(work(unit))
                if _faulted(out):  # the rest of the bundle waits for the rerun
                    commits.drop_unsealed()
                    break
                commits.seal()
    except Exception as e:  # the commit itself (a sync or rename on a full disk)
        fault = environment_fault(e, run)
        if fault is None:
            raise
        out.append(summary(units[0].unit_id, 0, fault=fault))
    return pa.concat_tables(out)


def measure_block(batch: pa.Table, run: str, limits: dict, cfg: dict, score_all: bool) -> pa.Table:
    """Phase 1 of a bundle's units: their summaries."""
    retry.configure(cfg)  # the run's storage.retry_* in this worker (a remote cluster's too)
    stages = [s for s in build_stages(cfg) if s.phase == "measure" and s.name in cfg["stages"]]
    return _each_unit(batch, run, lambda unit: measure_unit(run, unit, stages, limits, score_all,
                                                            max_batch_bytes(cfg)))


def pass_of(batch: pa.Table) -> str | None:
    """The phase-3 pass an item of a pipeline of several passes (score_ds `passes`) belongs to."""
    return batch.column("pass")[0].as_py() if "pass" in batch.column_names else None


def pass_cfg(cfg: dict, p: str | None) -> dict:
    """The config of pass `p` (a fallback round's number or fallback.WRITE); cfg itself without one."""
    if p is None:
        return cfg
    from pipeline.dedup import fallback
    return fallback.round_cfg(cfg, p if p == fallback.WRITE else int(p))


def _score_block(batch: pa.Table, run: str, limits: dict, score_all: bool, cfg: dict, fused: bool = False) -> pa.Table:
    """Phase 3's read of one unit, whose rows go on to the stages; or, with `fused` (no stage in
    phase 3), read and write of each unit of the bundle: their summaries. In a pipeline of several
    passes, an item of the write pass is read and written here too, and its summary passes the stages."""
    retry.configure(cfg)
    if "fault" in batch.column_names:  # a summary from the gate (a unit with nothing to do in this pass)
        return batch
    p = pass_of(batch)
    cfg = pass_cfg(cfg, p)
    from pipeline.dedup import fallback
    if fused or fallback.round_of(cfg) == fallback.WRITE:
        return _each_unit(batch, run, lambda unit: finish_unit(run, read_for_score(run, unit, limits, score_all, cfg),
                                                               cfg))
    out: list = []
    unit = _units_of(batch, run)[0]  # unbundled: one unit a block
    with _faults_reported(run, unit.unit_id, out):
        table = read_for_score(run, unit, limits, score_all, cfg)
        if table.num_rows:  # the writer at the end of the pipeline finishes it for this pass (a round's
            # rows read back carry no pass of their own: write_scored keeps none)
            meta = unit_meta(table)
            if p is None:
                meta.pop("pass", None)
            else:
                meta["pass"] = p
            return with_meta(table, meta)
        # an empty unit is finished here (Ray Data drops empty blocks): its summary passes the stages
        # and the writer untouched
        out.append(finish_unit(run, table, cfg))
    return out[-1]


def _finish_unit_block(batch: pa.Table, run: str, cfg: dict) -> pa.Table:
    retry.configure(cfg)
    if "fault" in batch.column_names:  # summaries from _score_block (empty units, faults) pass through
        return batch
    out: list = []
    meta = unit_meta(batch)
    with _faults_reported(run, meta["unit"]["unit_id"], out):
        out.append(finish_unit(run, batch, pass_cfg(cfg, meta.get("pass"))))
    return out[-1]


@contextmanager
def unit_blocks(ray, cpus: float | None = None, errored_blocks: int = -1):
    """Data context of the engine's datasets: blocks never split (one block = one unit), a block
    whose task failed after its retries is dropped instead of aborting (its unit is redone); with
    errored_blocks=0 the dataset stops at the first such block instead (a pipeline of several passes,
    which waits for every unit of a pass). With `cpus`, the datasets built in it use at most that
    many (others are held by actors)."""
    import copy
    ctx = ray.data.DataContext.get_current()
    old = (ctx.target_max_block_size, ctx.max_errored_blocks, ctx.execution_options)
    ctx.target_max_block_size, ctx.max_errored_blocks = None, errored_blocks
    if cpus is not None:  # a new options object: datasets built before keep theirs
        ctx.execution_options = copy.copy(ctx.execution_options)
        ctx.execution_options.resource_limits = ctx.execution_options.resource_limits.copy(cpu=cpus)
    try:
        yield ctx
    finally:
        ctx.target_max_block_size, ctx.max_errored_blocks, ctx.execution_options = old


def _weight(u: Unit) -> int:
    """A unit's bytes as the listing saw them; a unit of unknown size weighs a full bundle."""
    if u.bytes:
        return u.bytes
    return u.count * ESTIMATED_FILE_BYTES if u.kind == "files" and u.count else 1 << 62


def bundles(units: list[Unit], cfg: dict, cpus: float) -> list[list[Unit]]:
    """Consecutive units packed into tasks: small units share one (engine.bundle_bytes,
    engine.bundle_units), so Ray's cost per task is paid per bundle, not per unit; a window keeps
    at least 4 tasks per CPU, so a cluster's CPUs all have work."""
    eng = cfg.get("engine", {})
    cap_bytes = int(eng.get("bundle_bytes") or DEFAULT_BUNDLE_BYTES)
    cap_units = max(1, min(int(eng.get("bundle_units") or DEFAULT_BUNDLE_UNITS), len(units) // max(1, int(4 * cpus))))
    out: list[list[Unit]] = []
    cur: list[Unit] = []
    size = 0
    for u in units:
        w = _weight(u)
        if cur and (len(cur) >= cap_units or size + w > cap_bytes):
            out.append(cur)
            cur, size = [], 0
        cur.append(u)
        size += w
    if cur:
        out.append(cur)
    return out


def units_ds(units: list[Unit], cfg: dict, bundled: bool, passes: list[str] | None = None):
    """One item per bundle of units (per unit unbundled); with `passes`, one per unit and pass, the
    passes one after the other."""
    import ray
    groups = bundles(units, cfg, ray.cluster_resources().get("CPU", 1)) if bundled else [[u] for u in units]
    if passes:
        items = [{"units": json.dumps([u.to_dict() for u in g]), "pass": p} for p in passes for g in groups]
    else:
        items = [{"units": json.dumps([u.to_dict() for u in g])} for g in groups]
    return ray.data.from_items(items, override_num_blocks=len(items))


def retries_of(cfg: dict) -> int:
    return int(section(cfg, "engine")["max_retries"])


_OPEN_GATES: dict[tuple, object] = {}  # in a worker: (gate token, pass) -> the units with work in the pass


def _after_gate(batch: pa.Table, gate, token: str) -> pa.Table:
    """Ray Data task: a unit passes once its pass is open (dedup is done; for a fallback round or the
    write pass, the exchange before it); none pass if the run stopped. A unit with nothing to do in
    an open pass leaves as a summary of that pass, which every later step passes on untouched."""
    p = pass_of(batch) or "0"
    key = (token, p)
    if key not in _OPEN_GATES:
        import ray
        _OPEN_GATES[key] = ray.get(gate.wait.remote(p))
    work = _OPEN_GATES[key]
    if work is False:
        return batch.slice(0, 0)  # an empty block: the unit goes no further
    if work is not True:
        uid = json.loads(batch.column("units")[0].as_py())[0]["unit_id"]
        if uid not in work:
            return summary(uid, 0, pass_=p)
    return batch


def score_ds(run: Path, units: list[Unit], stages: list[Stage], cfg: dict, score_all: bool, gate=None,
             passes: list[str] | None = None):
    """Phase 3 as one Ray Data pipeline; with a gate, its units wait for the gate to open first. With
    `passes` (fallback rounds and the write pass, pipeline/dedup/fallback_rounds.py), every unit goes
    through it once per pass, each pass behind the gate until the driver opens it: the model actors
    start once for all passes. Such a pipeline stops at the first unit that fails for good (the
    driver then goes on pass by pass, from the files written)."""
    import ray
    retries = retries_of(cfg)
    with unit_blocks(ray, errored_blocks=0 if passes else -1):  # a Dataset keeps the context it was built in
        if not stages:  # read and write in one task per bundle
            return units_ds(units, cfg, bundled=True).map_batches(
                _score_block, fn_kwargs=dict(run=str(run), limits=limits_of(cfg), score_all=score_all, cfg=cfg,
                                             fused=True),
                batch_size=None, batch_format="pyarrow", max_retries=retries)
        ds = units_ds(units, cfg, bundled=False, passes=passes)
        if gate is not None:  # one zero-CPU task at a time waits (no CPU or worker per unit held); once
            # the gate is open a unit passes in a few milliseconds, far below its work downstream
            ds = ds.map_batches(_after_gate, fn_kwargs=dict(gate=gate[0], token=gate[1]), batch_size=None,
                                batch_format="pyarrow", num_cpus=0, compute=ray.data.TaskPoolStrategy(size=1))
        ds = ds.map_batches(_score_block, fn_kwargs=dict(run=str(run), limits=limits_of(cfg),
                            score_all=score_all, cfg=cfg), batch_size=None, batch_format="pyarrow",
                            max_retries=retries)
        for s in fuse_stages(stages, bool(section(cfg, "engine")["fuse_model_stages"])):
            ds = apply_stage(ds, s, score_all, retries, storage=cfg.get("storage") or {}, units=len(units))
        return ds.map_batches(_finish_unit_block, fn_kwargs=dict(run=str(run), cfg=cfg), batch_size=None,
                              batch_format="pyarrow", max_retries=retries)
