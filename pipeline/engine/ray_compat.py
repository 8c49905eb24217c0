"""Every place humanset reaches into Ray's internals, and nothing else.

Tested on ray 2.60.0 (pyproject pins ray to 2.60.*). tests/pipeline/engine/test_ray_compat.py fails when
a Ray upgrade moves or renames what is patched here; update this module and the pin together.
"""
from __future__ import annotations

import os
import sys

TESTED_RAY = ("2.60",)  # minor versions these patches were tested on

# Ray Data's scheduling loop waits (ray.wait) for all running tasks or this long, whichever comes
# first, before it hands a freed CPU the next block (ray/data/_internal/execution/streaming_executor_state.py)
TASK_WAIT_MODULE = "ray.data._internal.execution.streaming_executor_state"
TASK_WAIT_CONSTANT = "WAIT_FOR_TASK_COMPLETION_TIMEOUT_S"
# ... with this call: ray.wait(active tasks, num_returns=len(active tasks), timeout=...) in the module's
# function process_completed_tasks, through the module's global `ray`
TASK_WAIT_FUNCTION = "process_completed_tasks"
# Ray reads this at import (ray/_private/ray_constants.py): "0" keeps a local node on 127.0.0.1
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def set_task_poll(seconds: float) -> None:
    """Make Ray Data's scheduling loop notice a finished task within `seconds`.

    Its 0.1 s default kept a core idle 10-30% of the time with unit tasks of 0.3-1.5 s on two CPUs
    (bench/scale.py). The wait is a module constant with no public setting; where a Ray version
    lacks it, nothing changes (the test of this module fails instead)."""
    import importlib
    try:
        state = importlib.import_module(TASK_WAIT_MODULE)
    except ImportError:
        return
    if isinstance(getattr(state, TASK_WAIT_CONSTANT, None), (int, float)):
        setattr(state, TASK_WAIT_CONSTANT, float(seconds))


class _FirstReady:
    """The `ray` module as Ray Data's scheduling loop sees it, except `wait`: it returns as soon as one
    task is ready (with every other task ready by then), instead of when all are or the timeout ends."""

    def __init__(self, ray):
        self._ray = ray

    def __getattr__(self, name):
        return getattr(self._ray, name)

    def wait(self, refs, *, num_returns=1, timeout=None, **kw):
        if len(refs) <= 1 or num_returns <= 1:
            return self._ray.wait(refs, num_returns=num_returns, timeout=timeout, **kw)
        first, _ = self._ray.wait(refs, num_returns=1, timeout=timeout, **kw)
        if not first:
            return first, list(refs)
        return self._ray.wait(refs, num_returns=num_returns, timeout=0, **kw)


def wake_on_first_task() -> None:
    """Make Ray Data's scheduling loop wake when the first of its running tasks finishes.

    The loop waits for all its running tasks or the timeout (set_task_poll), whichever comes first:
    with a short timeout a finished task's CPU is handed on soon, but the loop then runs ~100 times a
    second for as long as the pipeline runs (its driver's CPU: ~14% of a core on two CPUs, measured in
    bench/profile.py); with the long one a CPU idles. Waking on the first finished task gives both.
    Where a Ray version lacks the call, nothing changes (the test of this module fails instead)."""
    import importlib
    try:
        state = importlib.import_module(TASK_WAIT_MODULE)
    except ImportError:
        return
    current = getattr(state, "ray", None)
    if current is not None and not isinstance(current, _FirstReady) and callable(getattr(state, TASK_WAIT_FUNCTION, None)):
        state.ray = _FirstReady(current)


def keep_local_ray_on_loopback() -> None:
    """Keep a single-machine Ray on 127.0.0.1: by default Ray swaps loopback for the machine's
    network address. The variable is set before the cluster starts (its processes inherit it); in a
    process that imported Ray already, the constant Ray read from it at import is set too."""
    os.environ[LOOPBACK_ENV] = "0"
    if "ray" in sys.modules:
        import ray._private.ray_constants as rc
        rc.ENABLE_RAY_CLUSTER = False
