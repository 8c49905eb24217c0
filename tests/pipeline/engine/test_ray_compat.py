"""pipeline/engine/ray_compat.py: each patch of Ray's internals still lands where Ray reads it. These fail
when a Ray upgrade moves or renames what is patched (update ray_compat and the pin together)."""
import importlib
import inspect
import subprocess
import sys

import ray

from pipeline.engine import ray_compat


def test_ray_is_a_tested_minor_version():
    minor = ".".join(ray.__version__.split(".")[:2])
    assert minor in ray_compat.TESTED_RAY, (f"ray {ray.__version__} is not among the versions "
                                            f"pipeline/engine/ray_compat.py was tested on {ray_compat.TESTED_RAY}")


def test_task_poll_constant_exists_and_is_what_the_scheduling_loop_waits_on():
    state = importlib.import_module(ray_compat.TASK_WAIT_MODULE)
    name = ray_compat.TASK_WAIT_CONSTANT
    assert isinstance(getattr(state, name), (int, float))
    # read from the module's globals at the call, so setting the module attribute reaches the loop
    assert f"timeout={name}" in inspect.getsource(state).replace(" ", "")
    old = getattr(state, name)
    try:
        ray_compat.set_task_poll(0.02)
        assert getattr(state, name) == 0.02
    finally:
        setattr(state, name, old)


def test_loopback_variable_is_the_one_ray_reads_and_keeps_a_local_node_on_127_0_0_1():
    import ray._private.ray_constants as rc
    import ray._private.services as services
    assert rc.ENABLE_RAY_CLUSTERS_ENV_VAR == ray_compat.LOOPBACK_ENV
    assert isinstance(rc.ENABLE_RAY_CLUSTER, bool)
    assert "ENABLE_RAY_CLUSTER" in inspect.getsource(services.get_node_ip_address)
    probe = ("import ray; from pipeline.engine import ray_compat; ray_compat.keep_local_ray_on_loopback(); "
             "import ray._private.services as s, ray._private.ray_constants as rc; "
             "print(rc.ENABLE_RAY_CLUSTER, s.get_node_ip_address())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "127.0.0.1"]
