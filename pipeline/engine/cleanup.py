"""The scratch a complete run leaves and nothing reads afterwards, removed with parallel deletes.

What goes (once every unit's marker and the manifest, status complete, are written):
  RUN/work/dedup/dist/   the partitioned dedup's shuffle files and task markers (pipeline/dedup/partitioned.py)
  RUN/work/dedup/pairs/  the in-process dedup's near-pair files (pipeline/dedup/tables.py)
  RUN/work/fallback/     the fallback exchanges' files and markers (pipeline/dedup/fallback_rounds.py)
  RUN/work/scored/       phase 3's scored rows per unit and round (read by the write pass only)
What stays: RUN/work/measure/ (phase 1's rows), RUN/work/dedup/{unit}.parquet and _done.json (the
verdicts: a resumed or rerun curate checks _done.json before it would redo dedup), and everything
`humanset select`, `stats` and `report` read (manifest, stats/, catalog/, shards/, units.jsonl).
A failed or interrupted run never gets here, so resume finds its files; a rerun of a complete run
removes what an interrupted removal left. engine.keep_work=true keeps it all (debugging).

Deletes stream the listing (one page of keys at a time on S3) into a pool of DELETE_THREADS
threads, at most 4 x that many in flight, so the driver holds a bounded window of names.
"""
from __future__ import annotations

import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

from catalog.storage import storage_for

log = logging.getLogger("humanset.curate")

SCRATCH = ("work/dedup/dist", "work/dedup/pairs", "work/fallback", "work/scored")
DELETE_THREADS = 16


def remove_tree(store, prefix: str, threads: int = DELETE_THREADS) -> int:
    """Delete every file under `prefix` of `store` (a catalog Storage), `threads` at a time;
    local folders left empty are removed too. Returns the files deleted."""
    n, pending = 0, []
    with ThreadPoolExecutor(threads) as pool:
        for entry in store.list(prefix):
            pending.append(pool.submit(store.delete, entry.path))
            n += 1
            if len(pending) >= 4 * threads:
                for f in pending:
                    f.result()
                pending = []
        for f in pending:
            f.result()
    if store.posix:  # the empty folders (object stores have none)
        shutil.rmtree(store.fs_path(prefix), ignore_errors=True)
    return n


def remove_scratch(run, folders=SCRATCH, threads: int = DELETE_THREADS) -> int:
    """remove_tree for each of a run's scratch folders (module docstring). Returns the files deleted."""
    store = storage_for(os.fspath(run))
    n = sum(remove_tree(store, f, threads) for f in folders)
    if n:
        log.info("removed %d work files of dedup and the fallback rounds", n)
    return n
