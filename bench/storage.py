"""Throughput of catalog/storage/__init__.py on one store, against pyarrow and boto3 alone: prints JSON.

    python bench/storage.py --uri s3://bucket/bench --mb 64      # endpoint + credentials from AWS_* variables
    python bench/storage.py --uri /tmp/bench --mb 64

Measures: a whole-object write and read through the storage layer (S3: obstore), a streamed write in
64 KiB pieces (open_output, as the shard writer writes), the same bytes through pyarrow's S3 file system
and boto3 (s3:// only; boto3 if installed), the latency of a 64 KiB ranged read at a random offset
(open_input: pyarrow), and the listing rate of 2,000 keys.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from catalog.storage import open_storage  # noqa: E402


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uri", required=True, help="a folder or URI to write the bench objects under")
    ap.add_argument("--mb", type=int, default=64, help="object size in MiB (default 64)")
    ap.add_argument("--keys", type=int, default=2000, help="keys to list (default 2000)")
    args = ap.parse_args(argv)
    store = open_storage(args.uri)
    data = os.urandom(args.mb << 20)
    out = {"uri": store.uri, "mib": args.mb, "load_avg": os.getloadavg()[0],
           "date_utc": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime())}
    out["storage_write_mib_s"] = args.mb / _timed(lambda: store.write_bytes("bench/big.bin", data))
    got = {}
    out["storage_read_mib_s"] = args.mb / _timed(lambda: got.update(b=store.read_bytes("bench/big.bin")))
    assert got["b"] == data
    rng = random.Random(0)
    lat = []
    with store.open_input("bench/big.bin") as f:
        for _ in range(20):
            off = rng.randrange(0, len(data) - 65536)
            lat.append(_timed(lambda: f.read_at(65536, off)))  # noqa: B023 (called at once)
    out["range_read_64k_ms_median"] = sorted(lat)[len(lat) // 2] * 1000
    def streamed():  # as the shard writer writes: 64 KiB at a time into one open_output
        with store.open_output("bench/streamed.bin") as f:
            for i in range(0, len(data), 65536):
                f.write(data[i:i + 65536])
    out["storage_stream_write_mib_s"] = args.mb / _timed(streamed)
    if store.scheme == "s3":  # the same bytes through the other clients: pyarrow's AWS C++ SDK, boto3
        key = store.fs_path("bench/big-pyarrow.bin")

        def pa_put():
            with store.fs.open_output_stream(key) as f:
                f.write(data)
        out["pyarrow_put_mib_s"] = args.mb / _timed(pa_put)
        out["pyarrow_get_mib_s"] = args.mb / _timed(lambda: store.fs.open_input_file(key).read())
        try:
            import boto3
        except ImportError:
            boto3 = None
        if boto3 is not None:
            client = boto3.session.Session().client("s3", endpoint_url=store._clients.endpoint,
                                                    region_name=store.region)
            key = store._key("bench/big-boto3.bin")
            out["boto3_put_mib_s"] = args.mb / _timed(lambda: client.put_object(Bucket=store.bucket, Key=key, Body=data))
            out["boto3_get_mib_s"] = args.mb / _timed(
                lambda: client.get_object(Bucket=store.bucket, Key=key)["Body"].read())
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: store.write_bytes(f"bench/keys/{i:06d}", b"k"), range(args.keys)))
    n = {}
    dt = _timed(lambda: n.update(k=sum(1 for _ in store.list("bench/keys"))))
    assert n["k"] == args.keys
    out["list_keys_per_s"] = args.keys / dt
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}, indent=2))


if __name__ == "__main__":
    main()
