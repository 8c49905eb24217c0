"""size: shortest side and aspect ratio against the config's limits."""
from __future__ import annotations

import pyarrow as pa

from .base import Stage


class SizeStage(Stage):
    name = "size"
    phase = "measure"
    reads = ("width", "height")
    writes = ("short_side", "aspect")
    default_batch_size = 1024

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

    def reject(self, table: pa.Table):
        min_short = self.cfg.get("min_short_side", 0)
        max_aspect = self.cfg.get("max_aspect")
        out = []
        for s, a in zip(table.column("short_side").to_pylist(), table.column("aspect").to_pylist()):
            if s is None:
                out.append(None)
            elif s < min_short:
                out.append(f"short_side<{min_short}")
            elif max_aspect and a > max_aspect:
                out.append(f"aspect>{max_aspect:g}")
            else:
                out.append(None)
        return out
