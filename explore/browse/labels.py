"""Hand labels from `humanset browse`, in the CSV `humanset calibrate --labels` and the quality bench
read: a header `sample_id,label`, then one row per sample and stage, label `STAGE=0|1`:

    sample_id,label
    3f2a...,person=1      a clear person is in the image
    91bc...,watermark=0   no watermark

Stages and the meaning of 1 are calibrate's (catalog.rules.CALIBRATED): person=1 a clear person,
text=1 overlaid text, watermark=1 a mark, art=1 not a photo. The file lives outside the run; it is
read at start (an existing file is kept and added to; a later row for the same sample and stage
wins, as in calibrate) and rewritten whole, atomically, after every change, so a crash leaves the
old file or the new one. Comment lines (`#`) are kept, moved between the header and the rows.
"""
from __future__ import annotations

import csv
import io
import threading
from collections import OrderedDict
from pathlib import Path

from catalog.io import write_bytes
from catalog.rules import CALIBRATED

STAGES = tuple(CALIBRATED)
# what 1 and 0 mean, per stage, as the app's buttons say it
MEANING = {"person": ("clear person", "no clear person"), "text": ("text", "no text"),
           "watermark": ("mark", "no mark"), "art": ("non-photo", "photo")}


class LabelError(ValueError):
    """A labels file or a label that is not in calibrate's format."""


def parse(text: str, name: str) -> tuple[list[str], OrderedDict]:
    """(comment lines, {(sample_id, stage): 0|1} in file order) of a labels CSV; errors name the line."""
    comments, labels, first = [], OrderedDict(), True
    for n, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or not "".join(row).strip():
            continue
        if row[0].lstrip().startswith("#"):
            comments.append(",".join(row))
            continue
        if first and row[0].strip().lower() == "sample_id":  # the header, before any row
            first = False
            continue
        first = False
        if len(row) != 2 or "=" not in row[1]:
            raise LabelError(f"{name}:{n}: expected 'sample_id,STAGE=0|1' (e.g. 'ab12..,person=1'), "
                             f"got {','.join(row)!r}")
        stage, value = (x.strip() for x in row[1].split("=", 1))
        if stage not in STAGES or value not in ("0", "1"):
            raise LabelError(f"{name}:{n}: expected STAGE=0|1 with STAGE one of {', '.join(STAGES)}, got {row[1]!r}")
        key = (row[0].strip(), stage)
        labels.pop(key, None)  # a later row wins; it moves to the end
        labels[key] = int(value)
    return comments, labels


def render(comments: list[str], labels: OrderedDict) -> bytes:
    """The file: the header first (calibrate skips it on line 1 only), then the comments, then the rows."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["sample_id", "label"])
    for c in comments:
        buf.write(c + "\n")
    for (sid, stage), value in labels.items():
        w.writerow([sid, f"{stage}={value}"])
    return buf.getvalue().encode()


class Labels:
    """The labels of one file, in memory and on disk; `path` None: labelling is off (read-only app)."""

    def __init__(self, path: Path | None):
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self.comments: list[str] = []
        self.labels: OrderedDict = OrderedDict()
        if self.path and self.path.exists():
            if not self.path.is_file():
                raise LabelError(f"--labels {self.path}: not a file")
            self.comments, self.labels = parse(self.path.read_text(), str(self.path))

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def of(self, sample_id: str) -> dict[str, int]:
        with self._lock:
            return {stage: self.labels[(sample_id, stage)] for stage in STAGES if (sample_id, stage) in self.labels}

    def set(self, sample_id: str, stage: str, value: int | None) -> dict[str, int]:
        """Set (0 or 1) or clear (None) one label, write the file, return the sample's labels."""
        if not self.enabled:
            raise LabelError("labelling is off: start `humanset browse RUN --labels FILE`")
        if stage not in STAGES:
            raise LabelError(f"stage {stage!r}: expected one of {', '.join(STAGES)}")
        if value not in (0, 1, None):
            raise LabelError(f"label value {value!r}: expected 0, 1 or null (clear)")
        with self._lock:
            key = (sample_id, stage)
            self.labels.pop(key, None)
            if value is not None:
                self.labels[key] = value
            write_bytes(self.path, render(self.comments, self.labels))
        return self.of(sample_id)

    def summary(self) -> dict:
        with self._lock:
            counts = {s: {"1": 0, "0": 0} for s in STAGES}
            for (_, stage), value in self.labels.items():
                counts[stage][str(value)] += 1
            return {"enabled": self.enabled, "path": str(self.path) if self.path else None, "counts": counts,
                    "meaning": MEANING, "samples": len({sid for sid, _ in self.labels})}
