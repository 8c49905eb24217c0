"""`humanset demo` / `make demo`: every room on embedded data, offline, on a CPU.

1. curation: a small crawl from photos shipped in installed packages (plus generated duplicates,
   overlays, watermarks, graphics and broken files) -> catalog, curated shards, funnel, HTML report;
   all seven stages run: the watermark stage its ocr method (no weights needed), rejecting the marked
   photos, and the art stage its shipped probe (pipeline/stages/art_probe.py)
2. synthetic humans: a few anny bodies rendered with BlenderProc under the HDRIs shipped in bpy
   -> RGB, metric depth, normals, masks, cameras in render shards + contact sheets
3. MAE pretraining for a few dozen steps on the curated shards + a reconstruction figure
4. depth and normal heads fine-tuned briefly on the renders (encoder from step 3), predictions for
   one rendered image
5. the watermark and art filters trained briefly from the curated photos and the renders (encoder
   from step 3, synthetic watermarks and stylised non-photos), then the crawl curated again with
   them in place of the ocr method and the probe (demo-quality figures; a filter that
   validates no better than chance scores every sample and rejects none)
Rerunning resumes or skips what is already there.
"""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

log = logging.getLogger("humanset.demo")


def run(output: str = "runs/demo", progress: bool = True, pretrain_steps: int = 40, frames: int = 4,
        finetune_steps: int = 30, filter_steps: int = 300) -> int:
    from catalog import run_kind
    from pipeline.demo.crawl import run as curate_demo
    from render.demo_renders import run as render_demo
    out = Path(output)
    from explore.report import write_report

    run_kind.claim(out, "demo", flag="--output")  # a folder of runs: curate or render into it is refused
    curate_demo(str(out), progress=progress)
    run_dir = out / "run"
    report = write_report(run_dir, out / "report.html")
    print(f"\nreport: {report.resolve()}   (humanset stats {run_dir} for the same in the terminal)")

    print(f"\n== rendering {frames} anny bodies under the HDRIs shipped in bpy (BlenderProc, CPU)")
    renders = out / "render"
    rendered = render_demo(renders, frames=frames, progress=progress)
    print(f"frames: {json.dumps({k: v for k, v in rendered.items() if k != 'output'}, default=str)}")
    print(f"contact sheets: {renders / 'contact'}")
    print(f"for Sapiens' fine-tuning: humanset render export {renders} --format sapiens --to {out / 'sapiens'}")

    print("\n== MAE pretraining on the curated shards (tiny preset, 64 px)")
    pre = out / "pretrain"
    if (pre / "encoder.pth").exists():
        print(f"already done: {pre}")
    else:
        summary = pretrain_demo(run_dir / "shards", pre, steps=pretrain_steps)
        losses = [json.loads(line)["loss"] for line in (pre / "log.jsonl").read_text().splitlines() if line.strip()]
        print(f"MAE loss {losses[0]:.3f} -> {losses[-1]:.3f} over {summary['steps']} steps; "
              f"reconstruction figure: {summary['vis']}")
    print("\n== fine-tuning depth and normal heads on the renders (encoder from the pretraining)")
    tuned = out / "finetune"
    if (tuned / "summary.json").exists():
        print(f"already done: {tuned}")
    else:
        result = finetune_demo(renders, tuned, steps=finetune_steps, encoder=str(pre / "encoder.pth"))
        for task, r in result.items():
            print(f"{task}: predictions {', '.join(r['predictions'])}")
    filtered = filters_demo(out, out / "crawl", run_dir, renders, pre / "encoder.pth", progress=progress,
                            steps=filter_steps)
    print(f"\ndemo outputs in {out}/: crawl/, run/ (catalog, shards, stats), report.html, render/, "
          f"pretrain/, finetune/, filters/, {filtered.name}/ (curated with the trained filters)")
    print(browse_line(run_dir, out / "labels.csv"))
    return 0


def browse_line(run_dir: Path, labels: Path) -> str:
    """The last line of the demo: how to look at the run and label it (labels live outside RUN)."""
    from explore.browse.cli import DEFAULT_PORT

    return (f"\nlook at the run: humanset browse {run_dir} --labels {labels}   (then http://127.0.0.1:{DEFAULT_PORT}/; "
            f"labels feed humanset calibrate {run_dir} --labels {labels})")


# --- the training part of the demo: short CPU runs with the real recipes ---------------------------
def pretrain_demo_config(data, output, steps: int = 40):
    """A short CPU run: tiny preset at 64 px, under 2 minutes on 2 cores. The lr is far above the Sapiens
    rule (a few dozen steps must show the loss falling); everything else is the real recipe."""
    from training.pretrain import PretrainConfig

    return PretrainConfig(data=str(data), output=str(output), model="tiny", image_size=64, batch_size=16,
                          steps=steps, warmup_steps=max(1, steps // 10), base_lr=0.02, loader_workers=1,
                          cpu_threads=1, checkpoint_every=steps, log_every=5,
                          resume="auto")  # a rerun continues an interrupted demo


def pretrain_demo(data, output, steps: int = 40) -> dict:
    """Pretrain briefly on a shards folder, then draw the reconstruction figure of the first image."""
    import pyarrow.parquet as pq

    import catalog
    from training import checkpoint as ckpt
    from training.image_decode import read_image_member
    from training.pretrain import pretrain
    from training.vis import pretrain_vis

    summary = pretrain(pretrain_demo_config(data, output, steps))
    first = catalog.list_shards(data)[0]
    row = pq.read_table(first.with_suffix(".parquet"), columns=["members"]).column("members")[0].as_py()
    image = Path(output) / "vis-input.img"
    with open(first, "rb") as fh:
        image.write_bytes(read_image_member(fh, row))
    summary["vis"] = str(pretrain_vis(ckpt.latest_checkpoint(output), image, Path(output) / "vis.png"))
    return summary


def finetune_demo_config(task: str, data, output, steps: int = 30, encoder: str = ""):
    """A short CPU run: tiny preset at 128x96 with narrow heads; the lr is raised so a few dozen steps
    show the loss falling. Everything else is the real recipe."""
    from training.tasks.finetune import FinetuneConfig

    return FinetuneConfig(task=task, data=str(data), output=str(output), encoder=encoder, model="tiny",
                          image_size=(128, 96), head_width=32, batch_size=4, steps=steps,
                          warmup_steps=max(1, steps // 10), lr=2e-3, loader_workers=0, cpu_threads=1,
                          checkpoint_every=steps, log_every=5, resume="auto")


def finetune_demo(render_dir, out_dir, steps: int = 30, encoder: str = "") -> dict:
    """Fine-tune depth and normals briefly on a render run, then predict the first frame."""
    import numpy as np
    from PIL import Image

    import catalog
    from training.tasks.finetune import finetune
    from training.tasks.predict import predict
    from training.tasks.data import RenderFrames

    out_dir = Path(out_dir)
    frames = RenderFrames(render_dir, (128, 96))
    out_dir.mkdir(parents=True, exist_ok=True)
    first = frames.raw(0)
    image, mask = out_dir / "demo-input.png", out_dir / "demo-mask.png"
    Image.fromarray(first["rgb"]).save(image)
    Image.fromarray((first["mask"] * 255).astype(np.uint8)).save(mask)
    summary = {}
    for task in ("depth", "normal"):
        run = finetune(finetune_demo_config(task, render_dir, out_dir / task, steps, encoder))
        written = predict(task, run["checkpoint"], [image], out_dir / task / "predictions", masks=[mask])
        summary[task] = {**run, "predictions": [str(p) for p in written]}
    catalog.write_json(out_dir / "summary.json", summary)
    return summary


def filters_demo(out: Path, crawl: Path, run_dir: Path, renders: Path, encoder: Path, progress: bool = True,
                 steps: int = 60) -> Path:
    """Train the watermark and art filters on the curated photos of `run_dir` (and the renders), then curate
    `crawl` again into OUT/run-filters with their cards at their chosen thresholds. Returns that folder."""
    from pipeline.demo.crawl import demo_config
    from pipeline.engine.driver import curate
    from pipeline.engine.funnel import print_funnel
    from training.filters.train import demo_config as filter_config
    from training.filters.train import summary_line, train_filter

    import catalog

    cards = {}
    for task in ("watermark", "art"):
        print(f"\n== training the {task} filter from the curated photos"
              f"{' and the renders' if task == 'art' else ''} (tiny ViT, 64 px, {steps} steps)")
        folder = out / "filters" / task
        if (folder / "card.json").exists():
            print(f"already done: {folder}")
            cards[task] = catalog.read_json(folder / "card.json")
        else:
            frames = renders if task == "art" and (Path(renders) / "shards").is_dir() else ""
            cfg = filter_config(task, run_dir, folder, renders=frames,
                                encoder=str(encoder) if Path(encoder).exists() else "", steps=steps)
            cfg.progress = progress
            cards[task] = train_filter(cfg)
        print(summary_line(cards[task]))
    sets = [f"{t}.weights={out / 'filters' / t}" for t in cards]
    sets += [f"{t}.max_score={cards[t]['threshold']['score']:.4f}" for t in cards]
    print("\n== curating the crawl again with the trained filters (" + ", ".join(sets[2:]) + ")")
    filtered = out / "run-filters"
    manifest = curate([str(crawl)], str(filtered), demo_config(sets), progress=progress)
    print_funnel(manifest)  # the reject reasons are the first run's plus the two filters' (humanset stats)
    print(f"reject reasons: humanset stats {filtered}")
    return filtered


def cmd_pretrain_demo(args) -> int:
    print(json.dumps(pretrain_demo(args.data, args.output, args.steps), indent=2))
    return 0


def cmd_demo(args) -> int:
    return run(args.output, progress=not args.no_progress, frames=args.frames)


def register(sub) -> None:
    p = sub.add_parser("demo", help="run every stage on embedded data (what `make demo` runs)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", default="runs/demo", help="demo folder (default: runs/demo)")
    p.add_argument("--frames", type=int, default=4, help="frames to render (default 4)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_demo)

    d = sub.add_parser("pretrain-demo", help="a one-minute CPU pretraining (tiny preset, 64 px) + its figure",
                       description="Short pretraining on a shards folder, as `make demo` runs it: tiny preset, "
                                   "64 px, batch 16, a raised lr so the loss visibly falls; then OUT/vis.png.")
    d.add_argument("--data", required=True, help="folder of curated shards (RUN/shards)")
    d.add_argument("--output", required=True, help="run folder")
    d.add_argument("--steps", type=int, default=40, help="optimiser steps (default %(default)s)")
    d.set_defaults(func=cmd_pretrain_demo)
