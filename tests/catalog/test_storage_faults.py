"""The storage layer against a store that throttles, cuts bodies, resets connections and loses
acknowledgements (tests/faultstore.py in front of the SeaweedFS fixture): every operation returns
what it returns against a clean store, a cut read resumes from the byte reached, a lost answer
never fools a conditional write or the lock's probe, and a permanent refusal is one line, sent once."""
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from catalog import storage as st
from catalog.storage import retry
from catalog.storage.answers import StoreRefused
from faultstore import through


@pytest.fixture
def quick_retries():
    """Short waits: the tests meet many faults in a row."""
    retry.configure({"retry_first_wait_s": 0.01, "retry_max_wait_s": 0.1})
    yield
    retry.configure(None)


def test_every_operation_under_heavy_faults_returns_what_a_clean_store_returns(s3_server, quick_retries):
    rng = random.Random(7)
    blobs = {f"d/{i:02d}.bin": rng.randbytes(rng.randrange(1, 2 << 20)) for i in range(12)}
    table = pa.table({"x": list(range(50_000)), "s": [str(i) for i in range(50_000)]})
    big = rng.randbytes(20 << 20)
    before = retry.snapshot()
    with through(s3_server.endpoint, seed=7, slowdown=0.2, cut=0.2, reset=0.1, lost_ack=0.2) as fs:
        store = st.open_storage(s3_server.prefix("faults"))
        for k, v in blobs.items():
            store.write_bytes(k, v)
        with store.open_output("big.bin") as f:  # a streamed multipart upload (obstore retries its parts)
            for i in range(0, len(big), 1 << 20):
                f.write(big[i:i + (1 << 20)])
        store.write_parquet("t.parquet", table)
        for k, v in blobs.items():
            off, n = rng.randrange(len(v)), rng.randrange(1, 200_000)
            assert store.read_bytes(k) == v
            assert store.read_range(k, off, n) == v[off:off + n]
            with store.open_input(k) as f:
                assert f.read_at(n, off) == v[off:off + n] and f.size() == len(v)
            with store.open_stream(k, 64 << 10) as f:
                assert f.read() == v
        assert store.read_bytes("big.bin") == big
        assert pq.read_table(store.fs_path("t.parquet"), filesystem=store.fs).equals(table)  # pyarrow's reads
        assert sorted(e.path for e in store.list("d")) == sorted(blobs)
        for i in range(8):
            assert store.create_once(f"c/{i}", b"first") and not store.create_once(f"c/{i}", b"second")
        for k in blobs:
            store.delete(k)
        assert list(store.list("d")) == [] and store.read_bytes("c/0") == b"first"
    got = retry.since(before)
    assert fs.counts["slowdown"] and fs.counts["cut"] and fs.counts["reset"] and fs.counts["lost_ack"]
    assert got["retries"] >= fs.counts["slowdown"] and got["throttled"] and got["resumed_reads"], got
    assert got["gave_up"] == 0


def test_a_cut_read_resumes_from_the_byte_reached(s3_server, quick_retries):
    store = st.open_storage(s3_server.prefix("cut"))
    data = random.Random(1).randbytes(8 << 20)
    store.write_bytes("shard.tar", data)
    with through(s3_server.endpoint, seed=1) as fs:
        store = st.open_storage(store.uri)
        fs.log = []
        fs.once("GET", "/shard.tar", "cut")
        before = retry.snapshot()
        with store.open_stream("shard.tar", 1 << 20) as f:
            assert f.read() == data
        gets = [p for m, p, _ in fs.log if m == "GET"]
    assert len(gets) == 2 and retry.since(before)["resumed_reads"] == 1  # one more GET, from the byte reached


def test_a_lost_answer_never_fools_the_lock_its_probe_or_its_release(s3_server, quick_retries):
    """The issue's failures: the lock's create applied but answered 500 (the retry met its own
    object and the probe called the store broken), and a 503 on the lock's release at the end."""
    prefix = s3_server.prefix("lock")
    with through(s3_server.endpoint, seed=2) as fs:
        store = st.open_storage(prefix)
        fs.once("PUT", "/.probe-", "lost_ack")  # the probe's first create: applied, answer lost
        fs.once("PUT", "/.lock", "lost_ack")  # the lock's create: applied, answer lost
        fs.once("DELETE", "/.lock", "slowdown")  # its release: 503 SlowDown, then lost
        fs.once("DELETE", "/.lock", "lost_ack")
        with store.run_lock(lease_s=30) as held:
            assert held.owner and store.exists(".lock")
        assert not store.exists(".lock")
        assert not fs._script  # every aimed fault was met
        other = st.open_storage(prefix)
        fs.once("PUT", "/taken", "lost_ack")
        assert other.create_once("taken", b"mine")  # our create, its answer lost: still ours
        fs.once("PUT", "/taken", "lost_ack")
        assert not other.create_once("taken", b"theirs")  # a refusal whose answer was lost: still refused
        assert other.read_bytes("taken") == b"mine"
        assert [e.path for e in other.list()] == ["taken"]  # no probe object, no lock left


def test_a_multipart_upload_whose_completion_answer_is_lost_is_checked_not_redone(s3_server, quick_retries):
    data = random.Random(3).randbytes(20 << 20)
    with through(s3_server.endpoint, seed=3) as fs:
        store = st.open_storage(s3_server.prefix("mpu"))
        fs.once("POST", "uploadId=", "lost_ack", times=3)  # CompleteMultipartUpload, answered 500 thrice
        with store.open_output("big.tar") as f:
            for i in range(0, len(data), 1 << 20):
                f.write(data[i:i + (1 << 20)])
    assert st.open_storage(store.uri).read_bytes("big.tar") == data


def test_a_wrong_secret_or_a_missing_bucket_is_one_line_and_one_request(s3_server, monkeypatch):
    with through(s3_server.endpoint, seed=4) as fs:
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-" + s3_server.secret_key[::-1])
        store = st.open_storage(s3_server.prefix("denied"))
        t0 = time.monotonic()
        with pytest.raises(StoreRefused) as e:
            store.write_bytes("x.bin", b"data")
        assert fs.counts["requests"] == 1 and time.monotonic() - t0 < 5  # no retry loop
        line = str(e.value)
        assert "\n" not in line and line.startswith(store.uri_of("x.bin") + ": ")
        assert "SignatureDoesNotMatch" in line and "AWS_SECRET_ACCESS_KEY" in line
        assert s3_server.secret_key not in line and os.environ["AWS_SECRET_ACCESS_KEY"] not in line
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
        missing = st.open_storage(f"s3://no-such-bucket-{os.urandom(3).hex()}/runs/r1")
        n = fs.counts["requests"]
        with pytest.raises(StoreRefused, match=r"no such bucket \(NoSuchBucket\); create s3://no-such-bucket-"):
            list(missing.list())  # (SeaweedFS makes a bucket a PUT names; S3 answers NoSuchBucket to both)
        assert fs.counts["requests"] == n + 1


def test_sustained_throttling_lowers_the_requests_in_flight_and_they_recover(s3_server):
    retry.configure({"retry_first_wait_s": 0.01, "retry_max_wait_s": 0.1, "retry_max_in_flight": 8})
    try:
        data = b"x" * 100_000
        gate = retry.limiter()
        lowest = [gate.limit]
        with through(s3_server.endpoint, seed=6, slowdown=0.5) as fs:
            src = st.open_storage(s3_server.prefix("busy"))  # its client talks to the proxy
            src.write_bytes("a.bin", data)

            def reads(_):
                for _ in range(10):
                    assert src.read_bytes("a.bin") == data
                    lowest[0] = min(lowest[0], gate.limit)
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(reads, range(8)))
            assert fs.counts["slowdown"] > 20 and lowest[0] <= 2  # halved again and again, not failed
            fs.set(slowdown=0.0)
            for _ in range(80):  # the store recovered: so does the limit, by 1/limit a success
                src.read_bytes("a.bin")
        assert gate.limit == 8
    finally:
        retry.configure(None)


def test_a_retry_after_answer_is_waited_out(s3_server, quick_retries):
    """The requests whose answer's headers reach humanset (the lock's signed HEAD and DELETE) wait at
    least what Retry-After asks (obstore does not pass the header on: its requests back off as usual)."""
    with through(s3_server.endpoint, seed=8, retry_after=1) as fs:
        store = st.open_storage(s3_server.prefix("after"))
        assert store.create_once("lk", b"1")
        fs.once("HEAD", "/lk", "slowdown")
        t0 = time.monotonic()
        tag, age = store._stat("lk")
        assert time.monotonic() - t0 >= 1.0 and tag and fs.counts["slowdown"] == 1
