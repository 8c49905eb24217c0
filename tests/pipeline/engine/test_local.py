"""The local executor (engine.executor=local, pipeline/engine/local.py): a run without Ray, in a pool of
worker processes on this machine. It curates exactly as Ray does (equal catalogs, byte-equal shards), a
worker that dies is retried and then its unit's samples isolated as on Ray, a fault of the environment
stops it with Ray's one line and exit status, and `auto` picks it only for a small run that joins no
cluster and asks for no GPU."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import catalog
from pipeline.config import load_config
from pipeline.engine.local import use_local

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "faults"))
import humanset_faults  # noqa: E402  (test-only fault injection: tests/faults)

CHEAP = ["stages=[decode,size,dedup]"]


def _curate(crawl, run, *sets, env=None, timeout=900):
    """`pipeline/curate.py` in a child process (the driver a user runs), with `--set`s."""
    cmd = [sys.executable, str(ROOT / "pipeline" / "curate.py"), "--input", str(crawl), "--output", str(run),
           "--no-progress"]
    for s in sets:
        cmd += ["--set", s]
    if env is None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                                          if p))
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _manifest(run) -> dict:
    return json.loads((Path(run) / "manifest.json").read_text())


def _photos(folder, n, start=0):
    from pipeline.demo.crawl import photo_like
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(start, start + n):
        (folder / f"{i:03d}.jpg").write_bytes(photo_like(400, 320, 500 + i))
    return folder


# --- the same run on both executors ------------------------------------------------------------------------

@pytest.mark.e2e
def test_the_local_executor_curates_exactly_as_ray(ray_local, tmp_path):
    """32 images of the demo crawl in 4 shards, the real person and text models with the default
    fallback rounds (dedup.max_fallbacks): on Ray (the session's) and in the local pool (a driver in a
    child process, where no Ray runs at all: dedup and the rounds' exchanges run in process), equal
    catalogs, byte-equal shards and the same counts, funnel and rounds; each manifest names its executor."""
    from pipeline.demo.crawl import demo_samples, write_webdataset
    crawl = tmp_path / "crawl"
    write_webdataset(crawl, demo_samples()[:32], per_shard=8)
    runs, manifests = _both(crawl, tmp_path, "stages=[decode,size,dedup,person,text]", local_in_child=True)
    ray_m, local_m = manifests["ray"], manifests["local"]
    assert ray_m["units"] == 4
    assert load_config()["dedup"]["max_fallbacks"] > 0  # the default config's rounds, and this crawl needs them
    assert sum(ray_m["fallbacks"]["rounds"].values()) > 0 and local_m["fallbacks"] == ray_m["fallbacks"]
    # a unit's samples ran in a model stage of the local pool's workers: their set-up is on its marker
    markers = [json.loads(p.read_text()) for p in (runs["local"] / "stats").glob("*.json")]
    assert {"person", "text"} <= {n for m in markers for n in (m.get("actor_setup") or {})}

    tables = _same_catalog_and_shards(runs)
    scored = tables["ray"].column("scored_stages").to_pylist()
    assert sum("text" in (s or []) for s in scored) > 0  # units went through both models
    assert tables["ray"].num_rows == 32


def _both(crawl, tmp_path, *sets, local_in_child=False):
    """The crawl curated on the session Ray and in the local pool, in this process (where Ray runs:
    an explicit `local` is honoured all the same) or, with `local_in_child`, by `pipeline/curate.py`
    in a child process: (runs, manifests)."""
    from pipeline.engine.driver import curate
    runs, manifests = {}, {}
    for executor in ("ray", "local"):
        run = runs[executor] = tmp_path / executor
        if executor == "local" and local_in_child:
            p = _curate(crawl, run, *sets, "engine.executor=local")
            assert p.returncode == 0, p.stderr[-3000:]
            assert "executor: local, " in p.stderr and "ray: " not in p.stderr, p.stderr[-3000:]
            manifests[executor] = _manifest(run)
        else:
            manifests[executor] = curate([str(crawl)], str(run),
                                         load_config(sets=[*sets, f"engine.executor={executor}"]), progress=False)
        assert _manifest(run)["executor"] == manifests[executor]["executor"] == executor
        assert manifests[executor]["status"] == "complete"
    for key in ("units", "counts", "funnel", "reject_reasons", "dedup"):
        assert manifests["local"].get(key) == manifests["ray"].get(key), key
    return runs, manifests


def _same_catalog_and_shards(runs: dict):
    """Equal catalogs (read in sample_id order) and byte-equal shards (their indexes equal tables)."""
    tables = {e: pq.read_table(sorted((r / "catalog" / "samples").glob("*.parquet"))).sort_by("sample_id")
              for e, r in runs.items()}
    assert tables["ray"].num_rows and tables["ray"].equals(tables["local"])
    shards = {e: sorted(p.name for p in (r / "shards").iterdir()) for e, r in runs.items()}
    assert any(n.endswith(".tar") for n in shards["ray"]) and shards["ray"] == shards["local"]
    for name in shards["ray"]:
        if name.endswith(".tar"):
            assert (runs["ray"] / "shards" / name).read_bytes() == (runs["local"] / "shards" / name).read_bytes()
        else:  # the shard's index
            assert pq.read_table(runs["ray"] / "shards" / name).equals(pq.read_table(runs["local"] / "shards" / name))
    return tables


def test_a_junk_shard_and_an_empty_one_end_as_on_ray(ray_local, tmp_path):
    """The demo crawl's shards, 5 KB of random bytes named .tar and an empty tar through the cheap path,
    in windows of two units and bundles: both executors write the same catalog, shards and markers'
    counts, each unit's marker once."""
    from pipeline.demo.crawl import demo_samples, write_webdataset
    crawl = tmp_path / "crawl"
    write_webdataset(crawl, demo_samples())
    (crawl / "junk.tar").write_bytes(os.urandom(5000))
    (crawl / "empty.tar").write_bytes(b"\0" * 10240)
    runs, manifests = _both(crawl, tmp_path, *CHEAP, "engine.window_units=2")
    _same_catalog_and_shards(runs)
    markers = {e: {m.stem: json.loads(m.read_text()) for m in (r / "stats").glob("*.json")} for e, r in runs.items()}
    assert set(markers["local"]) == set(markers["ray"]) == {"00000", "00001", "00002", "junk", "empty"}
    for unit, m in markers["local"].items():
        assert {k: m[k] for k in ("inputs", "kept", "unit_error")} == \
            {k: markers["ray"][unit][k] for k in ("inputs", "kept", "unit_error")}, unit
    assert markers["local"]["junk"]["unit_error"] and markers["local"]["empty"]["inputs"] == 0
    assert all(m["node_id"] is None for m in markers["local"].values())  # no Ray node: none recorded
    assert all(m["node_id"] for m in markers["ray"].values())


# --- a worker that dies -------------------------------------------------------------------------------------

@pytest.mark.e2e
@pytest.mark.parametrize("stage", ["decode", "text"])
def test_a_sample_that_kills_its_local_worker_is_retried_then_isolated(tmp_path, stage):
    """The process running the stage dies on one sample (tests/faults: os._exit), in phase 1 (decode) or
    phase 3 (a model stage): the pool restarts and the unit runs again (engine.max_retries), then its
    samples run one at a time in child processes; the killer is rejected as worker_crash, every other
    sample curated as usual, and the run completes."""
    folder = _photos(tmp_path / "in", 5)
    (folder / "killer.jpg").write_bytes((folder / "000.jpg").read_bytes()[:-1] + b"\xd9")  # a valid image
    run = tmp_path / "run"
    stages = "[decode,size,dedup]" if stage == "decode" else "[decode,size,dedup,text]"
    p = _curate(folder, run, "engine.executor=local", "engine.max_retries=1", f"stages={stages}",
                "dedup.exact=false", "dedup.max_distance=null",
                env=humanset_faults.env({"stage": stage, "uri": "killer.jpg"}))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "its worker process died); retrying (1 of 1)" in p.stderr, p.stderr[-3000:]
    assert "running their samples one at a time" in p.stderr
    rows = {Path(r["source_uri"]).name: r for r in
            catalog.connect(run).sql("SELECT * FROM samples").to_arrow_table().to_pylist()}
    assert len(rows) == 6
    assert rows["killer.jpg"]["reject_reason"] == "decode:worker_crash"
    assert "worker crash" in rows["killer.jpg"]["decode_error"]
    others = [r for name, r in rows.items() if name != "killer.jpg"]
    assert all(r["keep"] for r in others)
    if stage == "text":
        assert all("text" in r["scored_stages"] for r in others)
    (stats,) = [json.loads(p.read_text()) for p in (run / "stats").glob("*.json")]
    assert stats["isolated"] and stats["worker_crashes"] == 1
    manifest = _manifest(run)
    assert manifest["executor"] == "local" and manifest["counts"] == {"inputs": 6, "kept": 5}
    assert manifest["reject_reasons"] == {"decode:worker_crash": 1}


@pytest.mark.e2e
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT"])
def test_a_driver_stopped_mid_run_takes_its_workers_along_and_the_rerun_finishes(tmp_path, sig):
    """SIGKILL (no finally, no atexit) or Ctrl-C on a local run's driver while its workers run: every
    worker is gone within seconds (none is left orphaned, holding a core and its models); Ctrl-C ends
    with one line and exit status 130, no traceback; the same command then finishes the run: every input
    once in the catalog."""
    import signal
    import time

    import psutil
    folder = _photos(tmp_path / "in", 48)
    run = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "pipeline" / "curate.py"), "--input", str(folder), "--output", str(run),
           "--no-progress", "--set", "engine.executor=local", "--set", "input.files_per_unit=4",
           "--set", "stages=[decode,size,dedup,text]"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    # Ctrl-C as a terminal delivers it, even where this suite runs with SIGINT ignored (a shell's background job)
    driver = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        workers: list = []
        deadline = time.time() + 300
        while time.time() < deadline and driver.poll() is None:
            workers = [c for c in psutil.Process(driver.pid).children(recursive=True)
                       if "spawn_main" in " ".join(c.cmdline())]
            if workers and (run / "stats").is_dir() and any((run / "stats").iterdir()):
                break  # the pool is at work on phase 3: units are finishing
            time.sleep(0.2)
        assert workers and driver.poll() is None, "the run ended before its workers were seen at work"
        driver.send_signal(getattr(signal, sig))
        _, err = driver.communicate(timeout=120)
        gone, alive = psutil.wait_procs(workers, timeout=30)
        assert not alive, [p.pid for p in alive]
        if sig == "SIGINT":
            assert driver.returncode == 130, err[-3000:]
            assert "Traceback" not in err and "humanset curate: interrupted; rerun the same command" in err, err[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert len(list((run / "stats").glob("*.json"))) < 12  # it was stopped with units to do
    p = _curate(folder, run, "engine.executor=local", "input.files_per_unit=4", "stages=[decode,size,dedup,text]")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = catalog.connect(run).sql("SELECT source_uri FROM samples").fetchall()
    assert len(rows) == len({r[0] for r in rows}) == 48
    assert _manifest(run)["status"] == "complete"


# --- a fault of the environment ----------------------------------------------------------------------------

@pytest.fixture
def small_disks(tmp_path):
    """Two file systems of 1 MB (tmpfs), one per executor."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a small tmpfs (CI runs as root)")
    mounts = {}
    for name in ("ray", "local"):
        mnt = mounts[name] = tmp_path / f"small-{name}"
        mnt.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)]).returncode:
            pytest.skip("mount -t tmpfs is not permitted in this container")
    yield mounts
    for mnt in mounts.values():
        subprocess.run(["umount", "-l", str(mnt)])


@pytest.mark.e2e
def test_a_full_disk_stops_a_local_run_with_rays_line_and_exit_status(tmp_path, small_disks):
    """~24 x 160 KB of curated bytes onto a 1 MB file system: on each executor the run stops with exit
    status 3 and the same one line (the RUN's path aside), no traceback; the local run's workers go."""
    from pipeline.demo.crawl import photo_like
    crawl = tmp_path / "crawl"
    crawl.mkdir()
    for i in range(24):
        (crawl / f"{i:03d}.jpg").write_bytes(photo_like(720, 540, 900 + i))
    lines = {}
    for executor, disk in small_disks.items():
        run = disk / "run"
        p = _curate(crawl, run, *CHEAP, "ray.num_cpus=2", "input.files_per_unit=4", f"engine.executor={executor}",
                    timeout=600)
        assert p.returncode == 3, (executor, p.stderr[-3000:])
        (line,) = [x for x in p.stderr.splitlines() if x.startswith("humanset curate: error")]
        assert "Traceback" not in p.stderr and "RayTaskError" not in p.stderr, (executor, p.stderr[-3000:])
        assert "no space left on device" in line and str(run) in line, line
        lines[executor] = line.replace(str(run), "RUN")
        # the manifest of a run that stopped names no executor yet: the driver's log line does
        assert ("executor: local, " in p.stderr) == (executor == "local"), p.stderr[-3000:]
        assert ("ray: private local cluster" in p.stderr) == (executor == "ray"), p.stderr[-3000:]
    assert lines["local"] == lines["ray"]


# --- which executor `auto` picks ---------------------------------------------------------------------------

def _decide(sets: list[str], n_inputs: int, env: dict | None = None) -> bool:
    """use_local in a fresh process, where no Ray runs (this test session may have started one)."""
    code = ("import json, sys\nfrom pipeline.config import load_config\nfrom pipeline.engine.local import use_local\n"
            "print(json.dumps(use_local(load_config(sets=json.loads(sys.argv[1])), int(sys.argv[2]))))")
    base = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    p = subprocess.run([sys.executable, "-c", code, json.dumps(sets), str(n_inputs)], cwd=ROOT,
                       env={**base, **(env or {})}, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_an_explicit_executor_is_taken_as_set(ray_local):
    """`ray` or `local` whatever the run's size, even with Ray running in this process; `auto` then
    takes the Ray that runs."""
    for n in (1, 10**6):
        assert use_local(load_config(sets=["engine.executor=local"]), n) is True
        assert use_local(load_config(sets=["engine.executor=ray"]), n) is False
    assert ray_local.is_initialized() and use_local(load_config(), 1) is False


@pytest.fixture
def no_cluster_here():
    if Path("/tmp/ray/ray_current_cluster").exists():
        pytest.skip("a `ray start` cluster runs on this machine (/tmp/ray/ray_current_cluster): auto joins it")


def test_auto_is_local_up_to_local_max_files_inputs(no_cluster_here):
    assert _decide([], 300000) is True and _decide([], 300001) is False  # the default limit, 300,000
    assert _decide(["engine.local_max_files=10"], 10) is True
    assert _decide(["engine.local_max_files=10"], 11) is False
    assert _decide(["engine.executor=auto", "engine.local_max_files=0"], 1) is False


def test_auto_joins_a_configured_cluster(no_cluster_here):
    assert _decide(["ray.address=127.0.0.1:6379"], 10) is False
    assert _decide([], 10, env={"RAY_ADDRESS": "127.0.0.1:6379"}) is False


def test_auto_runs_a_stage_that_asks_for_gpus_on_ray(no_cluster_here):
    gpu = "person.resources={num_cpus: 1, num_gpus: 1}"
    assert _decide([gpu], 10) is False
    assert _decide([gpu, "stages=[decode,size,dedup]"], 10) is True  # a GPU stage the run does not run


@pytest.mark.e2e
def test_auto_counts_a_shard_as_a_full_unit_of_inputs(tmp_path, no_cluster_here):
    """A tar shard's images are not counted by the listing: auto takes each as input.files_per_unit
    inputs, so a few shards of many images are a large run (Ray), not a few inputs."""
    from pipeline.demo.crawl import demo_samples, write_webdataset
    crawl = tmp_path / "crawl"
    write_webdataset(crawl, demo_samples()[:16], per_shard=8)  # 2 shards of 8 images
    small = _curate(crawl, tmp_path / "small", *CHEAP, "ray.num_cpus=2", "input.files_per_unit=8",
                    "engine.local_max_files=16")
    assert small.returncode == 0, small.stderr[-3000:]
    assert _manifest(tmp_path / "small")["executor"] == "local"
    large = _curate(crawl, tmp_path / "large", *CHEAP, "ray.num_cpus=2", "input.files_per_unit=8",
                    "engine.local_max_files=15")
    assert large.returncode == 0, large.stderr[-3000:]
    assert _manifest(tmp_path / "large")["executor"] == "ray"


# --- resuming, and the tier guard ---------------------------------------------------------------------------

@pytest.mark.e2e
def test_a_run_the_local_executor_began_is_finished_on_ray(ray_local, tmp_path):
    """The same config (engine.executor=auto) is the same run on either executor: a run curated in a child
    process (no Ray there: local) loses two units' markers and is finished in this process, where Ray
    runs (auto: Ray); its catalog and shards equal the local run's."""
    from pipeline.demo.crawl import demo_samples, write_webdataset
    from pipeline.engine.driver import curate
    crawl = tmp_path / "crawl"
    write_webdataset(crawl, demo_samples(), per_shard=8)  # 6 shards
    sets = [*CHEAP, "input.files_per_unit=8"]  # a shard weighs 8 inputs: 48 <= engine.local_max_files
    p = _curate(crawl, tmp_path / "local", *sets)
    assert p.returncode == 0, p.stderr[-3000:]
    assert _manifest(tmp_path / "local")["executor"] == "local"
    run = tmp_path / "resumed"
    shutil.copytree(tmp_path / "local", run)
    markers = sorted((run / "stats").glob("*.json"))
    assert len(markers) == 6
    for m in markers[1:3]:
        m.unlink()
    manifest = curate([str(crawl)], str(run), load_config(sets=sets), progress=False)
    assert manifest["executor"] == "ray" and manifest["status"] == "complete"
    node = {m.name: json.loads(m.read_text())["node_id"] for m in (run / "stats").glob("*.json")}
    assert sorted(n for n, v in node.items() if v) == [m.name for m in markers[1:3]]  # redone on a Ray node
    _same_catalog_and_shards({"ray": run, "local": tmp_path / "local"})


def test_a_unit_test_cannot_run_model_stages_in_the_local_pool(tmp_path):
    """tests/tiers.py: the local executor's workers running a model stage make a test e2e, as the
    model stages' Ray actors do; the cheap path stays a unit test."""
    from pipeline.engine.driver import curate
    folder = _photos(tmp_path / "in", 2)
    with pytest.raises(RuntimeError, match=r"a model stage in the local executor's workers.*@pytest\.mark\.e2e"):
        curate([str(folder)], str(tmp_path / "run"),
               load_config(sets=["stages=[decode,size,dedup,text]", "engine.executor=local"]), progress=False)
    manifest = curate([str(folder)], str(tmp_path / "cheap"),
                      load_config(sets=[*CHEAP, "engine.executor=local"]), progress=False)
    assert manifest["executor"] == "local" and manifest["counts"] == {"inputs": 2, "kept": 2}
