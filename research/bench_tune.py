"""The quality bench's tune split for research scripts: its images and labels, bench/quality.py, the shipped person
stage, the scripts' shared options and report (one JSON object, each image's rows as CSV)."""
from __future__ import annotations

import csv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tune_images(cache: Path) -> tuple[dict[str, dict], list[Path]]:
    """The bench's labels (id -> row) and the tune split's image files in the cache, sorted."""
    labels = {r["id"]: r for r in csv.DictReader(open(ROOT / "bench/quality/labels.csv", newline=""))}
    files = [f for f in sorted((cache / "splits" / "tune").iterdir()) if labels.get(f.stem, {}).get("split") == "tune"]
    return labels, files


def bench_quality():
    """bench/quality.py as a module (bench/ is scripts, not a package): its scoring, compare and sign_test."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_quality", ROOT / "bench" / "quality.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_rows(path: Path, rows: list[dict]) -> None:
    """Each image's scores as CSV (\\n line endings)."""
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def parser(doc: str):
    """The scripts' shared options: the bench cache, a rows CSV to write, the batch size."""
    import argparse

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path("~/.cache/humanset/quality").expanduser())
    ap.add_argument("--rows", type=Path, help="also write each image's scores here (CSV)")
    ap.add_argument("--batch", type=int, default=8)
    return ap


def run_labels_parser(doc: str):
    """The person scripts' options: a curated tune run, its `bench/quality.py --write-labels` CSV, a rows CSV to
    write."""
    import argparse

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("labels", type=Path, help="bench/quality.py --write-labels CSV of the run")
    ap.add_argument("--rows", type=Path, help="also write each row's scores here (CSV)")
    return ap


def report(out: dict, rows: list[dict], rows_path: Path | None) -> int:
    """Print the JSON report, write the rows where asked; the exit status."""
    import json

    print(json.dumps(out, indent=1))
    if rows_path:
        write_rows(rows_path, rows)
    return 0


def shipped_person_stage():
    """The person stage as the default config sets it up, and that config's person section."""
    from pipeline.config import load_config
    from pipeline.stages.person import PersonStage

    cfg = load_config()["person"]
    stage = PersonStage(cfg)
    stage.setup()
    return stage, cfg
