"""Fonts, words and colours the filter-data generators draw with (training/filters/samples.py)."""
from __future__ import annotations

import functools
import importlib.util
import logging
import shutil
import subprocess
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

log = logging.getLogger(__name__)

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


# --- small helpers ----------------------------------------------------------------------------------
def random_colour(rng, light=None) -> tuple[int, int, int]:
    if light is True:
        return tuple(int(v) for v in rng.integers(200, 256, 3))
    if light is False:
        return tuple(int(v) for v in rng.integers(0, 60, 3))
    return tuple(int(v) for v in rng.integers(0, 256, 3))


def text_size(text: str, fnt) -> tuple[int, int]:
    l, t, r, b = fnt.getbbox(text)
    return max(1, r - l), max(1, b - t)


def text_layer(text: str, height_px: int, rng, stroke: int = 0) -> Image.Image:
    """White text on a transparent layer (its alpha is the glyph mask), cropped to the text."""
    fnt = font(rng, height_px)
    l, t, r, b = fnt.getbbox(text, stroke_width=stroke)
    layer = Image.new("L", (r - l + 4, b - t + 4), 0)
    ImageDraw.Draw(layer).text((2 - l, 2 - t), text, fill=255, font=fnt, stroke_width=stroke, stroke_fill=255)
    return layer
