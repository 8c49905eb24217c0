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

import json
import logging
from pathlib import Path

log = logging.getLogger("humanset.demo")


def run(output: str = "runs/demo", progress: bool = True, pretrain_steps: int = 40, frames: int = 4,
        finetune_steps: int = 30) -> int:
    from pipeline.demo import run as curate_demo
    from render.demo import run as render_demo
    from training.finetune import demo as finetune_demo
    from training.pretrain import demo as pretrain_demo

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


def register(sub) -> None:
    p = sub.add_parser("demo", help="run every stage on embedded data (what `make demo` runs)",
                       description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("--output", default="runs/demo", help="demo folder (default: runs/demo)")
    p.add_argument("--frames", type=int, default=4, help="frames to render (default 4)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=lambda a: run(a.output, progress=not a.no_progress, frames=a.frames))
