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
