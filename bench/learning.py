"""Does fine-tuning learn? Held-out metrics of every head against trivial baselines, MAE init against random.

    python bench/learning.py                       # the default budget: ~30 minutes on a quiet 2-core CPU
    python bench/learning.py --train 8 --test 4 --steps 20 --pretrain-steps 10 --work /tmp/learn   # a smoke run
    python bench/learning.py --train-renders A --test-renders B --encoder PT/encoder.pth   # reuse earlier outputs

1. renders N training and M held-out frames of generated anny bodies with `humanset render` (two run seeds:
   distinct bodies, checked from the frame catalogs), small frames at few samples;
2. curates the demo crawl (pipeline.demo.crawl, as `make demo`) and MAE-pretrains the tiny encoder with
   `humanset pretrain` on its curated photos plus the training renders (never the held-out ones);
3. fine-tunes each head (depth, normal, seg, pose from the renders' keypoints) (a) from that encoder and
   (b) from random initialisation, with the same recipe, steps and seed;
4. scores each on the held-out frames with `training.tasks.evaluate` and the trivial baselines of
   `training.tasks.baselines` (statistics of the training frames, scored by the same code).

Prints one JSON object: per task and init the held-out metrics, the best baseline's, the relative gain on
the task's error (AbsRel, mean angle, 1 - mIoU, 1 - PCK@0.1; target >= 0.10), steps and seconds; per task
how MAE init compares with random init. Work files go to --work (reruns reuse finished renders,
curation and pretraining there).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

import pyarrow.parquet as pq

TASKS = ("depth", "normal", "seg", "pose")
FIGURES = {"depth": ["absrel", "rmse", "delta1"], "normal": ["mean", "median", "within_30"],
           "seg": ["mIoU", "mAcc"], "pose": ["PCK@0.05", "PCK@0.1", "PCK@0.2", "AP"]}
TARGET_GAIN = 0.10
# fine-tuning peak lr per head (research/notes/learning.md, "Second look"): at 2e-3 the normal head under-fits and stays
# near the mean normal (300 steps at 5e-4: +7.5 % against +3.7 % after 400 at 2e-3); at 5e-4 the seg head,
# under sapiens28's weights (background 0.1), still labels almost every pixel a part after 300 steps (mIoU
# 0.005 against 0.094 after 400 at 2e-3); depth and pose gained >= 16 % at 2e-3
TASK_LR = {"depth": 2e-3, "normal": 5e-4, "seg": 2e-3, "pose": 2e-3}
# seg: background weight 1 instead of sapiens28's 0.1 (600 steps, held-out mIoU 0.129 against 0.108 with the
# vocabulary's weights and 0.099 with uniform ones; background IoU 0.91 against 0.73)
SEG_BACKGROUND_WEIGHT = 1.0
# heads that also see the image through two 3x3 convs (FinetuneConfig.head_image_skip; research/notes/learning.md,
# "Third look"): at 128x96 the encoder sees 8 x 6 tokens and the normal head, from tokens alone, learns little beyond the
# mean normal (300 steps, 32 frames, random init: 31.0 deg held-out with the skip, 36.7 without, baseline 39.7);
# seg: mIoU 0.194 with the skip against 0.129 without (600 steps; baseline 0.099); depth and pose not measured
IMAGE_SKIP = ("normal", "seg")


def humanset(*args: str, log: Path) -> None:
    """One humanset CLI call in a subprocess (its output to `log`); raises with the log's tail on failure."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    with open(log, "w") as fh:
        rc = subprocess.call([sys.executable, "-m", "humanset.cli", *args], stdout=fh, stderr=subprocess.STDOUT,
                             env=env)
    if rc:
        raise RuntimeError(f"humanset {' '.join(args[:3])} failed (exit {rc}); see {log}:\n"
                           + "\n".join(log.read_text().splitlines()[-15:]))


def render(out: Path, frames: int, seed: int, args) -> Path:
    h, w = args.size
    sets = [f"sampling.camera.height={h}", f"sampling.camera.width={w}", f"cycles.samples={args.samples}",
            "cycles.device=cpu", f"output.frames_per_shard={max(frames, 1)}",
            f"sampling.camera.fill=[{args.fill[0]},{args.fill[1]}]"]
    humanset("render", "--scans", "anny", "--hdris", "builtin", "--frames", str(frames), "--seed", str(seed),
             "--output", str(out), "--no-progress", *[a for s in sets for a in ("--set", s)],
             log=out.with_name(out.name + ".log"))
    return out


def bodies(run: Path) -> set:
    files = sorted((run / "catalog" / "frames").glob("*.parquet"))
    return {b for f in files for b in pq.read_table(f, columns=["scan_id"]).column("scan_id").to_pylist()}


def frame_count(run: Path) -> int:
    files = sorted((run / "catalog" / "frames").glob("*.parquet"))
    return sum(pq.read_table(f, columns=["error"]).column("error").null_count for f in files)


def pretrain(work: Path, train_renders: Path, args) -> Path:
    """The demo crawl curated as `make demo` does, then MAE on its photos plus the training renders."""
    out = work / "mae"
    if (out / "encoder.pth").is_file():
        return out / "encoder.pth"
    demo = work / "demo"
    if not (demo / "run" / "shards").is_dir():
        code = f"from pipeline.demo.crawl import run; run({str(demo)!r}, progress=False)"
        with open(work / "demo.log", "w") as fh:
            subprocess.check_call([sys.executable, "-c", code], stdout=fh, stderr=subprocess.STDOUT,
                                  cwd=Path(__file__).resolve().parents[1])
    data = work / "pretrain-data"  # one shards folder: links to the curated shards and the training renders
    data.mkdir(exist_ok=True)
    for src in [demo / "run" / "shards", train_renders / "shards"]:
        for f in sorted(src.glob("*.tar")):
            for member in (f, f.with_suffix(".parquet")):
                link = data / member.name
                if not link.exists():
                    link.symlink_to(member.resolve())
    steps = args.pretrain_steps
    humanset("pretrain", "--data", str(data), "--model", "tiny", "--image-size", str(args.pretrain_size),
             "--batch-size", "16", "--steps", str(steps), "--output", str(out),
             "--set", "base_lr=0.02", "--set", f"warmup_steps={max(1, steps // 10)}", "--set", "loader_workers=1",
             "--set", f"cpu_threads={args.threads}", "--set", f"checkpoint_every={steps}", "--set", "log_every=25",
             "--set", "progress=false", log=work / "pretrain.log")
    return out / "encoder.pth"


def finetune_and_score(task: str, init: str, encoder: str, train: Path, test: Path, work: Path, args) -> dict:
    from training.tasks.evaluate import evaluate
    from training.tasks.finetune import FinetuneConfig, finetune
    out = work / "finetune" / f"{task}-{init}"
    cfg = FinetuneConfig(task=task, data=str(train), output=str(out), encoder=encoder if init == "mae" else "",
                         model="tiny", image_size=tuple(args.size), head_width=args.head_width, batch_size=4,
                         steps=args.steps, warmup_steps=max(1, args.steps // 10), lr=args.lr or TASK_LR[task],
                         loader_workers=0, cpu_threads=args.threads, checkpoint_every=args.steps, log_every=50,
                         seed=args.seed, progress=False,
                         background_weight=SEG_BACKGROUND_WEIGHT if task == "seg" else None,
                         head_image_skip=task in args.image_skip)
    with contextlib.redirect_stdout(sys.stderr):  # the training log lines; stdout carries the JSON alone
        t = time.time()
        summary = finetune(cfg)
        seconds = time.time() - t
        result = evaluate(summary["checkpoint"], data=str(test), baselines=True)
    base = result["baselines"]
    best = base[base["best"]]
    err, base_err = error_of(task, result), error_of(task, best)
    return {"held_out": {k: round(result[k], 4) for k in FIGURES[task]},
            "baseline": base["best"], "baseline_held_out": {k: round(best[k], 4) for k in FIGURES[task]},
            "gain_vs_baseline": round(1 - err / base_err, 4),
            "beats_baseline_by_10pct": 1 - err / base_err >= TARGET_GAIN,
            "steps": args.steps, "lr": cfg.lr, "head_image_skip": cfg.head_image_skip,
            "seconds": round(seconds, 1), "n_test": result["n"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", type=int, default=64, help="training frames to render (default 64)")
    p.add_argument("--test", type=int, default=16, help="held-out frames to render (default 16)")
    p.add_argument("--size", default="128x96", help="render and fine-tuning size HxW (default 128x96)")
    p.add_argument("--samples", type=int, default=8, help="Cycles samples per pixel (default 8)")
    p.add_argument("--fill", default="0.8,0.95", help="person height as a fraction of the frame (default 0.8,0.95)")
    p.add_argument("--steps", type=int, default=1000, help="fine-tuning steps per head and init (default 1000)")
    p.add_argument("--lr", type=float,
                   help="fine-tuning peak lr for every head (default per head: normal 5e-4, depth / seg / pose 2e-3)")
    p.add_argument("--head-width", type=int, default=32, help="decoder width (default 32)")
    p.add_argument("--image-skip", default=",".join(IMAGE_SKIP),
                   help="comma-separated heads that also see the image through two 3x3 convs (head_image_skip; "
                        f"default {','.join(IMAGE_SKIP)}; 'none' for tokens only)")
    p.add_argument("--pretrain-steps", type=int, default=300, help="MAE steps (default 300)")
    p.add_argument("--pretrain-size", type=int, default=128, help="MAE input side (default 128)")
    p.add_argument("--tasks", default=",".join(TASKS), help="comma-separated subset of depth,normal,seg,pose")
    p.add_argument("--inits", default="mae,random", help="mae, random or both (default)")
    p.add_argument("--train-renders", help="reuse this render run for training (skips rendering)")
    p.add_argument("--test-renders", help="reuse this render run as the held-out frames")
    p.add_argument("--encoder", help="reuse this MAE encoder (skips curation and pretraining)")
    p.add_argument("--jobs", type=int, default=2, help="fine-tuning runs side by side (default 2, one per core)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    p.add_argument("--seed", type=int, default=0, help="fine-tuning seed")
    p.add_argument("--work", default="runs/bench-learning", help="work folder (default runs/bench-learning)")
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--merge", nargs="+", metavar="JSON",
                   help="only merge the JSON of earlier runs (e.g. --inits mae and --inits random run side by "
                        "side) into one report with the MAE-against-random comparison")
    args = p.parse_args(argv)
    if args.merge:
        return print_report(merge([json.loads(Path(f).read_text()) for f in args.merge]), args.out)
    args.size = [int(v) for v in args.size.lower().split("x")]
    args.fill = [float(v) for v in args.fill.split(",")]
    tasks, inits = args.tasks.split(","), args.inits.split(",")
    args.image_skip = [] if args.image_skip in ("", "none") else args.image_skip.split(",")
    for name in args.image_skip:
        if name not in TASKS:
            raise SystemExit(f"--image-skip {name!r}: choose among {', '.join(TASKS)} or 'none'")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t0, load_at_start, started = time.time(), load(), time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    timings = {}
    train = Path(args.train_renders) if args.train_renders else render(work / "train", args.train, 0, args)
    test = Path(args.test_renders) if args.test_renders else render(work / "test", args.test, 1, args)
    timings["render_s"] = round(time.time() - t0, 1)
    shared = bodies(train) & bodies(test)
    if shared:
        raise SystemExit(f"{train} and {test} share bodies {sorted(shared)[:3]}: the held-out frames must show "
                         f"other people (render them with another --seed)")
    encoder = ""
    if "mae" in inits:
        t = time.time()
        encoder = args.encoder or str(pretrain(work, train, args))
        timings["pretrain_s"] = round(time.time() - t, 1)
    runs = [(task, init) for task in tasks for init in inits]
    t = time.time()
    results: dict = {task: {} for task in tasks}
    with ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(finetune_and_score, task, init, encoder, train, test, work, args): (task, init)
                   for task, init in runs}
        for future in as_completed(futures):
            task, init = futures[future]
            results[task][init] = future.result()
            print(json.dumps({task: {init: results[task][init]}}), file=sys.stderr, flush=True)
    timings["finetune_s"] = round(time.time() - t, 1)
    for task in tasks:
        compare(task, results[task])
    args.train, args.test = frame_count(train), frame_count(test)  # the frames used, rendered here or reused
    report = {"bench": "learning", "started_utc": started, "ended_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
              "load_avg_at_start": load_at_start, "train_frames": str(train), "test_frames": str(test),
              "train_bodies": len(bodies(train)), "test_bodies": len(bodies(test)),
              "settings": {k: v for k, v in vars(args).items() if k not in ("out", "work")},
              "results": results, **timings, "total_s": round(time.time() - t0, 1), "load_avg_at_end": load()}
    return print_report(report, args.out)


def print_report(report: dict, out=None) -> int:
    text = json.dumps(report, indent=2)
    print(text)
    if out:
        Path(out).write_text(text + "\n")
    return 0


def compare(task: str, per_init: dict) -> None:
    if {"mae", "random"} <= set(per_init):
        per_init["mae_vs_random"] = {
            "mae_better": error_of(task, per_init["mae"]["held_out"]) < error_of(task, per_init["random"]["held_out"]),
            "error_reduction": round(error_reduction(task, per_init["mae"], per_init["random"]), 4)}


def merge(reports: list[dict]) -> dict:
    """Reports of the same renders with different --inits or --tasks -> one report (results joined)."""
    out = {**reports[0], "results": {}, "merged_from": [r.get("settings") for r in reports]}
    for r in reports:
        for task, per_init in r["results"].items():
            out["results"].setdefault(task, {}).update({k: v for k, v in per_init.items() if k != "mae_vs_random"})
    for task, per_init in out["results"].items():
        compare(task, per_init)
    for key in ("render_s", "pretrain_s", "finetune_s", "total_s"):
        out[key] = round(sum(r.get(key, 0) for r in reports), 1)
    return out


def error_of(task: str, figures: dict) -> float:
    from training.tasks.scoring import error_of as task_error
    return task_error(task, figures)


def error_reduction(task: str, mae: dict, rand: dict) -> float:
    """1 - error(MAE init) / error(random init) on the held-out frames (> 0: MAE init is better)."""
    return 1 - error_of(task, mae["held_out"]) / error_of(task, rand["held_out"])


def load() -> list:
    return [round(v, 2) for v in os.getloadavg()]


if __name__ == "__main__":
    raise SystemExit(main())
