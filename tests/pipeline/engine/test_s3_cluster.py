"""A real multi-node Ray cluster on 127.0.0.1 (a head and two worker nodes, one CPU each, token
authentication on) curating from S3 into a RUN on S3 (SeaweedFS on 127.0.0.1), with `ray job submit`.

Checks: every input member is one catalog row; the shards, markers and catalog are on S3 and nothing
of the run is on local disk; units ran on at least two nodes (the Ray node id in each stats marker);
killing one worker node's raylet (by pid) mid-run still ends in a catalog equal to the clean run's;
a second curate on the same S3 RUN while the first holds its lock exits at once with the lock message.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

import catalog
from catalog import storage as st
from s3server import free_ports  # tests/s3server.py (tests/ is on sys.path: tests/conftest.py)

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
PER_SHARD = 4


def _node_ports(head: bool) -> tuple[dict, list[str]]:
    names = ["node-manager-port", "object-manager-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
             "metrics-export-port", "runtime-env-agent-port"] + (["port", "dashboard-port"] if head else [])
    lo = min(max(free_ports(1)[0], 20000), 60000)
    ports = dict(zip(names, free_ports(len(names))))
    while any(lo <= p <= lo + 200 for p in ports.values()):  # Ray refuses a component port in the workers' range
        ports = dict(zip(names, free_ports(len(names))))
    args = [f"--{k}={v}" for k, v in ports.items()] + [f"--min-worker-port={lo}", f"--max-worker-port={lo + 200}"]
    return ports, args


def _raylet_pid(node_manager_port: int) -> int | None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"raylet") and f"--node_manager_port={node_manager_port}".encode() in cmd:
            return int(pid)
    return None


@pytest.fixture(scope="module")
def cluster(s3_server):
    """`ray start --head` and two `ray start --address` on 127.0.0.1, each with its own ports, one CPU,
    token authentication; Ray's files in a private temporary folder (nothing in ~/.ray or /tmp/ray).
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1 lets a second raylet join on this host (=0, the single-node
    guard the engine sets for a private local cluster, refuses it); every address is 127.0.0.1."""
    temp = Path(tempfile.mkdtemp(prefix="hs-ray-", dir="/tmp"))
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=uuid.uuid4().hex + uuid.uuid4().hex,
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1", PATH=f"{BIN}:{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
               RAY_health_check_period_ms="1000", RAY_health_check_failure_threshold="3",
               RAY_health_check_timeout_ms="1000", RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    ray = str(BIN / "ray")
    head_ports, head_args = _node_ports(head=True)
    common = ["--num-cpus=1", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]

    def start(args):
        p = subprocess.run([ray, "start", *common, *args], env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"ray start failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"

    workers = []
    try:
        start(["--head", f"--temp-dir={temp}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
               *head_args])
        address = f"127.0.0.1:{head_ports['port']}"
        for _ in range(2):
            ports, args = _node_ports(head=False)
            start([f"--address={address}", *args])
            workers.append(ports)
        yield {"env": env, "ray": ray, "address": address, "dash": head_ports["dashboard-port"], "temp": temp,
               "workers": workers}
    finally:
        # not `ray stop`: it stops every Ray of this user on the machine; only this cluster's processes
        for pid in _cluster_pids(temp, [head_ports["node-manager-port"]] + [w["node-manager-port"] for w in workers]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(temp, ignore_errors=True)


def _cluster_pids(temp: Path, node_ports: list[int]) -> list[int]:
    """Processes of this cluster only: their command line names its temp folder or one of its raylets'
    ports (never another Ray of the machine)."""
    marks = [str(temp).encode()] + [f"={p}".encode() for p in node_ports]
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ_ok = b"ray" in cmd
        except OSError:
            continue
        if environ_ok and any(m in cmd for m in marks):
            out.append(int(pid))
    return out


@pytest.fixture(scope="module")
def s3_crawl(s3_server, demo_crawl):
    """The demo crawl re-cut into shards of PER_SHARD samples on S3 (enough units to spread)."""
    import io
    import json
    import tarfile
    _, samples = demo_crawl
    store = st.open_storage(s3_server.prefix("cluster"))
    n = 0
    for s in range(0, len(samples), PER_SHARD):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for key, ext, data, caption in samples[s:s + PER_SHARD]:
                meta = json.dumps({"key": key, "caption": caption, "status": "success"}).encode()
                for name, blob in ((f"{key}.{ext}", data), (f"{key}.txt", caption.encode()), (f"{key}.json", meta)):
                    info = tarfile.TarInfo(name)
                    info.size = len(blob)
                    tf.addfile(info, io.BytesIO(blob))
        store.write_bytes(f"crawl/{n:05d}.tar", buf.getvalue())
        n += 1
    return store, len(samples), n


def _submit(cluster, *args, wait=True):
    entry = ["python", str(ROOT / "pipeline" / "curate.py"), *args, "--no-progress",
             "--set", "stages=[decode,size,dedup]"]
    cmd = [cluster["ray"], "job", "submit", "--address", f"http://127.0.0.1:{cluster['dash']}",
           *([] if wait else ["--no-wait"]), "--", *entry]
    deadline = time.monotonic() + 240
    while True:  # the job agent registers some time after `ray start` returns
        p = subprocess.run(cmd, env=cluster["env"], capture_output=True, text=True, timeout=600)
        out = p.stdout + p.stderr
        if p.returncode == 0 or "raysubmit_" in out or time.monotonic() > deadline:
            return p.returncode, out
        time.sleep(3)


def _catalog(run):
    con = catalog.connect(run)
    rows = con.sql("SELECT * FROM samples ORDER BY sample_id").to_arrow_table()
    shards = sorted(tuple(r) for r in con.execute("SELECT key, sample_id, sha256 FROM shards").fetchall())
    return rows, shards


def _local_leftovers(since: float, roots) -> list[str]:
    """Files of a run (a listing, Parquet parts, shards, stats markers) written since `since` under the
    given local folders."""
    out = []
    for root in roots:
        for dirpath, _, files in os.walk(root):
            if "/.git" in dirpath or "__pycache__" in dirpath:
                continue
            for f in files:
                p = os.path.join(dirpath, f)
                run_file = f == "units.jsonl" or f.endswith((".parquet", ".tar")) or (
                    f.endswith(".json") and os.path.basename(dirpath) == "stats")
                try:
                    if run_file and os.path.getmtime(p) >= since:
                        out.append(p)
                except OSError:
                    pass
    return out


def test_curate_on_three_nodes_from_s3_into_s3_survives_a_killed_raylet(cluster, s3_crawl, s3_server):
    store, n_samples, n_shards = s3_crawl
    inp = store.uri_of("crawl") + "/"
    clean_run, killed_run = store.uri_of("runs-clean"), store.uri_of("runs-killed")
    t0 = time.time()

    rc, out = _submit(cluster, "--input", inp, "--output", clean_run)
    assert rc == 0 and "succeeded" in out, out[-4000:]
    r = st.open_storage(clean_run)
    markers = [r.read_json(e.path) for e in r.list("stats", suffix=".json")]
    assert len(markers) == n_shards
    nodes = {m["node_id"] for m in markers}
    assert None not in nodes and len(nodes) >= 2, nodes  # the units spread over the nodes
    rows, shards = _catalog(clean_run)
    assert rows.num_rows == n_samples and len(set(rows.column("sample_id").to_pylist())) == n_samples
    assert {e.path for e in r.list("shards")} and not r.exists(".lock")
    assert _local_leftovers(t0, [ROOT, cluster["temp"]]) == []  # the repo, and Ray's folders on every node
    assert s3_server.secret_key not in out

    # the same run again, killed: one worker node's raylet is killed by pid once units are being measured
    rc, out = _submit(cluster, "--input", inp, "--output", killed_run, wait=False)
    assert rc == 0, out[-3000:]
    job = re.search(r"raysubmit_\w+", out)[0]
    k = st.open_storage(killed_run)
    deadline = time.monotonic() + 240
    while not any(True for _ in k.list("work/measure")):
        assert time.monotonic() < deadline, "the killed run never started measuring"
        time.sleep(0.2)
    victim = _raylet_pid(cluster["workers"][0]["node-manager-port"])
    assert victim is not None
    os.kill(victim, signal.SIGKILL)  # the node dies with the units it was running
    # a second curate while the first holds the lock: refused at once with the local message
    t1 = time.monotonic()
    env = dict(cluster["env"], PYTHONPATH=cluster["env"]["PYTHONPATH"])
    p = subprocess.run([sys.executable, str(ROOT / "pipeline" / "curate.py"), "--input", inp, "--output", killed_run,
                        "--no-progress", "--set", "stages=[decode,size,dedup]", "--set", "ray.num_cpus=1"], env=env,
                       capture_output=True, text=True, timeout=120)
    second = time.monotonic() - t1
    assert p.returncode == 2 and "another run is using this directory" in p.stderr, p.stderr[-2000:]
    assert second < 60 and "Traceback" not in p.stderr

    status = ""
    while time.monotonic() < deadline + 300:
        s = subprocess.run([cluster["ray"], "job", "status", "--address", f"http://127.0.0.1:{cluster['dash']}", job],
                           env=cluster["env"], capture_output=True, text=True, timeout=120)
        status = s.stdout + s.stderr
        if re.search(r"(succeeded|failed|was stopped)", status):
            break
        time.sleep(2)
    logs = subprocess.run([cluster["ray"], "job", "logs", "--address", f"http://127.0.0.1:{cluster['dash']}", job],
                          env=cluster["env"], capture_output=True, text=True, timeout=120)
    assert "succeeded" in status, status[-1000:] + (logs.stdout + logs.stderr)[-4000:]
    rows_k, shards_k = _catalog(killed_run)
    assert rows_k.equals(rows) and shards_k == shards
    assert not k.exists(".lock") and sum(1 for _ in k.list("stats")) == n_shards
