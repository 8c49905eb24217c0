"""size: shortest side and aspect ratio against the config's limits.

`size.use_original` (default true): when the source records the resolution before the downloader
resized it (img2dataset's original_width / original_height) and the stored image is larger than
that (upscaled), the rules judge the original resolution: an upscaled image holds no more detail
than its original. `resolution_scale` (judged pixels per stored pixel) carries that to the person
box rule. A downscaled image is judged at its stored size (what training reads). Orientation is
ignored in the comparison (EXIF-rotated sides are matched longer to longer). false: stored pixels.
The columns are recomputed from stored ones on every decision (derive), so `humanset select
--set size.use_original=false` re-cuts without re-reading.
"""
from __future__ import annotations

from catalog.rules import RULES

from pipeline.settings import DEFAULTS
from pipeline.stages.base import Stage

COLUMNS = ("short_side", "aspect", "upscaled", "resolution_scale")


def judged(w, h, ow, oh, use_original: bool = True) -> tuple:
    """(short_side, aspect, upscaled, resolution_scale) of a stored w x h image whose source
    records an original ow x oh (None if not recorded); all None for an unmeasured image."""
    if not w or not h:
        return None, None, None, None
    long_s, short_s = max(w, h), min(w, h)
    upscaled, scale = None, 1.0
    if ow and oh and ow > 0 and oh > 0:
        long_o, short_o = max(ow, oh), min(ow, oh)
        upscaled = long_s > long_o or short_s > short_o
        if use_original and upscaled:  # a uniform resize (img2dataset keep_ratio, border) keeps this exact
            scale = min(1.0, max(long_o / long_s, short_o / short_s))
    return int(round(short_s * scale)), long_s / short_s, upscaled, scale


class SizeStage(Stage):
    name = "size"
    phase = "measure"
    reads = ("width", "height", "original_width", "original_height")
    writes = COLUMNS
    default_batch_size = 1024
    rules = RULES["size"]  # short_side >= size.min_short_side, aspect <= size.max_aspect (null: off)

    @property
    def use_original(self) -> bool:
        return bool(self.cfg.get("use_original", DEFAULTS.size.use_original))

    def _columns(self, w, h, ow, oh) -> dict[str, list]:
        ow, oh = ow or [None] * len(w), oh or [None] * len(w)
        out = list(zip(*(judged(*x, self.use_original) for x in zip(w, h, ow, oh)))) or [[]] * len(COLUMNS)
        return {c: list(v) for c, v in zip(COLUMNS, out)}

    def measure(self, batch):
        return self._columns(batch["width"], batch["height"], batch.get("original_width"),
                             batch.get("original_height"))

    def derive(self, table) -> dict[str, list]:
        """The judged columns under this config (size.use_original may differ from the run's)."""
        def col(c):
            return table.column(c).to_pylist() if c in table.column_names else None
        if col("width") is None:
            return {}
        return self._columns(col("width"), col("height"), col("original_width"), col("original_height"))
