"""`ray up` / `ray submit` / `ray down` with cluster/local.yaml against sshd on 127.0.0.1.

sshd runs in its own PID namespace, so the `ray stop` that `ray up` and `ray down` run over ssh
only sees this cluster's processes, never another Ray on the machine.
"""
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import catalog

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
SetEnv PATH={path} RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
""")
    # Ray runs remote commands in `bash --login` after `source ~/.bashrc`, which reset PATH: inside
    # sshd's own mount namespace, both gain a line that puts this virtualenv first. Nothing outside
    # the namespace changes.
    export = f'export PATH="{BIN}:$PATH" RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0\n'
    profile_d = keys / "profile.d"
    shutil.copytree("/etc/profile.d", profile_d) if os.path.isdir("/etc/profile.d") else profile_d.mkdir()
    (profile_d / "zz-humanset-test.sh").write_text(export)
    bashrc = Path.home() / ".bashrc"
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


@pytest.mark.slow
def test_ray_up_submit_down_on_loopback(sshd, tmp_path, demo_crawl):
    config = yaml.safe_load((ROOT / "cluster" / "local.yaml").read_text())
    assert config["provider"]["head_ip"] == "127.0.0.1"
    port = _free_port()
    config["auth"]["ssh_private_key"] = str(sshd)
    config["cluster_name"] = f"humanset-test-{port}"
    config["head_start_ray_commands"] = [c.replace("--port=6379", f"--port={port}")
                                        for c in config["head_start_ray_commands"]]
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(config))
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    ray = str(BIN / "ray")
    run = tmp_path / "run"

    def sh(*args, timeout=600):
        p = subprocess.run([ray, *args], env=env, capture_output=True, text=True, timeout=timeout)
        assert p.returncode == 0, f"ray {args[0]} failed:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
        return p.stdout + p.stderr

    sh("up", "-y", "--no-config-cache", str(cluster))
    try:
        out = sh("submit", str(cluster), str(ROOT / "pipeline" / "curate.py"), "--",
                 "--input", str(demo_crawl[0]), "--output", str(run), "--no-progress")
        assert "funnel" in out
    finally:
        sh("down", "-y", str(cluster))
    manifest = catalog.read_json(run / "manifest.json")
    assert manifest["status"] == "complete" and manifest["counts"]["inputs"] == len(demo_crawl[1])
    con = catalog.connect(run)
    assert con.execute("SELECT count(DISTINCT sample_id) FROM samples").fetchone()[0] == len(demo_crawl[1])
