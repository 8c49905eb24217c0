"""Watermark generators (text, logos; single, corner, tiled) and their hard negatives (scene-text signs,
borders, frames), drawn on a clean photo. Pure functions of (photo, numpy Generator)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import cv2
import numpy as np
from PIL import Image, ImageDraw

from training.filters.lettering import random_colour, text_size, font, name, sentence, text_layer, watermark_text

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
        w, h = text_size(letters, fnt)
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
    colour = random_colour(rng, light=bool(rng.random() < .6)) if rng.random() < .85 else random_colour(rng)
    if mode == "multiply":
        colour = random_colour(rng, light=False)
    elif mode == "screen":
        colour = random_colour(rng, light=True)
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
def sign(rgb: np.ndarray, rng, scene_text: list[str] | tuple = ()) -> np.ndarray:
    """Scene text: one to three opaque boards with words, in perspective, small, blurred into the scene.
    Half the words come from `scene_text` (what the text stage read in the crawl) when there is some."""
    out = rgb.copy()
    h, w = rgb.shape[:2]
    for _ in range(int(rng.integers(1, 4))):
        if scene_text and rng.random() < .5:
            text = str(scene_text[int(rng.integers(len(scene_text)))])[:40] or name(rng)
        else:
            text = sentence(rng, int(rng.integers(1, 3))).upper() if rng.random() < .6 else name(rng).title()
        board, ink = random_colour(rng), None
        ink = (0, 0, 0) if sum(board) > 380 else (255, 255, 255)
        fnt = font(rng, 40)
        tw, th = text_size(text, fnt)
        pad = 12
        im = Image.new("RGB", (tw + 2 * pad, th + 2 * pad), board)
        l, t, _, _ = fnt.getbbox(text)
        ImageDraw.Draw(im).text((pad - l, pad - t), text, fill=ink, font=fnt)
        src = np.asarray(im)
        bw = w * rng.uniform(.12, .35)
        bh = bw * src.shape[0] / src.shape[1]
        x0, y0 = rng.uniform(0, max(1, w - bw)), rng.uniform(0, max(1, h - bh))
        j = lambda: rng.uniform(-.12, .12) * bw  # noqa: E731, B023  perspective jitter of each corner
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
    colour = random_colour(rng, light=bool(rng.random() < .5)) if rng.random() < .8 else random_colour(rng)
    out[:t], out[-t:], out[:, :t], out[:, -t:] = colour, colour, colour, colour
    if rng.random() < .4:  # a thin inner line
        c2 = random_colour(rng)
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
    wood = np.array(random_colour(rng), np.float32)
    out = np.empty_like(rgb, dtype=np.float32)
    yy, xx = np.mgrid[0:h, 0:w]
    d = np.minimum.reduce([yy, xx, h - 1 - yy, w - 1 - xx]).astype(np.float32)
    grain = 0.85 + 0.15 * np.sin(xx * rng.uniform(.3, .8) + yy * rng.uniform(.05, .2))[..., None]
    bevel = np.clip(0.7 + 0.6 * d / max(f, 1), .6, 1.3)[..., None]
    out[:] = wood * grain * bevel
    out[d >= f] = np.array(random_colour(rng, light=True), np.float32)  # passe-partout
    k = f + mat
    inner = cv2.resize(rgb, (max(1, w - 2 * k), max(1, h - 2 * k)), interpolation=cv2.INTER_AREA)
    out[k:k + inner.shape[0], k:k + inner.shape[1]] = inner
    return np.clip(out, 0, 255).astype(np.uint8)
