"""Synthetic training data for the watermark and art filters, made from clean photos of the crawl.

Every generator is a pure function of (clean photo, numpy Generator): the same seed draws the same
image in any process, so a resumed run sees the same data and tests are exact.

watermark (label "watermark" vs "clean"):
  positives  text_single, text_corner, text_tiled, logo_single, logo_corner, logo_tiled: copyright
             strings, URLs, stock-agency-like words and random vector logos, drawn in the fonts installed
             on the machine, opacity 0.1-0.6, scale, rotation, blend modes (normal, multiply, screen,
             emboss), outline or shadow
  negatives  clean, sign (scene-text boards in perspective, opaque, small), border, frame
art (label "photo" vs the non-photo families):
  non-photo  cartoon (edge mask + colour quantisation), pencil (dodge sketch or edge line drawing),
             painterly (Kuwahara filter + canvas), document (rendered text pages and web-page-like
             screenshots), clipart (flat vector shapes in the photo's palette), render (frames of a
             `humanset render` run, when one is given)
  photo      clean

Every sample is JPEG re-encoded after the generator (most of the time), positives and negatives
alike, so compression is no cue. HTML screenshots through headless Chromium are not made: one
browser start per image costs seconds on 2 cores; `document` draws web-page-like layouts instead.
"""
from __future__ import annotations

import functools
import importlib.util
import io
import logging
import math
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFont

log = logging.getLogger(__name__)

WATERMARK_POSITIVE = ("text_single", "text_corner", "text_tiled", "logo_single", "logo_corner", "logo_tiled")
WATERMARK_NEGATIVE = ("clean", "sign", "border", "frame")
ART_POSITIVE = ("cartoon", "pencil", "painterly", "document", "clipart", "render")
ART_NEGATIVE = ("clean",)
# the art stage's label of each family (pipeline/stages/art.py prompt groups)
ART_LABELS = {"clean": "photo", "cartoon": "cartoon", "pencil": "drawing", "painterly": "painting",
              "document": "text document", "clipart": "clip art", "render": "3d render"}
# families held out of training by default: validation measures an unseen style
DEFAULT_HOLDOUT = {"watermark": ("text_corner", "frame"), "art": ("painterly",)}
FONT_DIRS = ("/usr/share/fonts", "/usr/local/share/fonts", "~/.local/share/fonts", "~/.fonts")
FONT_EXTS = (".ttf", ".otf", ".ttc")
# symbol and math fonts map letters to other glyphs (or to none): no use for words
SYMBOL_FONTS = ("sym", "math", "cmex", "cmsy", "cmmi", "lastresort", "nonuni", "dingbat", "emoji")


# --- fonts ------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def find_fonts() -> tuple[str, ...]:
    """TrueType / OpenType fonts installed on this machine: fontconfig's list, the usual font folders,
    and the fonts matplotlib ships. Raises with the fix when there are none."""
    found: set[str] = set()
    if shutil.which("fc-list"):
        try:
            out = subprocess.run(["fc-list", "-f", "%{file}\n"], capture_output=True, text=True, timeout=30).stdout
            found.update(line.strip() for line in out.splitlines() if line.strip().lower().endswith(FONT_EXTS))
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("fc-list failed (%s); looking in the font folders", e)
    folders = [Path(d).expanduser() for d in FONT_DIRS]
    spec = importlib.util.find_spec("matplotlib")  # located without importing matplotlib
    if spec and spec.submodule_search_locations:
        folders.append(Path(list(spec.submodule_search_locations)[0]) / "mpl-data" / "fonts" / "ttf")
    for folder in folders:
        if folder.is_dir():
            found.update(str(p) for p in folder.rglob("*") if p.suffix.lower() in FONT_EXTS)
    usable, names = [], set()
    for path in sorted(found):
        if Path(path).name in names:  # the same font in two folders
            continue
        if any(s in Path(path).name.lower() for s in SYMBOL_FONTS):
            continue
        try:
            if _draws_latin(ImageFont.truetype(path, 20)):
                usable.append(path)
                names.add(Path(path).name)
        except OSError:
            continue
    if not usable:
        raise RuntimeError("no TrueType/OpenType fonts found (fc-list, /usr/share/fonts, matplotlib): the watermark "
                           "and document generators draw text with them. Install fonts-dejavu-core "
                           "(deps/filters.apt.txt) or put .ttf files in ~/.fonts")
    return tuple(usable)


def _draws_latin(fnt) -> bool:
    """True when 'A', 'g' and 'x' are three different, non-empty glyphs (not the missing-glyph box)."""
    masks = []
    for ch in "Agx":
        im = Image.new("L", (40, 40), 0)
        ImageDraw.Draw(im).text((5, 5), ch, fill=255, font=fnt)
        masks.append(np.asarray(im))
    return all(m.any() for m in masks) and not any(np.array_equal(a, b) for a, b in
                                                   ((masks[0], masks[1]), (masks[1], masks[2])))


@functools.lru_cache(maxsize=512)
def _font(path: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path, max(6, int(size)))


def font(rng: np.random.Generator, size: int) -> ImageFont.FreeTypeFont:
    fonts = find_fonts()
    return _font(fonts[int(rng.integers(len(fonts)))], size)


# --- words ------------------------------------------------------------------------------------------
_SYLLABLES = ("ka", "lo", "mi", "ra", "ven", "to", "sa", "lux", "pix", "ne", "or", "ti", "mar", "zen", "fo", "da",
              "bel", "cor", "sun", "vi", "lan", "pho", "gra", "sto", "nova", "el", "us", "ar", "qui", "be")
STOCK_WORDS = ("stock", "images", "photos", "pictures", "photography", "studio", "media", "pics", "visuals",
               "creative", "agency", "foto", "archive", "press")
BADGES = ("PREVIEW", "SAMPLE", "COMP", "PROOF", "WATERMARK", "DO NOT COPY", "NOT FOR USE", "LICENSE REQUIRED",
          "UNLICENSED", "DRAFT")
TLDS = ("com", "net", "org", "io", "co.uk", "de", "photo", "pics")


def name(rng: np.random.Generator) -> str:
    return "".join(_SYLLABLES[int(i)] for i in rng.integers(len(_SYLLABLES), size=int(rng.integers(2, 4))))


def watermark_text(rng: np.random.Generator) -> str:
    """A copyright line, a URL, a stock-agency-like name or a badge word."""
    who = name(rng)
    kind = int(rng.integers(6))
    if kind == 0:
        return f"\u00a9 {int(rng.integers(1995, 2027))} {who.title()}" + (" Photography" if rng.random() < .4 else "")
    if kind == 1:
        return f"Copyright {who.title()} {STOCK_WORDS[int(rng.integers(len(STOCK_WORDS)))].title()}"
    if kind == 2:
        return f"{'www.' if rng.random() < .6 else ''}{who}{STOCK_WORDS[int(rng.integers(len(STOCK_WORDS)))]}." \
               f"{TLDS[int(rng.integers(len(TLDS)))]}"
    if kind == 3:
        return f"{who}{STOCK_WORDS[int(rng.integers(len(STOCK_WORDS)))]}".upper() if rng.random() < .5 else \
            f"{who.title()} {STOCK_WORDS[int(rng.integers(len(STOCK_WORDS)))].title()}"
    if kind == 4:
        return BADGES[int(rng.integers(len(BADGES)))]
    return f"@{who}" + (f" | {int(rng.integers(10 ** 5, 10 ** 8))}" if rng.random() < .5 else "")


def sentence(rng: np.random.Generator, words: int) -> str:
    return " ".join(name(rng) if rng.random() < .8 else str(int(rng.integers(1, 999))) for _ in range(words))


# --- settings ---------------------------------------------------------------------------------------
@dataclass
class GeneratorSettings:
    """What the generators draw from; written into the filter card."""
    opacity: tuple = (0.1, 0.6)
    blend_modes: tuple = ("normal", "multiply", "screen", "emboss")
    jpeg_quality: tuple = (55, 95)
    jpeg_prob: float = 0.85
    crop_scale: tuple = (0.35, 1.0)  # area of the clean photo each sample starts from
    gen_px: int = 256  # longer side at which generators draw; the model input is resized from it

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


# --- small helpers ----------------------------------------------------------------------------------
def _colour(rng, light=None) -> tuple[int, int, int]:
    if light is True:
        return tuple(int(v) for v in rng.integers(200, 256, 3))
    if light is False:
        return tuple(int(v) for v in rng.integers(0, 60, 3))
    return tuple(int(v) for v in rng.integers(0, 256, 3))


def _text_size(text: str, fnt) -> tuple[int, int]:
    l, t, r, b = fnt.getbbox(text)
    return max(1, r - l), max(1, b - t)


def text_layer(text: str, height_px: int, rng, stroke: int = 0) -> Image.Image:
    """White text on a transparent layer (its alpha is the glyph mask), cropped to the text."""
    fnt = font(rng, height_px)
    l, t, r, b = fnt.getbbox(text, stroke_width=stroke)
    layer = Image.new("L", (r - l + 4, b - t + 4), 0)
    ImageDraw.Draw(layer).text((2 - l, 2 - t), text, fill=255, font=fnt, stroke_width=stroke, stroke_fill=255)
    return layer


def logo_layer(size: int, rng, with_text: bool) -> Image.Image:
    """A random vector logo (rings, polygons, stars, monogram) as an alpha mask, optionally with a name."""
    s = size * 2  # drawn at 2x and shrunk: antialiased edges
    im = Image.new("L", (s, s), 0)
    d = ImageDraw.Draw(im)
    c, r = s / 2, s * 0.45
    kind = int(rng.integers(5))
    if kind == 0:
        d.ellipse([c - r, c - r, c + r, c + r], outline=255, width=max(2, int(s * rng.uniform(.05, .12))))
    elif kind == 1:
        n = int(rng.integers(3, 9))
        a0 = rng.uniform(0, 2 * math.pi)
        d.polygon([(c + r * math.cos(a0 + 2 * math.pi * i / n), c + r * math.sin(a0 + 2 * math.pi * i / n))
                   for i in range(n)], fill=255)
    elif kind == 2:
        n = int(rng.integers(4, 8))
        pts = []
        for i in range(2 * n):
            rr = r if i % 2 == 0 else r * rng.uniform(.35, .6)
            a = math.pi * i / n - math.pi / 2
            pts.append((c + rr * math.cos(a), c + rr * math.sin(a)))
        d.polygon(pts, fill=255)
    elif kind == 3:
        d.rounded_rectangle([c - r, c - r * .7, c + r, c + r * .7], radius=int(r * .3), fill=255)
    else:
        for k in range(int(rng.integers(2, 5))):
            rr = r * (1 - k * .22)
            d.ellipse([c - rr, c - rr, c + rr, c + rr], outline=255, width=max(2, int(s * .04)))
    if rng.random() < .6:  # a monogram cut out of (or drawn on) the shape
        fnt = font(rng, int(s * .45))
        letters = name(rng)[:int(rng.integers(1, 3))].upper()
        w, h = _text_size(letters, fnt)
        l, t, _, _ = fnt.getbbox(letters)
        d.text((c - w / 2 - l, c - h / 2 - t), letters, fill=0 if kind in (1, 2, 3) else 255, font=fnt)
    im = im.resize((size, size), Image.LANCZOS)
    if not with_text:
        return im
    label = text_layer(name(rng).title() if rng.random() < .6 else watermark_text(rng), max(8, size // 3), rng)
    if rng.random() < .5:  # name beside the logo
        out = Image.new("L", (size + label.width + size // 8, max(size, label.height)), 0)
        out.paste(im, (0, (out.height - size) // 2))
        out.paste(label, (size + size // 8, (out.height - label.height) // 2))
    else:  # name below
        out = Image.new("L", (max(size, label.width), size + label.height + size // 10), 0)
        out.paste(im, ((out.width - size) // 2, 0))
        out.paste(label, ((out.width - label.width) // 2, size + size // 10))
    return out


def _rotate(mask: Image.Image, degrees: float) -> Image.Image:
    return mask.rotate(degrees, resample=Image.BICUBIC, expand=True) if abs(degrees) > .5 else mask


def _fit(mask: Image.Image, max_w: int, max_h: int) -> Image.Image:
    f = min(max_w / mask.width, max_h / mask.height, 4.0)
    return mask.resize((max(1, int(mask.width * f)), max(1, int(mask.height * f))), Image.LANCZOS)


def blend(rgb: np.ndarray, mask: np.ndarray, colour, opacity: float, mode: str) -> np.ndarray:
    """Composite a flat colour through `mask` (float 0..1, HxW) at `opacity` with a blend mode."""
    b = rgb.astype(np.float32) / 255.0
    a = (mask * opacity)[..., None]
    c = np.asarray(colour, np.float32).reshape(1, 1, 3) / 255.0
    if mode == "multiply":
        top = b * c
    elif mode == "screen":
        top = 1 - (1 - b) * (1 - c)
    elif mode == "emboss":  # a relief: light on one side of the glyph edges, dark on the other
        m = mask.astype(np.float32)
        relief = (np.roll(m, (1, 1), axis=(0, 1)) - np.roll(m, (-1, -1), axis=(0, 1)))[..., None]
        out = b + relief * opacity * 1.2 + (m[..., None] * opacity * 0.25) * (0.5 - b)
        return (np.clip(out, 0, 1) * 255 + .5).astype(np.uint8)
    else:
        top = np.broadcast_to(c, b.shape)
    out = b * (1 - a) + top * a
    return (np.clip(out, 0, 1) * 255 + .5).astype(np.uint8)


def _place(canvas_hw, mask: Image.Image, x: int, y: int) -> np.ndarray:
    h, w = canvas_hw
    full = Image.new("L", (w, h), 0)
    full.paste(mask, (x, y))
    return np.asarray(full, np.float32) / 255.0


def _overlay(rgb: np.ndarray, mask: np.ndarray, rng, s: GeneratorSettings) -> np.ndarray:
    """Draw a mask as a watermark: colour, opacity, blend mode, optional outline or drop shadow."""
    opacity = float(rng.uniform(*s.opacity))
    mode = s.blend_modes[int(rng.integers(len(s.blend_modes)))]
    colour = _colour(rng, light=bool(rng.random() < .6)) if rng.random() < .85 else _colour(rng)
    if mode == "multiply":
        colour = _colour(rng, light=False)
    elif mode == "screen":
        colour = _colour(rng, light=True)
    extra = rng.random()
    if extra < .25 and mode != "emboss":  # outline of the opposite tone
        edge = cv2.dilate(mask, np.ones((3, 3), np.uint8)) - mask
        rgb = blend(rgb, np.clip(edge, 0, 1), tuple(255 - v for v in colour), opacity, "normal")
    elif extra < .45 and mode != "emboss":  # soft drop shadow
        shadow = cv2.GaussianBlur(np.roll(mask, (2, 2), axis=(0, 1)), (0, 0), 1.5)
        rgb = blend(rgb, shadow, (0, 0, 0), opacity * .7, "normal")
    return blend(rgb, mask, colour, opacity, mode)


# --- watermark generators ---------------------------------------------------------------------------
def _content(kind: str, rng, height_px: int) -> Image.Image:
    if kind == "text":
        text = watermark_text(rng)
        if rng.random() < .25:
            text = text.upper()
        return text_layer(text, height_px, rng)
    return logo_layer(max(12, height_px * 2), rng, with_text=bool(rng.random() < .6))


def watermark(rgb: np.ndarray, family: str, rng, s: GeneratorSettings) -> np.ndarray:
    h, w = rgb.shape[:2]
    kind, layout = family.split("_")
    if layout == "single":
        mask = _content(kind, rng, int(h * rng.uniform(.08, .2)))
        mask = _rotate(mask, float(rng.uniform(-35, 35)) if rng.random() < .6 else 0.0)
        mask = _fit(mask, int(w * rng.uniform(.35, .9)), int(h * rng.uniform(.2, .6)))
        x = int(rng.integers(0, max(1, w - mask.width + 1)))
        y = int(rng.integers(0, max(1, h - mask.height + 1)))
        if rng.random() < .5:  # centred, the most common single placement
            x, y = (w - mask.width) // 2, (h - mask.height) // 2
        return _overlay(rgb, _place((h, w), mask, x, y), rng, s)
    if layout == "corner":
        mask = _content(kind, rng, int(h * rng.uniform(.04, .09)))
        mask = _fit(mask, int(w * rng.uniform(.2, .45)), int(h * rng.uniform(.08, .25)))
        m = int(min(h, w) * rng.uniform(.01, .05))
        right, bottom = rng.random() < .65, rng.random() < .75
        x = w - mask.width - m if right else m
        y = h - mask.height - m if bottom else m
        return _overlay(rgb, _place((h, w), mask, max(0, x), max(0, y)), rng, s)
    # tiled: the same mark repeated on a rotated grid over the whole image
    unit = _content(kind, rng, int(h * rng.uniform(.04, .1)))
    unit = _fit(unit, int(w * rng.uniform(.2, .45)), int(h * .3))
    gap_x, gap_y = int(unit.width * rng.uniform(1.2, 2.0)), int(unit.height * rng.uniform(2.0, 4.0))
    side = int(math.hypot(h, w)) + 2 * max(gap_x, gap_y)
    big = Image.new("L", (side, side), 0)
    for row, y in enumerate(range(0, side, gap_y)):
        shift = (gap_x // 2) * (row % 2)
        for x in range(-shift, side, gap_x):
            big.paste(unit, (x, y), unit)
    big = big.rotate(float(rng.choice([-1, 1]) * rng.uniform(20, 45)), resample=Image.BICUBIC)
    left, top = (side - w) // 2, (side - h) // 2
    mask = np.asarray(big.crop((left, top, left + w, top + h)), np.float32) / 255.0
    return _overlay(rgb, mask, rng, s)


# --- watermark hard negatives -----------------------------------------------------------------------
def sign(rgb: np.ndarray, rng) -> np.ndarray:
    """Scene text: one to three opaque boards with words, in perspective, small, blurred into the scene."""
    out = rgb.copy()
    h, w = rgb.shape[:2]
    for _ in range(int(rng.integers(1, 4))):
        text = sentence(rng, int(rng.integers(1, 3))).upper() if rng.random() < .6 else name(rng).title()
        board, ink = _colour(rng), None
        ink = (0, 0, 0) if sum(board) > 380 else (255, 255, 255)
        fnt = font(rng, 40)
        tw, th = _text_size(text, fnt)
        pad = 12
        im = Image.new("RGB", (tw + 2 * pad, th + 2 * pad), board)
        l, t, _, _ = fnt.getbbox(text)
        ImageDraw.Draw(im).text((pad - l, pad - t), text, fill=ink, font=fnt)
        src = np.asarray(im)
        bw = w * rng.uniform(.12, .35)
        bh = bw * src.shape[0] / src.shape[1]
        x0, y0 = rng.uniform(0, max(1, w - bw)), rng.uniform(0, max(1, h - bh))
        j = lambda: rng.uniform(-.12, .12) * bw  # noqa: E731  perspective jitter of each corner
        dst = np.float32([[x0 + j(), y0 + j()], [x0 + bw + j(), y0 + j()], [x0 + bw + j(), y0 + bh + j()],
                          [x0 + j(), y0 + bh + j()]])
        srcq = np.float32([[0, 0], [src.shape[1], 0], [src.shape[1], src.shape[0]], [0, src.shape[0]]])
        M = cv2.getPerspectiveTransform(srcq, dst)
        warped = cv2.warpPerspective(src, M, (w, h), flags=cv2.INTER_AREA)
        mask = cv2.warpPerspective(np.full(src.shape[:2], 255, np.uint8), M, (w, h), flags=cv2.INTER_AREA)
        shade = rng.uniform(.6, 1.05)  # scene lighting on the board
        warped = np.clip(warped.astype(np.float32) * shade, 0, 255)
        warped = cv2.GaussianBlur(warped, (0, 0), rng.uniform(.3, .9))
        a = (mask.astype(np.float32) / 255.0)[..., None]
        out = (out * (1 - a) + warped * a).astype(np.uint8)
    return out


def border(rgb: np.ndarray, rng) -> np.ndarray:
    """A solid or double border around the photo."""
    h, w = rgb.shape[:2]
    out = rgb.copy()
    t = max(1, int(min(h, w) * rng.uniform(.015, .08)))
    colour = _colour(rng, light=bool(rng.random() < .5)) if rng.random() < .8 else _colour(rng)
    out[:t], out[-t:], out[:, :t], out[:, -t:] = colour, colour, colour, colour
    if rng.random() < .4:  # a thin inner line
        c2 = _colour(rng)
        cv2.rectangle(out, (t, t), (w - t - 1, h - t - 1), c2, max(1, t // 4))
    return out


def frame(rgb: np.ndarray, rng) -> np.ndarray:
    """A picture frame: bevelled moulding and a passe-partout, or a print with a wide bottom margin."""
    h, w = rgb.shape[:2]
    if rng.random() < .5:  # print with a white margin, wider at the bottom
        m = int(min(h, w) * rng.uniform(.04, .08))
        inner = cv2.resize(rgb, (w - 2 * m, h - 3 * m - m), interpolation=cv2.INTER_AREA)
        out = np.full_like(rgb, int(rng.integers(225, 256)))
        out[m:m + inner.shape[0], m:m + inner.shape[1]] = inner
        return out
    f = int(min(h, w) * rng.uniform(.05, .1))
    mat = int(min(h, w) * rng.uniform(0, .08))
    wood = np.array(_colour(rng), np.float32)
    out = np.empty_like(rgb, dtype=np.float32)
    yy, xx = np.mgrid[0:h, 0:w]
    d = np.minimum.reduce([yy, xx, h - 1 - yy, w - 1 - xx]).astype(np.float32)
    grain = 0.85 + 0.15 * np.sin(xx * rng.uniform(.3, .8) + yy * rng.uniform(.05, .2))[..., None]
    bevel = np.clip(0.7 + 0.6 * d / max(f, 1), .6, 1.3)[..., None]
    out[:] = wood * grain * bevel
    out[d >= f] = np.array(_colour(rng, light=True), np.float32)  # passe-partout
    k = f + mat
    inner = cv2.resize(rgb, (max(1, w - 2 * k), max(1, h - 2 * k)), interpolation=cv2.INTER_AREA)
    out[k:k + inner.shape[0], k:k + inner.shape[1]] = inner
    return np.clip(out, 0, 255).astype(np.uint8)


# --- art generators: non-photos from the clean photo ------------------------------------------------
def quantise(rgb: np.ndarray, colours: int) -> np.ndarray:
    return np.asarray(Image.fromarray(rgb).quantize(colors=colours, method=Image.MEDIANCUT).convert("RGB"))


def cartoon(rgb: np.ndarray, rng) -> np.ndarray:
    """Edge-preserving smoothing, few flat colours (median cut or posterise) and dark outlines."""
    smooth = rgb
    for _ in range(int(rng.integers(2, 5))):
        smooth = cv2.bilateralFilter(smooth, 7, rng.uniform(40, 90), 7)
    if rng.random() < .5:
        flat = quantise(smooth, int(rng.integers(4, 13)))
    else:  # posterise: a few levels per channel
        levels = int(rng.integers(2, 5))
        step = 256 / levels
        flat = (np.floor(smooth / step) * step + step / 2).astype(np.uint8)
    if rng.random() < .2:
        return flat  # posterised, no outlines
    grey = cv2.medianBlur(cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY), 5)
    block = int(rng.integers(4, 9)) * 2 + 1
    edges = cv2.adaptiveThreshold(grey, 255, cv2.ADAPTIVE_THRESH_MEAN_C, cv2.THRESH_BINARY, block, rng.uniform(6, 14))
    if rng.random() < .4:
        edges = cv2.erode(edges, np.ones((2, 2), np.uint8))
    return np.where(edges[..., None] > 0, flat, np.uint8(int(rng.integers(0, 50)))).astype(np.uint8)


def pencil(rgb: np.ndarray, rng) -> np.ndarray:
    """Pencil sketch (colour dodge of the blurred negative) or an ink line drawing (edges)."""
    grey = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY).astype(np.float32)
    h, w = grey.shape
    paper = np.array(_colour(rng, light=True), np.float32) if rng.random() < .5 else np.full(3, 250, np.float32)
    if rng.random() < .6:
        blur = cv2.GaussianBlur(255 - grey, (0, 0), rng.uniform(2, 8))
        sketch = np.clip(grey * 255.0 / np.maximum(255 - blur, 1), 0, 255)
        sketch = 255 - (255 - sketch) * rng.uniform(.8, 1.6)  # pressure
        if rng.random() < .5:  # hatching texture in the shadows
            yy, xx = np.mgrid[0:h, 0:w]
            hatch = (np.sin((xx + yy) * rng.uniform(.8, 1.6)) > .6).astype(np.float32)
            sketch -= hatch * np.clip(200 - grey, 0, 200) * .25
        tone = np.clip(sketch, 0, 255) / 255.0
    else:
        edges = cv2.Canny(grey.astype(np.uint8), *sorted(rng.uniform(40, 160, 2)))
        k = int(rng.integers(1, 3))
        edges = cv2.dilate(edges, np.ones((k, k), np.uint8))
        tone = 1 - cv2.GaussianBlur(edges.astype(np.float32), (0, 0), .6) / 255.0
    out = tone[..., None] * paper.reshape(1, 1, 3)
    if rng.random() < .3:  # coloured pencil: a faint wash of the photo's colours
        out = out * .75 + (rgb.astype(np.float32) * tone[..., None]) * .25
    out += rng.normal(0, 4, (h, w, 1))  # paper grain
    return np.clip(out, 0, 255).astype(np.uint8)


def kuwahara(rgb: np.ndarray, radius: int) -> np.ndarray:
    """Kuwahara filter: each pixel takes the mean of the least varied of its four quadrant windows."""
    img = rgb.astype(np.float32)
    grey = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY).astype(np.float32)
    k = radius + 1
    mean = cv2.blur(img, (k, k), borderType=cv2.BORDER_REFLECT)
    gm = cv2.blur(grey, (k, k), borderType=cv2.BORDER_REFLECT)
    var = cv2.blur(grey * grey, (k, k), borderType=cv2.BORDER_REFLECT) - gm * gm
    # the box of size k centred at c covers [c - k//2, c + (k-1)//2]; shift it onto each quadrant
    a, b = radius // 2, radius - radius // 2
    shifts = [(-a, -a), (-a, b), (b, -a), (b, b)]
    means = np.stack([np.roll(mean, s, axis=(0, 1)) for s in shifts])
    vars_ = np.stack([np.roll(var, s, axis=(0, 1)) for s in shifts])
    best = vars_.argmin(axis=0)
    return np.take_along_axis(means, best[None, ..., None].repeat(3, axis=-1), axis=0)[0]


def painterly(rgb: np.ndarray, rng) -> np.ndarray:
    """Oil-paint look: Kuwahara strokes, stronger colour, a canvas weave."""
    out = kuwahara(rgb, int(rng.integers(3, 8)))
    hsv = cv2.cvtColor(np.clip(out, 0, 255).astype(np.uint8), cv2.COLOR_RGB2HSV).astype(np.float32)
    hsv[..., 1] = np.clip(hsv[..., 1] * rng.uniform(1.1, 1.6), 0, 255)
    out = cv2.cvtColor(hsv.astype(np.uint8), cv2.COLOR_HSV2RGB).astype(np.float32)
    h, w = out.shape[:2]
    yy, xx = np.mgrid[0:h, 0:w]
    p = rng.uniform(2.5, 4.5)
    weave = (np.sin(xx * 2 * math.pi / p) * np.sin(yy * 2 * math.pi / p))[..., None]
    out += weave * rng.uniform(4, 12)
    return np.clip(out, 0, 255).astype(np.uint8)


def document(rgb: np.ndarray, rng) -> np.ndarray:
    """A page of text (title, paragraphs, columns, rules) or a web-page-like screenshot with a photo."""
    h, w = rgb.shape[:2]
    paper = _colour(rng, light=True) if rng.random() < .5 else (255, 255, 255)
    im = Image.new("RGB", (w, h), paper)
    d = ImageDraw.Draw(im)
    ink = _colour(rng, light=False)
    y = int(h * rng.uniform(.03, .08))
    margin = int(w * rng.uniform(.04, .1))
    if rng.random() < .5:  # web page: a header bar, a photo, buttons
        bar = int(h * rng.uniform(.06, .12))
        d.rectangle([0, 0, w, bar], fill=_colour(rng))
        d.text((margin, bar // 4), name(rng).title(), fill=(255, 255, 255), font=font(rng, bar // 2))
        y = bar + int(h * .03)
        if rng.random() < .7:
            pw, ph = int(w * rng.uniform(.3, .5)), int(h * rng.uniform(.2, .35))
            im.paste(Image.fromarray(rgb).resize((pw, ph)), (w - margin - pw, y))
        for _ in range(int(rng.integers(1, 3))):
            bx, by = margin, int(h * rng.uniform(.6, .9))
            d.rounded_rectangle([bx, by, bx + int(w * .25), by + int(h * .06)], radius=6, fill=_colour(rng))
    size = int(h * rng.uniform(.06, .1))
    d.text((margin, y), sentence(rng, int(rng.integers(2, 5))).title(), fill=ink, font=font(rng, size))
    y += int(size * 1.6)
    body = font(rng, int(h * rng.uniform(.022, .04)))
    line_h = int(body.size * rng.uniform(1.25, 1.6))
    cols = int(rng.integers(1, 3))
    col_w = (w - 2 * margin) // cols
    for c in range(cols):
        yy = y
        while yy < h - margin:
            if rng.random() < .08:
                yy += line_h  # paragraph break
                continue
            text = sentence(rng, 12)
            while text and _text_size(text, body)[0] > col_w - 6:
                text = text.rsplit(" ", 1)[0] if " " in text else ""
            d.text((margin + c * col_w, yy), text, fill=ink, font=body)
            yy += line_h
    if rng.random() < .3:
        d.line([margin, y - size // 3, w - margin, y - size // 3], fill=ink, width=2)
    return np.asarray(im)


def clipart(rgb: np.ndarray, rng) -> np.ndarray:
    """Flat vector clip art: outlined shapes and a simple figure in the photo's own palette."""
    h, w = rgb.shape[:2]
    palette = np.asarray(Image.fromarray(rgb).quantize(colors=6, method=Image.MEDIANCUT).convert("RGB"))
    colours = [tuple(int(v) for v in c) for c in np.unique(palette.reshape(-1, 3), axis=0)] or [_colour(rng)]
    colours += [_colour(rng) for _ in range(3)]
    pick = lambda: colours[int(rng.integers(len(colours)))]  # noqa: E731
    s = 2
    im = Image.new("RGB", (w * s, h * s), pick())
    d = ImageDraw.Draw(im)
    outline = (20, 20, 20) if rng.random() < .7 else None
    lw = int(rng.integers(2, 6)) * s
    if rng.random() < .5:  # ground
        d.rectangle([0, int(h * s * rng.uniform(.6, .85)), w * s, h * s], fill=pick(), outline=outline, width=lw)
    for _ in range(int(rng.integers(4, 10))):
        x, y = rng.uniform(0, w * s), rng.uniform(0, h * s)
        r = rng.uniform(.06, .25) * min(w, h) * s
        kind = int(rng.integers(4))
        if kind == 0:
            d.ellipse([x - r, y - r, x + r, y + r], fill=pick(), outline=outline, width=lw)
        elif kind == 1:
            d.rounded_rectangle([x - r, y - r * .7, x + r, y + r * .7], radius=int(r * .3), fill=pick(),
                                outline=outline, width=lw)
        else:
            n = int(rng.integers(3, 7))
            d.polygon([(x + r * math.cos(2 * math.pi * i / n + .3), y + r * math.sin(2 * math.pi * i / n + .3))
                       for i in range(n)], fill=pick(), outline=outline, width=lw)
    if rng.random() < .7:  # a simple figure
        cx, top, u = rng.uniform(.3, .7) * w * s, rng.uniform(.15, .35) * h * s, rng.uniform(.06, .1) * h * s
        d.rounded_rectangle([cx - u, top + u * 1.2, cx + u, top + u * 4], radius=int(u * .5), fill=pick(),
                            outline=outline, width=lw)
        d.ellipse([cx - u * .8, top - u * .4, cx + u * .8, top + u * 1.2], fill=pick(), outline=outline, width=lw)
    return np.asarray(im.resize((w, h), Image.LANCZOS))


def render_frame(rgb: np.ndarray, rng, renders: list[np.ndarray]) -> np.ndarray:
    """A frame of a `humanset render` run (synthetic humans under HDRIs), cropped like the photos."""
    frame_rgb = renders[int(rng.integers(len(renders)))]
    return random_view(frame_rgb, rng, max(rgb.shape[:2]), (.5, 1.0))


# --- composing a sample -----------------------------------------------------------------------------
def random_view(rgb: np.ndarray, rng, longer_side: int, scale=(0.35, 1.0)) -> np.ndarray:
    """A random crop (area fraction in `scale`, aspect 3:5..5:3) resized so its longer side is `longer_side`."""
    h, w = rgb.shape[:2]
    area = h * w * rng.uniform(*scale)
    aspect = math.exp(rng.uniform(math.log(.6), math.log(1 / .6)))
    cw, ch = min(w, int(round(math.sqrt(area * aspect)))), min(h, int(round(math.sqrt(area / aspect))))
    cw, ch = max(cw, 8), max(ch, 8)
    x, y = int(rng.integers(0, max(1, w - cw + 1))), int(rng.integers(0, max(1, h - ch + 1)))
    crop = rgb[y:y + ch, x:x + cw]
    if rng.random() < .5:
        crop = crop[:, ::-1]
    f = longer_side / max(crop.shape[:2])
    size = (max(8, int(round(crop.shape[1] * f))), max(8, int(round(crop.shape[0] * f))))
    return cv2.resize(np.ascontiguousarray(crop), size, interpolation=cv2.INTER_AREA if f < 1 else cv2.INTER_CUBIC)


def jpeg(rgb: np.ndarray, quality: int) -> np.ndarray:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=int(quality))
    return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))


def generate(task: str, family: str, base: np.ndarray, rng: np.random.Generator, settings: GeneratorSettings,
             renders: list[np.ndarray] | None = None) -> np.ndarray:
    """One image of `family` made from a view of the clean photo `base` (already at generator size)."""
    if task == "watermark":
        if family in WATERMARK_POSITIVE:
            return watermark(base, family, rng, settings)
        fn = {"clean": lambda b, r: b, "sign": sign, "border": border, "frame": frame}.get(family)
    elif task == "art":
        if family == "render":
            if not renders:
                raise ValueError("art family 'render' needs frames of a render run (--renders)")
            return render_frame(base, rng, renders)
        fn = {"clean": lambda b, r: b, "cartoon": cartoon, "pencil": pencil, "painterly": painterly,
              "document": document, "clipart": clipart}.get(family)
    else:
        raise ValueError(f"filter {task!r}: choose watermark or art")
    if fn is None:
        raise ValueError(f"{task}: unknown generator family {family!r}")
    return fn(base, rng)


@dataclass
class FilterSpec:
    """Which families feed which class, and which are held out for validation."""
    task: str
    holdout: tuple = ()
    renders: bool = False  # art: frames of a render run are available
    classes: list = field(init=False)
    keep_class: str = field(init=False)
    positive: tuple = field(init=False)  # families that should be rejected
    negative: tuple = field(init=False)

    def __post_init__(self):
        if self.task == "watermark":
            self.positive, self.negative = WATERMARK_POSITIVE, WATERMARK_NEGATIVE
        elif self.task == "art":
            self.positive = tuple(f for f in ART_POSITIVE if f != "render" or self.renders)
            self.negative = ART_NEGATIVE
        else:
            raise ValueError(f"filter {self.task!r}: choose watermark or art")
        self.holdout = tuple(self.holdout)
        unknown = [f for f in self.holdout if f not in self.positive + self.negative]
        if unknown:
            raise ValueError(f"{self.task}: held-out families {unknown} are not among "
                             f"{', '.join(self.positive + self.negative)}")
        if not self.train_positive or not self.train_negative:
            raise ValueError(f"{self.task}: holding out {list(self.holdout)} leaves a class with no family to train on")
        if self.task == "watermark":
            self.classes, self.keep_class = ["clean", "watermark"], "clean"
        else:  # one class per non-photo family, so the stage can say which kind of image it saw
            self.classes = ["photo"] + [ART_LABELS[f] for f in self.train_positive]
            self.keep_class = "photo"

    @property
    def train_positive(self) -> tuple:
        return tuple(f for f in self.positive if f not in self.holdout)

    @property
    def train_negative(self) -> tuple:
        return tuple(f for f in self.negative if f not in self.holdout)

    def label(self, family: str) -> int:
        """Class index of a training family (held-out families have none: -1)."""
        if family in self.holdout:
            return -1
        if self.task == "watermark":
            return int(family in self.positive)
        return self.classes.index(ART_LABELS[family])


class FilterSamples:
    """Sample k of a stream is a pure function of (seed, k): class, family, clean photo, crop and generator.

    Odd samples are positives, even ones negatives. Split "train" draws from the training families on the
    training photos; "val_seen" from the same
    families on the validation photos; "val_heldout" the held-out families (plus, for a class without a
    held-out family, its training families) on the validation photos. Items are (uint8 (3, S, S),
    class index or -1, positive (bool), family).
    """

    def __init__(self, spec: FilterSpec, photos: list[np.ndarray], input_px: int, seed: int = 0,
                 settings: GeneratorSettings | None = None, renders: list[np.ndarray] | None = None,
                 split: str = "train"):
        if not photos:
            raise ValueError("no clean photos to make filter training data from")
        self.spec, self.photos, self.input_px, self.seed = spec, photos, input_px, seed
        self.settings = settings or GeneratorSettings()
        self.renders = renders or []
        self.split = split
        if split == "train":
            self.pos, self.neg = spec.train_positive, spec.train_negative
        elif split == "val_seen":
            self.pos, self.neg = spec.train_positive, spec.train_negative
        elif split == "val_heldout":
            held_pos = tuple(f for f in spec.holdout if f in spec.positive)
            held_neg = tuple(f for f in spec.holdout if f in spec.negative)
            # the clean class is always measured on real clean photos too
            self.pos = held_pos or spec.train_positive
            self.neg = tuple(dict.fromkeys(held_neg + (("clean",) if "clean" in spec.negative else ())))
        else:
            raise ValueError(f"split {split!r}")
        self._salt = {"train": 0, "val_seen": 1, "val_heldout": 2}[split]

    def rng(self, k: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self._salt, k])

    def sample(self, k: int) -> tuple[np.ndarray, int, bool, str]:
        """Samples 2j and 2j + 1 share one view of one photo: a negative and a positive of the same scene,
        so a batch's contrast is the overlay or the style, not the scene."""
        s = self.settings
        pair = np.random.default_rng([self.seed, self._salt, k // 2, 7])
        base = random_view(self.photos[int(pair.integers(len(self.photos)))], pair, s.gen_px, s.crop_scale)
        rng = self.rng(k)
        positive = k % 2 == 1
        families = self.pos if positive else self.neg
        family = families[int(rng.integers(len(families)))]
        img = generate(self.spec.task, family, base, rng, s, self.renders)
        if rng.random() < s.jpeg_prob:
            img = jpeg(img, int(rng.integers(s.jpeg_quality[0], s.jpeg_quality[1] + 1)))
        return to_input(img, self.input_px), self.spec.label(family), positive, family

    def __getitem__(self, k: int) -> dict:
        img, label, positive, _ = self.sample(int(k))
        return {"image": img, "label": np.int64(label), "positive": np.bool_(positive)}


def to_input(rgb: np.ndarray, input_px: int) -> np.ndarray:
    """HxWx3 uint8 -> (3, S, S) uint8: squashed to the square input, bilinear, as the stages do."""
    im = Image.fromarray(rgb).resize((input_px, input_px), Image.BILINEAR)
    return np.ascontiguousarray(np.asarray(im, np.uint8).transpose(2, 0, 1))


def split_photos(photos: list, every: int = 5) -> tuple[list, list]:
    """Every `every`-th clean photo is for validation only (at least one each side)."""
    if len(photos) < 2:
        raise ValueError(f"{len(photos)} clean photo(s): at least 2 are needed (one for training, one for validation)")
    val = photos[::every]
    train = [p for i, p in enumerate(photos) if i % every]
    return train, val


def contact_sheet(spec: FilterSpec, photos: list[np.ndarray], px: int = 128, per_family: int = 4,
                  seed: int = 0, renders=None) -> Image.Image:
    """One row per family: what the generators draw (for eyes and the README)."""
    settings = GeneratorSettings(gen_px=px)
    families = spec.positive + spec.negative
    sheet = Image.new("RGB", (per_family * px, len(families) * px), (255, 255, 255))
    for r, fam in enumerate(families):
        for c in range(per_family):
            rng = np.random.default_rng([seed, r, c])
            base = random_view(photos[(r + c) % len(photos)], rng, px, settings.crop_scale)
            img = generate(spec.task, fam, base, rng, settings, renders)
            sheet.paste(Image.fromarray(img).resize((px, px)), (c * px, r * px))
    return sheet

