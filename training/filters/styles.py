"""Non-photo generators made from a clean photo (cartoon, pencil, painterly, document, clip art, render
frames) and the random view every sample starts from. Pure functions of (photo, numpy Generator)."""
from __future__ import annotations

import math

import cv2
import numpy as np
from PIL import Image, ImageDraw

from training.filters.lettering import random_colour, text_size, font, name, sentence

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
    paper = np.array(random_colour(rng, light=True), np.float32) if rng.random() < .5 else np.full(3, 250, np.float32)
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
    paper = random_colour(rng, light=True) if rng.random() < .5 else (255, 255, 255)
    im = Image.new("RGB", (w, h), paper)
    d = ImageDraw.Draw(im)
    ink = random_colour(rng, light=False)
    y = int(h * rng.uniform(.03, .08))
    margin = int(w * rng.uniform(.04, .1))
    if rng.random() < .5:  # web page: a header bar, a photo, buttons
        bar = int(h * rng.uniform(.06, .12))
        d.rectangle([0, 0, w, bar], fill=random_colour(rng))
        d.text((margin, bar // 4), name(rng).title(), fill=(255, 255, 255), font=font(rng, bar // 2))
        y = bar + int(h * .03)
        if rng.random() < .7:
            pw, ph = int(w * rng.uniform(.3, .5)), int(h * rng.uniform(.2, .35))
            im.paste(Image.fromarray(rgb).resize((pw, ph)), (w - margin - pw, y))
        for _ in range(int(rng.integers(1, 3))):
            bx, by = margin, int(h * rng.uniform(.6, .9))
            d.rounded_rectangle([bx, by, bx + int(w * .25), by + int(h * .06)], radius=6, fill=random_colour(rng))
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
            while text and text_size(text, body)[0] > col_w - 6:
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
    colours = [tuple(int(v) for v in c) for c in np.unique(palette.reshape(-1, 3), axis=0)] or [random_colour(rng)]
    colours += [random_colour(rng) for _ in range(3)]
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


# --- photo variants: still photographs (the art filter must keep them) --------------------------------
def old_photo(rgb: np.ndarray, rng) -> np.ndarray:
    """Black-and-white or sepia print: faded contrast, film grain, soft focus, vignette."""
    grey = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY).astype(np.float32)
    if rng.random() < .5:
        grey = cv2.GaussianBlur(grey, (0, 0), rng.uniform(.5, 1.5))
    lo, hi = rng.uniform(0, 50), rng.uniform(190, 255)
    grey = lo + grey * (hi - lo) / 255.0
    tint = np.array([1.0, 1.0, 1.0]) if rng.random() < .5 else np.array([1.07, .95, .78]) * rng.uniform(.95, 1.05)
    out = grey[..., None] * tint.reshape(1, 1, 3).astype(np.float32)
    out += rng.normal(0, rng.uniform(2, 10), grey.shape)[..., None]
    return np.clip(out * _vignette(rgb.shape[:2], rng)[..., None], 0, 255).astype(np.uint8)


def grey(rgb: np.ndarray, rng) -> np.ndarray:
    """A plain black-and-white photo: luma only (ITU-R 601), no grain, fading or tint (a digital B/W
    portrait, a scan of a clean print)."""
    return np.repeat(cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)[..., None], 3, axis=2)


def low_light(rgb: np.ndarray, rng) -> np.ndarray:
    """Underexposed: darkened (gamma), sensor noise stronger in the shadows, a colour cast."""
    x = (rgb.astype(np.float32) / 255.0) ** rng.uniform(1.6, 3.0) * rng.uniform(.35, .8)
    x *= np.array([1.0, rng.uniform(.85, 1.05), rng.uniform(.6, 1.1)], np.float32)
    sigma = rng.uniform(.01, .05)
    x += rng.normal(0, sigma, x.shape).astype(np.float32) + rng.normal(0, sigma, x.shape[:2] + (1,))
    return np.clip(x * 255.0, 0, 255).astype(np.uint8)


def processed(rgb: np.ndarray, rng) -> np.ndarray:
    """Heavy editing: strong saturation and contrast, local contrast ('HDR'), a colour grade, vignette."""
    x = rgb.astype(np.float32)
    blur = cv2.GaussianBlur(x, (0, 0), rng.uniform(8, 30))
    x = x + (x - blur) * rng.uniform(.5, 2.0)
    hsv = cv2.cvtColor(np.clip(x, 0, 255).astype(np.uint8), cv2.COLOR_RGB2HSV).astype(np.float32)
    hsv[..., 1] = np.clip(hsv[..., 1] * rng.uniform(1.2, 2.0), 0, 255)
    x = cv2.cvtColor(hsv.astype(np.uint8), cv2.COLOR_HSV2RGB).astype(np.float32)
    grade = rng.uniform(.85, 1.15, 3).astype(np.float32)
    x = 255.0 / (1 + np.exp(-(x * grade / 255.0 - .5) * rng.uniform(4, 9)))
    return np.clip(x * _vignette(rgb.shape[:2], rng)[..., None], 0, 255).astype(np.uint8)


def video_frame(rgb: np.ndarray, rng) -> np.ndarray:
    """A frame of a low-bit-rate video or webcam stream: shrunk to 240-480 lines and blown back up (soft),
    colour at half resolution, coded in 8 px blocks at a low JPEG quality (10-35) while small, contrast
    and gamma slightly off; a quarter of them in black and white (archival footage, a filmed print)."""
    h, w = rgb.shape[:2]
    lines = int(rng.integers(240, 481))
    f = min(1.0, lines / h)
    small = cv2.resize(rgb, (max(16, round(w * f)), max(16, round(h * f))), interpolation=cv2.INTER_AREA)
    if rng.random() < .25:
        small = grey(small, rng)
    ycc = cv2.cvtColor(small, cv2.COLOR_RGB2YCrCb)
    sh, sw = ycc.shape[:2]
    chroma = cv2.resize(cv2.resize(ycc[..., 1:], (max(8, sw // 2), max(8, sh // 2)), interpolation=cv2.INTER_AREA),
                        (sw, sh), interpolation=cv2.INTER_LINEAR)
    small = cv2.cvtColor(np.dstack([ycc[..., :1], chroma]), cv2.COLOR_YCrCb2RGB)
    ok, buf = cv2.imencode(".jpg", small[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, int(rng.integers(10, 36))])
    if not ok:
        raise ValueError(f"video_frame: OpenCV could not encode a {small.shape} frame as JPEG")
    small = cv2.imdecode(buf, cv2.IMREAD_COLOR)[..., ::-1]
    x = cv2.resize(small, (w, h), interpolation=cv2.INTER_LINEAR).astype(np.float32) / 255.0
    x = x ** rng.uniform(.8, 1.25) * rng.uniform(.85, 1.1) + rng.uniform(-.04, .06)
    return np.clip(x * 255.0, 0, 255).astype(np.uint8)


def _vignette(shape, rng) -> np.ndarray:
    h, w = shape
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    r = np.hypot((xx - w / 2) / (w / 2), (yy - h / 2) / (h / 2)) / math.sqrt(2)
    return (1 - rng.uniform(0, .5) * r ** 2).astype(np.float32)


PHOTO_VARIANTS = {"old_photo": old_photo, "low_light": low_light, "processed": processed, "grey": grey,
                  "video_frame": video_frame}
