"""Curation throughput: the engine with the cheap stages (decode, size, dedup) against a plain
single-process decode of the same files, in the same run. Prints JSON.

    python bench/curate.py [--n 2000] [--size 1920x1080] [--per-shard 100] [--workdir DIR]
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # a local benchmark stays on loopback


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="images (default 2000)")
    ap.add_argument("--size", default="1920x1080", help="WxH of the generated photos")
    ap.add_argument("--per-shard", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3, help="timed passes of each (median reported)")
    ap.add_argument("--workdir", help="where to put the crawl (default: a temp dir, removed after)")
    args = ap.parse_args()
    w, h = map(int, args.size.lower().split("x"))

    from PIL import Image

    from catalog import iter_tar
    from pipeline.config import load_config
    from pipeline.demo.crawl import photo_like, write_webdataset
    from pipeline.engine.driver import curate
    from pipeline.engine.ray_setup import init_ray

    work = Path(args.workdir or tempfile.mkdtemp(prefix="humanset-bench-"))
    crawl = work / "crawl"
    t0 = time.perf_counter()
    if not crawl.exists():
        write_webdataset(crawl, [(f"{i:08d}", "jpg", photo_like(w, h, i), "") for i in range(args.n)], args.per_shard)
    gen_s = time.perf_counter() - t0
    total_bytes = sum(p.stat().st_size for p in crawl.glob("*.tar"))

    def plain_decode() -> float:
        """What one would write by hand: read each shard, fully decode every JPEG, hash it."""
        t = time.perf_counter()
        n = 0
        for tar in sorted(crawl.glob("*.tar")):
            for rec in iter_tar(tar):
                data = rec.files["jpg"]
                hashlib.sha256(data).hexdigest()
                Image.open(io.BytesIO(data)).convert("RGB").load()
                n += 1
        assert n == args.n
        return time.perf_counter() - t

    cfg = load_config(sets=["stages=[decode,size,dedup]", "ray.num_cpus=" + str(os.cpu_count())])
    init_ray(cfg)
    engine_s, decode_s = [], []
    for r in range(args.repeats):
        run = work / f"run{r}"
        shutil.rmtree(run, ignore_errors=True)
        t = time.perf_counter()
        m = curate([str(crawl)], str(run), cfg, progress=False)
        engine_s.append(time.perf_counter() - t)
        assert m["counts"]["inputs"] == args.n
        decode_s.append(plain_decode())
    e, d = statistics.median(engine_s), statistics.median(decode_s)
    print(json.dumps({
        "benchmark": "curate", "images": args.n, "size": f"{w}x{h}", "mb": round(total_bytes / 2**20, 1),
        "cpus": os.cpu_count(), "stages": cfg["stages"], "repeats": args.repeats,
        "engine_images_per_s": round(args.n / e, 1),
        "plain_decode_images_per_s": round(args.n / d, 1),
        "ratio_engine_over_plain_decode": round(d / e, 3),
        "engine_seconds": [round(x, 2) for x in engine_s], "plain_decode_seconds": [round(x, 2) for x in decode_s],
        "generate_seconds": round(gen_s, 1),
    }, indent=2))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
