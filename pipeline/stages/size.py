"""size: shortest side and aspect ratio against the config's limits."""
from __future__ import annotations

from catalog.rules import RULES

from .base import Stage


class SizeStage(Stage):
    name = "size"
    phase = "measure"
    reads = ("width", "height")
    writes = ("short_side", "aspect")
    default_batch_size = 1024
    rules = RULES["size"]  # short_side >= size.min_short_side, aspect <= size.max_aspect (null: off)

    def measure(self, batch):
        short, aspect = [], []
        for w, h in zip(batch["width"], batch["height"]):
            if not w or not h:
                short.append(None)
                aspect.append(None)
                continue
            short.append(min(w, h))
            aspect.append(max(w, h) / min(w, h))
        return {"short_side": short, "aspect": aspect}
