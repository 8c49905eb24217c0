"""Benchmark `humanset train-filter`: training time, validation on held-out generator families, real
images, stage throughput, generator speed and a GPU estimate. Prints JSON.

    python bench/train_filters.py --out /tmp/bf                                         # demo scale (64 px)
    python bench/train_filters.py --out /tmp/bf --input-px 128 --steps 400 --encoder PT/encoder.pth
    python bench/train_filters.py --out /tmp/bf --steps 5 --val-samples 16 --model micro   # smoke test

Clean photos default to the ones shipped in installed packages (scikit-image, ultralytics, matplotlib);
--images takes a curation run instead. Real images (named in the output with their package):
- watermark: the shipped photos are real negatives; as positives the same photos carry the demo crawl's
  tiled watermark (pipeline/demo/crawl.py with_watermark: Pillow's default font, a generator the filter never
  saw). No real watermarked photo ships in any installed package.
- art: the shipped photos are real photos; the real non-photos found are scikit-image's logo, horse
  (silhouette), page (scanned text), text, phantom and color, and matplotlib's logo2 and
  Minduka_Present_Blue_Pack (a vector illustration). No painting ships in any installed package.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PHOTOS = {"skimage": ("data", ["astronaut.png", "camera.png", "coffee.png", "chelsea.png", "rocket.jpg",
                               "motorcycle_left.png", "hubble_deep_field.jpg", "brick.png", "grass.png",
                               "gravel.png", "coins.png", "moon.png", "retina.jpg"]),
          "ultralytics": ("assets", ["bus.jpg", "zidane.jpg"]),
          "matplotlib": ("mpl-data/sample_data", ["grace_hopper.jpg"])}
NON_PHOTOS = {"skimage": ("data", ["logo.png", "horse.png", "page.png", "text.png", "phantom.png", "color.png"]),
              "matplotlib": ("mpl-data/sample_data", ["logo2.png", "Minduka_Present_Blue_Pack.png"])}


def package_files(table: dict) -> dict[str, bytes]:
    """'package/file' -> bytes, found without importing the packages."""
    out = {}
    for pkg, (sub, names) in table.items():
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(list(spec.submodule_search_locations)[0]) / sub
        for n in names:
            if (root / n).is_file():
                out[f"{pkg}/{n}"] = (root / n).read_bytes()
    return out


def score(stage, images: dict[str, bytes], column: str) -> dict[str, float]:
    names = list(images)
    res = stage.measure({"sample_id": names, "image": [images[n] for n in names]})
    return {n: s for n, s in zip(names, res[column]) if s is not None}


def throughput(stage, images: list[bytes], n: int, batch: int) -> float:
    data = [images[i % len(images)] for i in range(n)]
    stage.measure({"sample_id": ["w"] * batch, "image": data[:batch]})  # warm-up
    t0 = time.perf_counter()
    for i in range(0, n, batch):
        chunk = data[i:i + batch]
        stage.measure({"sample_id": ["x"] * len(chunk), "image": chunk})
    return n / (time.perf_counter() - t0)


def forward_flops(kw: dict) -> int:
    """Multiply-adds x 2 of the classifier at its input size (patch embedding, blocks, head)."""
    from training.flops import block_macs

    size = kw["img_size"] if isinstance(kw["img_size"], int) else kw["img_size"][0]
    n = (size // kw["patch_size"]) ** 2
    w, mlp = kw["embed_dim"], int(round(kw["mlp_ratio"] * kw["embed_dim"]))
    macs = n * 3 * kw["patch_size"] ** 2 * w + kw["depth"] * block_macs(n + 1, w, mlp) + w * kw["num_classes"]
    return 2 * macs


def generator_rate(task: str, photos: list[np.ndarray], gen_px: int, input_px: int, n: int = 32) -> float:
    from training.filters.samples import DEFAULT_HOLDOUT, FilterSamples, FilterSpec
    from training.filters.overlays import GeneratorSettings

    data = FilterSamples(FilterSpec(task, DEFAULT_HOLDOUT[task]), photos, input_px, 0, GeneratorSettings(gen_px=gen_px))
    t0 = time.perf_counter()
    for k in range(n):
        data.sample(k)
    return n / (time.perf_counter() - t0)


def bench_filter(task: str, args, images: str, photos_real: dict, non_photos: dict) -> dict:
    from pipeline.demo.crawl import with_watermark
    from pipeline.stages.art import ArtStage
    from pipeline.stages.watermark.stage import WatermarkStage
    from PIL import Image
    from training.filters.train import FilterConfig, train_filter
    from training.filters.thresholds import at_threshold, roc_auc
    from training.filters.inputs import read_photos

    out = Path(args.out) / task
    if out.exists():
        shutil.rmtree(out)
    cfg = FilterConfig(filter=task, images=images, renders=args.renders if task == "art" else "", output=str(out),
                       encoder=args.encoder or "", model=args.model, input_px=args.input_px,
                       gen_px=args.gen_px or 2 * args.input_px, batch_size=args.batch_size, steps=args.steps,
                       lr=args.lr, warmup_steps=max(1, args.steps // 10), val_samples=args.val_samples,
                       loader_workers=args.loader_workers, cpu_threads=args.threads, checkpoint_every=args.steps,
                       progress=False, max_images=args.max_images, html_pages=args.html_pages)
    card = train_filter(cfg)
    thr = card["threshold"]["score"]
    stage_cfg = {"weights": str(out), "resources": {"num_cpus": args.threads}}
    if task == "watermark":
        stage = WatermarkStage(stage_cfg)
        stage.setup()
        clean = score(stage, photos_real, "watermark_score")
        marked = {}
        for name, data in photos_real.items():
            buf = io.BytesIO()
            with_watermark(Image.open(io.BytesIO(data)).convert("RGB")).save(buf, "JPEG", quality=90)
            marked[name + "+demo_watermark"] = buf.getvalue()
        marked_s = score(stage, marked, "watermark_score")
        s = np.array(list(clean.values()) + list(marked_s.values()))
        y = np.array([False] * len(clean) + [True] * len(marked_s))
        real = {"negatives": sorted(clean), "positives": "the same photos + pipeline/demo/crawl.py with_watermark",
                "roc_auc": roc_auc(s, y), "at_threshold": at_threshold(s, y, thr),
                "false_positive_rate_on_photos": float(np.mean(np.array(list(clean.values())) > thr)),
                "scores": {**clean, **marked_s}}
    else:
        stage = ArtStage(stage_cfg)
        stage.setup()
        ph, nph = score(stage, photos_real, "art_score"), score(stage, non_photos, "art_score")
        labels = stage.measure({"sample_id": list(non_photos), "image": list(non_photos.values())})["art_label"]
        s = np.array(list(ph.values()) + list(nph.values()))
        y = np.array([False] * len(ph) + [True] * len(nph))
        real = {"photos": sorted(ph), "non_photos": sorted(nph), "roc_auc": roc_auc(s, y),
                "at_threshold": at_threshold(s, y, thr), "scores": {**ph, **nph},
                "labels_of_non_photos": dict(zip(non_photos, labels)),
                "paintings": "none ship in the installed packages"}
    ips = throughput(stage, list(photos_real.values()), args.throughput_images, 16)
    photos = read_photos(images, 16, int(cfg.generator_px * 1.5))
    fwd = forward_flops(card["architecture"]["kwargs"])
    train_flops = 3 * fwd * cfg.steps * cfg.batch_size
    gen_rate = generator_rate(task, photos, cfg.generator_px, cfg.input_px)
    v = card["validation"]
    return {
        "filter": task, "input_px": cfg.input_px, "model": card["architecture"]["kwargs"], "steps": cfg.steps,
        "batch_size": cfg.batch_size, "encoder": card["training"]["encoder"], "random_init": card["training"]["random_init"],
        "train_seconds": card["training"]["train_seconds"], "total_seconds": card["training"]["total_seconds"],
        "html_screenshots": card["generator"]["html_screenshots"],  # render_seconds: the Chromium pool, once per run
        "threshold": card["threshold"],
        "heldout": {"families": card["generator"]["holdout"], "roc_auc": v["heldout"]["roc_auc"],
                    **{k: v["heldout"]["at_threshold"][k] for k in ("precision", "recall")},
                    "per_family": v["heldout"]["families"]},
        "seen": {"roc_auc": v["seen"]["roc_auc"], **{k: v["seen"]["at_threshold"][k] for k in ("precision", "recall")}},
        "real": real,
        "stage_images_per_s": ips, "stage_threads": args.threads,
        "generator_samples_per_s_one_core": gen_rate,  # without the html family (a crop of a rendered page)
        "flops": {"forward_per_image": fwd, "training_total": train_flops,
                  "gpu_estimate_s": {"a100_bf16_40pct_mfu": train_flops / (0.4 * 312e12),
                                     "h100_bf16_40pct_mfu": train_flops / (0.4 * 989e12)},
                  "gpu_note": "model compute only; the CPU generators must feed "
                              f"{cfg.batch_size * cfg.steps} samples: at the measured one-core rate that is "
                              f"{cfg.batch_size * cfg.steps / gen_rate:.0f} core-seconds, the real bound on a GPU"},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="scratch folder for the trained filters")
    ap.add_argument("--images", help="clean photos (a curation run, shards, or image files); default: shipped photos")
    ap.add_argument("--renders", default="", help="art: a render run (the '3d render' class)")
    ap.add_argument("--encoder", help="MAE encoder export; default: random initialisation")
    ap.add_argument("--filters", default="watermark,art")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--input-px", type=int, default=64)
    ap.add_argument("--gen-px", type=int, default=0)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--val-samples", type=int, default=256)
    ap.add_argument("--max-images", type=int, default=1000)
    ap.add_argument("--html-pages", type=int, default=32, help="art: HTML pages Chromium renders (0 = none)")
    ap.add_argument("--loader-workers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="torch threads for training and the stage")
    ap.add_argument("--throughput-images", type=int, default=64)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import torch
    torch.set_num_threads(args.threads)
    photos_real = package_files(PHOTOS)
    non_photos = package_files(NON_PHOTOS)
    tmp = None
    images = args.images
    if not images:
        tmp = tempfile.mkdtemp(prefix="bench-filters-")
        for name, data in photos_real.items():
            (Path(tmp) / name.replace("/", "__")).write_bytes(data)
        images = tmp
    try:
        with contextlib.redirect_stdout(sys.stderr):  # the run log's progress lines: stdout stays JSON only
            results = [bench_filter(t, args, images, photos_real, non_photos) for t in args.filters.split(",")]
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"bench": "train_filters", "cpu_count": os.cpu_count(), "threads": args.threads,
                      "images": args.images or "shipped photos", "results": results}, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
