"""A run against an object store that throttles, drops connections and loses acknowledgements.

Starts SeaweedFS (`weed mini`, tests/s3server.py) on 127.0.0.1 and the fault-injecting proxy of
tests/faultstore.py in front of it, writes a crawl of --shards shards of --per-shard images (the demo
crawl's photos) to s3://crawl/shards/, starts one local Ray (--num-cpus) whose processes reach the
store through the proxy, then curates the crawl once with every rate 0 (the clean run) and once per
seed with the given rates: `humanset curate --input s3://crawl/shards/ --output s3://runs/rN --set
'stages=[decode,size,dedup]'`, each a driver process of its own on that Ray (RAY_ADDRESS), every
request of the driver and its workers through the proxy. Prints JSON:

  finished            runs that exited 0, of --seeds
  catalog_equal       runs whose catalog (every row, sorted) and curated shards (key, sample id,
                      sha256) equal the clean run's, read back straight from the store
  clean_files         runs whose objects are exactly the clean run's names (no lock, no probe, no
                      temporary object) with no multipart upload left open under them
  retries_per_1000    the runs' retries (their manifests' `store`) per 1,000 requests they counted
  proxy               requests the proxy saw and the faults it injected, summed over the faulty runs
                      (more than the retries counted: a streamed upload's parts are retried inside
                      obstore, and a unit's last writes come after its counts are taken)
  wall_s              a clean run's wall time (the second one, after the faulty runs: Ray as warm as
                      for them), the faulty runs' median, and their ratio (all through the proxy:
                      its relay costs the same in each)
  runs                per seed: exit status, wall seconds, the manifest's `store`, the last
                      stderr line of a run that failed

    python bench/store_faults.py --seeds 20 --rate-503 0.1 --rate-cut 0.05 --rate-lost-ack 0.05
    python bench/store_faults.py --seeds 3 --rate-503 0.3 --rate-reset 0.05 --rate-latency 0.02

Timings are only comparable within one invocation (same machine load).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[1:1] = [str(ROOT)]  # the packages as regular ones, before tests/pipeline/ (a namespace portion)
sys.path.append(str(ROOT / "tests"))

from faultstore import FaultStore  # noqa: E402  (test-side code: the product never imports it)
from s3server import start_weed, stop_weed  # noqa: E402

BUCKETS = ("crawl", "runs")


def _env(endpoint: str, key: str, secret: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY=secret, AWS_REGION="us-east-1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return env


def curate(run: str, env: dict, num_cpus: int, timeout: float) -> tuple[int, float, str]:
    cmd = [sys.executable, "-m", "humanset.cli", "curate", "--input", "s3://crawl/shards/", "--output", run,
           "--no-progress", "--set", "stages=[decode,size,dedup]", "--set", f"ray.num_cpus={num_cpus}"]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="store-faults-cwd-") as cwd:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    return p.returncode, time.perf_counter() - t0, p.stderr


def catalog_of(run: str):
    import catalog
    con = catalog.connect(run)
    rows = con.sql("SELECT * FROM samples ORDER BY sample_id").to_arrow_table()
    shards = sorted(tuple(r) for r in con.execute("SELECT key, sample_id, sha256 FROM shards").fetchall())
    return rows, shards


def names_of(run: str) -> set[str]:
    from catalog.storage import open_storage
    return {e.path for e in open_storage(run).list()}


def open_uploads(client, prefix: str) -> int:
    """Multipart uploads begun under `prefix` and never completed nor aborted."""
    got = client.list_multipart_uploads(Bucket="runs", Prefix=prefix)
    return len(got.get("Uploads") or [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20, help="faulty runs, seeds 1..N (default 20)")
    ap.add_argument("--rate-503", type=float, default=0.1, help="requests answered 503 SlowDown (default 0.1)")
    ap.add_argument("--rate-cut", type=float, default=0.05, help="GET answers cut mid-body (default 0.05)")
    ap.add_argument("--rate-lost-ack", type=float, default=0.05,
                    help="writes applied, then answered 500 InternalError (default 0.05)")
    ap.add_argument("--rate-reset", type=float, default=0.0, help="connections reset before forwarding (default 0)")
    ap.add_argument("--rate-latency", type=float, default=0.0, help="requests delayed 0.2-1 s (default 0)")
    ap.add_argument("--retry-after", type=int, default=None, help="send Retry-After: N with each 503")
    ap.add_argument("--shards", type=int, default=6, help="crawl shards (default 6)")
    ap.add_argument("--per-shard", type=int, default=8, help="images a shard (default 8)")
    ap.add_argument("--num-cpus", type=int, default=2, help="Ray CPUs of each run (default 2)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds a run may take (default 900)")
    args = ap.parse_args(argv)

    import boto3

    from catalog.storage import open_storage
    from pipeline.demo.crawl import demo_samples, write_webdataset

    root = Path(tempfile.mkdtemp(prefix="store-faults-"))
    proc, endpoint, key, secret, ports, _ = start_weed(root / "weed")
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                           "AWS_REGION", "AWS_PROFILE", "AWS_SESSION_TOKEN")}
    try:
        clean_env = _env(endpoint, key, secret)
        os.environ.update({k: v for k, v in clean_env.items() if k.startswith("AWS_")})
        os.environ.pop("AWS_PROFILE", None)
        os.environ.pop("AWS_SESSION_TOKEN", None)
        s3 = boto3.session.Session().client("s3", endpoint_url=endpoint)
        for b in BUCKETS:
            s3.create_bucket(Bucket=b)
        samples = demo_samples()
        need = args.shards * args.per_shard
        samples = (samples * (need // len(samples) + 1))[:need]
        samples = [(f"{i:06d}", ext, data, cap) for i, (_, ext, data, cap) in enumerate(samples)]
        crawl = open_storage("s3://crawl/shards")
        for t in write_webdataset(root / "crawl", samples, per_shard=args.per_shard):
            crawl.write_bytes(t.name, t.read_bytes())

        rates = dict(slowdown=args.rate_503, cut=args.rate_cut, lost_ack=args.rate_lost_ack, reset=args.rate_reset,
                     latency=args.rate_latency)
        fs = FaultStore(endpoint, seed=0, retry_after=args.retry_after)
        run_env = _env(fs.endpoint, key, secret)
        os.environ["AWS_ENDPOINT_URL"] = fs.endpoint  # the Ray started here passes it to its workers
        # a private cluster on loopback, its token known to the runs' drivers (as tests/pipeline/engine/test_s3_cluster.py)
        os.environ.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="token",
                          RAY_AUTH_TOKEN=uuid.uuid4().hex + uuid.uuid4().hex)
        run_env.update({k: os.environ[k] for k in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_AUTH_MODE",
                                                   "RAY_AUTH_TOKEN")})
        import ray
        for left in (2, 1, 0):  # on a loaded machine the raylet can miss Ray's 30 s start-up window
            try:
                ray.init(num_cpus=args.num_cpus, include_dashboard=False, logging_level="ERROR")
                break
            except Exception:
                ray.shutdown()
                if not left:
                    raise
        run_env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
        os.environ["AWS_ENDPOINT_URL"] = endpoint  # this process checks the runs straight on the store
        rc, clean_s, err = curate("s3://runs/clean", run_env, args.num_cpus, args.timeout)
        if rc != 0:
            print(f"store_faults: the clean run failed (exit {rc}):\n{err[-3000:]}", file=sys.stderr)
            return 1
        clean_rows, clean_shards = catalog_of("s3://runs/clean")
        clean_names = names_of("s3://runs/clean")

        runs, proxy = [], {}
        for seed in range(1, args.seeds + 1):
            run = f"s3://runs/r{seed}"
            fs.reseed(seed, **rates)
            rc, wall, err = curate(run, run_env, args.num_cpus, args.timeout)
            for k, v in fs.counts.items():
                proxy[k] = proxy.get(k, 0) + v
            fs.reseed(0, **{k: 0.0 for k in rates})
            one = {"seed": seed, "exit": rc, "wall_s": round(wall, 1)}
            if rc == 0:
                rows, shards = catalog_of(run)
                one["catalog_equal"] = rows.equals(clean_rows) and shards == clean_shards
                names = names_of(run)
                one["stray_objects"] = sorted(names ^ clean_names)[:10]
                one["open_uploads"] = open_uploads(s3, f"r{seed}/")
                one["store"] = open_storage(run).read_json("manifest.json").get("store")
            else:
                one["error"] = (err.strip().splitlines() or [""])[-1][:500]
            runs.append(one)
            print(json.dumps(one), file=sys.stderr, flush=True)

        fs.reseed(0, **{k: 0.0 for k in rates})  # a second clean run, warm as the faulty ones were: the timing
        rc, clean_s, err = curate("s3://runs/clean-timed", run_env, args.num_cpus, args.timeout)
        if rc != 0:
            print(f"store_faults: the second clean run failed (exit {rc}):\n{err[-3000:]}", file=sys.stderr)
            return 1
        ok = [r for r in runs if r["exit"] == 0]
        stores = [r["store"] for r in ok if r.get("store")]
        retries, requests = sum(s["retries"] for s in stores), sum(s["requests"] for s in stores)
        walls = [r["wall_s"] for r in ok]
        result = {
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "seeds": args.seeds, "rates": {"503": args.rate_503, "cut": args.rate_cut, "lost_ack": args.rate_lost_ack,
                                           "reset": args.rate_reset, "latency": args.rate_latency},
            "crawl": {"shards": args.shards, "images": need},
            "finished": len(ok),
            "catalog_equal": sum(bool(r.get("catalog_equal")) for r in ok),
            "clean_files": sum(not r["stray_objects"] and not r["open_uploads"] for r in ok),
            "retries_per_1000": round(1000 * retries / requests, 1) if requests else None,
            "retries": retries, "requests_counted": requests,
            "throttled": sum(s["throttled"] for s in stores), "resumed_reads": sum(s["resumed_reads"] for s in stores),
            "proxy": proxy,
            "faults_per_1000_proxy_requests": round(1000 * sum(proxy.get(k, 0) for k in ("slowdown", "cut", "reset",
                                                                                       "lost_ack"))
                                                    / max(1, proxy.get("requests", 0)), 1),
            "wall_s": {"clean": round(clean_s, 1), "faulty_median": round(statistics.median(walls), 1) if walls else None,
                       "ratio": round(statistics.median(walls) / clean_s, 2) if walls else None},
            "runs": runs,
        }
        print(json.dumps(result, indent=2))
        return 0 if len(ok) == args.seeds and result["catalog_equal"] == args.seeds else 1
    finally:
        if "ray" in sys.modules:
            sys.modules["ray"].shutdown()
        if "fs" in locals():
            fs.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        stop_weed(proc, ports)


if __name__ == "__main__":
    sys.exit(main())
