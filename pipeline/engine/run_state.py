"""What the driver knows of a run while it runs, in memory flat in the number of units: which units
are done (one listing per phase, 8 bytes a unit), the windows of units it hands to Ray Data, and
the summaries it drains."""
from __future__ import annotations

import hashlib
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from catalog import console
from catalog.storage import retry
from catalog.storage.paths import absolute
from pipeline.config import with_defaults, with_local_weights
from pipeline.engine.errors import EnvironmentFault, RunError
from pipeline.inputs.units import Unit
from pipeline.inputs.listing import iter_listing
from pipeline.engine.unit_io import listing_path, run_store


class Spans:
    """The driver's steps on its own clock: [name, start, end] in epoch seconds (ms resolution), in
    the order they ended (manifest.json `timeline.spans`), so a run shows its fixed costs (Ray start,
    phase barriers, the fallback exchanges, compaction, clean-up) beside its phases; bench/profile.py
    adds the CPU time of every process of the run over each span."""

    def __init__(self, into: list | None = None):
        self.items = [] if into is None else into

    @contextmanager
    def __call__(self, name: str):
        t0 = time.time()
        try:
            yield
        finally:
            self.items.append([name, round(t0, 3), round(time.time(), 3)])


def drain_batches(batches, total: int, desc: str, progress: bool, bar=None) -> set[str]:
    """Consume a phase's summaries (one row per unit): the ids of the units finished, nothing per
    sample. A summary carrying a fault of the environment stops the run."""
    done: set[str] = set()
    with (console.progress(total, desc, enabled=progress) if bar is None else _same(bar)) as b:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            faults = [f for f in batch.column("fault").to_pylist() if f]
            if faults:
                raise EnvironmentFault(faults[0])
            done.update(batch.column("unit_id").to_pylist())
            b.update(batch.num_rows)
    return done


@contextmanager
def _same(bar):
    yield bar


def failed_units(units: list[Unit], done: set[str], folder: tuple, suffix: str) -> list[Unit]:
    """The units of a window with no summary and no output: a task that failed for good loses its
    whole bundle's summaries, but the units it finished before have their files."""
    missing = [u for u in units if u.unit_id not in done]
    if not missing:
        return []
    finished = NameSet(folder, suffix)
    return [u for u in missing if u.unit_id not in finished]


class NameSet:
    """The names of one folder's marker files as a sorted array of 8-byte hashes: which units are
    done is one listing per phase (one paginated, streamed listing on an object store), at 8 bytes
    per unit on the driver. `folder`: a local folder, or (Storage, folder relative to it)."""

    def __init__(self, folder, suffix: str):
        hashes = []
        store, rel = folder if isinstance(folder, tuple) else (run_store(folder), "")
        if store.posix:  # one directory's names, no stat per file
            try:
                with os.scandir(store.fs_path(rel)) as it:
                    names = [e.name for e in it]
            except FileNotFoundError:
                names = []
        else:
            names = (e.path[len(rel):].lstrip("/") for e in store.list(rel, suffix=suffix))
        for name in names:
            if name.endswith(suffix) and not name.startswith(".") and "/" not in name:
                hashes.append(self._hash(name[: -len(suffix)]))
        self._h = np.sort(np.array(hashes, dtype=np.uint64))

    @staticmethod
    def _hash(name: str) -> int:
        return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")

    def __len__(self) -> int:
        return len(self._h)

    def __contains__(self, name: str) -> bool:
        h = np.uint64(self._hash(name))
        i = int(np.searchsorted(self._h, h))
        return i < len(self._h) and self._h[i] == h


def unit_windows(run: Path, keep, size: int):
    """The listing's units (without their files) that `keep` accepts, in lists of at most `size`."""
    window = []
    for u in iter_listing(listing_path(run)):
        if keep(u.unit_id):
            window.append(u)
            if len(window) >= size:
                yield window
                window = []
    if window:
        yield window



MARKER_READERS = 16  # stats markers read at once by reason_counts (one GET each on an object store)


def reason_counts(run: str, readers: int = MARKER_READERS) -> tuple[dict[str, int], int, int, dict[str, int], dict]:
    """Rejections per stage (first reason), inputs, kept, the count of each reject reason and the
    sum of the units' store counts (what was retried, catalog/storage/retry.py), from the units' stats markers. The listing is streamed and at most 4 x `readers` reads are in flight,
    so the driver holds counters and a bounded window, never the run's markers (a DuckDB scan of the
    catalog would hold ~4 KB per part until it ends); on an object store the reads overlap their
    round trips instead of paying one after another."""
    by_stage: dict[str, int] = {}
    reasons: dict[str, int] = {}
    n_inputs = n_kept = 0
    store = run_store(run)
    retried = retry.total([])

    def add(m: dict) -> None:
        nonlocal n_inputs, n_kept, retried
        retried = retry.total([retried, m.get("store")])
        n_inputs += int(m.get("inputs") or 0)
        n_kept += int(m.get("kept") or 0)
        for reason, n in (m.get("rejected") or {}).items():
            reasons[reason] = reasons.get(reason, 0) + n
            stage = reason.split(":", 1)[0]
            by_stage[stage] = by_stage.get(stage, 0) + n

    window: deque = deque()
    with ThreadPoolExecutor(max(1, readers)) as pool:
        for e in store.list("stats/", suffix=".json"):
            name = e.path.rsplit("/", 1)[-1]
            if name.startswith(".") or e.path.count("/") != 1:
                continue
            window.append(pool.submit(store.read_json, e.path))
            if len(window) >= 4 * max(1, readers):
                add(window.popleft().result())
        while window:
            add(window.popleft().result())
    return by_stage, n_inputs, n_kept, dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))), retried


def run_identity(cfg) -> dict:
    """What makes a run the same run: its config without `storage` (how the store is talked to), its
    weights resolved (older runs recorded them as given)."""
    c = with_defaults(cfg)
    return {k: v for k, v in with_local_weights(c).items() if k != "storage"} if isinstance(c, dict) else c


def resumed_manifest(run, old: dict, manifest: dict) -> dict:
    """This invocation's `manifest` continuing `old` (RUN's manifest.json). Refused, naming what changed, when
    its inputs, config or --score-all differ (older runs recorded inputs relative: they are compared
    resolved). The inputs stay as the run's listing names them; `started` and `dedup` are kept."""
    changed = [what for what, differs in (
        ("inputs", [absolute(i) for i in old.get("inputs") or []] != manifest["inputs"]),
        ("config", run_identity(old.get("config")) != run_identity(manifest["config"])),
        ("--score-all", old.get("score_all") != manifest["score_all"])) if differs]
    if changed:
        raise RunError(f"{run}: holds a curation run with other {' and '.join(changed)}; rerun its own "
                       "command to resume it, or pass another --output")
    kept = {k: old[k] for k in ("dedup",) if old.get(k)}
    return {**manifest, **kept, "inputs": list(old.get("inputs") or []), "started": old.get("started")}
