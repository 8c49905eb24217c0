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


def test_the_scheduling_loop_wakes_on_the_first_finished_task():
    """wake_on_first_task reaches the loop's ray.wait (through the module's global `ray`): a wait on
    several tasks returns once one is ready, with every task ready by then, not after the timeout."""
    state = importlib.import_module(ray_compat.TASK_WAIT_MODULE)
    source = inspect.getsource(getattr(state, ray_compat.TASK_WAIT_FUNCTION)).replace(" ", "").replace("\n", "")
    assert "ray.wait(list(active_tasks.keys()),num_returns=len(active_tasks)" in source
    old = state.ray  # already wrapped when an earlier test of the session curated in this process
    raw = getattr(old, "_ray", old)
    try:
        state.ray = raw
        ray_compat.wake_on_first_task()
        ray_compat.wake_on_first_task()  # twice: still one wrapper
        assert isinstance(state.ray, ray_compat._FirstReady) and state.ray._ray is raw
        assert state.ray.ObjectRef is ray.ObjectRef  # everything else is Ray's own

        class FakeRay:
            def __init__(self):
                self.calls = []

            def wait(self, refs, num_returns=1, timeout=None, fetch_local=True):
                self.calls.append((num_returns, timeout))
                ready = [r for r in refs if r.startswith("done")][:num_returns]
                return ready, [r for r in refs if r not in ready]

        fake = FakeRay()
        first = ray_compat._FirstReady(fake)
        ready, rest = first.wait(["a", "done1", "done2", "b"], num_returns=4, timeout=0.1, fetch_local=False)
        assert ready == ["done1", "done2"] and rest == ["a", "b"]
        assert fake.calls == [(1, 0.1), (4, 0)]  # one ready wakes it; then whatever else is ready, no wait
        fake.calls.clear()
        assert first.wait(["a", "b"], num_returns=2, timeout=0.1) == ([], ["a", "b"])
        assert fake.calls == [(1, 0.1)]  # none ready within the timeout: as before
    finally:
        state.ray = old


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
