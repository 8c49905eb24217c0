"""`humanset demo` / `make demo`: every room on embedded data, offline, on a CPU.

1. curation: a small crawl from photos shipped in installed packages (plus generated duplicates,
   overlays, graphics and broken files) -> catalog, curated shards, funnel, HTML report
2. MAE pretraining for a few dozen steps on the curated shards + a reconstruction figure
Rerunning resumes or skips what is already there.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger("humanset.demo")


def run(output: str = "runs/demo", progress: bool = True, pretrain_steps: int = 40) -> int:
    from pipeline.demo import run as curate_demo
    from training.pretrain import demo as pretrain_demo

    out = Path(output)
    from catalog.report import write_report

    curate_demo(str(out), progress=progress)
    run_dir = out / "run"
    report = write_report(run_dir, out / "report.html")
    print(f"\nreport: {report.resolve()}   (humanset stats {run_dir} for the same in the terminal)")

    print("\n== MAE pretraining on the curated shards (tiny preset, 64 px)")
    pre = out / "pretrain"
    if (pre / "encoder.pth").exists():
        print(f"already done: {pre}")
    else:
        summary = pretrain_demo(run_dir / "shards", pre, steps=pretrain_steps)
        losses = [json.loads(line)["loss"] for line in (pre / "log.jsonl").read_text().splitlines() if line.strip()]
        print(f"MAE loss {losses[0]:.3f} -> {losses[-1]:.3f} over {summary['steps']} steps; "
              f"reconstruction figure: {summary['vis']}")
    print(f"\ndemo outputs in {out}/: crawl/, run/ (catalog, shards, stats), report.html, pretrain/")
    print(f"report: {report.resolve()}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("demo", help="run every stage on embedded data (what `make demo` runs)",
                       description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("--output", default="runs/demo", help="demo folder (default: runs/demo)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=lambda a: run(a.output, progress=not a.no_progress))
