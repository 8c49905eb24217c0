"""The art stage alone on a split of the quality bench: per category, the share it rejects. JSON.

    python bench/art_quality.py --split tune|eval [--cache ~/.cache/humanset/quality/images] [--set art.max_score=X]

Every image of the split goes through the art stage's `measure` (the default method unless --set says
otherwise), whatever the other stages would say; bench/quality.py gives the whole cascade's keep rates.
Score the eval split once per change of the probe, after its threshold was fixed on tune.
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.config import load_config  # noqa: E402
from pipeline.stages.art import ArtStage  # noqa: E402

PHOTOS_OF_PEOPLE = ("person_clear", "person_small")  # the photos the stage sees after the person stage: named


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", required=True, choices=("tune", "eval"))
    ap.add_argument("--labels", type=Path, default=ROOT / "bench/quality/labels.csv")
    ap.add_argument("--cache", type=Path, default=Path("~/.cache/humanset/quality/images").expanduser())
    ap.add_argument("--set", action="append", default=[], help="config override, e.g. art.max_score=0.6")
    ap.add_argument("--batch", type=int, default=16)
    a = ap.parse_args(argv)
    cfg = load_config(sets=a.set)["art"]
    stage = ArtStage(cfg)
    cut = float(cfg["max_score"])
    with open(a.labels, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["split"] == a.split]
    files = []
    for r in rows:
        found = sorted(a.cache.glob(f"{r['id']}.*"))
        if not found:
            raise SystemExit(f"{a.cache}: no image {r['id']}.*; fetch it with bench/quality_data.py --split {a.split}")
        files.append(found[0])
    scores: list = []
    for i in range(0, len(files), a.batch):
        out = stage.measure({"image": [f.read_bytes() for f in files[i:i + a.batch]]})
        scores += out["art_score"]
    per: dict[str, dict] = {}
    for r, s in zip(rows, scores):
        c = per.setdefault(r["category"], {"n": 0, "rejected": 0, "errors": 0})
        c["n"] += 1
        if s is None:
            c["errors"] += 1
        elif s > cut:
            c["rejected"] += 1
            if r["category"] in PHOTOS_OF_PEOPLE:
                c.setdefault("rejected_ids", []).append(f"{r['id']} {s:.3f}")
    for c in per.values():
        c["rejected_share"] = round(c["rejected"] / c["n"], 3)
    print(json.dumps({"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                      "load_1min": round(os.getloadavg()[0], 1), "split": a.split, "method": stage.method,
                      "max_score": cut, "categories": dict(sorted(per.items()))}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
