"""Image decoding and MAE augmentation, free of torch so Ray Data's decode workers start light.

Everything here is a pure function of bytes and an RNG: the same sample draws the same crop in any
process, which is what makes the shard stream exactly resumable.
"""
from __future__ import annotations

import io
import logging
import random
import warnings

import numpy as np
from PIL import Image, ImageOps

import catalog
from catalog.tars import IMAGE_EXTS

log = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# --- decoding --------------------------------------------------------------------------------
def decode_image(data: bytes) -> Image.Image:
    """Original file bytes -> upright 8-bit RGB: EXIF orientation applied, first frame of animations,
    16-bit and float greyscale rescaled (not clipped), alpha composited on white, CMYK/P/LA converted."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        img = Image.open(io.BytesIO(data))
        img.seek(0)  # animations: the first frame
        img.load()
    img = ImageOps.exif_transpose(img)
    if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        arr = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
        img = Image.fromarray(np.clip(arr / top * 255.0 + 0.5, 0, 255).astype(np.uint8), "L")
    if img.mode == "P":
        img = img.convert("RGBA")  # palette transparency becomes an alpha channel
    if img.mode in ("RGBA", "LA", "PA"):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(background, rgba)
    return img.convert("RGB")


# --- augmentation: RandomResizedCrop(scale 0.2-1, bicubic) + horizontal flip, from a given RNG ----
def crop_params(rng: random.Random, width: int, height: int, scale=(0.2, 1.0),
                ratio=(3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params drawn from `rng`: (top, left, height, width)."""
    area = width * height
    log_ratio = (np.log(ratio[0]), np.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = float(np.exp(rng.uniform(*log_ratio)))
        w = int(round((target * aspect) ** 0.5))
        h = int(round((target / aspect) ** 0.5))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    # fallback: the central crop with the aspect clamped into `ratio`
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def augment(img: Image.Image, size: int, rng: random.Random, scale=(0.2, 1.0)) -> np.ndarray:
    """RandomResizedCrop to size x size (bicubic) and a horizontal flip with p = 0.5 -> uint8 (3, S, S)."""
    top, left, h, w = crop_params(rng, img.width, img.height, scale)
    out = img.resize((size, size), Image.BICUBIC, box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return np.ascontiguousarray(np.asarray(out, dtype=np.uint8).transpose(2, 0, 1))


def center_resize(img: Image.Image, size: int) -> np.ndarray:
    """Evaluation view: the central square, resized bicubically -> uint8 (3, S, S)."""
    side = min(img.width, img.height)
    left, top = (img.width - side) // 2, (img.height - side) // 2
    out = img.resize((size, size), Image.BICUBIC, box=(left, top, left + side, top + side))
    return np.ascontiguousarray(np.asarray(out, dtype=np.uint8).transpose(2, 0, 1))


def sample_rng(seed: int, epoch: int, shard: str, row: int) -> random.Random:
    # str seeds are hashed with SHA-512 by `random`: identical in every process, whatever PYTHONHASHSEED
    return random.Random(f"{seed}/{epoch}/{shard}/{row}")


RENDER_IMAGE = "rgb.png"  # a render frame's picture ({key}.rgb.png beside its depth, normals and mask)


def read_image_member(fh, members: list[dict]) -> bytes:
    """The bytes of a sample's image member: a curated shard's {key}.jpg / .png / ..., or a render shard's
    {key}.rgb.png (so MAE pretraining reads render runs' shards too)."""
    for m in members:
        if catalog.split_member(m["name"])[1].lower() in IMAGE_EXTS + (RENDER_IMAGE,):
            fh.seek(m["offset"])
            data = fh.read(m["size"])
            if len(data) != m["size"]:
                raise EOFError(f"member {m['name']} is cut short")
            return data
    raise KeyError(f"no image member among {[m['name'] for m in members]}")


def decode_augment_batch(batch: dict, folder: str, image_size: int, crop_scale=(0.2, 1.0)) -> dict:
    """Ray Data map_batches function: index rows -> {"image": uint8 (n, 3, S, S), "ok": bool (n,)}.

    Undecodable rows keep their slot with ok = False (and a black image), so the training loop can
    count them; rows dropped inside Ray Data would vanish without a trace. Ray Data reorders every pass,
    so augmentation here draws from fresh entropy rather than from (seed, epoch, row).
    """
    n = len(batch["key"])
    images = np.zeros((n, 3, image_size, image_size), np.uint8)
    ok = np.zeros(n, bool)
    rng = random.Random()
    for i in range(n):
        shard, key = str(batch["shard"][i]), str(batch["key"][i])
        try:
            with catalog.open_shard_file(folder, shard) as fh:  # local, or ranged reads on a store
                img = decode_image(read_image_member(fh, list(batch["members"][i])))
        except Exception as e:
            log.warning("shard %s key %s: skipped, image does not decode (%s: %s)", shard, key, type(e).__name__, e)
            continue
        images[i] = augment(img, image_size, rng, crop_scale)
        ok[i] = True
    return {"image": images, "ok": ok}


def read_image_file(path, what: str = "IMAGE") -> Image.Image:
    """decode_image of a file a user named, refused in one line naming it when it is missing or not an image."""
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path}: no such file; pass a photo (JPEG, PNG, WebP, ...)")
    try:
        return decode_image(path.read_bytes())
    except (OSError, ValueError, Image.DecompressionBombError) as e:  # PIL.UnidentifiedImageError is an OSError
        raise ValueError(f"{what} {path}: not an image PIL can read ({type(e).__name__}); pass a photo "
                         "(JPEG, PNG, WebP, ...)") from None
