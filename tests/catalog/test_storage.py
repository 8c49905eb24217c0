"""catalog/storage/__init__.py: one contract, checked on a local folder, memory:// and a real S3 server
(SeaweedFS on 127.0.0.1, tests/s3server.py)."""
import io
import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from catalog import storage as st
from catalog.io import RunLocked, lock_message
from catalog.storage.lock import LockUnsupported

ROOT = Path(__file__).resolve().parents[2]


S3 = pytest.param("s3", marks=pytest.mark.s3)  # the S3 server, asked for by name below: its tier mark here


@pytest.fixture(params=["local", "memory", S3])
def store(request, tmp_path):
    if request.param == "local":
        return st.open_storage(tmp_path / "run")
    if request.param == "memory":
        return st.open_storage(f"memory://t-{os.urandom(4).hex()}/run")
    return st.open_storage(request.getfixturevalue("s3_server").prefix("run"))


@pytest.fixture(params=["memory", S3])
def object_store(request):
    """The stores without flock, where the lock is an object (local run locks die with their process)."""
    if request.param == "memory":
        return st.open_storage(f"memory://t-{os.urandom(4).hex()}/run")
    return st.open_storage(request.getfixturevalue("s3_server").prefix("run"))


def _tar(n_members=6, size=256_000, seed=0) -> bytes:
    rng = random.Random(seed)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(n_members):
            data = rng.randbytes(size)
            info = tarfile.TarInfo(f"s{i:03d}.jpg")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_stream_reads_a_file_front_to_back_a_buffer_a_request(store):
    lines = [f"{i:06d} {'x' * (i % 97)}\n".encode() for i in range(20_000)]
    store.write_bytes("units.jsonl", b"".join(lines))
    with store.open_stream("units.jsonl", 64 << 10) as fh:
        got = []
        while line := fh.readline():
            got.append(line)
    assert got == lines
    with store.open_stream("units.jsonl") as fh:
        assert fh.read(7) == lines[0][:7] and fh.read() == b"".join(lines)[7:]
    with pytest.raises(FileNotFoundError, match="no such file"):
        store.open_stream("missing.jsonl").read()
    # a name ending in .gz holds the bytes as given: pyarrow's compression='detect' is never applied
    blob = b"bytes that are not gzip, under a .gz name\n" * 50
    store.write_bytes("raw/x.gz", blob)
    with store.open_output("raw/y.tar.gz") as f:
        f.write(blob)
    for name in ("raw/x.gz", "raw/y.tar.gz"):
        assert store.read_bytes(name) == blob and store.size(name) == len(blob)
        with store.open_stream(name) as fh:
            assert fh.read() == blob
        with st.open_input(store.uri_of(name), buffer_size=1 << 16) as fh:
            assert fh.read() == blob


def test_a_tar_round_trips_bit_for_bit_and_ranged_reads_hit_its_members(store):
    data = _tar()
    assert len(data) > 1_500_000
    store.write_bytes("shards/b-00000.tar", data)
    with store.open_output("shards/b-00001.tar") as f:  # the streaming writer, in pieces
        for i in range(0, len(data), 100_000):
            f.write(data[i:i + 100_000])
    for name in ("shards/b-00000.tar", "shards/b-00001.tar"):
        assert store.read_bytes(name) == data
        assert store.size(name) == len(data)
    members = tarfile.open(fileobj=io.BytesIO(data)).getmembers()
    with store.open_input("shards/b-00001.tar") as f:  # random access: tarfile reads it as a file
        assert [m.name for m in tarfile.open(fileobj=f).getmembers()] == [m.name for m in members]
    for m in reversed(members):  # the second read of phase 3: ranged reads at measured offsets
        got = store.read_range("shards/b-00000.tar", m.offset_data, m.size)
        assert got == data[m.offset_data:m.offset_data + m.size]
    assert store.read_range("shards/b-00000.tar", len(data) - 7, 7) == data[-7:]


def test_json_and_parquet_and_existence(store):
    store.write_json("units/00001.json", {"unit": 1, "ok": True})
    assert store.read_json("units/00001.json") == {"unit": 1, "ok": True}
    t = pa.table({"id": list(range(100)), "name": [f"n{i}" for i in range(100)]})
    store.write_parquet("catalog/part-0.parquet", t)
    with store.open_input("catalog/part-0.parquet") as f:
        assert pq.read_table(f).equals(t)
    assert store.exists("units/00001.json") and not store.exists("units/00002.json")
    with pytest.raises(FileNotFoundError, match="00002.json"):
        store.read_bytes("units/00002.json")
    store.delete("units/00001.json")
    assert not store.exists("units/00001.json")


def test_a_failed_writer_leaves_nothing_under_the_final_name(store):
    with pytest.raises(RuntimeError):
        with store.open_output("shards/b-00009.tar") as f:
            f.write(b"x" * 300_000)
            raise RuntimeError("the writer died half way")
    assert not store.exists("shards/b-00009.tar")
    assert [e.path for e in store.list()] == []  # nor a temporary file that a listing would show


def test_listing_a_prefix_streams_and_filters(store):
    names = [f"crawl/{i:05d}.tar" for i in range(30)] + ["crawl/notes.txt", "crawl/sub/00001.tar", "other/x.tar"]
    for n in names:
        store.write_bytes(n, n.encode())
    got = {e.path: e.size for e in store.list("crawl", suffix=".tar")}
    assert set(got) == {n for n in names if n.startswith("crawl/") and n.endswith(".tar")}
    assert got["crawl/00007.tar"] == len(b"crawl/00007.tar")
    assert {e.path for e in store.list()} == set(names)
    assert list(store.list("nothing-here")) == []
    it = store.list("crawl")
    assert next(it).path.startswith("crawl/")  # an iterator, not a list


def test_brace_ranges_and_globs_as_webdataset_users_write_them(store):
    for n in [f"crawl/{i:05d}.tar" for i in range(12)] + ["crawl/notes.txt", "crawl/sub/00001.tar"]:
        store.write_bytes(n, b"t")
    base = store.uri
    assert list(st.expand(f"{base}/crawl/{{00000..00003}}.tar")) == [f"{base}/crawl/{i:05d}.tar" for i in range(4)]
    assert sorted(st.expand(f"{base}/crawl/*.tar")) == [f"{base}/crawl/{i:05d}.tar" for i in range(12)]
    assert len(list(store.glob("crawl/**/*.tar"))) == 13
    assert sorted(st.expand(f"{base}/crawl/sub/")) == [f"{base}/crawl/sub/00001.tar"]  # a prefix: all under it
    assert sorted(store.glob("crawl/0000[0-2].tar")) == [f"crawl/{i:05d}.tar" for i in range(3)]
    assert sorted(store.glob("crawl/{00001,sub/00001}.tar")) == ["crawl/00001.tar", "crawl/sub/00001.tar"]
    assert sorted(store.glob("crawl/{notes.txt,0001?.tar}")) == ["crawl/00010.tar", "crawl/00011.tar", "crawl/notes.txt"]


def test_create_once_is_a_conditional_create_even_under_a_race(store):
    assert store.create_once("markers/a", b"first")
    assert not store.create_once("markers/a", b"second")
    assert store.read_bytes("markers/a") == b"first"
    assert store.supports_conditional_writes()
    with ThreadPoolExecutor(8) as pool:
        won = list(pool.map(lambda i: store.create_once("markers/race", f"{i}".encode()), range(8)))
    assert won.count(True) == 1
    assert store.read_bytes("markers/race") == str(won.index(True)).encode()


def test_a_second_holder_is_refused_with_the_local_message(store):
    with store.run_lock(lease_s=5, heartbeat_s=0.5):
        with pytest.raises(RunLocked) as e:
            with store.run_lock():
                pass
        lock = store.fs_path(".lock") if store.posix else store.uri_of(".lock")
        assert str(e.value).startswith(lock_message(store.fs_path("") if store.posix else store.uri, lock))
    with store.run_lock():  # released on exit
        pass
    if not store.posix:
        assert not store.exists(".lock")


def test_a_stale_lock_is_taken_over_only_with_force_and_loudly(object_store, capsys):
    store = object_store
    dead = json.dumps({"owner": "node-7:4242:deadbeef", "lease_s": 1}).encode()
    assert store.create_once(".lock", dead)  # what a crashed run leaves behind
    with pytest.raises(RunLocked, match="another run is using this directory"):
        with store.run_lock(lease_s=1, force=True):  # not stale yet: force does not help
            pass
    time.sleep(2.3)  # S3 times are whole seconds
    with pytest.raises(RunLocked, match="pass --force-unlock"):
        with store.run_lock(lease_s=1):
            pass
    with store.run_lock(lease_s=1, heartbeat_s=0.25, force=True) as held:
        assert "TAKING OVER a stale run lock" in capsys.readouterr().err
        assert store.read_json(".lock")["owner"] == held.owner
        time.sleep(1.6)  # longer than the lease: only the heartbeat keeps it fresh
        with pytest.raises(RunLocked, match="another run is using this directory"):
            with store.run_lock(lease_s=1, force=True):
                pass
        held.check()
    assert not store.exists(".lock")


def test_a_store_without_conditional_writes_refuses_the_lock_unless_forced(tmp_path, capsys):
    # the base Storage over pyarrow's local file system: how gs:// and hdfs:// behave here
    bare = st.Storage(f"file://{tmp_path}", pafs.LocalFileSystem(), str(tmp_path))
    assert not bare.supports_conditional_writes()
    with pytest.raises(LockUnsupported, match="does not honour create-only writes"):
        with bare.run_lock():
            pass
    with bare.run_lock(force=True):
        assert "WITHOUT a working run lock" in capsys.readouterr().err
    assert not (tmp_path / ".lock").exists()


def test_paths_stay_under_the_root_and_uris_carry_no_credentials(tmp_path):
    s = st.open_storage(tmp_path)
    for bad in ("../escape", "/etc/passwd", "a/../../b"):
        with pytest.raises(ValueError, match="relative to its root"):
            s.write_bytes(bad, b"x")
    with pytest.raises(ValueError) as e:
        st.open_storage("s3://AKIAEXAMPLE:wJalrXUtnFEMIK7MDENG@bucket/x")
    assert "wJalrXUtnFEMIK7MDENG" not in str(e.value) and "AKIAEXAMPLE" not in str(e.value)
    with pytest.raises(ValueError, match="unsupported storage scheme"):
        st.open_storage("ftp://host/x")
    assert st.open_storage(f"file://{tmp_path}").child("a/b").fs_path("c") == f"{tmp_path}/a/b/c"


_KILLED_WRITER = """
import sys, time
from catalog.storage import open_storage
with open_storage(sys.argv[1]).open_output("shards/b-00000.tar") as f:
    f.write(b"y" * 2_000_000); f.flush()
    print("written", flush=True)
    time.sleep(60)
"""


def test_a_writer_killed_mid_write_leaves_no_partial_local_file(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(tmp_path)], stdout=subprocess.PIPE, env=env)
    assert proc.stdout.readline().strip() == b"written"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    s = st.open_storage(tmp_path)
    assert not s.exists("shards/b-00000.tar")
    assert list(s.list()) == []  # the temporary file is not listed ...
    from catalog.io import clean_tmp
    assert clean_tmp(tmp_path, ["shards"]) == 1  # ... and resume's cleaner finds it


def test_braceexpand_is_lazy_and_pads_like_the_range_start():
    from catalog.storage.globs import braceexpand
    it = braceexpand("s3://b/crawl/{0000000000..9999999999}.tar")
    assert next(it) == "s3://b/crawl/0000000000.tar" and next(it) == "s3://b/crawl/0000000001.tar"
    assert list(braceexpand("x{8..11}")) == ["x8", "x9", "x10", "x11"]
    assert list(braceexpand("{a,b{1..2}}-{3..1}")) == ["a-3", "a-2", "a-1", "b1-3", "b1-2", "b1-1", "b2-3", "b2-2", "b2-1"]
    assert list(braceexpand("{00..10..5}")) == ["00", "05", "10"]
    assert list(braceexpand("{x}")) == ["{x}"]
    with pytest.raises(ValueError, match="unbalanced"):
        list(braceexpand("crawl/{000..999.tar"))


def test_a_storage_pickles_as_its_uri_for_ray_tasks(store):
    import pickle
    store.write_bytes("a/x.bin", b"payload")
    blob = pickle.dumps(store.child("a"))
    assert b"payload" not in blob
    secret = os.environ.get("AWS_SECRET_ACCESS_KEY")  # set while the S3 server runs
    assert not secret or secret.encode() not in blob
    fs_blob = pickle.dumps(store.fs)  # what Ray Data pickles with `filesystem=store.fs`
    assert not secret or secret.encode() not in fs_blob
    again = pickle.loads(blob)
    assert type(again) is type(store) and again.uri == store.uri_of("a") and again.read_bytes("x.bin") == b"payload"


def test_a_file_uri_store_and_a_bad_uri_round_trip_as_open_storage_does(tmp_path):
    import pickle
    store = st.open_storage(f"file://{tmp_path}/run")
    store.write_bytes("x.bin", b"payload")
    again = pickle.loads(pickle.dumps(store))
    assert type(again) is st.LocalStorage and again.uri == store.uri and again.read_bytes("x.bin") == b"payload"
    for bad, match in [("s3://KEY:SECRET@bucket/x", "credentials in a URI"), ("s3:///x", "names a bucket"),
                       ("ftp://host/x", "unsupported storage scheme"), ("file://host/x", "file:// URIs name")]:
        with pytest.raises(ValueError, match=match) as err:
            st.open_storage(bad)
        assert "SECRET" not in str(err.value)


def test_threads_share_one_storage(store):
    errors = []

    def work(i):
        try:
            store.write_bytes(f"t/{i}.bin", bytes([i]) * 1000)
            assert store.read_bytes(f"t/{i}.bin") == bytes([i]) * 1000
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(list(store.list("t"))) == 8


def test_compare_and_swap_and_conditional_delete(object_store):
    store = object_store
    assert store.create_once("lk", b"v1")
    tag, age = store._stat("lk")
    assert 0 <= age < 30
    assert store._replace_if("lk", b"v2", "\"0123456789abcdef0123456789abcdef\"") is None  # a wrong tag
    assert store.read_bytes("lk") == b"v1"
    new = store._replace_if("lk", b"v2", tag)
    assert new and new != tag and store.read_bytes("lk") == b"v2"
    assert not store._delete_if("lk", tag)  # the old tag no longer deletes it
    assert store.exists("lk")
    assert store._delete_if("lk", new) and not store.exists("lk")
    assert store._stat("lk") is None
