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


def with_person_verdict(samples: list[dict], passes: dict[str, bool]) -> list[dict]:
    """A run's samples (bench/quality.py's read_samples) with the person stage's verdict replaced by `passes` (id ->
    passes) and every other stage's kept: the cascade's keep, for quality.compare against the run."""
    return [dict(s, keep=passes[s["id"]] and not [r for r in s["reject_reasons"] if r.split(":")[0] != "person"])
            for s in samples]


def shipped_person_stage():
    """The person stage as the default config sets it up, and that config's person section."""
    from pipeline.config import load_config
    from pipeline.stages.person import PersonStage

    cfg = load_config()["person"]
    stage = PersonStage(cfg)
    stage.setup()
    return stage, cfg


def person_look_rows(run: Path, labels_csv: Path):
    """The rows a second look at the person box is judged on: the shipped calibration's training rows of a tune run
    (role "row": each labelled image's top box over the size rule, person_clear = 1) and painted_person's rows
    (role "painted": scored, never trained on), each with its box in judged pixels and the shipped calibrated
    probability. Also: sample id -> (image file, resolution_scale), the bench's labels by id, package by id."""
    from catalog import connect
    from pipeline.select.calibrate import _run_config, read_labels
    from pipeline.stages.person_calibration import box_features, load_calibration

    person = read_labels(labels_csv)["person"]
    bench = {r["id"]: r for r in csv.DictReader(open(ROOT / "bench/quality/labels.csv", newline=""))}
    package = {r["id"]: r["package"] for r in csv.DictReader(open(ROOT / "bench/quality/images.csv", newline=""))}
    meta = {sid: (Path(str(uri)), sc or 1.0) for sid, uri, sc in connect(run).execute(
        "SELECT sample_id, source_uri, resolution_scale FROM samples").fetchall()}
    shipped = load_calibration()
    painted = {sid: 0 for sid, (path, _) in meta.items()
               if bench.get(path.stem, {}).get("category") == "painted_person"}
    rows, cfg = [], _run_config(run)
    for role, labels in (("row", person), ("painted", painted)):
        for sid, score, box, k in person_training_rows(run, labels, cfg):
            rows.append(dict(sid=sid, id=meta[sid][0].stem, y=labels[sid], box=box, role=role,
                             shipped=shipped.probability(list(box_features(score, box, k, shipped.box_ref_px)))))
    return rows, meta, bench, package


def look_rows(run: Path, labels_csv: Path):
    """person_look_rows of a run plus a row ("extra", label 0) for every other sample with a box over the size rule,
    with the same returns: the rows a second look at the person box is judged on."""
    from pipeline.select.calibrate import _run_config
    from pipeline.stages.person_calibration import box_features, load_calibration

    rows, meta, bench, package = person_look_rows(run, labels_csv)
    shipped, have = load_calibration(), {r["sid"] for r in rows}
    for sid, score, box, k in person_training_rows(run, {sid: 0 for sid in meta if sid not in have}, _run_config(run)):
        rows.append(dict(sid=sid, id=meta[sid][0].stem, y=0, box=box, role="extra",
                         shipped=shipped.probability(list(box_features(score, box, k, shipped.box_ref_px)))))
    return rows, meta, bench, package


def box_crops(rows: list[dict], meta: dict, decode: int = 1024) -> list:
    """Each row's box cropped as the person stage's second look crops it (pipeline/stages/person_look.region), from
    its image decoded at longer side `decode` (each image decoded once; rows of one image are adjacent)."""
    from pipeline.inputs.images import load_rgb
    from pipeline.stages.person_look import region

    x, decoded = [], {}
    for r in rows:
        path, judged = meta[r["sid"]]
        if r["sid"] not in decoded:
            decoded = {r["sid"]: load_rgb(path.read_bytes(), max_side=decode)}
        rgb, scale = decoded[r["sid"]]
        x.append(region(rgb, r["box"], scale / judged))
    return x


def person_training_rows(run: Path, labels: dict[str, int], cfg: dict) -> list[tuple]:
    """(sample_id, raw score, box in judged pixels, keypoints) of each labelled sample's box with the highest raw
    score among those passing the box rule (pipeline/select/person_fit.training_boxes, the shipped fit's rows)."""
    from pipeline.select.person_fit import training_boxes

    return [(sid, score, box, kpts) for sid, _, score, box, kpts, _ in training_boxes(run, labels, cfg)]


def held_out_logistic(X, y, groups, train=None, c_grid=(0.1, 1.0, 10.0)):
    """Each row's P(y = 1) from a logistic fit that saw no row of its group (package), fitted on the train rows
    only; C from c_grid by the held-out log loss of the train rows. Returns (P, C, {C: log loss})."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from pipeline.select.person_fit import log_losses

    train = np.ones(len(y), bool) if train is None else train
    probs, loss = {}, {}
    for c in c_grid:
        p = np.zeros(len(y))
        for g in np.unique(groups):
            out = groups == g
            fit = ~out & train
            p[out] = LogisticRegression(C=c, max_iter=2000).fit(X[fit], y[fit]).predict_proba(X[out])[:, 1]
        probs[c], loss[c] = p, float(log_losses(p[train], y[train]).mean())
    c = min(loss, key=loss.get)
    return probs[c], c, loss
