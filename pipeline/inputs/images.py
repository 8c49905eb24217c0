"""Image bytes -> facts and pixels, cheaply: header reads, JPEG draft mode, EXIF orientation.

Every function takes the original file bytes; nothing here touches a file system or a cluster.
"""
from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, ImageOps

from pipeline.inputs.resample import lanczos_grey

# Orientations 5-8 swap width and height (EXIF spec: transpose / rotate 90 / 270).
_SWAPS_AXES = {5, 6, 7, 8}


class ImageError(Exception):
    """The bytes cannot be used as an image; the message is the catalog's decode_error."""


def _open(data: bytes, max_pixels: int | None) -> Image.Image:
    if not data:
        raise ImageError("empty file (0 bytes)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a corrupt file's metadata warnings are not console news
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        old = Image.MAX_IMAGE_PIXELS
        try:
            Image.MAX_IMAGE_PIXELS = max_pixels
            im = Image.open(io.BytesIO(data))
            if max_pixels and im.width * im.height > max_pixels:
                raise ImageError(f"decompression bomb: declares {im.width}x{im.height} = "
                                 f"{im.width * im.height} px > decode.max_pixels={max_pixels}")
            return im
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            raise ImageError(f"decompression bomb: {e}") from e
        except Image.UnidentifiedImageError as e:
            raise ImageError("not an image (unrecognised bytes)") from e
        except (OSError, ValueError, SyntaxError) as e:
            raise ImageError(f"unreadable header: {e}") from e
        finally:
            Image.MAX_IMAGE_PIXELS = old


THUMB = 32  # side of the grey thumbnail probe() keeps: what a 64-bit pHash looks at
# JPEGs are draft-decoded (DCT scaling, a power of two) to at least this many pixels a side before
# the LANCZOS resize to THUMB, as imagehash.phash resizes the full image: at 8x THUMB the hash agrees
# with imagehash's of the full image (tests/pipeline/dedup/test_phash.py measures it); the old 1/8 draft did not
THUMB_DRAFT = 8 * THUMB


def probe(data: bytes, max_pixels: int | None = None, verify: bool = True) -> dict:
    """Format, mode, size after EXIF orientation, frame count - from the header.

    With verify=True the pixel data is decoded too (JPEG in draft mode, scaled down by up to 8 but
    kept at least THUMB_DRAFT px a side; it still reads every entropy-coded byte), so truncated files
    are caught without a full-size decode, and the decoded pixels leave a THUMBxTHUMB grey thumbnail
    ("thumb", EXIF-oriented, first frame; grey then LANCZOS as imagehash.phash does) for the
    perceptual hash, so no stage decodes the image twice.
    """
    im = _open(data, max_pixels)
    try:
        orientation = int(im.getexif().get(0x0112, 1) or 1)
    except Exception:  # broken EXIF must not lose the image
        orientation = 1
    w, h = im.size
    if orientation in _SWAPS_AXES:
        w, h = h, w
    info = {"format": im.format, "mode": im.mode, "width": w, "height": h,
            "exif_orientation": orientation, "n_frames": int(getattr(im, "n_frames", 1) or 1)}
    if verify:
        try:
            if im.format == "JPEG":  # grey straight from libjpeg (its Y channel): no colour conversion,
                # no chroma upsampling; every entropy-coded byte is still decoded
                im.draft("L" if im.mode in ("RGB", "L") else None, (THUMB_DRAFT, THUMB_DRAFT))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                Image.LOAD_TRUNCATED_IMAGES = False
                im.load()
        except (OSError, ValueError, SyntaxError, EOFError) as e:
            raise ImageError(f"truncated or corrupt pixel data: {e}") from e
        small = ImageOps.exif_transpose(im) if orientation != 1 else im
        grey = small if small.mode == "L" else to_rgb(small).convert("L")
        info["thumb"] = lanczos_grey(np.asarray(grey), THUMB, THUMB).tobytes()  # Pillow's resize, faster
    return info


def to_rgb(im: Image.Image) -> Image.Image:
    """Any PIL mode -> RGB: CMYK, palette with transparency, 16-bit, alpha (composited on grey)."""
    if im.mode == "RGB":
        return im
    if im.mode in ("I;16", "I;16B", "I;16L", "I"):
        a = np.asarray(im, dtype=np.float64)
        hi = 65535.0 if im.mode.startswith("I;16") else max(float(a.max()), 1.0)
        return Image.fromarray(np.clip(a / hi * 255.0 + 0.5, 0, 255).astype(np.uint8)).convert("RGB")
    if im.mode == "F":
        a = np.asarray(im, dtype=np.float64)
        return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).convert("RGB")
    if im.mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")
    if im.mode in ("RGBA", "LA", "PA"):
        im = im.convert("RGBA")
        bg = Image.new("RGBA", im.size, (128, 128, 128, 255))
        return Image.alpha_composite(bg, im).convert("RGB")
    return im.convert("RGB")


def load_rgb(data: bytes, max_side: int | None = None, max_pixels: int | None = None
             ) -> tuple[np.ndarray, float]:
    """Decode to an RGB uint8 array (H, W, 3), EXIF-oriented, first frame of animations.

    With max_side, the image is shrunk so its longer side is at most max_side, using JPEG draft
    mode (DCT scaling) when possible. Returns (pixels, scale) with scale = returned / original size,
    so a box in returned pixels maps back to original pixels by dividing by scale.
    """
    im = _open(data, max_pixels)
    try:
        orientation = int(im.getexif().get(0x0112, 1) or 1)
    except Exception:
        orientation = 1
    ow, oh = im.size
    if orientation in _SWAPS_AXES:
        ow, oh = oh, ow
    try:
        if max_side and im.format == "JPEG" and max(ow, oh) > max_side:
            # draft picks a DCT scale >= the requested size, so quality stays at least max_side
            f = max_side / max(ow, oh)
            im.draft("RGB" if im.mode in ("RGB", "CMYK", "YCbCr") else im.mode,
                     (max(1, int(im.size[0] * f)), max(1, int(im.size[1] * f))))
        im.seek(0)
        im = ImageOps.exif_transpose(im) if orientation != 1 else im
        im = to_rgb(im)
        if max_side and max(im.size) > max_side:
            f = max_side / max(im.size)
            im = im.resize((max(1, round(im.size[0] * f)), max(1, round(im.size[1] * f))),
                           Image.BILINEAR, reducing_gap=2.0)
        arr = np.asarray(im, dtype=np.uint8)
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise ImageError(f"truncated or corrupt pixel data: {e}") from e
    return arr, arr.shape[1] / ow
