"""Shared fixtures (one loopback-only Ray for the session, the demo crawl curated once) and the test
tiers (tests/tiers.py, docs/testing.md): each test gets the tier marks of what it needs at collection,
from the fixtures it uses or its explicit marks, else `unit`; a unit test that starts what a heavier tier
stands for fails, naming the mark it needs."""
import gc
import os
import sys

# Ray swaps 127.0.0.1 for the machine's network address unless told not to: tests stay on loopback.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# Ray Train's controller polls its workers every 2 s, and a run's start, each report and its end wait for
# a poll: at a tenth of that, a two-step training run spends its seconds training. Set before any Ray
# starts (the session's, a child's), whose processes inherit it.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")

import pytest  # noqa: E402
from s3server import s3_server  # noqa: E402,F401  (the real S3 server on 127.0.0.1: tests/s3server.py)

import tiers  # noqa: E402  (the test tiers: tests/tiers.py)


def pytest_collection_modifyitems(config, items):
    """Each test gets its tier marks (tests/tiers.py); the cluster tier runs last (it starts and stops
    whole clusters)."""
    for item in items:
        marks = {m.name for m in item.iter_markers()}
        if "unit" in marks and marks & set(tiers.HEAVY):
            raise pytest.UsageError(f"{item.nodeid}: marked unit and {sorted(marks & set(tiers.HEAVY))}; a unit "
                                    "test needs none of those (tests/tiers.py)")
        for tier in sorted(tiers.tiers_of(item.fixturenames, marks) - marks):
            item.add_marker(tier)
    items.sort(key=lambda item: item.get_closest_marker("cluster") is not None)


sys.addaudithook(tiers.audit)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A unit test fails at once, naming the mark it needs, when it (or a fixture it sets up) starts a
    training run, Blender, SeaweedFS, Ray cluster nodes or a heavy `humanset` command (tests/tiers.py)."""
    if item.get_closest_marker("unit") is None:
        return (yield)
    patch = pytest.MonkeyPatch()
    tiers.refuse_entry_points(item.nodeid, patch)
    tiers.RUNNING_UNIT.append(item.nodeid)
    try:
        return (yield)
    finally:
        tiers.RUNNING_UNIT.clear()
        patch.undo()


def pytest_runtest_logreport(report):
    tiers.add_report(report.keywords, report.when, report.duration)


def pytest_terminal_summary(terminalreporter):
    """The seconds per tier, beside pytest's wall time (docs/testing.md's figures)."""
    lines = tiers.summary_lines()
    if lines:
        terminalreporter.write_sep("=", "seconds per tier (tests/tiers.py)")
        for line in lines:
            terminalreporter.write_line(line)


_STATUS: dict = {}


def pytest_sessionfinish(session, exitstatus):
    _STATUS["exit"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Leave with the tests' status once pytest has reported everything, before the interpreter's
    teardown: its finalizers of native state (Ray's core worker, obstore's runtime, torch's workers,
    objects gc.freeze kept) crashed a finished run once (a segfault after the summary), which would
    turn a green suite red. HUMANSET_TEST_TEARDOWN=1 keeps the ordinary exit, to look into it."""
    if "exit" in _STATUS and os.environ.get("HUMANSET_TEST_TEARDOWN") != "1":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_STATUS["exit"])


@pytest.fixture(autouse=True)
def _gc_frozen():
    """What is alive when a test starts is moved out of the cyclic collector's reach (gc.freeze): a
    gc.collect() in the test (the dedup tasks run one each, when in process) then scans the test's own
    objects, not the ~10^6 of torch, Ray and every test module. Garbage of earlier tests is collected first."""
    gc.collect()
    gc.freeze()
    yield


# --- shared fixtures ---------------------------------------------------------------------------------
def session_ray_cpus() -> int:
    """The session Ray's logical CPUs: what the engine starts for a local run of the demo config with a
    pool per model stage (engine.fuse_model_stages=false; fused they need fewer): the machine's cores, or
    more where the four model stages' actors, one CPU each for the run, and a read/write slot need more:
    6 on 2 cores. The demo run, the runs with trained filters and the fused/unfused comparison curate on it."""
    from pipeline.demo.crawl import demo_config
    from pipeline.engine.ray_setup import actor_cpus
    cfg = demo_config()
    cfg = dict(cfg, engine={**(cfg.get("engine") or {}), "fuse_model_stages": False})
    return max(os.cpu_count() or 1, int(actor_cpus(cfg, configured=True)) + 2)


@pytest.fixture(scope="session")
def ray_local():
    import ray
    if not ray.is_initialized():
        ray.init(num_cpus=session_ray_cpus(), include_dashboard=False, logging_level="WARNING")
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def demo_crawl(tmp_path_factory):
    from pipeline.demo.crawl import demo_samples, write_webdataset
    folder = tmp_path_factory.mktemp("demo") / "crawl"
    samples = demo_samples()
    write_webdataset(folder, samples)
    return folder, samples


@pytest.fixture(scope="session")
def demo_run(demo_crawl, ray_local, tmp_path_factory):
    """The demo crawl curated with the demo config, all seven stages (the run `make demo` makes)."""
    from pipeline.demo.crawl import demo_config
    from pipeline.engine.driver import curate
    run = tmp_path_factory.mktemp("demo") / "run"
    manifest = curate([str(demo_crawl[0])], str(run), demo_config(), progress=False)
    return run, manifest
