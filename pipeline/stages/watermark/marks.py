"""Generated watermarks on real photos: what the OCR watermark rule is tuned on and measured against.

A mark is drawn from a `MarkSpec` (kind, text, font, size, opacity, colour, shadow, angle, JPEG
quality) that `sample_spec` draws from a seed and a family. Families split the fonts (by installed
font family, `fc-list`), the strings, the photos and the seed, so the evaluation set
(bench/watermark.py, family "eval") shares none of them with the set the rule's weights and cut are
tuned on (family "tune").
Kinds: tiled (a string repeated over the image, level or diagonal), corner (a copyright line,
domain or name in a corner band or the bottom centre), center (one large word across the middle).
Nothing here is downloaded: photos come from installed packages (scikit-image, ultralytics), fonts from the
system (Pillow's bundled default when fc-list finds none).
"""
from __future__ import annotations

import io
import subprocess
from dataclasses import asdict, dataclass
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

KINDS = ("tiled", "corner", "center")
FAMILIES = ("tune", "eval")
SEEDS = {"tune": 1, "eval": 2}

# strings per family: the same kinds of mark text (domains, copyright lines, agency names, words), no
# string shared (tests/pipeline/stages/test_marks_families.py checks it)
TEXTS = {
    "tune": {
        "tiled": ["shutterpix", "(c) dreamphoto", "www.stockfoto.net", "PHOTOLAB", "istockimage", "proof copy",
                  "pixelbank.com", "© imagery"],
        "corner": ["© 2021 Anna Berg", "www.lenswork.org", "(c) Marco Photography", "fotobase.com",
                   "Copyright Kim Lee", "© studio nord"],
        "center": ["PREVIEW", "SAMPLE", "Dreamstock", "PROOF", "WATERMARK"],
    },
    "eval": {
        "tiled": ["alamyx", "(c) depositpics", "www.photostock.co.uk", "GETTYPIX", "123rfoto", "stockvault",
                  "© picsum images", "for review only"],
        "corner": ["© 2023 John Smith", "www.janedoe-photo.com", "(c) Blue Sky Studio", "pixabase.io",
                   "Copyright Lucia Ruiz", "© northlight"],
        "center": ["DRAFT", "Fotolandia", "Stockland", "COMP", "NOT FOR SALE"],
    },
}
# installed font families per family (the rest of the system's fonts are not used)
FONT_FAMILIES = {"tune": ("DejaVu",), "eval": ("Liberation", "FreeSans", "FreeSerif", "FreeMono")}
# shipped photos per family, (package, folder, file): no photo in both (the stereo pair of motorcycles
# stays together). The eval photos hold the scene text (the bus's ad, the motorcycles' brand).
PHOTOS = {
    "tune": (("skimage", "data", "chelsea.png"), ("skimage", "data", "camera.png"),
             ("skimage", "data", "retina.jpg"), ("skimage", "data", "brick.png"), ("skimage", "data", "grass.png"),
             ("skimage", "data", "gravel.png"), ("skimage", "data", "coins.png"), ("skimage", "data", "ihc.png"),
             ("skimage", "data", "clock_motion.png")),
    "eval": (("ultralytics", "assets", "bus.jpg"), ("ultralytics", "assets", "zidane.jpg"),
             ("skimage", "data", "astronaut.png"), ("skimage", "data", "coffee.png"),
             ("skimage", "data", "rocket.jpg"), ("skimage", "data", "motorcycle_left.png"),
             ("skimage", "data", "motorcycle_right.png"), ("skimage", "data", "hubble_deep_field.jpg")),
}
SCENE_TEXT = ("bus", "motorcycle_left", "motorcycle_right")  # eval photos with text that is part of the scene


def family_photos(family: str) -> dict[str, Image.Image]:
    """name -> RGB photo of a family, from the installed packages (located without importing them:
    importing ultralytics patches PIL's opener); photos of packages not installed are left out."""
    import importlib.util
    from pathlib import Path

    out = {}
    for pkg, sub, name in PHOTOS[family]:
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            continue
        f = Path(list(spec.submodule_search_locations)[0]) / sub / name
        if f.is_file():
            out[f.stem] = Image.open(f).convert("RGB")
    if not out:
        raise RuntimeError(f"no {family} photos found: install scikit-image (and ultralytics)")
    return out


@lru_cache(maxsize=1)
def system_fonts() -> tuple[str, ...]:
    """Font files fc-list reports (TrueType/OpenType only), sorted; empty without fontconfig."""
    try:
        out = subprocess.run(["fc-list", ":", "file"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    files = {ln.split(":")[0].strip() for ln in out.splitlines()}
    return tuple(sorted(f for f in files if f.lower().endswith((".ttf", ".otf"))))


def family_fonts(family: str) -> list[str]:
    """Font files of a family ("tune" / "eval"); [""] (Pillow's default font) when none is installed."""
    fonts = [f for f in system_fonts() if any(k in f.rsplit("/", 1)[-1] for k in FONT_FAMILIES[family])]
    fonts = [f for f in fonts if "Math" not in f and "ExtraLight" not in f]
    return fonts or [""]


def font(path: str, size: int):
    if path:
        try:
            return ImageFont.truetype(path, size)
        except OSError:
            pass
    return ImageFont.load_default(size=size)


@dataclass(frozen=True)
class MarkSpec:
    kind: str
    text: str
    font: str           # a font file, "" = Pillow's default
    size_rel: float     # text height / image height
    opacity: float      # alpha of the mark, 0..1
    colour: tuple[int, int, int]
    shadow: bool        # a dark, blurred copy under the mark
    angle: float        # degrees, counter-clockwise (tiled and center)
    corner: str         # tl, tr, bl, br, bc (corner kind)
    jpeg_quality: int   # the marked image is re-encoded as JPEG at this quality

    def to_dict(self) -> dict:
        return asdict(self)


def sample_spec(rng: np.random.Generator, kind: str, family: str,
                opacity: float | None = None) -> MarkSpec:
    texts = TEXTS[family][kind]
    fonts = family_fonts(family)
    size = {"tiled": (0.035, 0.08), "corner": (0.025, 0.055), "center": (0.10, 0.22)}[kind]
    colour = [(255, 255, 255), (255, 255, 255), (0, 0, 0), (128, 128, 128),
              tuple(int(c) for c in rng.integers(0, 256, 3))][int(rng.integers(0, 5))]
    angle = 0.0
    if kind == "tiled":
        angle = float(rng.choice([0.0, 30.0, 45.0, -30.0])) + float(rng.uniform(-5, 5))
    elif kind == "center":
        angle = float(rng.choice([0.0, 0.0, 25.0, -25.0]))
    return MarkSpec(
        kind=kind, text=str(texts[int(rng.integers(0, len(texts)))]), font=fonts[int(rng.integers(0, len(fonts)))],
        size_rel=float(rng.uniform(*size)),
        opacity=float(opacity if opacity is not None else rng.uniform(0.1, 0.8)),
        colour=colour, shadow=bool(rng.random() < 0.3), angle=angle,
        corner=str(rng.choice(["tl", "tr", "bl", "br", "bc", "br"])),
        jpeg_quality=int(rng.integers(60, 96)))


def _text_layer(text: str, fnt, colour, alpha: int, shadow: bool) -> Image.Image:
    """RGBA image of one string (with its shadow), tight around the ink."""
    l, t, r, b = fnt.getbbox(text)
    pad = max(2, (b - t) // 4)
    layer = Image.new("RGBA", (r - l + 3 * pad, b - t + 3 * pad), (0, 0, 0, 0))
    d = ImageDraw.Draw(layer)
    if shadow:
        sh = Image.new("RGBA", layer.size, (0, 0, 0, 0))
        off = max(1, (b - t) // 12)
        ImageDraw.Draw(sh).text((pad - l + off, pad - t + off), text, font=fnt, fill=(0, 0, 0, alpha))
        layer = Image.alpha_composite(layer, sh.filter(ImageFilter.GaussianBlur(max(1, off))))
        d = ImageDraw.Draw(layer)
    d.text((pad - l, pad - t), text, font=fnt, fill=tuple(colour) + (alpha,))
    return layer


def draw_mark(im: Image.Image, spec: MarkSpec) -> Image.Image:
    """The photo with the mark composited at spec.opacity (RGB, not yet re-encoded)."""
    base = im.convert("RGBA")
    return Image.alpha_composite(base, mark_layer(base.size, spec)).convert("RGB")


def mark_mask(size: tuple[int, int], spec: MarkSpec) -> np.ndarray:
    """Boolean h x w mask of the pixels the mark touches (bench: was the mark detected, or missed?)."""
    return np.asarray(mark_layer(size, spec))[..., 3] > 0


def mark_layer(size: tuple[int, int], spec: MarkSpec) -> Image.Image:
    """The RGBA overlay of the mark over an image of `size` (w, h)."""
    w, h = size
    px = max(8, int(round(spec.size_rel * h)))
    fnt = font(spec.font, px)
    alpha = int(round(255 * spec.opacity))
    word = _text_layer(spec.text, fnt, spec.colour, alpha, spec.shadow)
    overlay = Image.new("RGBA", (w, h), (0, 0, 0, 0))
    if spec.kind == "tiled":
        # tile a large canvas, rotate it, crop the centre: rows offset like stock agencies do
        big = Image.new("RGBA", (2 * max(w, h), 2 * max(w, h)), (0, 0, 0, 0))
        sx, sy = int(word.width * 1.6), int(word.height * 3.2)
        for row, y in enumerate(range(0, big.height, sy)):
            for x in range(-(row % 2) * sx // 2, big.width, sx):
                big.alpha_composite(word, (x, y))
        big = big.rotate(spec.angle, resample=Image.BICUBIC)
        ox, oy = (big.width - w) // 2, (big.height - h) // 2
        overlay = big.crop((ox, oy, ox + w, oy + h))
    elif spec.kind == "center":
        rot = word.rotate(spec.angle, resample=Image.BICUBIC, expand=True)
        if rot.width > 0.95 * w:  # a centred word spans the middle, never the whole width and beyond
            f = 0.95 * w / rot.width
            rot = rot.resize((max(1, int(rot.width * f)), max(1, int(rot.height * f))), Image.BICUBIC)
        overlay.alpha_composite(rot, ((w - rot.width) // 2, (h - rot.height) // 2))
    else:
        m = int(0.02 * max(w, h))
        word = word if word.width < w - 2 * m else word.resize(
            (w - 2 * m, max(1, int(word.height * (w - 2 * m) / word.width))), Image.BICUBIC)
        x = {"tl": m, "bl": m, "tr": w - word.width - m, "br": w - word.width - m,
             "bc": (w - word.width) // 2}[spec.corner]
        y = m if spec.corner in ("tl", "tr") else h - word.height - m
        overlay.alpha_composite(word, (max(0, x), max(0, y)))
    return overlay


def jpeg(im: Image.Image, quality: int) -> bytes:
    b = io.BytesIO()
    im.convert("RGB").save(b, "JPEG", quality=int(quality))
    return b.getvalue()


def clean_view(im: Image.Image, rng: np.random.Generator) -> Image.Image:
    """A plausible other copy of a photo: a random crop (70-100 % per side), rescaled (never mirrored:
    mirrored scene text would no longer read as text)."""
    im = im.convert("RGB")
    w, h = im.size
    cw, ch = int(w * rng.uniform(0.7, 1.0)), int(h * rng.uniform(0.7, 1.0))
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    im = im.crop((x, y, x + cw, y + ch))
    f = float(rng.uniform(0.8, 1.6))
    if min(im.size) * f >= 300:
        im = im.resize((int(im.width * f), int(im.height * f)), Image.BICUBIC)
    return im
