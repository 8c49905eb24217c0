"""Experiment: a tiny CNN on the downscaled image as extra watermark evidence (research/notes/watermark.md,
"Tile classifier (tried)"). Prints one JSON object.

Trained ONLY on generated tune-family marks (pipeline/stages/watermark/marks.py: tune photos, DejaVu fonts, tune
strings) over the tune photos plus other shipped backgrounds that are not eval photos (scikit-learn's
china and flower; scikit-image's text, page and moon). Seeded, so a rerun gives the same weights on
the same torch build. The image is resized to SIZE x SIZE (RGB); five 3x3 convolutions (four of
stride 2, batch norm, ReLU) give a 16 x 16 map of 32 features, one cell per tile of 16 px; a 1 x 1
convolution gives each tile a logit. It is taught per tile (BCE; a tile is marked where the mark's
pixels, marks.mark_mask, cover >= 5 % of it), and an image's tile score is the mean probability of
its 3 most mark-like tiles. 24,801 parameters (~110 KB as a state dict).

The evaluation combines the tile score as its own noisy-OR term with the OCR rule's stored evidence
(the rows `bench/watermark.py --rows` writes): score = 1 - (1 - ocr_score) * (1 - W * tile), W
chosen on the tune family's bench set (seed 1, which the training, seeds 1000+, never drew) as the
largest recall with <= 5 % of clean photos rejected, then measured once on the eval family.

usage: python research/watermark/tile.py [--tune-rows T.jsonl] [--eval-rows E.jsonl] [--n-train 2000] [--epochs 12]
                               [--cache FILE.npz] [--save FILE.pt | --load FILE.pt]
  (T, E: `python bench/watermark.py --family tune|eval --no-own --rows T|E.jsonl`)

Result (2026-12-01, research/notes/watermark.md "Tile classifier (tried)"): tile ROC AUC 0.78 on the tune bench
set but 0.54 on eval, where it scores nearly every photo, clean or marked, near 1; at the W chosen on
tune (0.8) eval recall at opacity >= 0.2 rose 0.43 -> 0.73 only by rejecting 8 of 60 clean photos and
8 of 22 scene-text photos. Not wired in.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pipeline.stages.watermark import marks  # noqa: E402

SIZE = 256
TRAIN_SEED = 1000
TOPK = 3
GRID = 16  # tiles per side: SIZE / 16 px each
WS = (0.0, 0.3, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95)


def extra_backgrounds() -> dict[str, Image.Image]:
    """Shipped photos that are in neither family (never an eval photo): negatives and mark backgrounds."""
    import importlib.util

    out = {}
    for pkg, sub, name in (("sklearn", "datasets/images", "china.jpg"), ("sklearn", "datasets/images", "flower.jpg"),
                           ("skimage", "data", "text.png"), ("skimage", "data", "page.png"),
                           ("skimage", "data", "moon.png")):
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            continue
        f = Path(list(spec.submodule_search_locations)[0]) / sub / name
        if f.is_file():
            out["x_" + f.stem] = Image.open(f).convert("RGB")
    for n in out:
        assert n[2:] not in {p[2].rsplit(".", 1)[0] for p in marks.PHOTOS["eval"]}
    return out


def to_input(data: bytes) -> np.ndarray:
    """JPEG/PNG bytes -> SIZE x SIZE x 3 uint8 (JPEG decoded at a reduced scale where it can)."""
    im = Image.open(io.BytesIO(data))
    im.draft("RGB", (SIZE, SIZE))
    return np.asarray(im.convert("RGB").resize((SIZE, SIZE), Image.BILINEAR))


def make_train(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n images (every other one marked, kinds in turn), their labels, and per tile (GRID x GRID) the
    fraction of the tile the mark touches: the tiles are what the net is taught on."""
    rng = np.random.default_rng(seed)
    base = {**marks.family_photos("tune"), **extra_backgrounds()}
    names = sorted(base)
    X = np.zeros((n, SIZE, SIZE, 3), np.uint8)
    y = np.zeros(n, np.float32)
    M = np.zeros((n, GRID, GRID), np.float32)
    for i in range(n):
        name = names[int(rng.integers(0, len(names)))]
        im = marks.clean_view(base[name], rng) if rng.random() < 0.7 else base[name]
        if max(im.size) > 384:  # draw at a moderate size: the input is SIZE px anyway
            f = 384 / max(im.size)
            im = im.resize((max(1, int(im.width * f)), max(1, int(im.height * f))), Image.BICUBIC)
        if i % 2 == 0:
            spec = marks.sample_spec(rng, marks.KINDS[(i // 2) % 3], "tune")
            X[i] = to_input(marks.jpeg(marks.draw_mark(im, spec), spec.jpeg_quality))
            y[i] = 1.0
            mask = Image.fromarray(marks.mark_mask(im.size, spec).astype(np.uint8) * 255)
            M[i] = np.asarray(mask.resize((GRID, GRID), Image.BOX), np.float32) / 255.0
        else:
            X[i] = to_input(marks.jpeg(im, int(rng.integers(60, 96))))
    return X, y, M


def build_net(in_channels: int = 3):
    import torch.nn as nn

    class TileNet(nn.Module):
        def __init__(self):
            super().__init__()
            ch = [in_channels, 8, 16, 32, 32, 32]
            layers = []
            for i in range(5):
                layers += [nn.Conv2d(ch[i], ch[i + 1], 3, stride=2 if i < 4 else 1, padding=1),
                           nn.BatchNorm2d(ch[i + 1]), nn.ReLU()]
            self.body = nn.Sequential(*layers)
            self.head = nn.Conv2d(32, 1, 1)

        def forward(self, x):
            """Per-tile logits, N x GRID x GRID."""
            return self.head(self.body(x)).squeeze(1)

    return TileNet()


def prep(X: np.ndarray):
    import torch

    return torch.from_numpy(np.ascontiguousarray(X)).permute(0, 3, 1, 2).float().div_(255.0).sub_(0.5)


def image_score(logits):
    """An image's tile score: the mean probability of its TOPK most mark-like tiles."""
    import torch

    return torch.sigmoid(logits.flatten(1)).topk(TOPK, 1).values.mean(1)


def train(X, M, epochs: int, seed: int):
    """Per-tile BCE: a tile is marked where the mark touches >= 5 % of it (tiles it barely touches count not)."""
    import torch

    torch.manual_seed(seed)
    net = build_net()
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=epochs * ((len(X) + 31) // 32))
    rng = np.random.default_rng(seed)
    yt = torch.from_numpy(M)
    wt = torch.where((yt > 0) & (yt < 0.05), 0.0, 1.0)  # tiles the mark barely touches: no loss
    for ep in range(epochs):
        order = rng.permutation(len(X))
        tot = 0.0
        for s in range(0, len(X), 32):
            idx = order[s:s + 32]
            xb = prep(X[idx])
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                net(xb), (yt[idx] >= 0.05).float(), weight=wt[idx], pos_weight=torch.tensor(3.0))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            tot += float(loss.detach()) * len(idx)
        print(f"epoch {ep + 1}/{epochs} loss {tot / len(X):.4f}", file=sys.stderr, flush=True)
    return net


def tile_scores(net, images: list[bytes], make_input=None, make_batch=None) -> tuple[np.ndarray, float]:
    """Sigmoid scores and CPU seconds per image (decode to SIZE + forward, one image at a time, 1 thread);
    make_input / make_batch: another input (research/watermark/tile2.py), else this file's to_input / prep."""
    import torch

    make_input, make_batch = make_input or to_input, make_batch or prep
    out = []
    c0 = time.process_time()
    with torch.no_grad():
        for b in images:
            out.append(float(image_score(net(make_batch(make_input(b)[None])))[0]))
    return np.array(out), (time.process_time() - c0) / max(1, len(images))


def cached_arrays(path: str | None, names: tuple[str, ...], make) -> tuple:
    """The arrays `names` from the .npz at `path` when it exists, else make()'s (saved there if a path is given)."""
    cache = Path(path) if path else None
    if cache and cache.is_file():
        z = np.load(cache)
        return tuple(z[n] for n in names)
    arrays = make()
    if cache:
        np.savez(cache, **dict(zip(names, arrays)))
    return arrays


def load_rows(path: str) -> list[dict]:
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]


def figures(rows, ocr, tile, w, cut=0.8) -> dict:
    lab = np.array([r["label"] for r in rows])
    op = np.array([r["opacity"] if r["opacity"] is not None else 0.0 for r in rows])
    scene = np.array([r["photo"] in marks.SCENE_TEXT for r in rows]) & (lab == 0)
    comb = 1 - (1 - ocr) * (1 - w * tile)
    f = comb > cut
    hi = (lab == 1) & (op >= 0.2)
    out = {"w": w, "recall_opacity_ge_0.2": round(float(f[hi].mean()), 3),
           "clean_rejected": f"{int(f[lab == 0].sum())}/{int((lab == 0).sum())}",
           "clean_rejected_frac": round(float(f[lab == 0].mean()), 4),
           "scene_text_rejected": f"{int(f[scene].sum())}/{int(scene.sum())}",
           "by_kind": {k: round(float(f[hi & np.array([r['kind'] == k for r in rows])].mean()), 3) for k in marks.KINDS}}
    return out


def auc(pos, neg):
    p, q = np.asarray(pos)[:, None], np.asarray(neg)[None, :]
    return float(((p > q).sum() + 0.5 * (p == q).sum()) / (p.size * q.size))


def family_images(family: str) -> list[bytes]:
    """The bench set's images, rebuilt exactly as bench/watermark.py draws them (same seed)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_watermark", ROOT / "bench" / "watermark.py")
    bw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bw)
    return [r["image"] for r in bw.build_set(family, 180, 60, marks.SEEDS[family])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tune-rows", default=None)
    ap.add_argument("--eval-rows", default=None)
    ap.add_argument("--n-train", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--save", default=None)
    ap.add_argument("--load", default=None)
    ap.add_argument("--cache", default=None, help="keep the generated training set in this .npz (reruns skip drawing)")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(2)
    res = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "load_avg": [round(x, 2) for x in os.getloadavg()],
           "size": SIZE, "n_train": None if a.load else a.n_train, "epochs": None if a.load else a.epochs,
           "weights": a.load}
    if a.load:
        net = build_net()
        net.load_state_dict(torch.load(a.load, weights_only=True))
    else:
        t0 = time.perf_counter()
        X, y, M = cached_arrays(a.cache, ("X", "y", "M"), lambda: make_train(a.n_train, TRAIN_SEED))
        res["gen_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        net = train(X, M, a.epochs, TRAIN_SEED)
        res["train_s"] = round(time.perf_counter() - t0, 1)
        del X
    net.eval()
    res["params"] = int(sum(p.numel() for p in net.parameters()))
    if a.save:
        torch.save(net.state_dict(), a.save)
    torch.set_num_threads(1)
    for fam, path in (("tune", a.tune_rows), ("eval", a.eval_rows)):
        if not path:
            continue
        rows = load_rows(path)
        tile, cpu = tile_scores(net, family_images(fam))
        ocr = np.array([r["watermark_score"] or 0.0 for r in rows])
        lab = np.array([r["label"] for r in rows])
        d = {"tile_auc": round(auc(tile[lab == 1], tile[lab == 0]), 3), "tile_cpu_ms_per_image": round(1000 * cpu, 2),
             "clean_tile_max": round(float(tile[lab == 0].max()), 3),
             "scene_tile": [round(float(t), 3) for t, r in zip(tile, rows) if r["label"] == 0 and r["photo"] in marks.SCENE_TEXT][:22],
             "ocr_only": figures(rows, ocr, tile, 0.0),
             "combined": [figures(rows, ocr, tile, w) for w in WS]}
        if fam == "tune":  # W: the largest tune recall with <= 5 % of tune clean photos rejected (the issue's
            # bound; ties: the smaller W), fixed before the eval family is scored
            ok = [c for c in d["combined"] if c["clean_rejected_frac"] <= 0.05]
            res["chosen_w"] = max(ok, key=lambda c: (c["recall_opacity_ge_0.2"], -c["w"]))["w"] if ok else 0.0
        d["at_chosen_w"] = figures(rows, ocr, tile, res.get("chosen_w", 0.0))
        res[fam] = d
        np.save(Path(path).with_suffix(".tile.npy"), tile)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
