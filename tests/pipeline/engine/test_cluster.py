"""`ray up` / `ray submit` / `ray job submit` / `ray down` with cluster/local.yaml against sshd on 127.0.0.1.

sshd runs in its own PID namespace, so the `ray stop` that `ray up` and `ray down` run over ssh
only sees this cluster's processes, never another Ray on the machine.
"""
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import catalog
from s3server import free_ports  # tests/s3server.py (tests/ is on sys.path: tests/conftest.py)

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


def _need(tool: str) -> str:
    path = shutil.which(tool) or (f"/usr/sbin/{tool}" if os.path.exists(f"/usr/sbin/{tool}") else None)
    assert path, f"{tool} not found: `make test` installs it from deps/core.apt.txt (openssh-server, rsync)"
    return path


@pytest.fixture
def sshd(tmp_path):
    sshd_bin = _need("sshd")
    _need("rsync")
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", 22)) != 0, "port 22 on 127.0.0.1 is taken; the test needs it for sshd"
    keys = tmp_path / "ssh"
    keys.mkdir()
    for name in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True)
    shutil.copy(keys / "client.pub", keys / "authorized_keys")
    path = f"{BIN}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
    # the cluster runs the code under test: a PYTHONPATH set for the tests travels to its processes
    pythonpath = f" PYTHONPATH={os.environ['PYTHONPATH']}" if os.environ.get("PYTHONPATH") else ""
    cfg = keys / "sshd_config"
    cfg.write_text(f"""Port 22
ListenAddress 127.0.0.1
HostKey {keys / 'host'}
PidFile {keys / 'sshd.pid'}
AuthorizedKeysFile {keys / 'authorized_keys'}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
SetEnv PATH={path} RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0{pythonpath}
""")
    # Ray runs remote commands in `bash --login` after `source ~/.bashrc`, which reset PATH: inside
    # sshd's own mount namespace, both gain a line that puts this virtualenv first. Nothing outside
    # the namespace changes.
    export = f'export PATH="{BIN}:$PATH" RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0{pythonpath}\n'
    profile_d = keys / "profile.d"
    shutil.copytree("/etc/profile.d", profile_d) if os.path.isdir("/etc/profile.d") else profile_d.mkdir()
    (profile_d / "zz-humanset-test.sh").write_text(export)
    bashrc = head_home_dir() / ".bashrc"
    (keys / "bashrc").write_text((bashrc.read_text() if bashrc.exists() else "") + "\n" + export)
    script = (f"mount --bind {profile_d} /etc/profile.d && "
              f"{{ [ ! -f {bashrc} ] || mount --bind {keys / 'bashrc'} {bashrc}; }} && "
              f"exec {sshd_bin} -D -e -f {cfg}")
    Path("/run/sshd").mkdir(exist_ok=True)
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script],
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", 22)) == 0:
                break
        time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail(f"sshd did not start: {proc.stderr.read()}")
    yield keys / "client"
    os.killpg(proc.pid, 9)
    proc.wait()


def head_home_dir() -> Path:
    """The home of cluster/local.yaml's ssh user on the head (loopback: this machine), from passwd, which is
    where sshd logs it in whatever $HOME says."""
    user = yaml.safe_load((ROOT / "cluster" / "local.yaml").read_text())["auth"]["ssh_user"]
    return Path(pwd.getpwnam(user).pw_dir)


@pytest.fixture
def head_home():
    """The files `ray up` and `ray submit` leave in the head's home, which on loopback is a user's of this
    machine: each is put back as it was (a file with its bytes and mode, a link as the link) or removed after
    the test, pass or fail, so a developer's own cluster files survive. Anything else there is left alone."""
    before = {}
    for name in ("ray_bootstrap_config.yaml", "ray_bootstrap_key.pem", "curate.py"):
        path = head_home_dir() / name
        if path.is_symlink():
            before[path] = ("link", os.readlink(path))
        elif path.is_file():
            before[path] = ("file", path.read_bytes(), path.stat().st_mode & 0o7777)
        else:
            before[path] = None if not path.exists() else ("other",)
    yield
    failed = []
    for path, was in before.items():
        try:
            if was and was[0] == "other":
                continue
            if path.is_symlink() or path.is_file():
                path.unlink()
            if was and was[0] == "link":
                path.symlink_to(was[1])
            elif was:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, was[2])
                with os.fdopen(fd, "wb") as f:
                    f.write(was[1])
                path.chmod(was[2])
        except OSError as e:
            failed.append(f"{path}: {e}")
    assert not failed, f"could not put back the head's files as they were: {failed}"


def _submit_job(ray: str, env: dict, dash: int, entrypoint: list[str], deadline_s: float = 420) -> str:
    """`ray job submit --no-wait`, retried until the head's job agent answers (it registers some
    time after `ray up` returns; on a cold machine that can take minutes), then poll the job."""
    address = ["--address", f"http://127.0.0.1:{dash}"]
    deadline = time.monotonic() + deadline_s
    while True:
        p = subprocess.run([ray, "job", "submit", *address, "--no-wait", "--", *entrypoint], env=env,
                           capture_output=True, text=True, timeout=120)
        out = p.stdout + p.stderr
        if p.returncode == 0:
            break
        assert time.monotonic() < deadline, f"the job API did not accept the job within {deadline_s} s:\n{out[-3000:]}"
        time.sleep(3)
    job_id = next(w.strip("'\"") for line in out.splitlines() if "raysubmit_" in line
                  for w in line.split() if "raysubmit_" in w)
    finished = re.compile(re.escape(job_id) + r"' (succeeded|failed|was stopped)")
    while True:
        p = subprocess.run([ray, "job", "status", *address, job_id], env=env, capture_output=True, text=True,
                           timeout=120)
        status = p.stdout + p.stderr
        done = finished.search(status)
        if done:
            break
        assert time.monotonic() < deadline + 600, f"job {job_id} did not finish:\n{status[-2000:]}"
        time.sleep(2)
    logs = subprocess.run([ray, "job", "logs", *address, job_id], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done[1] == "succeeded", f"job {job_id}: {status[-1000:]}\n{(logs.stdout + logs.stderr)[-4000:]}"
    return logs.stdout + logs.stderr


def test_ray_up_submit_job_submit_down_on_loopback(sshd, head_home, tmp_path, demo_crawl):
    config = yaml.safe_load((ROOT / "cluster" / "local.yaml").read_text())
    assert config["provider"]["head_ip"] == "127.0.0.1"
    # distinct: ports drawn one at a time, each released before the next, can repeat (CI drew the
    # same port for the GCS and the dashboard once, and `ray start` refused it)
    port, dash, agent, agent_grpc, metrics, runtime_env = free_ports(6)
    config["auth"]["ssh_private_key"] = str(sshd)
    config["cluster_name"] = f"humanset-test-{port}"
    # free ports, and the dashboard (the job server of `ray job submit`) on loopback
    config["head_start_ray_commands"] = [
        c.replace("--port=6379", f"--port={port}").replace(
            "--include-dashboard=false", f"--include-dashboard=true --dashboard-host=127.0.0.1 --dashboard-port={dash}"
            # the node's agents on free ports too: the session's Ray (conftest) already holds the
            # default agent port 52365, and a second agent there never registers ("No available agent")
            f" --dashboard-agent-listen-port={agent} --dashboard-agent-grpc-port={agent_grpc}"
            f" --metrics-export-port={metrics} --runtime-env-agent-port={runtime_env}")
        for c in config["head_start_ray_commands"]]
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(config))
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    ray = str(BIN / "ray")
    run, job_run = tmp_path / "run", tmp_path / "job-run"
    cheap = ["--set", "stages=[decode,size,dedup]"]  # the models are tested elsewhere; this is about the cluster

    def sh(*args, timeout=600):
        p = subprocess.run([ray, *args], env=env, capture_output=True, text=True, timeout=timeout)
        assert p.returncode == 0, f"ray {args[0]} failed:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
        return p.stdout + p.stderr

    sh("up", "-y", "--no-config-cache", str(cluster))
    try:
        out = sh("submit", str(cluster), str(ROOT / "pipeline" / "curate.py"), "--",
                 "--input", str(demo_crawl[0]), "--output", str(run), "--no-progress", *cheap)
        assert "funnel" in out
        out = _submit_job(ray, {**env, "RAY_AUTH_MODE": "token"}, dash,  # the head's token, saved in ~/.ray
                          ["python", str(ROOT / "pipeline" / "curate.py"), "--input", str(demo_crawl[0]),
                           "--output", str(job_run), "--no-progress", *cheap])
        assert "funnel" in out
    finally:
        sh("down", "-y", str(cluster))
    for r in (run, job_run):
        manifest = catalog.read_json(r / "manifest.json")
        assert manifest["status"] == "complete" and manifest["counts"]["inputs"] == len(demo_crawl[1])
        con = catalog.connect(r)
        assert con.execute("SELECT count(DISTINCT sample_id) FROM samples").fetchone()[0] == len(demo_crawl[1])
