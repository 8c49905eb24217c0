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


def keep_local_ray_on_loopback() -> None:
    """Keep a single-machine Ray on 127.0.0.1: by default Ray swaps loopback for the machine's
    network address. The variable is set before the cluster starts (its processes inherit it); in a
    process that imported Ray already, the constant Ray read from it at import is set too."""
    os.environ[LOOPBACK_ENV] = "0"
    if "ray" in sys.modules:
        import ray._private.ray_constants as rc
        rc.ENABLE_RAY_CLUSTER = False
