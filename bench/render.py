"""Render throughput: a warm worker vs a new process per frame, at equal quality. Prints JSON.

For each resolution (H×W) it renders the same frames (anny bodies, built-in HDRIs, seed 0) three ways:
  warm       one process, Blender initialised once, frames rendered back to back (render.job's worker)
  naive      a new Python process per frame that imports, initialises Blender, builds the body and renders
  reference  the warm worker at --ref-samples, the "converged" image PSNR is measured against
and reports frames/min and the mean PSNR (dB, RGB) of warm and naive frames against the reference.

    python bench/render.py                                    # 512x384 and 1024x768, 32 samples
    python bench/render.py --res 512x384 --frames 2 --samples 16 --ref-samples 128
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def settings(h, w, samples, denoiser, device):
    return [f"sampling.camera.height={h}", f"sampling.camera.width={w}", f"cycles.samples={samples}",
            f"cycles.denoiser={denoiser}", f"cycles.device={device}"]


def make_worker(out, sets):
    from render.config import load_config
    from render.job import ShardRenderer, prepare_run
    spec = prepare_run(out, "anny", "builtin", 1 << 20, 0, load_config(sets=sets))
    return ShardRenderer(spec)


def rgb_of(members) -> np.ndarray:
    from render.output import load_png
    return load_png(members["rgb.png"])[..., :3]


def render_one(args) -> int:
    """--single: what a process-per-frame renderer does for one frame; writes the RGB as .npy."""
    with tempfile.TemporaryDirectory() as tmp:
        worker = make_worker(tmp, json.loads(args.single_sets))
        _, members, _ = worker.render_frame(args.single)
        np.save(args.single_out, rgb_of(members))
    return 0


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB, capped at 100 (= identical images) so the JSON stays strict."""
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 100.0 if mse == 0 else min(100.0, float(10 * np.log10(255.0 ** 2 / mse)))


def bench_resolution(h, w, args) -> dict:
    frames = list(range(args.frames))
    sets = settings(h, w, args.samples, args.denoiser, args.device)
    with tempfile.TemporaryDirectory() as tmp:
        worker = make_worker(Path(tmp) / "warm", sets)
        worker.renderer  # noqa: B018  (initialise Blender before timing: that is the point of a warm worker)
        worker.render_frame(len(frames))  # warm-up frame: anny model, kernels, caches
        t = time.time()
        warm = [rgb_of(worker.render_frame(i)[1]) for i in frames]
        warm_s = time.time() - t

        naive, t = [], time.time()
        for i in frames:
            out = Path(tmp) / f"naive-{i}.npy"
            cmd = [sys.executable, __file__, "--single", str(i), "--single-out", str(out),
                   "--single-sets", json.dumps(sets)]
            subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            naive.append(np.load(out))
        naive_s = time.time() - t

        ref_sets = settings(h, w, args.ref_samples, args.denoiser, args.device)
        ref_worker = make_worker(Path(tmp) / "ref", ref_sets)
        ref = [rgb_of(ref_worker.render_frame(i)[1]) for i in frames]
    return {
        "resolution": f"{h}x{w}", "frames": len(frames), "samples": args.samples, "denoiser": args.denoiser,
        "device": worker.renderer.device,
        "warm_frames_per_min": round(60 * len(frames) / warm_s, 3),
        "naive_frames_per_min": round(60 * len(frames) / naive_s, 3),
        "speedup_warm_vs_naive": round(naive_s / warm_s, 2),
        "warm_psnr_db": round(float(np.mean([psnr(a, r) for a, r in zip(warm, ref)])), 2),
        "naive_psnr_db": round(float(np.mean([psnr(a, r) for a, r in zip(naive, ref)])), 2),
        # the same frame from a warm worker and from a fresh process should be the same image
        "warm_vs_naive_psnr_db": round(float(np.mean([psnr(a, b) for a, b in zip(warm, naive)])), 2),
        "warm_seconds": round(warm_s, 2), "naive_seconds": round(naive_s, 2),
        "reference_samples": args.ref_samples,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--res", action="append", help="HxW, repeatable (default: 512x384 and 1024x768)")
    p.add_argument("--frames", type=int, default=3, help="timed frames per mode and resolution")
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--denoiser", default="INTEL", help="INTEL, OPTIX or null")
    p.add_argument("--ref-samples", type=int, default=512)
    p.add_argument("--device", default="auto", help="auto, cpu or gpu")
    p.add_argument("--single", type=int, help=argparse.SUPPRESS)
    p.add_argument("--single-out", help=argparse.SUPPRESS)
    p.add_argument("--single-sets", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.single is not None:
        return render_one(args)
    import logging
    logging.basicConfig(level=logging.WARNING)
    results = []
    for res in args.res or ["512x384", "1024x768"]:
        h, w = (int(x) for x in res.lower().split("x"))
        results.append(bench_resolution(h, w, args))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"bench": "render", "cpu_count": os.cpu_count(), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
