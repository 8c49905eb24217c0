"""The cost of `humanset calibrate` against the size of the run it reads: what a few hundred labels of a large run take.

A user labels a few hundred samples of a run of any size and calibrates a threshold on them, or fits the person
calibration (`--fit-person`). For each size N this writes a synthetic run of N catalog rows as the engine lays out a finished local
run: one part per unit of 1,000 rows, compacted in groups of 1,000 units (catalog/compact.py); with --parts, the
parts alone (a run on an object store, or one not finished). Each row has one person box with its 17 keypoints, a
pose score where the second look would have read it and a text fraction; the rest of the schema is null. It labels
--labels of them at random (person and text) and runs `humanset calibrate RUN --labels CSV --fit-person OUT` in a
process of its own: its wall seconds and peak RSS. What it holds must follow the labels, not the run: the peak at
the largest N within 1.5x of the smallest is the target. Prints JSON.

    python bench/calibrate_scale.py [--rows 250000 1000000 4000000] [--labels 500] [--parts] [--workdir DIR]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
UNIT = 1_000  # rows of one unit's part


def write_run(run: Path, n: int, seed: int = 0, compacted: bool = True) -> tuple[list[str], np.ndarray]:
    """A run of n synthetic catalog rows; its sample ids and their raw person scores."""
    import catalog
    from catalog import compact
    from pipeline.config import default_config

    rng = np.random.default_rng(seed)
    ids, raws = [], []
    fields = {f.name: f for f in catalog.SAMPLES}
    units = []
    for k, start in enumerate(range(0, n, UNIT)):
        m = min(UNIT, n - start)
        sid = [f"{start + i:024x}" for i in range(m)]
        ids += sid
        side = rng.uniform(100, 800, m)
        raw = rng.uniform(0.3, 0.99, m)
        raws.append(raw)
        kp = rng.uniform(0, 1, (m, 17, 3)).astype(np.float32)
        kp[:, :, :2] *= side[:, None, None]
        looked = raw < 0.9
        cols = {
            "sample_id": pa.array(sid),
            "person_boxes": pa.array([[[0.0, 0.0, float(s) * 0.6, float(s)]] for s in side], fields["person_boxes"].type),
            "person_scores": pa.array([[float(r)] for r in raw], fields["person_scores"].type),
            "person_keypoints": pa.array([[row.reshape(-1).tolist()] for row in kp], fields["person_keypoints"].type),
            "person_look_box": pa.array(np.where(looked, 0, None).tolist(), fields["person_look_box"].type),
            "person_look_score": pa.array([float(v) if lk else None for v, lk in zip(rng.uniform(0, 1, m), looked)],
                                          fields["person_look_score"].type),
            "text_area_frac": pa.array(rng.uniform(0, 0.1, m), fields["text_area_frac"].type),
        }
        table = pa.table({f.name: cols.get(f.name, pa.nulls(m, f.type)) for f in catalog.SAMPLES},
                         schema=catalog.SAMPLES)
        units.append(f"u{k:07d}")
        catalog.write_parquet(run / "catalog" / "samples" / f"{units[-1]}.parquet", table)
    if compacted:
        groups = [units[i:i + compact.GROUP] for i in range(0, len(units), compact.GROUP)]
        rows = sum(compact.compact_group(str(run), i, g) for i, g in enumerate(groups))
        compact.finish(run, len(groups), rows, len(units))
    (run / "manifest.json").write_text(json.dumps({"config": default_config(), "status": "complete"}))
    return ids, np.concatenate(raws)


def measure(run: Path, labels: Path, out: Path) -> dict:
    """`humanset calibrate` in a process of its own (this one stays small: a child's peak RSS counts the pages it
    shares with its parent until it runs the command): wall seconds, peak RSS, exit status."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "humanset.cli", "calibrate", str(run), "--labels", str(labels),
                             "--fit-person", str(out / "person.json"), "--out", str(out / "curves.png")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode()[-2000:]
    return {"seconds": round(time.perf_counter() - t0, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "exit_status": os.waitstatus_to_exitcode(status), **({"stderr": err} if status else {})}


def write_labelled_run(run: Path, n: int, labels: Path, n_labels: int, compacted: bool) -> None:
    """write_run, then --labels of its samples labelled: a person where the raw score says so with one label in five
    flipped (so a fit has something to find), text at random."""
    ids, raw = write_run(run, n, compacted=compacted)
    rng = np.random.default_rng(1)
    picked = rng.choice(len(ids), size=min(n_labels, len(ids)), replace=False)
    with open(labels, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["sample_id", "label"])
        for i in picked:
            w.writerow([ids[i], f"person={int((raw[i] > 0.7) != (rng.random() < 0.2))}"])
            w.writerow([ids[i], f"text={int(rng.random() < 0.3)}"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[250_000, 1_000_000, 4_000_000])
    ap.add_argument("--labels", type=int, default=500, help="labelled samples (person and text each)")
    ap.add_argument("--parts", action="store_true", help="leave the parts uncompacted")
    ap.add_argument("--workdir", type=Path, help="where the runs are written (default: a temporary folder, removed)")
    ap.add_argument("--write", nargs=3, metavar=("RUN", "N", "LABELS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.write:  # in a process of its own, so that what writing holds is not in the measured command's peak
        write_labelled_run(Path(a.write[0]), int(a.write[1]), Path(a.write[2]), a.labels, not a.parts)
        return 0
    work = a.workdir or Path(tempfile.mkdtemp(prefix="humanset-calibrate-scale-"))
    result = {"labels": a.labels, "layout": "parts" if a.parts else "compacted",
              "load_avg_at_start": round(os.getloadavg()[0], 2), "sizes": []}
    try:
        for n in a.rows:
            run, labels = work / f"run-{n}", work / f"labels-{n}.csv"
            shutil.rmtree(run, ignore_errors=True)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, __file__, "--write", str(run), str(n), str(labels), "--labels",
                            str(a.labels), *(["--parts"] if a.parts else [])], check=True)
            made = time.perf_counter() - t0
            r = measure(run, labels, work)
            result["sizes"].append({"rows": n, "parts": -(-n // UNIT), "write_seconds": round(made, 1), **r})
            shutil.rmtree(run, ignore_errors=True)
            print(json.dumps(result["sizes"][-1]), file=sys.stderr)
        peaks = [s["peak_rss_mb"] for s in result["sizes"]]
        result["peak_ratio_largest_over_smallest"] = round(peaks[-1] / peaks[0], 3)
        print(json.dumps(result, indent=1))
        return 0 if all(s["exit_status"] == 0 for s in result["sizes"]) else 1
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
