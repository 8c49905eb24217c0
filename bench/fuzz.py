"""Fuzz the decode path: mutated JPEG, PNG, GIF (animated too), WebP, TIFF and BMP files.

Every mutant (byte flips, truncation at many offsets, header fields set to extremes) goes through
the engine's decode path in-process (decode -> size -> pHash, as pipeline/stages run them). A file
may decode or be rejected, but nothing may raise: an exception out of the decode path is an abort.
Prints JSON: files tried, aborts (must be 0), outcomes per reason kind and per format.

    python bench/fuzz.py --n 50000 [--seed 0] [--max-pixels N]
    python bench/fuzz.py --tars 20000 [--seed 0] [--curate 1000]
    python bench/fuzz.py --look 3000 [--seed 0]

--look N fuzzes the person stage's second look: N mutants of three real photos of people (ultralytics' bus and
zidane, scikit-image's cameraman) through the person stage at min_score 0.9999, where no box passes, so every
mutant that still decodes and holds a box over 300 px is cropped and read by MoveNet. Nothing may raise; each
mutant ends with a decode error, or a full result with or without a look (pose score in [0, 1], box index valid).

--tars N fuzzes the containers instead (bench/fuzz_tars.py): N damaged shards of every kind read
with UnitReader: shards tried, aborts (must be 0), intact samples lost (must be 0), outcome kinds.
--curate M also runs M of them through one `humanset curate` call (exit status, seconds).

tests/pipeline/inputs/test_fuzz.py imports `seed_files` and `mutants` from here.
"""
from __future__ import annotations

import argparse
import io
import json
import random
import sys
import time
from collections import Counter


def seed_files() -> dict[str, bytes]:
    """Small valid files of every format and common variants (generated, deterministic)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:48, 0:64]
    rgb = np.stack([xx * 4, yy * 5, (xx + yy) * 2], -1).astype(np.uint8) + rng.integers(0, 20, (48, 64, 3), np.uint8)
    im = Image.fromarray(rgb)

    def save(img, fmt, **kw):
        b = io.BytesIO()
        img.save(b, fmt, **kw)
        return b.getvalue()

    exif = Image.Exif()
    exif[0x0112] = 6
    frames = [Image.fromarray(np.roll(rgb, 8 * i, axis=1)) for i in range(3)]
    pal = im.convert("P", palette=Image.ADAPTIVE, colors=16)
    pal.info["transparency"] = 0
    return {
        "jpeg": save(im, "JPEG", quality=85),
        "jpeg_progressive_exif": save(im, "JPEG", quality=80, progressive=True, exif=exif),
        "jpeg_cmyk": save(im.convert("CMYK"), "JPEG"),
        "png": save(im, "PNG"),
        "png_palette_alpha": save(pal, "PNG"),
        "png_16bit": save(Image.fromarray((rgb[..., 0].astype(np.uint16) * 257)), "PNG"),
        "gif": save(pal, "GIF"),
        "gif_animated": save(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0),
        "webp": save(im, "WEBP", quality=80),
        "webp_lossless": save(im, "WEBP", lossless=True),
        "webp_animated": save(frames[0], "WEBP", save_all=True, append_images=frames[1:], duration=50),
        "tiff": save(im, "TIFF"),
        "tiff_lzw": save(im, "TIFF", compression="tiff_lzw"),
        "bmp": save(im, "BMP"),
        "bmp_palette": save(pal.convert("P"), "BMP"),
    }


EXTREMES = (b"\x00", b"\xff", b"\x7f", b"\x80")


def _header_fields(name: str, data: bytes) -> list[tuple[int, int]]:
    """(offset, width) of header fields that hold sizes, counts and offsets, per format."""
    fields = [(i, 1) for i in range(min(len(data), 64))] + [(i, 2) for i in range(0, min(len(data), 64), 2)]
    if name.startswith("png"):
        fields += [(16, 4), (20, 4), (24, 1), (25, 1), (8, 4), (33, 4)]
    elif name.startswith("gif"):
        fields += [(6, 2), (8, 2), (10, 1)]
    elif name.startswith("bmp"):
        fields += [(2, 4), (10, 4), (14, 4), (18, 4), (22, 4), (28, 2), (30, 4), (46, 4)]
    elif name.startswith("jpeg"):
        for marker in (b"\xff\xc0", b"\xff\xc2", b"\xff\xc4", b"\xff\xda", b"\xff\xdb", b"\xff\xe1"):
            i = data.find(marker)
            if i >= 0:
                fields += [(i + 2, 2), (i + 5, 2), (i + 7, 2), (i + 9, 1)]
    elif name.startswith("tiff"):
        fields += [(4, 4)] + [(8 + 2 + 12 * k + j, w) for k in range(12) for j, w in ((2, 2), (4, 4), (8, 4))]
    elif name.startswith("webp"):
        fields += [(4, 4), (16, 4), (20, 4), (24, 4), (26, 2), (28, 2)]
    return [(o, w) for o, w in fields if o + w <= len(data)]


def mutants(n: int, seed: int = 0, seeds: dict[str, bytes] | None = None):
    """Yield (format name, mutation label, bytes): n mutants spread over the seed files."""
    rnd = random.Random(seed)
    seeds = seeds or seed_files()
    names = sorted(seeds)
    for i in range(n):
        name = names[i % len(names)]
        data = seeds[name]
        kind = (i // len(names)) % 3
        if kind == 0:  # byte flips
            d = bytearray(data)
            for _ in range(rnd.choice((1, 1, 2, 4, 16))):
                d[rnd.randrange(len(d))] = rnd.randrange(256)
            yield name, "flip", bytes(d)
        elif kind == 1:  # truncation: every offset of the header, then anywhere
            cut = (i // (3 * len(names))) if rnd.random() < 0.5 else rnd.randrange(len(data))
            yield name, "truncate", data[: min(cut, len(data) - 1)]
        else:  # a header field set to an extreme value
            off, width = rnd.choice(_header_fields(name, data))
            d = bytearray(data)
            d[off:off + width] = rnd.choice(EXTREMES) * width
            yield name, "extreme", bytes(d)


class DecodePath:
    """The engine's measure stages (decode, size, dedup's pHash), called the way run_stage does."""

    def __init__(self, max_pixels: int | None = None):
        from pipeline.config import load_config
        from pipeline.stages import stage_class
        cfg = load_config()
        dec = dict(cfg["decode"], **({"max_pixels": max_pixels} if max_pixels else {}))
        self.decode = stage_class("decode")(dec)
        self.size = stage_class("size")(cfg["size"])
        self.dedup = stage_class("dedup")(cfg["dedup"])

    def __call__(self, images: list[bytes]) -> list[str | None]:
        """Per file: None (decoded) or its reject kind. Raises only if the decode path is broken."""
        from pipeline.stages.decode import error_kind
        n = len(images)
        d = self.decode.measure({"image": images, "read_error": [None] * n, "sample_id": [None] * n})
        self.size.measure({"width": d["width"], "height": d["height"]})
        self.dedup.measure({"_thumb": d["_thumb"], "decode_error": d["decode_error"]})
        return [error_kind(e) if e else None for e in d["decode_error"]]


def run(n: int, seed: int = 0, max_pixels: int | None = None, batch: int = 64) -> dict:
    import warnings
    warnings.simplefilter("ignore")
    path = DecodePath(max_pixels)
    outcomes, per_format, aborts, examples = Counter(), Counter(), 0, []
    t0 = time.perf_counter()
    buf: list[tuple[str, str, bytes]] = []

    def flush():
        nonlocal aborts
        try:
            kinds = path([b for _, _, b in buf])
        except Exception as e:  # an abort: find the file(s) that raise, one by one
            kinds = []
            for name, how, b in buf:
                try:
                    kinds += path([b])
                except Exception as e1:
                    aborts += 1
                    kinds.append("ABORT")
                    if len(examples) < 10:
                        examples.append({"format": name, "mutation": how, "error": f"{type(e1).__name__}: {e1}",
                                         "bytes_hex": b[:256].hex()})
            del e
        for (name, _, _), k in zip(buf, kinds):
            outcomes[k or "decoded"] += 1
            per_format[name.split("_")[0], "decoded" if k is None else "rejected"] += 1
        buf.clear()

    for item in mutants(n, seed):
        buf.append(item)
        if len(buf) >= batch:
            flush()
    if buf:
        flush()
    fmt: dict[str, dict] = {}
    for (name, result), c in sorted(per_format.items()):
        fmt.setdefault(name, {})[result] = c
    return {"files_tried": n, "aborts": aborts, "outcomes": dict(outcomes.most_common()), "per_format": fmt,
            "seconds": round(time.perf_counter() - t0, 2), "abort_examples": examples}


def look_seeds() -> dict[str, bytes]:
    """Three real photos of people, each named by its format for mutants()."""
    import importlib.util
    from importlib import resources
    from pathlib import Path
    assets = Path(list(importlib.util.find_spec("ultralytics").submodule_search_locations)[0]) / "assets"
    return {"jpeg_bus": (assets / "bus.jpg").read_bytes(), "jpeg_zidane": (assets / "zidane.jpg").read_bytes(),
            "png_camera": (resources.files("skimage") / "data" / "camera.png").read_bytes()}


def run_look(n: int, seed: int = 0, batch: int = 16) -> dict:
    """n mutants of look_seeds() through PersonStage.measure with no box passing: outcome counts, and the
    mutants that raised or whose row is incomplete (aborts, bad rows: both must be 0)."""
    import warnings
    from pipeline.config import load_config
    from pipeline.stages import stage_class
    from pipeline.stages.decode import error_kind
    from pipeline.inputs.images import probe
    warnings.simplefilter("ignore")
    stage = stage_class("person")(load_config()["person"] | {"min_score": 0.9999})
    stage.setup()
    outcomes, aborts, bad, t0 = Counter(), [], [], time.perf_counter()
    items = list(mutants(n, seed, look_seeds()))
    for k in range(0, n, batch):
        chunk = items[k:k + batch]
        b: dict[str, list] = {c: [] for c in ("sample_id", "image", "width", "height", "exif_orientation", "format")}
        for i, (_, _, data) in enumerate(chunk):
            try:
                info = probe(data)
            except Exception:
                info = dict.fromkeys(("width", "height", "exif_orientation", "format"))
            b["sample_id"].append(str(k + i))
            b["image"].append(data)
            for c in ("width", "height", "exif_orientation", "format"):
                b[c].append(info[c])
        try:
            out = stage.measure(b)
        except Exception as e:
            aborts.append({"batch": k, "error": f"{type(e).__name__}: {e}"})
            continue
        for i, (name, how, _) in enumerate(chunk):
            err, j, pose = out["person_error"][i], out["person_look_box"][i], out["person_look_score"][i]
            if err:
                outcomes[f"{err.split(':')[0]}: {error_kind(err.split(': ', 1)[-1])}"] += 1
            elif out["person_score_calibrated"][i] is None or out["person_n_pass"][i] is None:
                bad.append({"mutant": k + i, "format": name, "mutation": how, "why": "no result and no error"})
            elif j is None:
                outcomes["no look"] += 1
            elif not (0 <= j < len(out["person_boxes"][i]) and 0.0 <= pose <= 1.0):
                bad.append({"mutant": k + i, "format": name, "mutation": how, "why": f"look box {j}, score {pose}"})
            else:
                outcomes["look"] += 1
    return {"files_tried": n, "aborts": len(aborts), "bad_rows": len(bad), "outcomes": dict(outcomes.most_common()),
            "seconds": round(time.perf_counter() - t0, 1), "examples": (aborts + bad)[:10]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=50_000, help="mutated files (default 50000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-pixels", type=int, default=None, help="decode.max_pixels (default: the config's)")
    ap.add_argument("--tars", type=int, default=None, metavar="N", help="fuzz N damaged shards through the reader")
    ap.add_argument("--curate", type=int, default=0, metavar="M",
                    help="with --tars: also curate M damaged shards in one `humanset curate` run")
    ap.add_argument("--look", type=int, default=None, metavar="N", help="fuzz the person stage's second look")
    args = ap.parse_args()
    if args.look is not None:
        result = run_look(args.look, args.seed)
        print(json.dumps(result, indent=2))
        return 1 if result["aborts"] or result["bad_rows"] else 0
    if args.tars is not None:
        result = run_tars(args.tars, args.seed, args.curate)
        print(json.dumps(result, indent=2))
        return 1 if result["aborts"] or result["intact_samples_lost"] or result.get("curate", {}).get("exit", 0) else 0
    result = run(args.n, args.seed, args.max_pixels)
    print(json.dumps(result, indent=2))
    return 1 if result["aborts"] else 0


def _fuzz_tars():
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("bench_fuzz_tars", Path(__file__).with_name("fuzz_tars.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_fuzz_tars"] = mod
    spec.loader.exec_module(mod)
    return mod


def run_tars(n: int, seed: int = 0, curate: int = 0) -> dict:
    """The container fuzz: n damaged shards through UnitReader, optionally `curate` of them through the CLI."""
    import os
    import subprocess
    import tempfile
    from pathlib import Path
    ft = _fuzz_tars()
    result = ft.run(n, seed)
    if curate:
        with tempfile.TemporaryDirectory() as d:
            crawl = Path(d) / "crawl"
            crawl.mkdir()
            for i, case in enumerate(ft.cases(curate, seed + 1)):
                ft.write_case(case, crawl, f"{i:05d}-{case.damage}")
            root = Path(__file__).resolve().parents[1]
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "humanset.cli", "curate", "--input", str(crawl), "--output",
                                str(Path(d) / "run"), "--set", "stages=[decode,size,dedup]", "--set",
                                "size.min_short_side=1"], cwd=d, capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": str(root)})
            kinds = Counter()
            for m in (Path(d) / "run" / "stats").glob("*.json"):
                marker = json.loads(m.read_text())
                kinds[marker.get("unit_error_kind") or "ok"] += 1
            result["curate"] = {"shards": curate, "exit": p.returncode, "seconds": round(time.perf_counter() - t0, 1),
                                "markers": sum(kinds.values()), "outcomes": dict(kinds.most_common()),
                                "stderr_tail": p.stderr[-500:] if p.returncode else ""}
    return result


if __name__ == "__main__":
    sys.exit(main())
