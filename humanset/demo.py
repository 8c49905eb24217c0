"""`humanset demo` / `make demo`: every room on embedded data, offline, on a CPU.

1. curation: a small crawl from photos shipped in installed packages (plus generated duplicates,
   overlays, graphics and broken files) -> catalog, curated shards, funnel, HTML report
2. synthetic humans: a few anny bodies rendered with BlenderProc under the HDRIs shipped in bpy
   -> RGB, metric depth, normals, masks, cameras in render shards + contact sheets
3. MAE pretraining for a few dozen steps on the curated shards + a reconstruction figure
4. depth and normal heads fine-tuned briefly on the renders (encoder from step 3), predictions for
   one rendered image
Rerunning resumes or skips what is already there.
"""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

log = logging.getLogger("humanset.demo")


def run(output: str = "runs/demo", progress: bool = True, pretrain_steps: int = 40, frames: int = 4,
        finetune_steps: int = 30) -> int:
    from pipeline.demo import run as curate_demo
    from render.demo import run as render_demo
    out = Path(output)
    from catalog.report import write_report

    curate_demo(str(out), progress=progress)
    run_dir = out / "run"
    report = write_report(run_dir, out / "report.html")
    print(f"\nreport: {report.resolve()}   (humanset stats {run_dir} for the same in the terminal)")

    print(f"\n== rendering {frames} anny bodies under the HDRIs shipped in bpy (BlenderProc, CPU)")
    renders = out / "render"
    rendered = render_demo(renders, frames=frames, progress=progress)
    print(f"frames: {json.dumps({k: v for k, v in rendered.items() if k != 'output'}, default=str)}")
    print(f"contact sheets: {renders / 'contact'}")

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
    print(f"\ndemo outputs in {out}/: crawl/, run/ (catalog, shards, stats), report.html, render/, "
          f"pretrain/, finetune/")
    print(f"report: {report.resolve()}")
    return 0


# --- the training part of the demo: short CPU runs with the real recipes ---------------------------
def pretrain_demo_config(data, output, steps: int = 40):
    """A short CPU run: tiny preset at 64 px, under 2 minutes on 2 cores. The lr is far above the Sapiens
    rule (a few dozen steps must show the loss falling); everything else is the real recipe."""
    from training.pretrain import PretrainConfig

    return PretrainConfig(data=str(data), output=str(output), model="tiny", image_size=64, batch_size=16,
                          steps=steps, warmup_steps=max(1, steps // 10), base_lr=0.02, loader_workers=1,
                          cpu_threads=1, checkpoint_every=max(1, steps // 2), log_every=5)


def pretrain_demo(data, output, steps: int = 40) -> dict:
    """Pretrain briefly on a shards folder, then draw the reconstruction figure of the first image."""
    import pyarrow.parquet as pq

    import catalog
    from training import checkpoint as ckpt
    from training.decode import read_image_member
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
    from training.finetune import FinetuneConfig

    return FinetuneConfig(task=task, data=str(data), output=str(output), encoder=encoder, model="tiny",
                          image_size=(128, 96), head_width=32, batch_size=4, steps=steps,
                          warmup_steps=max(1, steps // 10), lr=2e-3, loader_workers=0, cpu_threads=1,
                          checkpoint_every=steps, log_every=5)


def finetune_demo(render_dir, out_dir, steps: int = 30, encoder: str = "") -> dict:
    """Fine-tune depth and normals briefly on a render run, then predict the first frame."""
    import numpy as np
    from PIL import Image

    import catalog
    from training.finetune import finetune
    from training.predict import predict
    from training.task_data import RenderFrames

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
