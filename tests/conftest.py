"""Shared fixtures: one loopback-only Ray for the session, the demo crawl curated once."""
import os

# Ray swaps 127.0.0.1 for the machine's network address unless told not to: tests stay on loopback.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest  # noqa: E402
from s3server import s3_server  # noqa: E402,F401  (the real S3 server on 127.0.0.1: tests/s3server.py)


@pytest.fixture(scope="session")
def ray_local():
    import ray
    if not ray.is_initialized():
        # logical CPUs beyond the 2 cores: Ray Train tests hold 2 workers plus the trainer's actors
        # while Ray Data read tasks (and earlier tests' idle actors) need slots of their own
        ray.init(num_cpus=8, include_dashboard=False, logging_level="WARNING")
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


def pytest_collection_modifyitems(items):
    """The loopback-cluster test runs last: it starts and stops a whole Ray cluster."""
    items.sort(key=lambda item: item.path.name == "test_cluster.py")
