"""catalog/storage.py against a real S3 server (SeaweedFS on 127.0.0.1): pagination, credentials
kept out of every message, DuckDB on remote Parquet."""
import logging
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest

from catalog import storage as st


def _count_lists(store):
    calls = []
    store.client.meta.events.register("before-call.s3.ListObjectsV2", lambda **kw: calls.append(1))
    return calls


def test_listing_more_than_a_thousand_keys_pages_and_streams(s3_server):
    store = st.open_storage(s3_server.prefix("many"))
    n = 1_234
    with ThreadPoolExecutor(16) as pool:  # boto3 clients are thread-safe
        list(pool.map(lambda i: store.client.put_object(Bucket=store.bucket, Key=store._key(f"shards/{i:05d}.tar"),
                                                        Body=b"t"), range(n)))
    calls = _count_lists(store)
    it = store.list("shards", suffix=".tar")
    first = next(it)
    assert first.path == "shards/00000.tar" and len(calls) == 1  # the first key came from the first page
    rest = sum(1 for _ in it)  # counted, never held: one page of <= 1,000 keys in memory at a time
    assert rest + 1 == n
    assert len(calls) == 2  # SeaweedFS pages ListObjectsV2 at 1,000 keys (IsTruncated + continuation)

    small = st.open_storage(store.uri)
    small.page_size = 100
    calls = _count_lists(small)
    names = [e.path for e in small.list("shards")]
    assert len(calls) == 13 and names == sorted(names) and len(set(names)) == n  # key order, no repeats
    assert sum(1 for _ in small.glob("shards/000*.tar")) == 100


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


def test_duckdb_on_a_local_run_is_a_plain_connection(tmp_path):
    store = st.open_storage(tmp_path)
    store.write_parquet("c/a.parquet", pa.table({"v": [1, 2, 3]}))
    con = st.duckdb_connect_for(tmp_path)
    assert con.sql(f"SELECT sum(v) FROM read_parquet('{tmp_path}/c/*.parquet')").fetchall()[0] == (6,)
