"""The curation engine's driver: one Ray Data pipeline per phase and window of units.

Worker-side work lives elsewhere: the stage adapter (pipeline/adapter.py, the one place a stage
becomes a Ray operation) and the unit I/O (pipeline/unit_io.py: read, measure, score, write one
unit in bounded memory). This module orders the phases, keeps the driver's memory flat and turns
faults into one line.

A run has three phases, each resumable:
  1. measure (per unit): the worker streams its unit through decode -> size -> pHash in batches of
     bounded bytes and writes RUN/work/measure/{unit}.parquet (no bytes; its counters in the metadata).
  2. dedup (whole run, once every unit is measured): pipeline/dedup.run_dedup, in a Ray task ->
     RUN/work/dedup/{unit}.parquet verdicts (a pure function of phase 1, so reruns agree).
  3. score + write (per unit): the measurements and verdicts, without bytes; each model stage
     reads back the bytes of the rows it scores (checked against their sha256: changed bytes are
     rejected as source_changed and never written); then the worker writes the catalog part, the
     curated shards and, last, RUN/stats/{unit}.json, the unit's completion marker. With
     engine.start_actors_early (auto: large runs) the first window's pipeline starts with the run,
     its units held at a gate the driver opens after dedup, so the model actors load meanwhile.

The driver holds O(units in flight), not O(units): the unit listing stays on disk
(RUN/units.jsonl; each unit is handed out as its id and the offset of its line, and the worker
reads its files from there), the units go to Ray Data in windows of engine.window_units, which
units are done is one directory listing per phase (a sorted array of 8-byte name hashes), and
unit ids never travel in bulk (dedup reads the listing itself). A worker that dies on a unit is
retried `engine.max_retries` times; then the unit runs again with each sample alone in a child
process (pipeline/isolate.py), and a sample that kills its process is rejected as
decode:worker_crash. A fault of the environment (no space, permission, read-only, credentials) is
never retried as data: the worker reports it in the unit's summary and the run stops with one line
(exit status 3). Final counts and the funnel come from DuckDB over the catalog.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa

import catalog
from catalog.storage import is_uri, run_root

from . import adapter, console
from . import dedup as dedup_mod
from .adapter import apply_stage, run_on_unit, run_stage  # noqa: F401 (engine's API)
from .columns import unit_meta, with_meta  # noqa: F401 (engine's API)
from .config import load_config
from .errors import EnvironmentFault, RunError, environment_fault
from .ray_compat import keep_local_ray_on_loopback, set_task_poll as task_poll
from .sources import Unit, check_inputs, count_new, iter_listing, load_unit, write_listing
from .stages import Stage, build_stages
from .unit_io import run_store
from .unit_io import (finish_measure, finish_unit, limits_of, listing_path, marker_path,  # noqa: F401
                      max_batch_bytes, measure_path, measure_unit, now, read_for_measure, read_for_score,
                      summary, write_curated)

log = logging.getLogger("humanset.curate")

_limits = limits_of  # the engine's name for it (tests, isolation)
_now = now
RUN_WRITERS = ["", "stats", "catalog/samples", "shards", "work/measure", "work/dedup", "work/dedup/pairs"]  # where
# our writers write in a RUN (clean_tmp looks only there)
DEFAULT_WINDOW_UNITS = 2048  # engine.window_units: units one Ray Data pipeline is given at a time
DEFAULT_BUNDLE_BYTES = 8 << 20  # engine.bundle_bytes: units smaller than this together share a task
DEFAULT_BUNDLE_UNITS = 64  # engine.bundle_units: at most this many units in one task
ESTIMATED_FILE_BYTES = 256 << 10  # a loose file's bytes for bundling (a folder's listing does not stat)


# --------------------------------------------------------------------------------------------
# Ray Data functions of each phase (run on workers; thin: the work is in unit_io)

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


def _measure_block(batch: pa.Table, run: str, limits: dict, cfg: dict, score_all: bool) -> pa.Table:
    """Phase 1 of a bundle's units: their summaries."""
    stages = [s for s in build_stages(cfg) if s.phase == "measure" and s.name in cfg["stages"]]
    return _each_unit(batch, run, lambda unit: measure_unit(run, unit, stages, limits, score_all,
                                                            max_batch_bytes(cfg)))


def _score_block(batch: pa.Table, run: str, limits: dict, score_all: bool, cfg: dict, fused: bool = False) -> pa.Table:
    """Phase 3's read of one unit, whose rows go on to the stages; or, with `fused` (no stage in
    phase 3), read and write of each unit of the bundle: their summaries."""
    if fused:
        return _each_unit(batch, run, lambda unit: finish_unit(run, read_for_score(run, unit, limits, score_all),
                                                               cfg))
    out: list = []
    unit = _units_of(batch, run)[0]  # unbundled: one unit a block
    with _faults_reported(run, unit.unit_id, out):
        table = read_for_score(run, unit, limits, score_all)
        if table.num_rows:
            return table
        # an empty unit is finished here (Ray Data drops empty blocks): its summary passes the stages
        # and the writer untouched
        out.append(finish_unit(run, table, cfg))
    return out[-1]


def _finish_unit_block(batch: pa.Table, run: str, cfg: dict) -> pa.Table:
    if "fault" in batch.column_names:  # summaries from _score_block (empty units, faults) pass through
        return batch
    out: list = []
    with _faults_reported(run, unit_meta(batch)["unit"]["unit_id"], out):
        out.append(finish_unit(run, batch, cfg))
    return out[-1]


# --------------------------------------------------------------------------------------------
# Driver side: one Ray Data pipeline per phase and window; summaries only.

# Driver side: one Ray Data pipeline per phase; summaries only.

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


def _units_ds(units: list[Unit], cfg: dict, bundled: bool):
    import ray
    groups = bundles(units, cfg, ray.cluster_resources().get("CPU", 1)) if bundled else [[u] for u in units]
    return ray.data.from_items([{"units": json.dumps([u.to_dict() for u in g])} for g in groups],
                               override_num_blocks=len(groups))


def _drain(batches, total: int, desc: str, progress: bool, bar=None) -> set[str]:
    """Consume a phase's summaries (one row per unit): the ids of the units finished, nothing per
    sample. A summary carrying a fault of the environment stops the run."""
    done: set[str] = set()
    with (console.progress(total, desc, enabled=progress) if bar is None else _same(bar)) as b:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            faults = [f for f in batch.column("fault").to_pylist() if f]
            if faults:
                raise EnvironmentFault(faults[0])
            done.update(batch.column("unit_id").to_pylist())
            b.update(batch.num_rows)
    return done


@contextmanager
def _same(bar):
    yield bar


def _failed(units: list[Unit], done: set[str], folder: tuple, suffix: str) -> list[Unit]:
    """The units of a window with no summary and no output: a task that failed for good loses its
    whole bundle's summaries, but the units it finished before have their files."""
    missing = [u for u in units if u.unit_id not in done]
    if not missing:
        return []
    finished = NameSet(folder, suffix)
    return [u for u in missing if u.unit_id not in finished]


def _retries(cfg: dict) -> int:
    return int(cfg.get("engine", {}).get("max_retries", 2))


def _window_units(cfg: dict) -> int:
    return int(cfg.get("engine", {}).get("window_units") or DEFAULT_WINDOW_UNITS)


class NameSet:
    """The names of one folder's marker files as a sorted array of 8-byte hashes: which units are
    done is one listing per phase (one paginated, streamed listing on an object store), at 8 bytes
    per unit on the driver. `folder`: a local folder, or (Storage, folder relative to it)."""

    def __init__(self, folder, suffix: str):
        hashes = []
        store, rel = folder if isinstance(folder, tuple) else (run_store(folder), "")
        if store.posix:  # one directory's names, no stat per file
            try:
                with os.scandir(store.fs_path(rel)) as it:
                    names = [e.name for e in it]
            except FileNotFoundError:
                names = []
        else:
            names = (e.path[len(rel):].lstrip("/") for e in store.list(rel, suffix=suffix))
        for name in names:
            if name.endswith(suffix) and not name.startswith(".") and "/" not in name:
                hashes.append(self._hash(name[: -len(suffix)]))
        self._h = np.sort(np.array(hashes, dtype=np.uint64))

    @staticmethod
    def _hash(name: str) -> int:
        return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")

    def __len__(self) -> int:
        return len(self._h)

    def __contains__(self, name: str) -> bool:
        h = np.uint64(self._hash(name))
        i = int(np.searchsorted(self._h, h))
        return i < len(self._h) and self._h[i] == h


def _windows(run: Path, keep, size: int):
    """The listing's units (without their files) that `keep` accepts, in lists of at most `size`."""
    window = []
    for u in iter_listing(listing_path(run)):
        if keep(u.unit_id):
            window.append(u)
            if len(window) >= size:
                yield window
                window = []
    if window:
        yield window


def _measure(run: Path, units: list[Unit], cfg: dict, score_all: bool, bar, progress: bool,
             cpus: float | None = None):
    import ray
    retries = _retries(cfg)
    measure_cpus = max([s.resources.num_cpus for s in build_stages(cfg)
                        if s.phase == "measure" and s.name in cfg["stages"]] or [1.0])
    with _unit_blocks(ray, cpus):
        ds = _units_ds(units, cfg, bundled=True).map_batches(
            _measure_block, fn_kwargs=dict(run=str(run), limits=_limits(cfg), cfg=cfg, score_all=score_all),
            batch_size=None, batch_format="pyarrow", num_cpus=measure_cpus, max_retries=retries)
        done = _drain(ds.iter_batches(batch_format="pyarrow", batch_size=None), len(units), "measure", True, bar)
    failed = _failed(units, done, (run_store(run), "work/measure"), ".parquet")
    if failed:
        _isolate(run, failed, "measure", cfg, score_all, progress)


def _score_ds(run: Path, units: list[Unit], stages: list[Stage], cfg: dict, score_all: bool, gate=None):
    """Phase 3 as one Ray Data pipeline; with a gate, its units wait for the gate to open first."""
    import ray
    retries = _retries(cfg)
    with _unit_blocks(ray):  # a Dataset keeps the context it was built in
        if not stages:  # read and write in one task per bundle
            return _units_ds(units, cfg, bundled=True).map_batches(
                _score_block, fn_kwargs=dict(run=str(run), limits=_limits(cfg), score_all=score_all, cfg=cfg,
                                             fused=True),
                batch_size=None, batch_format="pyarrow", max_retries=retries)
        ds = _units_ds(units, cfg, bundled=False)
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
                     bar, progress: bool, early: "_EarlyScore | None" = None):
    if early is not None:
        done = _drain(early.open(), len(units), "score+write", True, bar)
    else:
        ds = _score_ds(run, units, stages, cfg, score_all)
        done = _drain(ds.iter_batches(batch_format="pyarrow", batch_size=None), len(units), "score+write", True, bar)
    failed = _failed(units, done, (run_store(run), "stats"), ".json")
    if failed:
        _isolate(run, failed, "score", cfg, score_all, progress)


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

def _start_actors_early(cfg: dict, stages: list[Stage], units_to_measure: int) -> bool:
    """engine.start_actors_early: true, false, or auto (early when measure has at least
    engine.early_min_units units, enough work for the actors' set-up to hide behind)."""
    eng = cfg.get("engine", {})
    mode = eng.get("start_actors_early", "auto")
    if mode == "auto":
        mode = units_to_measure >= int(eng.get("early_min_units", 16))
    return bool(mode) and any(s.stateful for s in stages)



def _run_dedup(run: Path, cfg: dict) -> dict:
    """Phase 2 in one Ray task on a worker, which starts the near-search tables as tasks of its own:
    its per-sample arrays (see pipeline/dedup.py) never enter the driver, which gets the counts
    back. The task reads the unit ids from RUN/units.jsonl itself and resumes from the files a
    crashed attempt left (per table, then the verdicts), so it is retried like a unit."""
    import ray
    task = ray.remote(num_cpus=1, max_retries=_retries(cfg))(dedup_mod.run_dedup)
    try:
        return ray.get(task.remote(str(run), None, cfg))
    except Exception as e:
        fault = environment_fault(e, str(run))
        if fault:
            raise EnvironmentFault(fault) from e
        raise


def _isolate(run: Path, units: list[Unit], phase: str, cfg: dict, score_all: bool, progress: bool):
    """Units whose workers kept dying: redo each with every sample alone in a child process."""
    import ray

    from .isolate import isolate_unit
    log.warning("%d units failed in %s after %d retries: running their samples one at a time",
                len(units), phase, _retries(cfg))
    task = ray.remote(num_cpus=1, max_retries=0)(isolate_unit)
    refs = [task.remote(str(run), u.to_dict(), phase, cfg, score_all, _limits(cfg)) for u in units]
    with console.progress(len(refs), f"{phase} (isolated)", enabled=progress) as bar:
        while refs:
            ready, refs = ray.wait(refs, num_returns=1)
            try:
                result = ray.get(ready[0])
            except Exception as e:
                fault = environment_fault(e, str(run))
                if fault:
                    raise EnvironmentFault(fault) from e
                raise RunError(f"a unit failed even with its samples run one at a time: {e}") from e
            log.warning("unit %s: %d worker crashes isolated", result["unit_id"], result["worker_crashes"])
            bar.update(1)


# --------------------------------------------------------------------------------------------

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
    address = cfg.get("ray", {}).get("address")
    local = address is None and not os.environ.get("RAY_ADDRESS") and not Path(
        "/tmp/ray/ray_current_cluster").exists()
    if local:
        keep_local_ray_on_loopback()
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
            adapter.local_cores = os.cpu_count() or 1
            num_cpus = max(adapter.local_cores, int(np.ceil(actor_cpus(cfg, configured=True))) + 2)
        ray.init(num_cpus=num_cpus, **kw)
    else:
        ray.init(address=address or "auto", **{k: v for k, v in kw.items() if k != "include_dashboard"})
    res = ray.cluster_resources()
    short = cpu_shortfall(res.get("CPU", 0), cfg)
    if short:
        raise RunError(short)
    log.info("ray: %s, %g CPU, %g GPU", "private local cluster on 127.0.0.1 (token authentication on)" if local
             else f"cluster at {address or 'auto'}", res.get("CPU", 0), res.get("GPU", 0))



def _list_units(run: Path, inputs: list[str], cfg: dict, repeated: int) -> tuple[int, int, int]:
    """The run's units, listed into RUN/units.jsonl by the first run (streaming) and read back from
    it by every rerun. Returns (units, repeated listings dropped, inputs found now that are not in
    the saved listing); the units themselves stay on disk."""
    path, inp = listing_path(run), cfg["input"]
    if not run_store(run).exists("units.jsonl"):
        n_units, repeated = write_listing(inputs, path, inp["files_per_unit"], inp["extensions"])
        return n_units, repeated, 0
    n_units = sum(1 for _ in iter_listing(path))
    new = count_new(inputs, path, inp["files_per_unit"], inp["extensions"])
    if new:
        log.warning("%d inputs appeared since this run started; they are not in this run "
                    "(curate them into a new --output)", new)
    return n_units, repeated, new


def _run_root(output):
    """A local RUN as an absolute Path, a RUN on an object store as its URI string."""
    root = run_root(output)
    return root if is_uri(root) else Path(root)


def curate(inputs: list[str], output: str, config: dict | None = None, score_all: bool = False,
           progress: bool = True, force_unlock: bool = False, lock_lease_s: float = 120.0) -> dict:
    """Run (or finish) a curation run. Returns the manifest."""
    cfg = config or load_config()
    run = _run_root(output)  # workers write into it, from their own working directories
    # unusable inputs are refused, naming the input, before anything is written; the listing itself
    # is streamed into RUN/units.jsonl under the lock
    check_inputs(inputs, cfg["input"]["extensions"])
    check_stages(cfg)
    try:
        lock = run_store(run).run_lock(force=force_unlock, lease_s=float(lock_lease_s))
        with lock as held:
            return _curate_locked(run, inputs, cfg, score_all, progress, held)
    except catalog.RunLocked as e:
        raise RunError(str(e)) from e
    except OSError as e:  # the driver's own writes (listing, manifest) on a full or read-only disk
        fault = environment_fault(e, str(run))
        if fault:
            raise EnvironmentFault(fault) from e
        raise


def check_stages(cfg: dict) -> None:
    """The stage list as a cascade the engine can run: decode first (every other stage reads its
    columns), known names, each once."""
    from .stages import REGISTRY
    names = list(cfg.get("stages") or [])
    unknown = [n for n in names if n not in REGISTRY]
    if unknown or not names or names[0] != "decode" or len(set(names)) != len(names):
        raise RunError(f"config: stages={names} is not a cascade the engine can run: it starts with decode, "
                       f"names each stage once, from {list(REGISTRY)} (e.g. --set stages=[decode,size] "
                       "or [decode,size,dedup,person])")


def _curate_locked(run, inputs: list[str], cfg: dict, score_all: bool, progress: bool, held=None) -> dict:
    store = run_store(run)
    manifest = {"config": cfg, "inputs": [str(i) for i in inputs], "score_all": score_all}
    if store.exists("manifest.json"):
        old = store.read_json("manifest.json")
        if old.get("config") != cfg or old.get("inputs") != manifest["inputs"] or old.get("score_all") != score_all:
            raise RunError(f"{run}: holds a run with other inputs or config; resume it with the same "
                           "command, or pass a new --output")
        manifest["started"] = old.get("started")
        repeated = int(old.get("repeated_inputs") or 0)
        log.info("resuming %s", run)
    else:
        manifest["started"] = _now()
        repeated = 0
    removed = catalog.clean_tmp(run, RUN_WRITERS) if store.posix else 0  # object stores: no temp objects
    if removed:
        log.info("removed %d temporary files left by an interrupted run", removed)
    t0 = time.perf_counter()
    n_units, repeated, new = _list_units(run, inputs, cfg, repeated)
    seconds = {"listing": round(time.perf_counter() - t0, 2)}  # this invocation's phases (wall)
    stages = build_stages(cfg)
    skipped = {s.name: s.skip_reason() for s in stages if not s.enabled}
    for name, why in skipped.items():
        log.warning("stage %s skipped: %s", name, why)
    active = [s for s in stages if s.enabled and s.name in cfg["stages"]]
    manifest.update(stages=[s.name for s in active], skipped_stages=skipped, versions=_versions(),
                    stage_info={s.name: s.info() for s in active if s.info()},  # e.g. watermark's method
                    status="running", units=n_units, repeated_inputs=repeated, not_in_this_run=new)
    store.write_json("manifest.json", manifest)

    done, measured = NameSet((store, "stats"), ".json"), NameSet((store, "work/measure"), ".parquet")
    n_todo = n_measure = 0
    for u in iter_listing(listing_path(run)):
        if u.unit_id not in done:
            n_todo += 1
            n_measure += u.unit_id not in measured
    log.info("%d units: %d done, %d to measure, %d to write", n_units, n_units - n_todo, n_measure, n_todo)
    score_stages = [s for s in active if s.phase == "score"]
    cfg_active = dict(cfg, stages=[s.name for s in active])
    window = _window_units(cfg)

    if n_todo:
        init_ray(cfg)  # Ray Data's own progress off: ours (console.progress) counts units
        task_poll(float(cfg.get("engine", {}).get("task_poll_s", 0.01)))
        t_start = time.time()
        timeline = manifest["timeline"] = {"start": round(t_start, 3)}
        todo = lambda uid: uid not in done  # noqa: E731
        # model actors load while phases 1 and 2 run (engine.start_actors_early), for the first window
        early = None
        if _start_actors_early(cfg, score_stages, n_measure):
            first = next(_windows(run, todo, window))
            early = _EarlyScore(run, first, score_stages, cfg_active, score_all)
        try:
            if n_measure:  # with early actors, measure leaves their CPUs to them
                t0 = time.perf_counter()
                cpus = early.measure_cpus() if early is not None else None
                with console.progress(n_measure, "measure", enabled=progress) as bar:
                    for units in _windows(run, lambda uid: uid not in done and uid not in measured, window):
                        _measure(run, units, cfg_active, score_all, bar, progress, cpus)
                seconds["measure"] = round(time.perf_counter() - t0, 2)
            timeline["measured"] = round(time.time(), 3)
            if not dedup_mod.is_done(run):
                t0 = time.perf_counter()
                st = _run_dedup(run, cfg_active)
                seconds["dedup"] = round(time.perf_counter() - t0, 2)
                log.info("dedup: %d of %d candidates are duplicates (%.2f s)", st["duplicates"], st["candidates"],
                         seconds["dedup"])
            timeline["deduped"] = round(time.time(), 3)
            t0 = time.perf_counter()
            with console.progress(n_todo, "score+write", enabled=progress) as bar:
                for i, units in enumerate(_windows(run, todo, window)):
                    _score_and_write(run, units, score_stages, cfg_active, score_all, bar, progress,
                                     early if i == 0 else None)
                    early = None
        except BaseException:
            if early is not None:
                early.abort()
            raise
        seconds["score_write"] = round(time.perf_counter() - t0, 2)
        timeline["scored"] = round(time.time(), 3)
        log.info("processed %d units in %.1f s", n_todo, time.time() - t_start)

    if held is not None:
        held.check()  # the lock was not taken over while the units ran
    done = NameSet((store, "stats"), ".json")
    if len(done) < n_units:
        missing = next((u.unit_id for u in iter_listing(listing_path(run)) if u.unit_id not in done), "?")
        raise RunError(f"{n_units - len(done)} units have no stats marker after the run (e.g. {missing}); "
                       "rerun the same command to finish them")
    counts, n_inputs, n_kept, reasons = _reason_counts(run)
    manifest.update(status="complete", finished=_now(), funnel=funnel_from_counts(counts, n_inputs, manifest["stages"]),
                    counts={"inputs": n_inputs, "kept": n_kept}, reject_reasons=reasons, seconds=seconds)
    store.write_json("manifest.json", manifest)
    return manifest


def _reason_counts(run: str) -> tuple[dict[str, int], int, int, dict[str, int]]:
    """Rejections per stage (first reason), inputs, kept and the count of each reject reason, from
    the units' stats markers read one at a time (the driver holds counters only; a DuckDB scan of
    the catalog would hold ~4 KB per part until it ends)."""
    by_stage: dict[str, int] = {}
    reasons: dict[str, int] = {}
    n_inputs = n_kept = 0
    store = run_store(run)
    for e in store.list("stats/", suffix=".json"):
        name = e.path.rsplit("/", 1)[-1]
        if name.startswith(".") or e.path.count("/") != 1:
            continue
        m = store.read_json(e.path)
        n_inputs += int(m.get("inputs") or 0)
        n_kept += int(m.get("kept") or 0)
        for reason, n in (m.get("rejected") or {}).items():
            reasons[reason] = reasons.get(reason, 0) + n
            stage = reason.split(":", 1)[0]
            by_stage[stage] = by_stage.get(stage, 0) + n
    return by_stage, n_inputs, n_kept, dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))


def funnel_from_counts(rejected: dict[str, int], n_inputs: int, stage_names: list[str]) -> list[dict]:
    """inputs -> survivors after each stage -> kept (decide.funnel's shape, from grouped counts)."""
    from .decide import funnel_stages
    stage_names = funnel_stages(stage_names, rejected)  # 'input' first when a source had no bytes
    rows, alive = [], n_inputs
    for name in stage_names:
        out = alive - rejected.get(name, 0)
        rows.append({"stage": name, "in": alive, "out": out})
        alive = out
    unknown = sum(n for s, n in rejected.items() if s not in stage_names)
    if unknown:
        rows.append({"stage": "other", "in": alive, "out": alive - unknown})
    return rows
