"""A curation stage is data: a name, resources, batch size, the columns it reads and writes.

Scores and thresholds are separate (as in Data-Juicer): `measure` writes measurements for every
row it sees; `reject` turns stored measurements plus the config's thresholds into reasons. The same
`reject` serves `humanset curate` and `humanset select`, so re-thresholding never runs a model.
A stage's thresholds are data: `rules` points at its entry of catalog.rules.RULES (column, config
key, comparison, kept side), the one declaration stats, the report and calibrate read too.
The Ray wiring lives in pipeline/engine/driver.py only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pyarrow as pa

from catalog.rules import Rule, first_failure


@dataclass(frozen=True)
class Resources:
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory_gb: float | None = None

    @classmethod
    def from_cfg(cls, cfg: dict | None) -> "Resources":
        cfg = cfg or {}
        return cls(float(cfg.get("num_cpus", cls.num_cpus)), float(cfg.get("num_gpus", cls.num_gpus)), cfg.get("memory_gb"))


class Stage:
    """Base class. Subclasses set the class attributes and implement measure() and reject().

    - phase "measure": runs on every sample before global dedup (decode, size, hashes);
      phase "score": runs after dedup on the samples still kept (all of them with --score-all).
    - reads: batch columns needed. "image" is the original file bytes; decode columns (format,
      width, height, exif_orientation, ...) are available to score stages.
    - writes: SAMPLES columns this stage fills (catalog/schema.py).
    - stateful: True runs the stage as a Ray actor pool and calls setup() once per actor.
    """

    name: ClassVar[str]
    phase: ClassVar[str] = "score"
    reads: ClassVar[tuple[str, ...]] = ("image",)
    writes: ClassVar[tuple[str, ...]] = ()
    stateful: ClassVar[bool] = False
    default_batch_size: ClassVar[int] = 32
    rules: ClassVar[tuple[Rule, ...]] = ()  # its thresholds (catalog.rules.RULES[name])
    error_column: ClassVar[str | None] = None  # set when measure() failed on the row

    def __init__(self, cfg: dict | None = None):
        self.cfg = dict(cfg or {})

    # --- what the engine asks -----------------------------------------------------------------
    @property
    def resources(self) -> Resources:
        return Resources.from_cfg(self.cfg.get("resources"))

    @property
    def batch_size(self) -> int:
        return int(self.cfg.get("batch_size", self.default_batch_size))

    @property
    def concurrency(self) -> int | tuple[int, int] | None:
        c = self.cfg.get("concurrency")
        return tuple(c) if isinstance(c, list) else c

    @property
    def enabled(self) -> bool:
        """False when the stage cannot run (e.g. no weights configured); says why in skip_reason."""
        return self.skip_reason() is None

    def skip_reason(self) -> str | None:
        return None

    def info(self) -> dict:
        """What the manifest records about how this stage ran (e.g. {"method": "ocr"}); {} = nothing."""
        return {}

    # --- what a stage does ----------------------------------------------------------------------
    def setup(self) -> None:
        """Load models. Raise with a clear message if they cannot be loaded (stops the run)."""

    def measure(self, batch: dict[str, list]) -> dict[str, list]:
        """Return {column: values} for every row of `batch`, each list as long as the batch.

        A failure on one sample must not raise: put the message in the stage's `*_error` column.
        """
        raise NotImplementedError

    def derive(self, table: pa.Table) -> dict[str, list]:
        """Columns that depend on thresholds, recomputed from stored columns whenever the config
        changes (curate and select alike): {column: values} for every row of `table`. Most stages
        have none; size and person override it."""
        return {}

    def reject(self, table: pa.Table) -> list[str | None]:
        """Reason (short, 'detail' without the stage name) per row, or None when the row passes
        or was not measured by this stage. Reads only stored columns and self.cfg thresholds.

        By default: "error" where error_column is set, else the first of `rules` the row fails."""
        if not self.rules:
            raise NotImplementedError(f"stage {self.name}: declare its rules or override reject()")
        return first_failure(self.rules, self.cfg,
                             {r.column: table.column(r.column).to_pylist() for r in self.rules},
                             table.column(self.error_column).to_pylist() if self.error_column else None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, phase={self.phase!r})"
