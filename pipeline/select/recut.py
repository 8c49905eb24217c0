"""`humanset select`: re-cut a finished run with new thresholds from its stored scores.

No model runs. Dedup clusters are recomputed from the stored hashes when dedup settings change.
A threshold that needs a score the run never computed is refused, naming the stage to rerun.

No step holds the run's samples in one process (docs/dedup.md, "Select"): the work on units is in
pipeline/select/recut_units.py, run over windows of units as Ray tasks (at most 4 per CPU in flight) when
Ray is initialised, else one window after another here; this driver holds a window of unit ids
and counts. The steps, each reading and writing files of the new run:
  1. candidates (only when dedup.* or size.* change): each unit's dedup candidates under the new
     thresholds into OUT/work/measure; dedup: pipeline/dedup_dist.run_dedup on them, partitioned by
     hash or in one process as `dedup.partitioned` picks (as in curate), one verdict file per unit;
  2. fallback choice: a shuffle by cluster on files (pipeline/fallback_rounds' map / reduce / route):
     each hash partition of cluster keys re-cut by fallback.recut on its members only, the choices
     routed back to one file per unit;
  3. check: refuse thresholds the stored scores cannot decide, before anything is written;
  4. write: each unit's catalog part, shards and stats marker.
"""
from __future__ import annotations

import itertools
import logging
import math

import catalog

from catalog import console
from pipeline.select import recut_units as U
from pipeline.config import apply_sets
from pipeline.engine.driver import library_versions, funnel_from_counts
from pipeline.dedup.fallback_rounds import fold, tasks_in_flight
from pipeline.engine.cleanup import SCRATCH, remove_scratch, remove_tree
from pipeline.select.recut_units import SelectError
from pipeline.dedup.ranges import TASK_BASE_BYTES
from pipeline.settings import DEFAULTS
from pipeline.engine.unit_io import now
from pipeline.stages import REGISTRY

log = logging.getLogger("humanset.select")


def _changed(old: dict, new: dict, prefix: str = "") -> list[str]:
    out = []
    for k in set(old) | set(new):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _changed(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}")
    return sorted(out)


def plan(run, sets: list[str]) -> tuple[dict, dict, list[str]]:
    manifest = _store(run).read_json("manifest.json")
    if manifest.get("status") != "complete":
        raise SelectError(f"{run}: the run is not complete; finish it first (rerun the same curate command)")
    old = manifest["config"]
    new = apply_sets(old, sets)
    changed = _changed(old, new)
    ran = set(manifest["stages"])
    for key in changed:
        section = key.split(".")[0]
        if section == "stages":
            raise SelectError("select cannot add or remove stages; run `humanset curate` for that")
        if section in REGISTRY and section not in ran:
            why = (manifest.get("skipped_stages") or {}).get(section, "it did not run")
            raise SelectError(f"--set {key}: run {run} has no {section} scores ({why}); "
                              f"rerun `humanset curate` with the {section} stage configured")
        if section in ("input", "output", "ray", "decode") and not key.startswith("output."):
            raise SelectError(f"--set {key}: changes how inputs are read; rerun `humanset curate`")
    return manifest, new, changed


def select(run: str, output: str, sets: list[str], progress: bool = True) -> dict:
    started = now()
    run_p, out = _store(run), _store(output)  # either may be local or on an object store
    manifest, cfg, changed = plan(run_p, sets)
    if out.exists("manifest.json"):
        raise SelectError(f"{out}: already holds a run; choose a new --output")
    names = list(manifest["stages"])
    stages = U.stages_of(cfg, names)
    src, dst = _root(run_p), _root(out)
    redo = any(k.startswith(("dedup.", "size.")) for k in changed)
    n_units = sum(1 for _ in U.unit_names(run_p))  # counts only: the listing is streamed again per step
    size, limit, window = _sizes(n_units, cfg)
    groups = max(1, math.ceil(n_units / window))  # the exchange's partitions and route windows
    retries = int((cfg.get("engine") or {}).get("max_retries", DEFAULTS.engine.max_retries))

    def each(*extra):
        return ((src, dst, units, cfg, names, *extra) for _, units in _unit_windows(run_p, size))

    def run_step(fn, args, total, desc):
        return _step(fn, args, total, desc, n_units, progress, limit, retries)

    if redo:
        got = run_step(U.write_candidates, each(), {}, "candidates")
        st = _unwrapped(fold, U.dedup_units, [(dst, dict(cfg, stages=names))], 1, retries, lambda a, b: b, {})
        log.info("select: %d of %d candidates are duplicates", st.get("duplicates", 0), got.get("candidates", 0))
    fb_counts = _fallback_choice(run_p, dst, stages, cfg, names, redo, size, window, groups, limit, retries,
                                 run_step)

    # then two passes over the units: the first refuses thresholds the stored scores cannot decide,
    # before anything of the selection is written
    missing = run_step(U.check_units, each(redo), {}, "check").get("missing", {})
    for name, n in missing.items():
        raise SelectError(f"{n} samples now reach the {name} stage but were never scored by it "
                          f"(the cascade skipped them); rerun `humanset curate` with these thresholds or "
                          f"with --score-all")
    got = run_step(U.write_units, each(redo), {"rows": 0, "kept": 0, "first": {}, "reasons": {}}, "select")
    log.info("select: %d of %d samples kept (was %d)", got["kept"], got["rows"], manifest["counts"]["kept"])
    result = {**{k: manifest.get(k) for k in ("inputs", "stages", "skipped_stages", "score_all", "units")},
              "config": cfg, "selected_from": run_p.uri, "changed": changed, "started": started,
              "finished": now(), "status": "complete", "versions": library_versions(),
              "funnel": funnel_from_counts(got["first"], got["rows"], manifest["stages"]),
              "counts": {"inputs": got["rows"], "kept": got["kept"]}, "fallbacks": fb_counts,
              "reject_reasons": dict(sorted(got["reasons"].items(), key=lambda kv: (-kv[1], kv[0])))}
    out.write_json("manifest.json", result)
    if not (cfg.get("engine") or {}).get("keep_work", DEFAULTS.engine.keep_work):  # as curate does at its end
        remove_scratch(out.uri, (*SCRATCH, U.SELECT_DIR))
    return result


def _step(fn, args, total, desc: str, n_units: int, progress: bool, limit: int, retries: int):
    """One step over the run's units (fold of the tasks' counts) with a progress bar of units."""
    with console.progress(n_units, desc, enabled=progress) as bar:
        return _unwrapped(fold, fn, args, limit, retries, _add, total, lambda got: bar.update(got.get("units", 0)))


def _fallback_choice(run_p, dst: str, stages, cfg: dict, names: list[str], redo: bool, size: int, window: int,
                     groups: int, limit: int, retries: int, step) -> dict:
    """Each cluster's member under the new thresholds (pipeline/fallback.recut), as a group-by on
    cluster key through hash-partitioned files: map (per task of `size` units) -> recut (per
    partition, on its clusters' members only) -> route (per group of `window` units, one choice
    file per unit). As many partitions as groups (curate's exchange has the same geometry), so a
    partition holds ~1 / groups of the run's duplicates. Returns the counts (promoted, unscored,
    lost) summed over the partitions."""
    src = _root(run_p)
    _clear(_store(dst), U.SELECT_DIR)  # what an interrupted select into this OUT left: never mixed in
    score = [s.name for s in stages if s.phase == "score"]
    d = cfg.get("dedup") or {}
    n_fb = int(d.get("max_fallbacks", DEFAULTS.dedup.max_fallbacks) or 0) if score else 0
    args = ((src, dst, first, units, cfg, names, redo, window, groups)
            for first, units in _unit_windows(run_p, size))
    members = step(U.map_members, args, {}, "clusters").get("members", 0)
    counts = {"promoted": 0, "unscored": 0, "lost": 0}
    if members:
        # each partition and window holds ~1 / groups of the members: declared, so Ray never packs
        # more of them on a node than fit
        mem = TASK_BASE_BYTES + U.MEMBER_BYTES * U.SKEW * math.ceil(members / groups)
        fix = "lower engine.window_units (more, smaller partitions)"
        counts = _unwrapped(fold, U.recut_partition, ((dst, p, n_fb, groups) for p in range(groups)), limit, retries, _add,
                            counts, None, mem, fix)
        _unwrapped(fold, U.route_choices, ((dst, g) for g in range(groups)), limit, retries, _add, 0, None, mem, fix)
    if counts["promoted"] or counts["unscored"]:
        log.info("select: %d clusters keep another member than the run did; %d stop at a member the run "
                 "never scored (rerun `humanset curate` to score it)", counts["promoted"], counts["unscored"])
    return counts


def _clear(store, folder: str) -> None:
    """Remove every file under `folder` of `store` (streamed, in parallel)."""
    remove_tree(store, folder)


def _sizes(n_units: int, cfg: dict) -> tuple[int, int, int]:
    """(units per task, tasks in flight, engine.window_units). fallback_rounds.tasks_in_flight, each
    with at most window_units / (tasks in flight) units, so the driver holds at most
    max(window_units, tasks in flight) unit ids; fewer per task when the run is small, so every CPU
    gets work."""
    window = int((cfg.get("engine") or {}).get("window_units") or DEFAULTS.engine.window_units)
    limit = tasks_in_flight()
    return max(1, min(window // limit, math.ceil(n_units / limit))), limit, window


def _unit_windows(store, size: int):
    """(index of the first, the run's unit ids) in lists of at most `size`, streamed."""
    it = U.unit_names(store)
    first = 0
    while chunk := list(itertools.islice(it, size)):
        yield first, chunk
        first += len(chunk)


def _add(a, b):
    """Counts summed: ints, and dicts of counts (nested) key by key."""
    if isinstance(a, dict):
        out = dict(a)
        for k, v in (b or {}).items():
            out[k] = _add(out[k], v) if k in out else v
        return out
    return a + b


def _unwrapped(fold_fn, *args):
    """fold, with a task's SelectError raised as itself (not wrapped in Ray's task error)."""
    try:
        return fold_fn(*args)
    except Exception as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, (SelectError, FileNotFoundError)) and cause is not e:
            raise cause from None
        raise


def _root(store) -> str:
    """The run as the tasks open it (run_store): a local path, or the URI of an object store."""
    return store.base if store.posix else store.uri


def connect_ray(run) -> bool:
    """`humanset select` on a Ray cluster: connect when one is named (RAY_ADDRESS, or the run's
    ray.address), so every step runs as tasks there. False: none named; select then runs in this
    process, one window after another (the same bounds per step, no parallelism)."""
    import os
    cfg = _store(run).read_json("manifest.json").get("config") or {}
    address = os.environ.get("RAY_ADDRESS") or (cfg.get("ray") or {}).get("address")
    if not address or address == "local":
        return False
    import ray
    if not ray.is_initialized():
        console.quiet_ray()
        ray.init(address=address, log_to_driver=True, logging_level=logging.WARNING)
    return True


def _store(run) -> catalog.Storage:
    if isinstance(run, catalog.Storage):
        return run
    from catalog.storage import run_root, storage_for
    return storage_for(run_root(run))


