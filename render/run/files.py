"""The files of a render run OUT, read and written through catalog.storage (OUT: a local folder or a
URI such as s3://bucket/runs/synth), and the run's record of scans that crashed Blender (OUT/crashes/)."""
from __future__ import annotations

import hashlib
import logging

import pyarrow.parquet as pq

import catalog
from catalog import SCANS, conform
from catalog.storage import storage_for

log = logging.getLogger("render.run.job")

HDRI_CATALOG, SCAN_CATALOG = "catalog/hdris/hdris.parquet", "catalog/scans/scans.parquet"


def run_store(spec) -> catalog.Storage:
    """OUT's Storage: every file of the run is read and written through it (a local folder or a URI)."""
    return storage_for(spec.out)


def read_table(spec, rel: str, columns=None):
    store = run_store(spec)
    return pq.read_table(store.fs_path(rel), filesystem=store.fs, columns=columns)


def crash_file(scan_id: str) -> str:
    # names from data never become paths: the file is named by a hash of the scan id
    return "crashes/" + hashlib.blake2b(scan_id.encode(), digest_size=10).hexdigest() + ".json"


def crashed_scans(spec) -> dict[str, dict]:
    """Scans that crashed Blender in this run: scan_id -> {"scan_id", "frame_index", "attempts"}."""
    store, found = run_store(spec), {}
    for e in sorted(store.list("crashes", suffix=".json")):
        crash = store.read_json(e.path)
        found[crash["scan_id"]] = crash
    return found


def reject_crashed_scans(spec) -> int:
    """Mark the run's crashed scans in its scan catalog (ok = false, reason "blender_crash: ..."). Driver only."""
    crashed, store = crashed_scans(spec), run_store(spec)
    path = f"{spec.out}/{SCAN_CATALOG}"
    if not crashed or not store.exists(SCAN_CATALOG):
        return 0
    rows = read_table(spec, SCAN_CATALOG).to_pylist()
    n = 0
    for r in rows:
        c = crashed.get(r["scan_id"])
        if c is not None and r["ok"]:
            r["ok"], n = False, n + 1
            r["reject_reason"] = (f"blender_crash: Blender's process died loading or rendering it (frame "
                                  f"{c['frame_index']}); rejected for the rest of the run. Re-export the scan "
                                  f"or remove it from the library.")
    if n:
        store.write_parquet(SCAN_CATALOG, conform(rows, SCANS))
        log.warning("%s: %d scan(s) crashed Blender and are rejected in %s", spec.out, n, path)
    return n
