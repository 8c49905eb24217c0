"""Real photos with Impact-style captions that the real PP-OCR models (rapidocr) read: the text stage's
test images and the dedup fallback's crawl (two clusters whose captioned canonicals the text stage
rejects, a clean copy each), shared by the text, fallback and select tests."""
from __future__ import annotations

import io
from importlib import resources
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from pipeline.config import default_config

SKIMAGE = Path(str(resources.files("skimage") / "data"))


def _png(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.convert("RGB").save(buf, "PNG")
    return buf.getvalue()


def meme(path: Path, top: str, bottom: str, rel: float = 0.09) -> bytes:
    """Impact-style captions, top and bottom, text height `rel` of the image height."""
    im = Image.open(path).convert("RGB")
    d = ImageDraw.Draw(im)
    size = int(im.height * rel)
    font = ImageFont.load_default(size=size)
    for text, y in ((top, size * 0.3), (bottom, im.height - size * 1.5)):
        d.text((im.width * 0.05, y), text, font=font, fill="white", stroke_width=max(1, size // 15),
               stroke_fill="black")
    return _png(im)


def captioned_copy(tmp: Path, photo: str, side: int, caption=None) -> bytes:
    im = Image.open(SKIMAGE / photo).convert("RGB").resize((side, side), Image.LANCZOS)
    path = tmp / f"_{photo}-{side}.png"
    im.save(path)
    return meme(path, *caption, rel=0.07) if caption else path.read_bytes()


def write_crawl(tmp: Path) -> Path:
    """Two clusters of near copies (larger = canonical first) and a unique clean photo:
    astronaut: a 900-px captioned copy and a 512-px clean one;
    chelsea: 900- and 700-px captioned copies and a 512-px clean one."""
    folder = tmp / "crawl"
    folder.mkdir()
    files = {"astro_cap900": captioned_copy(tmp, "astronaut.png", 900, ("HELLO WORLD", "NICE DAY")),
             "astro_clean": captioned_copy(tmp, "astronaut.png", 512),
             "cat_cap900": captioned_copy(tmp, "chelsea.png", 900, ("WHEN THE CODE", "COMPILES")),
             "cat_cap700": captioned_copy(tmp, "chelsea.png", 700, ("BUY NOW", "FREE SHIPPING")),
             "cat_clean": captioned_copy(tmp, "chelsea.png", 512),
             "coffee": captioned_copy(tmp, "coffee.png", 400)}
    for name, data in files.items():
        (folder / f"{name}.png").write_bytes(data)
    return folder


def fallback_config(fallbacks: int) -> dict:
    """Decode, size, dedup (max distance 6) and text, with dedup.max_fallbacks = `fallbacks`."""
    cfg = default_config()
    cfg["stages"] = ["decode", "size", "dedup", "text"]
    cfg["dedup"]["max_distance"] = 6
    cfg["dedup"]["max_fallbacks"] = fallbacks
    cfg["engine"]["start_actors_early"] = False
    if fallbacks == 1:  # the partitioned dedup (same verdicts), its work files removed at the end
        cfg["dedup"]["partitioned"] = True
    if fallbacks == 2:  # its work files stay: test_resume_mid_fallback_round... cuts a crash state from them
        cfg["engine"]["keep_work"] = True
    return cfg
