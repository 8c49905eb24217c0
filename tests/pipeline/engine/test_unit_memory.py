"""A worker's memory is bounded by the batch, not by the shard: the largest per-unit peak RSS of the
workers (VmHWM over each unit, in its stats marker) for a shard of 8x the images stays within 1.25x.
bench/scale.py --shard-size measures the same at 1,000 and 10,000 images per shard."""
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[3]


def _shard(path: Path, n: int) -> int:
    """One shard of n distinct ~60 KB JPEGs (noise: they do not compress)."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(n)
    size = 0
    with tarfile.open(path, "w") as tf:
        for k in range(n):
            img = rng.integers(0, 255, (240, 300, 3), dtype=np.uint8)
            img[:8, :8] = k % 251  # distinct bytes per image
            b = io.BytesIO()
            Image.fromarray(img).save(b, "JPEG", quality=90)
            info = tarfile.TarInfo(f"{k:06d}.jpg")
            info.size = b.tell()
            size += b.tell()
            b.seek(0)
            tf.addfile(info, b)
    return size


def _peak(tmp_path: Path, n: int) -> tuple[float, int]:
    crawl = tmp_path / f"crawl{n}"
    crawl.mkdir()
    size = _shard(crawl / "s.tar", n)
    run = tmp_path / f"run{n}"
    cmd = [sys.executable, str(ROOT / "pipeline" / "curate.py"), "--input", str(crawl), "--output", str(run),
           "--no-progress", "--set", "ray.num_cpus=2", "--set", "stages=[decode,size,dedup]",
           "--set", "size.min_short_side=100", "--set", "dedup.max_distance=null",
           "--set", "engine.max_batch_bytes=2097152"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    marker = json.loads((run / "stats" / "s.json").read_text())
    assert marker["inputs"] == marker["kept"] == n
    return max(marker["peak_rss_mb"].values()), size


def test_worker_memory_does_not_grow_with_the_shard(tmp_path):
    small, small_bytes = _peak(tmp_path, 150)
    large, large_bytes = _peak(tmp_path, 1200)  # ~70 MB of images in one shard
    assert large_bytes > 8 * small_bytes * 0.9
    # holding the shard's bytes even once would add ~70 MB over a ~300 MB worker, twice ~140 MB
    assert large < 1.25 * small, (small, large, large_bytes / 2**20)
    assert large - small < 0.5 * large_bytes / 2**20, (small, large, large_bytes / 2**20)
