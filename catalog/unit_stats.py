"""Per-unit outcomes of a run, from its stats markers (RUN/stats/{unit}.json), streamed.

A run has one marker per input unit, ~10^6 for a billion-image crawl, so the markers are read one at
a time and only counters are kept: units, units with errors per kind, units with no row, and the
first `max_listed` failed units by name (a bounded heap). A marker's `unit_error` is "KIND: detail";
`unit_error_kind` is KIND where the engine writes it, else the text before the first ": ".
"""
from __future__ import annotations

import heapq
import json
import os
from pathlib import Path

MAX_LISTED = 20  # failed units listed by name; the counts per kind cover all of them


def error_kind(marker: dict) -> str | None:
    """The kind of a marker's unit error, None when the unit read cleanly."""
    err = marker.get("unit_error")
    if not err:
        return None
    kind = marker.get("unit_error_kind")
    if isinstance(kind, str) and kind:
        return kind
    text = str(err)
    return text.split(": ", 1)[0].strip() if ": " in text else "unit_error"


def _markers(folder):
    """(name, marker or None when unreadable) for every stats marker, from a lazily read listing
    (on an object store: one page of keys at a time, each marker one GET)."""
    from catalog.storage import is_uri, storage_for
    if is_uri(folder):
        store = storage_for(folder)
        for e in store.list():
            name = e.path
            if "/" in name or not name.endswith(".json") or name.startswith("."):
                continue
            try:
                marker = store.read_json(name)
            except (OSError, ValueError):
                marker = None
            yield name[:-len(".json")], marker if isinstance(marker, dict) else None
        return
    try:
        it = os.scandir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return
    with it:
        for e in it:
            if not e.name.endswith(".json") or e.name.startswith("."):
                continue
            try:
                with open(e.path, "rb") as fh:
                    marker = json.load(fh)
            except (OSError, ValueError):
                marker = None
            yield e.name[:-len(".json")], marker if isinstance(marker, dict) else None


def unit_outcomes(run_dir, max_listed: int = MAX_LISTED) -> dict:
    """Counts of the run's units from their markers, and the first `max_listed` failed units.

    {"units": n, "units_with_errors": n, "units_without_rows": n, "unreadable_markers": n,
     "error_kinds": [{"kind", "units", "example"}], "failed_units": [{"unit", "kind", "error", "inputs"}],
     "failed_units_listed": n}. A run without markers (written by hand, or not started) gives units 0.
    """
    units = failed = empty = unreadable = 0
    kinds: dict[str, list] = {}  # kind -> [units, example]
    first: list[tuple] = []  # max-heap of the smallest names (negated order via a wrapper)
    from catalog.storage import is_uri, join
    for name, marker in _markers(join(run_dir, "stats") if is_uri(run_dir) else Path(run_dir) / "stats"):
        units += 1
        if marker is None:
            unreadable += 1
            continue
        if not marker.get("inputs"):
            empty += 1
        kind = error_kind(marker)
        if kind is None:
            continue
        failed += 1
        entry = kinds.setdefault(kind, [0, None])
        entry[0] += 1
        item = (_Desc(name), {"unit": name, "kind": kind, "error": str(marker["unit_error"])[:500],
                              "inputs": marker.get("inputs")})
        if entry[1] is None or name < entry[1]["unit"]:
            entry[1] = item[1]
        if max_listed > 0:
            if len(first) < max_listed:
                heapq.heappush(first, item)
            elif name < first[0][0].name:
                heapq.heapreplace(first, item)
    listed = sorted((x[1] for x in first), key=lambda r: r["unit"])
    return {"units": units, "units_with_errors": failed, "units_without_rows": empty,
            "unreadable_markers": unreadable,
            "error_kinds": sorted(({"kind": k, "units": n, "example": ex["error"] if ex else None}
                                   for k, (n, ex) in kinds.items()), key=lambda r: (-r["units"], r["kind"])),
            "failed_units": listed, "failed_units_listed": len(listed)}


class _Desc:
    """A unit name ordered backwards, so that heapq's min-heap keeps the smallest names."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __lt__(self, other: "_Desc") -> bool:
        return self.name > other.name
