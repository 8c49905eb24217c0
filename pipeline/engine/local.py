"""A run without Ray, for small runs on one machine (engine.executor; `auto` picks it for a run of at
most engine.local_max_files inputs that joins no cluster).

A local Ray costs a small run more than its images do: on 2 cores, a 96-image run spent ~9 CPU s
starting model actors, ~10 s in Ray Data's helper actors and pooled workers and 4 s in the driver's
scheduling loop, against ~25 s of model work (docs/benchmarks.md, "Per core"). Here the same block
functions as Ray's path (pipeline/engine/blocks.py: measure_block, _score_block, _finish_unit_block,
and adapter.run_on_unit for each stage) run in a pool of worker processes, one per core (or per unit
when fewer), that lives for the whole run: each worker loads a stage's models once, on its first unit,
and keeps them for every phase, fallback round and pass; a unit goes through all of its stages in one
process. The files a unit writes, its summary and its stats marker are those of the Ray path, so a run
is resumable by either executor and their catalogs are equal (tests/pipeline/engine/test_local.py).

Faults as in Ray's path: a fault of the environment is the unit's summary and stops the run; a unit
whose worker raises or dies is retried engine.max_retries times (a dead worker takes the pool down:
the pool restarts and the units in flight run again, each counting one attempt), then its samples run
one at a time in child processes (pipeline/engine/isolate.py), in the driver.
"""
from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import sys
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

import pyarrow as pa

from pipeline.config import section
from pipeline.engine.errors import EnvironmentFault, environment_fault

log = logging.getLogger("humanset.curate")


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def use_local(cfg: dict, n_inputs: int, stages: list | None = None) -> bool:
    """engine.executor: `local` or `ray` as set; `auto`: local for at most engine.local_max_files inputs
    when this driver would start a private Ray (no cluster to join, none running in this process) and
    none of the run's `stages` (default: the configured ones) asks for GPUs (their batched pools are Ray's)."""
    eng = section(cfg, "engine")
    choice = str(eng["executor"])
    if choice != "auto":
        return choice == "local"
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return False
    from pipeline.engine.ray_setup import joins_cluster
    if joins_cluster(cfg):
        return False
    if stages is None:
        from pipeline.stages import build_stages
        stages = build_stages(cfg)
    if any(s.resources.num_gpus for s in stages):
        return False
    return n_inputs <= int(eng["local_max_files"])


def workers(score_stages: list, units: int) -> int:
    """One worker per core at the model stages' CPUs (as the fused model pool on a local Ray:
    adapter.group_pool_size), no more than the run has units."""
    per = max([s.resources.num_cpus for s in score_stages] or [1.0])
    return max(1, min(int(cores() // max(per, 1e-3)) or 1, max(1, units)))


# --------------------------------------------------------------------------------------------
# Worker side: one process of the pool.

PR_SET_PDEATHSIG = 1  # prctl(2)
_STAGE_CACHE: dict[str, object] = {}  # (name, cfg) -> a set-up stage, for the process's life
_SETUP: dict[str, list] = {}  # stage name -> [start, ready] epoch seconds of its set-up (unit counters)


def _init_worker(storage: dict, driver_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's: it stops the pool
    if sys.platform.startswith("linux"):  # a driver killed outright (SIGKILL, OOM) takes its workers along
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != driver_pid:  # it died before the line above
            os._exit(1)
    # one process per core: numpy's BLAS (the pHash resize's products, pipeline/inputs/resample.py) runs one
    # thread, as in Ray's workers (OMP_NUM_THREADS=1); a second thread per worker only spins against the other
    import numpy  # noqa: F401  (loads the BLAS library the limit applies to)
    from threadpoolctl import threadpool_limits
    threadpool_limits(1, user_api="blas")
    from catalog.storage import retry
    retry.configure(storage)


def _stages(specs: list[tuple[str, dict]]) -> list:
    from pipeline.engine.adapter import stage_instance
    out = []
    for name, cfg in specs:
        key = json.dumps([name, cfg], sort_keys=True, default=str)
        if key not in _STAGE_CACHE:
            t0 = time.time()
            _STAGE_CACHE[key] = stage_instance(name, cfg)
            _SETUP[name] = [round(t0, 3), round(time.time(), 3)]
            if "torch" in sys.modules:  # torch threads = the stage's CPUs (ONNX Runtime stages set theirs)
                import torch
                torch.set_num_threads(max(1, int(round(_STAGE_CACHE[key].resources.num_cpus))))
        out.append(_STAGE_CACHE[key])
    return out


def _block(units: list[dict]) -> pa.Table:
    return pa.table({"units": [json.dumps(units)]})


def measure_job(units: list[dict], run: str, limits: dict, cfg: dict, score_all: bool) -> pa.Table:
    """Phase 1 of a bundle of units: their summaries (blocks.measure_block)."""
    from pipeline.engine.blocks import measure_block
    return measure_block(_block(units), run, limits, cfg, score_all)


def score_job(unit: dict, run: str, limits: dict, score_all: bool, cfg: dict, specs: list[tuple[str, dict]]) -> pa.Table:
    """One pass of phase 3 over one unit: read, every stage of `specs` in order, write (the steps of
    blocks.score_ds, in this process); without stages, read and write. Its summary."""
    from pipeline.engine.adapter import run_on_unit
    from pipeline.engine.blocks import _finish_unit_block, _score_block
    from pipeline.engine.columns import unit_meta, with_meta
    if not specs:
        return _score_block(_block([unit]), run, limits, score_all, cfg, fused=True)
    table = _score_block(_block([unit]), run, limits, score_all, cfg)
    if "fault" in table.column_names:  # an empty unit finished, or a fault: its summary
        return table
    for stage in _stages(specs):
        table = run_on_unit(stage, table, score_all)
    meta = unit_meta(table)
    meta.setdefault("actor_setup", {}).update({s[0]: _SETUP[s[0]] for s in specs if s[0] in _SETUP})
    return _finish_unit_block(with_meta(table, meta), run, cfg)


# --------------------------------------------------------------------------------------------
# Driver side.

class LocalPool:
    """The run's worker processes (started on first use, stopped by close())."""

    def __init__(self, cfg: dict, run: str, workers: int):
        self.cfg, self.run, self.workers = cfg, str(run), max(1, int(workers))
        self.retries = int(section(cfg, "engine")["max_retries"])
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init_worker, initargs=(self.cfg.get("storage") or {}, os.getpid()))
        return self._pool

    def close(self, kill: bool = False) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if kill:  # a broken pool, or the driver stopping: no unit waits for its workers
            for p in list((getattr(pool, "_processes", None) or {}).values()):
                if p.is_alive():
                    p.kill()
        pool.shutdown(wait=True, cancel_futures=True)

    def results(self, fn, jobs: list[tuple[str, tuple]]):
        """fn(*args) for every (key, args) of `jobs` in the pool, yielding each result as it comes. A job
        that raises (not a fault of the environment, which stops the run) or whose worker dies runs
        again, at most engine.max_retries times; one that fails for good yields nothing (the driver
        finds it without output and isolates it)."""
        attempts = {key: 0 for key, _ in jobs}
        args = dict(jobs)
        queue = deque(key for key, _ in jobs)
        pending: dict = {}
        while queue or pending:
            pool = self._executor()
            while queue and len(pending) < 2 * self.workers:  # a bounded number of arguments in flight
                key = queue.popleft()
                pending[pool.submit(fn, *args[key])] = key
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            broken = False
            for f in done:
                key = pending.pop(f)
                try:
                    got = f.result()
                except BrokenProcessPool:
                    broken = True
                    self._again(key, attempts, queue, "its worker process died")
                except Exception as e:
                    fault = environment_fault(e, self.run)
                    if fault:
                        raise EnvironmentFault(fault) from e
                    self._again(key, attempts, queue, f"{type(e).__name__}: {e}")
                else:
                    yield got  # outside the try: what the consumer raises here is not the job's failure
            if broken:  # every job in flight died with the pool
                for key in list(pending.values()):
                    self._again(key, attempts, queue, "its worker process died")
                pending.clear()
                self.close(kill=True)  # the next pass starts a new pool

    def _again(self, key: str, attempts: dict, queue: deque, why: str) -> None:
        attempts[key] += 1
        if attempts[key] <= self.retries:
            log.warning("unit %s failed (%s); retrying (%d of %d)", key, why, attempts[key], self.retries)
            queue.append(key)
        else:
            log.warning("unit %s failed (%s) %d times", key, why, attempts[key])

    def call(self, fn, *args):
        """fn(*args) on one worker (dedup, a compaction group), retried like a unit; its result."""
        for got in self.results(fn, [("task", args)]):
            return got
        raise RuntimeError(f"{fn.__name__} failed {self.retries + 1} times (see the warnings above)")


def isolate(run: str, units: list, phase: str, cfg: dict, score_all: bool, limits: dict, progress: bool) -> None:
    """Units that failed for good: each sample alone in a child process (pipeline/engine/isolate.py)."""
    from catalog import console
    from pipeline.engine.isolate import isolate_unit, isolated
    log.warning("%d units failed in %s after %d retries: running their samples one at a time",
                len(units), phase, int(section(cfg, "engine")["max_retries"]))
    with console.progress(len(units), f"{phase} (isolated)", enabled=progress) as bar:
        for u in units:
            isolated(str(run), isolate_unit, str(run), u.to_dict(), phase, cfg, score_all, limits)
            bar.update(1)
