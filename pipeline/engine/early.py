"""Model actors that load while phases 1 and 2 run (engine.start_actors_early).

The first window's score pipeline starts executing with the run, so its actor pools start (and load
their models) at once, while its units wait at a gate (a zero-CPU actor) that the driver opens once
dedup is done. Model set-up then overlaps measure and dedup.
"""
from __future__ import annotations

import logging
from pathlib import Path

from pipeline.engine.blocks import score_ds
from pipeline.config import section
from pipeline.engine.ray_setup import actor_cpus
from pipeline.inputs.units import Unit
from pipeline.stages import Stage

log = logging.getLogger("humanset.curate")


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


class EarlyScore:
    """The score phase's pipeline, executing in a driver thread from the start of the run."""

    def __init__(self, run: Path, units: list[Unit], stages: list[Stage], cfg: dict, score_all: bool):
        import queue
        import threading
        import uuid

        import ray
        self._actor_cpus = actor_cpus(cfg)
        self._gate = ray.remote(num_cpus=0, max_restarts=0)(_Gate).remote()
        self._ds = score_ds(run, units, stages, cfg, score_all, gate=(self._gate, uuid.uuid4().hex))
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


def start_actors_early(cfg: dict, stages: list[Stage], units_to_measure: int) -> bool:
    """engine.start_actors_early: true, false, or auto (early when measure has at least
    engine.early_min_units units, enough work for the actors' set-up to hide behind)."""
    eng = section(cfg, "engine")  # the run's values; a partial config's defaults from pipeline/settings.py
    mode = eng["start_actors_early"]
    if mode == "auto":
        mode = units_to_measure >= int(eng["early_min_units"])
    return bool(mode) and any(s.stateful for s in stages)

