"""Phase 3 behind a gate: model actors that load while phases 1 and 2 run (engine.start_actors_early),
and one pipeline for every pass of phase 3 (the fallback rounds and the write pass).

The score pipeline starts executing in a driver thread, so its actor pools start (and load their
models) at once, while its units wait at a gate (a zero-CPU actor) that the driver opens: after dedup
for the first pass; with several passes (pipeline/dedup/fallback_rounds.py), each later pass once the
exchange before it is done, naming the units that have work in it. The model actors then start once
for the whole of phase 3 instead of once per pass.
"""
from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa

from pipeline.engine.blocks import score_ds
from pipeline.config import section
from pipeline.engine.errors import EnvironmentFault
from pipeline.engine.ray_setup import actor_cpus
from pipeline.inputs.units import Unit
from pipeline.stages import Stage

log = logging.getLogger("humanset.curate")


class _Gate:
    """Ray actor (no CPU): each pass's units wait in wait(pass) until the driver opens the pass with
    the units that have work in it (True: all) or stops the run (every wait then returns False)."""

    def __init__(self):
        self._events: dict = {}
        self._work: dict = {}
        self._stopped = False

    def _event(self, p: str):
        import asyncio
        if p not in self._events:
            self._events[p] = asyncio.Event()
            if self._stopped:
                self._events[p].set()
        return self._events[p]

    async def open(self, p: str, work) -> None:
        self._work[p] = work
        self._event(p).set()

    async def stop(self) -> None:
        self._stopped = True
        for e in self._events.values():
            e.set()

    async def wait(self, p: str):
        await self._event(p).wait()
        if p not in self._work:  # stopped before this pass opened
            return False
        work = self._work[p]
        return work if work is True else sorted(work)


class EarlyScore:
    """The score phase's pipeline, executing in a driver thread from its creation: one pass (the
    units as they are), or with `passes` one item per unit and pass (blocks.score_ds)."""

    def __init__(self, run: Path, units: list[Unit], stages: list[Stage], cfg: dict, score_all: bool,
                 passes: list[str] | None = None):
        import queue
        import threading
        import uuid

        import ray
        self._actor_cpus = actor_cpus(cfg)
        self.passes = passes
        self.units = units
        self._gate = ray.remote(num_cpus=0, max_restarts=0)(_Gate).remote()
        self._ds = score_ds(run, units, stages, cfg, score_all, gate=(self._gate, uuid.uuid4().hex), passes=passes)
        self._out: queue.Queue = queue.Queue()
        self._held: list = []  # summaries of a later pass that arrived while an earlier one drained
        self._ended = False
        self._thread = threading.Thread(target=self._execute, name="humanset-score", daemon=True)
        self._thread.start()

    def _execute(self) -> None:
        try:  # starting the execution starts the actor pools; summaries come once the gate opens. No
            # prefetch: Ray Data's iterator would hand out a block only once the next one is there, and
            # the next pass's first block waits at the gate until this pass's last summary is in
            for batch in self._ds.iter_batches(batch_format="pyarrow", batch_size=None, prefetch_batches=0):
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
        ray.get(self._gate.open.remote("0", True))
        while (item := self._out.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
        self._thread.join()

    def run_pass(self, p: str, work, bar=None) -> None:
        """Open pass `p` for the units in `work` (True: all) and wait until every unit has left it
        (the others leave at once). A unit that failed for good raises (the pipeline stops on it);
        so does a fault of the environment (EnvironmentFault), as in every phase."""
        import ray
        ray.get(self._gate.open.remote(p, work if work is True else sorted(work)))
        left, pending = len(self.units), list(self._held)
        self._held = []
        while left:
            if pending:
                batch = pending.pop(0)
            else:
                if self._ended:
                    raise RuntimeError(f"the score pipeline ended before pass {p} was done")
                batch = self._out.get()
                if batch is None:
                    self._ended = True
                    continue
                if isinstance(batch, BaseException):
                    raise batch
            if not batch.num_rows:
                continue
            faults = [f for f in batch.column("fault").to_pylist() if f]
            if faults:
                raise EnvironmentFault(faults[0])
            for row in batch.to_pylist():
                if row["pass"] != p:
                    self._held.append(pa.Table.from_pylist([row], schema=batch.schema))
                    continue
                left -= 1
                if bar is not None and (work is True or row["unit_id"] in work):
                    bar.update(1)

    def finish(self) -> None:
        """After the last pass: the pipeline ends and its actors go."""
        while not self._ended and (item := self._out.get()) is not None:
            if isinstance(item, BaseException):
                raise item
        self._ended = True
        self._thread.join()

    def abort(self) -> None:
        """The run stopped (or the pipeline failed) before phase 3 ended: no unit passes any more; the
        pipeline ends and frees its actors."""
        import ray
        try:
            ray.get(self._gate.stop.remote(), timeout=30)
        except Exception as e:  # the run's own error is the one to report
            log.debug("score gate: %s", e)
        self._thread.join(timeout=60)


def start_actors_early(cfg: dict, stages: list[Stage], units_to_measure: int) -> bool:
    """engine.start_actors_early: true, false, or auto (early when measure has at least
    engine.early_min_units units, enough work for the actors' set-up to hide behind)."""
    eng = section(cfg, "engine")  # the run's values; a partial config's defaults from pipeline/settings.py
    mode = eng["start_actors_early"]
    if mode == "auto":
        mode = units_to_measure >= int(eng["early_min_units"])
    return bool(mode) and any(s.stateful for s in stages)
