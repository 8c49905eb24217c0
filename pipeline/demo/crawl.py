"""Demo crawl: real photos that ship inside installed packages, generated variants and bad files.

Nothing is downloaded. Photos of people: ultralytics' bus.jpg and zidane.jpg, scikit-image's
astronaut and camera; without people: coffee, chelsea, rocket, motorcycle, hubble, page (text).
The same generators feed the tests and the benchmark.
"""
from __future__ import annotations

import io
import json
import logging
import struct
import tarfile
import zlib
import importlib.util
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

log = logging.getLogger("humanset.demo")

SKIMAGE_PHOTOS = ["astronaut.png", "camera.png", "coffee.png", "chelsea.png", "rocket.jpg",
                  "motorcycle_left.png", "hubble_deep_field.jpg", "page.png"]
ULTRALYTICS_PHOTOS = ["bus.jpg", "zidane.jpg"]


def shipped_photos() -> dict[str, bytes]:
    """name -> original bytes of the photos shipped in installed packages (those that are installed)."""
    out = {}
    for pkg, sub, names in (("ultralytics", "assets", ULTRALYTICS_PHOTOS), ("skimage", "data", SKIMAGE_PHOTOS)):
        # located without importing: importing ultralytics patches PIL's opener
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            log.warning("package %s not installed: its demo photos are left out", pkg)
            continue
        root = Path(list(spec.submodule_search_locations)[0]) / sub
        for n in names:
            f = root / n
            if f.is_file():
                out[Path(n).stem] = f.read_bytes()
    if not out:
        raise RuntimeError("no shipped photos found: install scikit-image (and ultralytics)")
    return out


def encode(im: Image.Image, fmt: str = "JPEG", **kw) -> bytes:
    b = io.BytesIO()
    if fmt == "JPEG" and im.mode not in ("RGB", "L", "CMYK"):
        im = im.convert("RGB")
    im.save(b, fmt, **kw)
    return b.getvalue()


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # older Pillow
        return ImageFont.load_default()


def with_caption(im: Image.Image, text: str = "BIG SALE TODAY 50% OFF") -> Image.Image:
    """A meme-style overlaid caption: white bands of large text over the photo."""
    im = im.convert("RGB").copy()
    d = ImageDraw.Draw(im)
    size = max(16, im.height // 9)
    for y in (im.height // 12, im.height - im.height // 12 - size):
        d.rectangle([0, y - size // 6, im.width, y + size + size // 6], fill=(255, 255, 255))
        d.text((im.width // 20, y), text, fill=(0, 0, 0), font=_font(size))
    return im


def with_watermark(im: Image.Image, text: str = "(c) stockphoto") -> Image.Image:
    """A semi-transparent tiled watermark."""
    im = im.convert("RGBA")
    layer = Image.new("RGBA", im.size, (0, 0, 0, 0))
    d = ImageDraw.Draw(layer)
    size = max(14, im.width // 14)
    for y in range(0, im.height, size * 3):
        for x in range(-size * 4, im.width, size * 8):
            d.text((x + (y // 3) % (size * 4), y), text, fill=(255, 255, 255, 110), font=_font(size))
    return Image.alpha_composite(im, layer).convert("RGB")


def with_corner_mark(im: Image.Image, text: str = "© 2024 www.demo-stock.com") -> Image.Image:
    """A photographer's line at 60 % opacity in the bottom-right corner (small: the text stage keeps it)."""
    from pipeline.stages.watermark.marks import MarkSpec, draw_mark, family_fonts
    spec = MarkSpec(kind="corner", text=text, font=family_fonts("eval")[0], size_rel=0.04, opacity=0.6,
                    colour=(255, 255, 255), shadow=True, angle=0.0, corner="br", jpeg_quality=90)
    return draw_mark(im, spec)


def flat_graphic(w: int = 800, h: int = 600, seed: int = 0) -> Image.Image:
    """A flat synthetic graphic (shapes on a plain background): not a photo of a person."""
    rng = np.random.default_rng(seed)
    im = Image.new("RGB", (w, h), tuple(int(c) for c in rng.integers(0, 255, 3)))
    d = ImageDraw.Draw(im)
    for _ in range(12):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1, y1 = x0 + int(rng.integers(40, w // 2)), y0 + int(rng.integers(40, h // 2))
        fill = tuple(int(c) for c in rng.integers(0, 255, 3))
        (d.ellipse if rng.random() < 0.5 else d.rectangle)([x0, y0, x1, y1], fill=fill)
    return im


def photo_like(w: int, h: int, seed: int) -> bytes:
    """A photo-like JPEG (smooth gradients + texture + noise) for benchmarks; unique per seed."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.zeros((h, w, 3), np.float32)
    for c in range(3):
        fx, fy, ph = rng.uniform(0.5, 4, 2).tolist() + [rng.uniform(0, 6.28)]
        img[..., c] = 128 + 60 * np.sin(xx / w * fx * 6.28 + ph) * np.cos(yy / h * fy * 6.28)
    img += rng.normal(0, 12, (h, w, 1)).astype(np.float32)
    return encode(Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)), quality=90)


# --- bad inputs --------------------------------------------------------------------------------

def png_bomb(width: int = 40000, height: int = 40000) -> bytes:
    """A tiny PNG whose header declares a huge image (a decompression bomb)."""
    raw = encode(Image.new("L", (1, 1)), "PNG")
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return raw[:8] + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk)) + raw[33:]


def odd_images(bases: list[Image.Image]) -> dict[str, tuple[str, bytes]]:
    """name -> (extension, bytes) for every unusual-but-valid and every broken input the issue names.

    Each valid one is made from its own (rotated or flipped) base, so they are not duplicates."""
    looks = [Image.Transpose.ROTATE_90, Image.Transpose.ROTATE_180, Image.Transpose.ROTATE_270,
             Image.Transpose.FLIP_TOP_BOTTOM, Image.Transpose.TRANSVERSE, Image.Transpose.TRANSPOSE]
    views = iter([b.convert("RGB").transpose(t) for t in looks for b in bases])
    rgb = next(views)
    jpg = encode(rgb, quality=92)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW on display: width and height swap
    v = next(views)
    wide = v.crop((0, 0, v.width, max(300, v.height * 2 // 3)))
    frames = [next(views).resize((320, 320)), flat_graphic(320, 320, 1), flat_graphic(320, 320, 2)]
    gif, webp = io.BytesIO(), io.BytesIO()
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    frames[0].save(webp, "WEBP", save_all=True, append_images=frames[1:], duration=100, loop=0)
    pal = next(views).convert("P", palette=Image.ADAPTIVE, colors=64)
    g16 = Image.fromarray(np.asarray(next(views).convert("L"), np.uint16) * 257)  # uint16 -> mode I;16
    return {
        "truncated_jpeg": ("jpg", jpg[: len(jpg) // 2]),
        "zero_bytes": ("jpg", b""),
        "not_an_image": ("jpg", b"<html><body>404 not found</body></html>\n" * 20),
        "bomb_png": ("png", png_bomb()),
        "cmyk_jpeg": ("jpg", encode(next(views).convert("CMYK"), quality=90)),
        "png_16bit": ("png", encode(g16, "PNG")),
        "grayscale": ("jpg", encode(next(views).convert("L"), quality=90)),
        "palette_transparent_png": ("png", encode(pal, "PNG", transparency=0)),
        "animated_gif": ("gif", gif.getvalue()),
        "animated_webp": ("webp", webp.getvalue()),
        "exif_rotated": ("jpg", encode(wide, quality=90, exif=exif)),
    }


# --- the crawl ----------------------------------------------------------------------------------

def demo_samples() -> list[tuple[str, str, bytes, str]]:
    """(key, extension, bytes, caption) for the demo crawl, in a fixed order."""
    photos = shipped_photos()
    out: list[tuple[str, str, bytes, str]] = []

    def add(name, ext, data, caption):
        out.append((f"{len(out):06d}", ext, data, f"{name}: {caption}"))

    for name, data in photos.items():
        ext = "png" if data[:4] == b"\x89PNG" else "jpg"
        add(name, ext, data, "original photo")
    for name in ("bus", "zidane", "astronaut", "coffee"):
        if name not in photos:
            continue
        im = Image.open(io.BytesIO(photos[name])).convert("RGB")
        add(name, "jpg", photos[name] if photos[name][:2] == b"\xff\xd8" else encode(im, quality=95),
            "exact copy")
        add(name, "jpg", encode(im.resize((im.width * 3 // 4, im.height * 3 // 4)), quality=70),
            "resized and re-encoded duplicate")
        crop = im.crop((0, 0, im.width * 3 // 4, im.height))
        if name == "coffee":
            add(name, "jpg", encode(crop, quality=90), "crop")
        else:  # photos of people reach the watermark stage
            add(name, "jpg", encode(with_corner_mark(crop), quality=90), "crop with a copyright line in a corner")
        add(name, "jpg", encode(with_caption(im), quality=90), "caption overlay")
        add(name, "jpg", encode(with_watermark(im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)), quality=90),
            "semi-transparent watermark (mirrored photo)")
        add(name, "jpg", encode(im.resize((im.width // 4, im.height // 4)), quality=90), "thumbnail (too small)")

    for i in range(3):
        add("graphic", "png", encode(flat_graphic(900, 700, seed=10 + i), "PNG"), "flat synthetic graphic")
    bases = [Image.open(io.BytesIO(photos[n])) for n in ("astronaut", "chelsea", "coffee", "camera") if n in photos]
    for name, (ext, data) in odd_images(bases or [flat_graphic()]).items():
        add(name, ext, data, "bad or unusual input")
    return out


def write_webdataset(folder: Path, samples, per_shard: int = 16) -> list[Path]:
    """img2dataset-style shards: {key}.{ext}, {key}.txt caption, {key}.json metadata."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(0, len(samples), per_shard):
        path = folder / f"{s // per_shard:05d}.tar"
        with tarfile.open(path, "w") as tf:
            for key, ext, data, caption in samples[s:s + per_shard]:
                meta = json.dumps({"key": key, "caption": caption, "status": "success"}).encode()
                for name, blob in ((f"{key}.{ext}", data), (f"{key}.txt", caption.encode()), (f"{key}.json", meta)):
                    info = tarfile.TarInfo(name)
                    info.size = len(blob)
                    tf.addfile(info, io.BytesIO(blob))
        paths.append(path)
    return paths


DEMO_CONFIG = Path(__file__).with_name("demo.yaml")


def demo_config(sets: list[str] | None = None) -> dict:
    """pipeline/default.yaml with the demo's overrides (pipeline/demo/demo.yaml)."""
    from pipeline.config import load_config
    return load_config(DEMO_CONFIG, sets)


def run(output: str = "runs/demo", progress: bool = True) -> int:
    from catalog import connect

    from pipeline.engine.driver import curate
    from pipeline.engine.funnel import print_funnel
    out = Path(output)
    crawl = out / "crawl"
    samples = demo_samples()
    if not crawl.exists():
        write_webdataset(crawl, samples)
    log.info("demo crawl: %d samples in %s", len(samples), crawl)
    run_dir = out / "run"
    manifest = curate([str(crawl)], str(run_dir), demo_config(), progress=progress)
    print_funnel(manifest, connect(run_dir))
    print(f"\ncatalog: {run_dir}/catalog/samples   curated shards: {run_dir}/shards")
    print(f"query it: humanset query {run_dir} \"SELECT reject_reason, count(*) FROM samples GROUP BY 1\"")
    return 0
