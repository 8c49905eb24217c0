"""catalog/storage/__init__.py against a real S3 server (SeaweedFS on 127.0.0.1): pagination, credentials
kept out of every message, DuckDB on remote Parquet."""
import gc
import logging
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest

from catalog import storage as st
from s3server import CountingProxy


@pytest.fixture
def counting(s3_server, monkeypatch):
    """Stores opened in the test talk through a relay that counts the ListObjectsV2 requests."""
    proxy = CountingProxy(s3_server.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    yield proxy
    proxy.close()


def _put_many(store, names):
    with ThreadPoolExecutor(16) as pool:  # one obstore client, shared by the threads
        list(pool.map(lambda name: store.write_bytes(name, b"t"), names))


def test_listing_more_than_a_thousand_keys_pages_and_streams(s3_server, counting):
    store = st.open_storage(s3_server.prefix("many"))
    n = 1_234
    _put_many(store, [f"shards/{i:05d}.tar" for i in range(n)])
    counting.lists = 0
    it = store.list("shards", suffix=".tar")
    first = next(it)
    assert first.path == "shards/00000.tar" and counting.lists == 1  # the first key came from the first page
    rest = sum(1 for _ in it)  # counted, never held: one page of <= 1,000 keys in memory at a time
    assert rest + 1 == n
    assert counting.lists == 2  # SeaweedFS pages ListObjectsV2 at 1,000 keys (IsTruncated + continuation)
    names = [e.path for e in st.open_storage(store.uri).list("shards")]
    assert names == sorted(names) and len(set(names)) == n  # key order, no repeats
    assert sum(1 for _ in store.glob("shards/000*.tar")) == 100
    assert [e.path for e in store.list("shards/0000")] == []  # a folder, not a part of a name
    assert [p for p in store.glob("shards/0000?.tar")] == [f"shards/0000{i}.tar" for i in range(10)]


def test_an_upload_that_fails_leaves_nothing_and_a_big_one_round_trips(s3_server):
    import os
    store = st.open_storage(s3_server.prefix("up"))
    blob = os.urandom(3 * (8 << 20) + 12345)  # four parts of a streamed multipart upload
    with pytest.raises(RuntimeError):
        with store.open_output("big.bin") as f:
            f.write(blob)
            raise RuntimeError("the writer failed after 24 MiB")
    assert not store.exists("big.bin") and list(store.list()) == []
    with store.open_output("big.bin") as f:
        for i in range(0, len(blob), 4096):  # small writes, as the shard writer makes them
            f.write(blob[i:i + 4096])
        assert f.tell() == len(blob)
    assert store.size("big.bin") == len(blob) and store.read_bytes("big.bin") == blob
    assert store.read_range("big.bin", 9 << 20, 100) == blob[9 << 20:(9 << 20) + 100]
    with store.open_input("big.bin") as f:  # pyarrow's file system reads what obstore wrote
        assert f.read_at(10, len(blob) - 10) == blob[-10:]


def test_a_bad_credential_never_shows_in_an_error_or_a_log(s3_server, monkeypatch, caplog, capsys):
    wrong = "wrong-" + s3_server.secret_key[::-1]
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    caplog.set_level(logging.DEBUG)
    store = st.open_storage(s3_server.prefix("creds"))
    failures = []
    for attempt in (lambda: store.write_bytes("x.bin", b"data"), lambda: store.read_bytes("x.bin"),
                    lambda: list(store.list()), lambda: store.create_once("lock", b"1"),
                    lambda: store.exists("x.bin")):
        with pytest.raises(Exception) as e:
            attempt()
        failures.append(e.value)
    out = capsys.readouterr()
    seen = "\n".join([str(f) for f in failures] + [repr(f) for f in failures] + [caplog.text, out.out, out.err])
    assert any("SignatureDoesNotMatch" in str(f) or "SIGNATURE" in str(f).upper() for f in failures), seen[:2000]
    for secret in (wrong, s3_server.secret_key):
        assert secret not in seen
    assert all(store.uri in str(f) for f in failures)  # and each message names what failed
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    assert st.open_storage(store.uri).create_once("lock", b"1")  # the right secret works


def test_credentials_from_a_profile_go_through_the_standard_chain(s3_server, tmp_path, monkeypatch):
    """No key in the environment, a ~/.aws profile: boto3's chain (profiles) feeds obstore; the
    environment's keys, when set, come first and no boto3 is involved."""
    (tmp_path / "credentials").write_text(f"[bench]\naws_access_key_id = {s3_server.access_key}\n"
                                          f"aws_secret_access_key = {s3_server.secret_key}\n")
    (tmp_path / "config").write_text("[profile bench]\nregion = us-east-1\n")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "bench")
    store = st.open_storage(s3_server.prefix("profile"))
    assert store.region == "us-east-1"  # from the profile
    store.write_bytes("a.txt", b"from a profile")
    assert store.create_once("lock", b"1") and not store.create_once("lock", b"2")
    assert [e.path for e in store.list()] == ["a.txt", "lock"] and store.read_bytes("a.txt") == b"from a profile"
    monkeypatch.setenv("AWS_PROFILE", "missing")  # a profile that is not there: a clear error, no secret
    with pytest.raises(st.StorageError, match="cannot get credentials from the AWS profile") as e:
        st.open_storage(store.uri).read_bytes("a.txt")
    assert s3_server.secret_key not in str(e.value) + repr(e.value)


def test_scrub_removes_the_environments_secret(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "abcdEFGH1234")
    assert st.scrub("signing with abcdEFGH1234 failed") == "signing with *** failed"


def test_duckdb_reads_remote_parquet_through_the_storage_layer(s3_server):
    store = st.open_storage(s3_server.prefix("duck"))
    for i in range(3):
        store.write_parquet(f"x/part-{i}.parquet", pa.table({"id": list(range(i * 100, i * 100 + 100 + i))}))
    store.write_bytes("x/readme.txt", b"not parquet")
    con = st.duckdb_connect_for(store.uri)
    assert con.sql(f"SELECT count(*), sum(id) FROM read_parquet('{store.uri}/x/*.parquet')").fetchall()[0] == (
        303, sum(range(0, 100)) + sum(range(100, 201)) + sum(range(200, 302)))
    httpfs = con.sql("SELECT loaded FROM duckdb_extensions() WHERE extension_name = 'httpfs'").fetchall()
    assert httpfs in ([], [(False,)])  # no extension, nothing downloaded: the fsspec path did it


def test_a_process_forked_after_duckdb_read_the_store_does_not_hang(s3_server):
    """A DataLoader worker forks after DuckDB read through our fsspec file system: fsspec's fork hook
    clears its instance cache in the child, which would drop the store's client there and hang."""
    def query():  # the store and the connection are gone when it returns, as in a finished report
        store = st.open_storage(s3_server.prefix("fork"))
        store.write_parquet("x/a.parquet", pa.table({"id": [1, 2]}))
        con = st.duckdb_connect_for(store.uri)
        assert con.sql(f"SELECT count(*) FROM read_parquet('{store.uri}/x/*.parquet')").fetchall() == [(2,)]
        con.close()

    query()
    gc.collect()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("a child forked after DuckDB read the store hung at fork (fsspec's instance cache)")


def test_duckdb_on_a_local_run_is_a_plain_connection(tmp_path):
    store = st.open_storage(tmp_path)
    store.write_parquet("c/a.parquet", pa.table({"v": [1, 2, 3]}))
    con = st.duckdb_connect_for(tmp_path)
    assert con.sql(f"SELECT sum(v) FROM read_parquet('{tmp_path}/c/*.parquet')").fetchall()[0] == (6,)


_HOLDER = """
import sys, time
from catalog.storage import open_storage
with open_storage(sys.argv[1]).run_lock(lease_s=1, heartbeat_s=0.25):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_run_killed_with_the_lock_leaves_it_stale_and_force_takes_it(s3_server, capsys):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from catalog.io import RunLocked
    uri = s3_server.prefix("crash")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, uri], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout.readline().strip() == b"held"
        time.sleep(1.5)  # past the lease: the other process's heartbeat keeps the lock fresh
        with pytest.raises(RunLocked, match="another run is using this directory") as e:
            with st.open_storage(uri).run_lock(lease_s=1, force=True):
                pass
        assert "--force-unlock" not in str(e.value)
    finally:
        proc.send_signal(signal.SIGKILL)  # a crash: nothing releases the lock
        proc.wait()
    store = st.open_storage(uri)
    assert store.exists(".lock")
    time.sleep(2.3)
    with pytest.raises(RunLocked, match="pass --force-unlock"):
        with store.run_lock(lease_s=1):
            pass
    with store.run_lock(lease_s=1, force=True) as held:
        assert store.read_json(".lock")["owner"] == held.owner
    assert "TAKING OVER a stale run lock" in capsys.readouterr().err
    assert not store.exists(".lock")


def test_the_test_server_listens_on_loopback_only(s3_server):
    import psutil
    listening = [c for c in psutil.Process(s3_server.pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert len(listening) >= 5  # S3, master, volume, filer, admin (HTTP and gRPC)
    assert {c.laddr.ip for c in listening} == {"127.0.0.1"}, listening
