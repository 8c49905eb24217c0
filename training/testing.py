"""Write small curated-shard folders (the curation engine's output format) from image bytes.

For tests and smoke runs of the training code without a curation run: the shards have the same
layout, index schema (catalog.CURATED_INDEX) and sidecars as `RUN/shards`.
"""
from __future__ import annotations

import hashlib
import io

from PIL import Image

import catalog


def write_curated_shards(folder, samples: list[tuple[str, bytes]], prefix: str = "curated",
                         per_shard: int = 8) -> list[str]:
    """samples: (file name such as 'astronaut.jpg', original bytes). Returns the shard names written.

    Index columns width/height/format come from PIL when the bytes open; undecodable bytes are
    written anyway (that is what the tests of skip-and-count need) with those columns null.
    """
    with catalog.ShardWriter(folder, prefix, catalog.CURATED_INDEX, max_count=per_shard) as writer:
        for i, (name, data) in enumerate(samples):
            ext = name.rsplit(".", 1)[-1].lower()
            key = f"{i:06d}"
            sha = hashlib.sha256(data).hexdigest()
            row = {"sample_id": sha[:24], "source_uri": f"test://{name}", "sha256": sha}
            try:
                with Image.open(io.BytesIO(data)) as im:
                    row.update(format=im.format, width=im.width, height=im.height)
            except Exception:
                pass
            writer.add(key, {ext: data, "json": {"source_uri": row["source_uri"], "sample_id": row["sample_id"]}},
                       row)
    return writer.written


def encode(array, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, fmt, **kw)
    return buf.getvalue()


def skimage_samples() -> list[tuple[str, bytes]]:
    """Real photos shipped inside scikit-image, encoded the ways a crawl delivers them: JPEG and PNG
    RGB, greyscale, CMYK JPEG, palette GIF, RGBA PNG, 16-bit PNG; plus one undecodable file."""
    import numpy as np
    import skimage.data as sd

    photos = {"astronaut": sd.astronaut(), "coffee": sd.coffee(), "chelsea": sd.chelsea(), "rocket": sd.rocket()}
    out = []
    for name, arr in photos.items():
        out.append((f"{name}.jpg", encode(arr, "JPEG", quality=90)))
        out.append((f"{name}_half.png", encode(arr[::2, ::2], "PNG")))
    out.append(("camera_grey.png", encode(sd.camera(), "PNG")))
    out.append(("astronaut_cmyk.jpg", _save(Image.fromarray(photos["astronaut"]).convert("CMYK"), "JPEG")))
    out.append(("coffee_palette.gif", _save(Image.fromarray(photos["coffee"]).convert("P"), "GIF")))
    rgba = np.dstack([photos["chelsea"], np.full(photos["chelsea"].shape[:2], 200, np.uint8)])
    out.append(("chelsea_alpha.png", encode(rgba, "PNG")))
    out.append(("camera_16bit.png", _save(Image.fromarray(sd.camera().astype(np.uint16) * 257), "PNG")))
    out.append(("broken.jpg", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00 truncated: not an image"))
    return out


def _save(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()
