"""The curation engine's driver: one Ray Data pipeline per phase and window of units.

Worker-side work lives elsewhere: the blocks of each phase and the bundling of small units
(pipeline/engine/blocks.py), the stage adapter (pipeline/engine/adapter.py, the one place a stage becomes a Ray
operation) and the unit I/O (pipeline/engine/unit_io.py: read, measure, score, write one unit in bounded
memory). Ray start-up is pipeline/engine/ray_setup.py, the early model actors pipeline/engine/early.py, the
driver's per-run state (done units, windows) pipeline/engine/run_state.py. This module orders the phases,
keeps the driver's memory flat and turns faults into one line.

A run has three phases, each resumable:
  1. measure (per unit): the worker streams its unit through decode -> size -> pHash in batches of
     bounded bytes and writes RUN/work/measure/{unit}.parquet (no bytes; its counters in the metadata).
  2. dedup (whole run, once every unit is measured): pipeline/dedup.run_dedup, in a Ray task ->
     RUN/work/dedup/{unit}.parquet verdicts (a pure function of phase 1, so reruns agree).
  3. score + write (per unit): the measurements and verdicts, without bytes; each model stage
     reads back the bytes of the rows it scores (checked against their sha256: changed bytes are
     rejected as source_changed and never written); then the worker writes the catalog part, the
     curated shards and, last, RUN/stats/{unit}.json, the unit's completion marker. With
     engine.start_actors_early (auto: large runs) the first window's pipeline starts with the run,
     its units held at a gate the driver opens after dedup, so the model actors load meanwhile.

The driver holds O(units in flight), not O(units): the unit listing stays on disk
(RUN/units.jsonl; each unit is handed out as its id and the offset of its line, and the worker
reads its files from there), the units go to Ray Data in windows of engine.window_units, which
units are done is one directory listing per phase (a sorted array of 8-byte name hashes), and
unit ids never travel in bulk (dedup reads the listing itself). A worker that dies on a unit is
retried `engine.max_retries` times; then the unit runs again with each sample alone in a child
process (pipeline/engine/isolate.py), and a sample that kills its process is rejected as
decode:worker_crash. A fault of the environment (no space, permission, read-only, credentials) is
never retried as data: the worker reports it in the unit's summary and the run stops with one line
(exit status 3). Final counts, the funnel and the reject reasons are summed from the units' stats
markers, one at a time.

Size: one concern, the order of a run's phases and how it stops, for both executors (Ray Data, and the
local pool of pipeline/engine/local.py, whose branch of each phase sits beside Ray's); the work of each
phase lives in the modules named above.
"""
from __future__ import annotations

import itertools
import logging
import platform
import sys
import time
from pathlib import Path


import catalog
from catalog import compact as compact_mod
from catalog.storage import is_uri, retry, run_root
from catalog.storage.lock import LEASE_S
from catalog.storage.paths import absolute

from catalog import console, run_kind
from pipeline.dedup import clusters as dedup_mod, partitioned as dedup_dist, fallback, fallback_rounds
from pipeline.engine import cleanup as run_cleanup
from pipeline.config import load_config, section, with_local_weights
from pipeline.settings import DEFAULTS
from pipeline.engine.funnel import funnel_from_counts
from pipeline.engine.errors import EnvironmentFault, RunError, environment_fault
from pipeline.engine import local
from pipeline.engine.blocks import bundles, measure_block, retries_of, score_ds, unit_blocks, units_ds
from pipeline.engine.local import LocalPool
from pipeline.engine.early import EarlyScore, start_actors_early
from pipeline.engine.ray_compat import set_task_poll as task_poll, wake_on_first_task
from pipeline.engine.ray_setup import init_ray
from pipeline.engine.run_state import NameSet, Spans, drain_batches, failed_units, unit_windows, reason_counts, resumed_manifest
from pipeline.inputs.kinds import check_inputs
from pipeline.inputs.units import Unit
from pipeline.inputs.listing import count_new, iter_listing, write_listing
from pipeline.stages import Stage, build_stages
from pipeline.engine.unit_io import run_store
from pipeline.engine.unit_io import limits_of, listing_path, now

log = logging.getLogger("humanset.curate")


_now = now
RUN_WRITERS = ["", "stats", "catalog/samples", "catalog/compact/samples", "catalog/compact/shards", "shards",
               "work/measure", "work/dedup", "work/dedup/pairs", "work/scored"]  # where
# our writers write in a RUN (clean_tmp looks only there)
DEFAULT_WINDOW_UNITS = DEFAULTS.engine.window_units  # its setting's default (pipeline/settings.py)


# --------------------------------------------------------------------------------------------
# Driver side: one Ray Data pipeline per phase and window (pipeline/engine/blocks.py); summaries only.


def _window_units(cfg: dict) -> int:
    return int(cfg.get("engine", {}).get("window_units") or DEFAULT_WINDOW_UNITS)


def _measure(run: Path, units: list[Unit], cfg: dict, score_all: bool, bar, progress: bool,
             cpus: float | None = None, pool: LocalPool | None = None):
    if pool is not None:  # no Ray (pipeline/engine/local.py): bundles of units as jobs of the pool
        jobs = [(g[0].unit_id, ([u.to_dict() for u in g], str(run), limits_of(cfg), cfg, score_all))
                for g in bundles(units, cfg, pool.workers)]
        done = drain_batches(pool.results(local.measure_job, jobs), len(units), "measure", True, bar)
        failed = failed_units(units, done, (run_store(run), "work/measure"), ".parquet")
        if failed:
            local.isolate(run, failed, "measure", cfg, score_all, limits_of(cfg), progress)
        return
    import ray

    from pipeline.engine import adapter
    retries = retries_of(cfg)
    measure_cpus = max([s.resources.num_cpus for s in build_stages(cfg)
                        if s.phase == "measure" and s.name in cfg["stages"]] or [1.0])
    if adapter.local_cores:  # a local Ray counts more CPUs than cores (init_ray); measure is CPU-bound: more
        # tasks at once than cores would only start more worker processes (seconds of CPU each)
        cpus = min(cpus or float(adapter.local_cores), float(adapter.local_cores))
    with unit_blocks(ray, cpus):
        ds = units_ds(units, cfg, bundled=True).map_batches(
            measure_block, fn_kwargs=dict(run=str(run), limits=limits_of(cfg), cfg=cfg, score_all=score_all),
            batch_size=None, batch_format="pyarrow", num_cpus=measure_cpus, max_retries=retries)
        done = drain_batches(ds.iter_batches(batch_format="pyarrow", batch_size=None), len(units), "measure", True, bar)
    failed = failed_units(units, done, (run_store(run), "work/measure"), ".parquet")
    if failed:
        _isolate(run, failed, "measure", cfg, score_all, progress)


def _score_and_write(run: Path, units: list[Unit], stages: list[Stage], cfg: dict, score_all: bool,
                     bar, progress: bool, early: "EarlyScore | None" = None, marker: str = "stats",
                     pool: LocalPool | None = None):
    if pool is not None:  # no Ray: one job per unit, through every stage in one worker
        specs = [(s.name, s.cfg) for s in stages]
        jobs = [(u.unit_id, (u.to_dict(), str(run), limits_of(cfg), score_all, cfg, specs)) for u in units]
        done = drain_batches(pool.results(local.score_job, jobs), len(units), "score+write", True, bar)
        failed = failed_units(units, done, (run_store(run), marker), ".json" if marker == "stats" else ".parquet")
        if failed:
            local.isolate(run, failed, "score", cfg, score_all, limits_of(cfg), progress)
        return
    if early is not None:
        done = drain_batches(early.open(), len(units), "score+write", True, bar)
    else:
        ds = score_ds(run, units, stages, cfg, score_all)
        done = drain_batches(ds.iter_batches(batch_format="pyarrow", batch_size=None), len(units), "score+write", True, bar)
    failed = failed_units(units, done, (run_store(run), marker), ".json" if marker == "stats" else ".parquet")
    if failed:
        _isolate(run, failed, "score", cfg, score_all, progress)


def _run_dedup(run: Path, cfg: dict, pool: LocalPool | None = None) -> dict:
    """Phase 2 in one Ray task on a worker, which starts the near-search tables as tasks of its own:
    its per-sample arrays (see pipeline/dedup/clusters.py) never enter the driver, which gets the counts
    back. The task reads the unit ids from RUN/units.jsonl itself and resumes from the files a
    crashed attempt left (per table, then the verdicts), so it is retried like a unit. Without Ray, the
    same function as one job of the pool (its tables then one after another)."""
    if pool is not None:
        return pool.call(dedup_dist.run_dedup, str(run), None, cfg)
    import ray
    task = ray.remote(num_cpus=1, max_retries=retries_of(cfg))(dedup_dist.run_dedup)  # partitioned or not
    try:
        return ray.get(task.remote(str(run), None, cfg))
    except Exception as e:
        fault = environment_fault(e, str(run))
        if fault:
            raise EnvironmentFault(fault) from e
        raise


def _isolate(run: Path, units: list[Unit], phase: str, cfg: dict, score_all: bool, progress: bool):
    """Units whose workers kept dying: redo each with every sample alone in a child process."""
    import ray

    from pipeline.engine.isolate import isolate_unit, isolated
    log.warning("%d units failed in %s after %d retries: running their samples one at a time",
                len(units), phase, retries_of(cfg))
    task = ray.remote(num_cpus=1, max_retries=0)(isolate_unit)
    refs = [task.remote(str(run), u.to_dict(), phase, cfg, score_all, limits_of(cfg)) for u in units]
    with console.progress(len(refs), f"{phase} (isolated)", enabled=progress) as bar:
        while refs:
            ready, refs = ray.wait(refs, num_returns=1)
            isolated(str(run), ray.get, ready[0])
            bar.update(1)


# --------------------------------------------------------------------------------------------

def library_versions() -> dict:
    import importlib.metadata as md
    out = {"python": platform.python_version()}
    for pkg in ("humanset", "ray", "pyarrow", "duckdb", "pillow", "imagehash", "torch", "ultralytics",
                "rapidocr", "timm", "open_clip_torch"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def _list_units(run: Path, inputs: list[str], cfg: dict, repeated: int) -> tuple[int, int, int]:
    """The run's units, listed into RUN/units.jsonl by the first run (streaming) and read back from
    it by every rerun. Returns (units, repeated listings dropped, inputs found now that are not in
    the saved listing); the units themselves stay on disk."""
    path, inp = listing_path(run), cfg["input"]
    if not run_store(run).exists("units.jsonl"):
        n_units, repeated = write_listing(inputs, path, inp["files_per_unit"], inp["extensions"])
        return n_units, repeated, 0
    n_units = sum(1 for _ in iter_listing(path))
    new = count_new(inputs, path, inp["files_per_unit"], inp["extensions"])
    if new:
        log.warning("%d inputs appeared since this run started; they are not in this run "
                    "(curate them into a new --output)", new)
    return n_units, repeated, new


def _run_root(output):
    """A local RUN as an absolute Path, a RUN on an object store as its URI string."""
    root = run_root(output)
    return root if is_uri(root) else Path(root)


def curate(inputs: list[str], output: str, config: dict | None = None, score_all: bool = False,
           progress: bool = True, force_unlock: bool = False, lock_lease_s: float = LEASE_S) -> dict:
    """Run (or finish) a curation run. Returns the manifest."""
    cfg = with_local_weights(config or load_config())
    retry.configure(cfg)  # storage.retry_*: this driver's requests, and the processes it starts
    run = _run_root(output)  # workers write into it, from their own working directories
    inputs = [absolute(i) for i in inputs]  # the manifest and the listing name them from anywhere
    # unusable inputs and a RUN of another kind are refused, naming them, before anything is written;
    # the listing itself is streamed into RUN/units.jsonl under the lock
    check_inputs(inputs, cfg["input"]["extensions"])
    check_stages(cfg)
    run_kind.check(run, "curate")
    try:
        lock = run_store(run).run_lock(force=force_unlock, lease_s=float(lock_lease_s))
        with lock as held:
            return _curate_locked(run, inputs, cfg, score_all, progress, held)
    except catalog.RunLocked as e:
        raise RunError(str(e)) from e
    except OSError as e:  # the driver's own writes (listing, manifest) on a full or read-only disk
        fault = environment_fault(e, str(run))
        if fault:
            raise EnvironmentFault(fault) from e
        raise


def check_stages(cfg: dict) -> None:
    """The stage list as a cascade the engine can run: decode first (every other stage reads its
    columns), known names, each once."""
    from pipeline.stages import REGISTRY
    names = list(cfg.get("stages") or [])
    unknown = [n for n in names if n not in REGISTRY]
    if unknown or not names or names[0] != "decode" or len(set(names)) != len(names):
        raise RunError(f"config: stages={names} is not a cascade the engine can run: it starts with decode, "
                       f"names each stage once, from {list(REGISTRY)} (e.g. --set stages=[decode,size] "
                       "or [decode,size,dedup,person])")


def _curate_locked(run, inputs: list[str], cfg: dict, score_all: bool, progress: bool, held=None) -> dict:
    store = run_store(run)
    before, store_parts = retry.snapshot(), []  # this driver's retries, then dedup's task's
    manifest = {"config": cfg, "inputs": [str(i) for i in inputs], "score_all": score_all}
    if store.exists("manifest.json"):
        old = store.read_json("manifest.json")
        manifest = resumed_manifest(run, old, manifest)  # refused when the inputs, config or --score-all differ
        inputs = manifest["inputs"]  # as its listing names them (older runs: relative)
        repeated = int(old.get("repeated_inputs") or 0)
        log.info("resuming %s", run)
    else:
        manifest["started"] = _now()
        repeated = 0
    run_kind.claim(store, "curate")
    removed = catalog.clean_tmp(run, RUN_WRITERS) if store.posix else 0  # object stores: no temp objects
    if removed:
        log.info("removed %d temporary files left by an interrupted run", removed)
    t0 = time.perf_counter()
    n_units, repeated, new = _list_units(run, inputs, cfg, repeated)
    seconds = {"listing": round(time.perf_counter() - t0, 2)}  # this invocation's phases (wall)
    stages = build_stages(cfg)
    skipped = {s.name: s.skip_reason() for s in stages if not s.enabled}
    for name, why in skipped.items():
        log.warning("stage %s skipped: %s", name, why)
    active = [s for s in stages if s.enabled and s.name in cfg["stages"]]
    manifest.update(stages=[s.name for s in active], skipped_stages=skipped, versions=library_versions(),
                    stage_info={s.name: s.info() for s in active if s.info()},  # e.g. watermark's method
                    status="running", units=n_units, repeated_inputs=repeated, not_in_this_run=new)
    store.write_json("manifest.json", manifest)

    done, measured = NameSet((store, "stats"), ".json"), NameSet((store, "work/measure"), ".parquet")
    n_todo = n_measure = n_inputs = 0
    for u in iter_listing(listing_path(run)):
        # a shard's images are not counted (its count is its 1 source): it weighs a full unit
        n_inputs += u.count if u.kind == "files" and u.count else int(cfg["input"]["files_per_unit"])
        if u.unit_id not in done:
            n_todo += 1
            n_measure += u.unit_id not in measured
    log.info("%d units: %d done, %d to measure, %d to write", n_units, n_units - n_todo, n_measure, n_todo)
    score_stages = [s for s in active if s.phase == "score"]
    cfg_active = dict(cfg, stages=[s.name for s in active])
    window = _window_units(cfg)

    if n_todo and not is_uri(str(run)):
        compact_mod.invalidate(Path(run))  # parts are written again: the views read them, not a stale copy
    spans = Spans()
    pool = None
    if local.use_local(cfg, n_inputs, score_stages):  # a small run on this machine: no Ray (pipeline/engine/local.py)
        pool = LocalPool(cfg, run, local.workers(score_stages, n_todo))
        log.info("executor: local, %d worker processes (%d inputs; engine.executor)", pool.workers, n_inputs)
    manifest["executor"] = "local" if pool is not None else "ray"
    try:
        if n_todo:
            if pool is None:
                with spans("ray_start"):
                    init_ray(cfg)  # Ray Data's own progress off: ours (console.progress) counts units
                task_poll(float(section(cfg, "engine")["task_poll_s"]))
                wake_on_first_task()
            t_start = time.time()
            timeline = manifest["timeline"] = {"start": round(t_start, 3), "spans": spans.items}
            todo = lambda uid: uid not in done  # noqa: E731
            n_fallbacks = fallback.max_fallbacks(cfg_active, score_stages)  # phase 3 in rounds (pipeline/dedup/fallback.py)
            cfg_score = fallback.round_cfg(cfg_active, 0) if n_fallbacks else cfg_active
            # model actors load while phases 1 and 2 run (engine.start_actors_early), for the first window
            # with fallbacks, phase 3 is one pipeline of all its passes when it fits one (its actors start once)
            passes = fallback_rounds.passes(n_fallbacks) if n_fallbacks else None
            one = bool(n_fallbacks) and fallback_rounds.one_pipeline(run, n_todo, window)
            early = None
            if pool is None and start_actors_early(cfg, score_stages, n_measure):
                scored = NameSet((store, fallback.SCORED_DIR), ".parquet") if n_fallbacks else ()
                first = next(unit_windows(run, lambda uid: uid not in done and uid not in scored, window))
                early = EarlyScore(run, first, score_stages, cfg_active if one else cfg_score, score_all,
                                   passes if one else None)
            try:
                if n_measure:  # with early actors, measure leaves their CPUs to them
                    t0 = time.perf_counter()
                    cpus = early.measure_cpus() if early is not None else None
                    with spans("measure"), console.progress(n_measure, "measure", enabled=progress) as bar:
                        for units in unit_windows(run, lambda uid: uid not in done and uid not in measured, window):
                            _measure(run, units, cfg_active, score_all, bar, progress, cpus, pool)
                    seconds["measure"] = round(time.perf_counter() - t0, 2)
                timeline["measured"] = round(time.time(), 3)
                if not dedup_mod.is_done(run):
                    t0 = time.perf_counter()
                    with spans("dedup"):
                        st = _run_dedup(run, cfg_active, pool)
                    store_parts.append(st.get("store"))
                    seconds["dedup"] = round(time.perf_counter() - t0, 2)
                    log.info("dedup: %d of %d candidates are duplicates (%.2f s)", st["duplicates"], st["candidates"],
                             seconds["dedup"])
                    manifest["dedup"] = {k: st.get(k) for k in ("candidates", "duplicates")}  # the funnel explains it
                timeline["deduped"] = round(time.time(), 3)
                t0 = time.perf_counter()
                if n_fallbacks:
                    manifest["fallbacks"] = fallback_rounds.run_rounds(
                        run, cfg_active, score_stages, progress, early, window, retries_of(cfg),
                        lambda *a: _score_and_write(run, *a[:3], score_all, a[3], progress, *a[4:], pool=pool), spans,
                        None if pool is not None else
                        lambda units: EarlyScore(run, units, score_stages, cfg_active, score_all, passes))
                    early = None
                else:
                    with spans("score+write"), console.progress(n_todo, "score+write", enabled=progress) as bar:
                        for i, units in enumerate(unit_windows(run, todo, window)):
                            _score_and_write(run, units, score_stages, cfg_active, score_all, bar, progress,
                                             early if i == 0 else None, pool=pool)
                            early = None
            except BaseException:
                if early is not None:
                    early.abort()
                raise
            seconds["score_write"] = round(time.perf_counter() - t0, 2)
            timeline["scored"] = round(time.time(), 3)
            log.info("processed %d units in %.1f s", n_todo, time.time() - t_start)

        if held is not None:
            held.check()  # the lock was not taken over while the units ran
        done = NameSet((store, "stats"), ".json")
        if len(done) < n_units:
            missing = next((u.unit_id for u in iter_listing(listing_path(run)) if u.unit_id not in done), "?")
            raise RunError(f"{n_units - len(done)} units have no stats marker after the run (e.g. {missing}); "
                           "rerun the same command to finish them")
        if not is_uri(str(run)) and not compact_mod.is_compacted(Path(run)):
            t0 = time.perf_counter()
            with spans("compact"):
                _compact(Path(run), cfg, n_units, pool)
            seconds["compact"] = round(time.perf_counter() - t0, 2)
        with spans("counts"):
            counts, n_inputs, n_kept, reasons, units_store = reason_counts(run)
        manifest.update(status="complete", finished=_now(), funnel=funnel_from_counts(counts, n_inputs, manifest["stages"]),
                        counts={"inputs": n_inputs, "kept": n_kept}, reject_reasons=reasons, seconds=seconds,
                        store=retry.total([units_store, retry.since(before), *store_parts]))  # units, driver, dedup
        store.write_json("manifest.json", manifest)
        if not section(cfg, "engine")["keep_work"]:  # complete: the scratch nothing reads now (pipeline/engine/cleanup.py)
            with spans("cleanup"):
                run_cleanup.remove_scratch(run)
            if "timeline" in manifest:  # the clean-up's span too (the manifest above said complete already)
                store.write_json("manifest.json", manifest)
        return manifest
    finally:
        if pool is not None:
            pool.close(kill=sys.exc_info()[0] is not None)


def _listing_groups(run: Path):
    """The listing's unit ids in groups of compact_mod.GROUP consecutive units (one compacted file each)."""
    group: list[str] = []
    for u in iter_listing(listing_path(run)):
        group.append(u.unit_id)
        if len(group) >= compact_mod.GROUP:
            yield group
            group = []
    if group:
        yield group


def _compact(run: Path, cfg: dict, n_units: int, pool: LocalPool | None = None) -> None:
    """The catalog's compacted copy (catalog/compact.py): one Ray task per group of consecutive units
    of the listing, at most 4 per CPU in flight (the driver holds their unit ids, never the run's);
    without Ray, one job of the pool per group."""
    if n_units <= compact_mod.GROUP:  # one file: copied here, no task to schedule
        rows = compact_mod.compact_group(str(run), 0, [u.unit_id for u in iter_listing(listing_path(run))])
        compact_mod.finish(run, 1, rows, n_units)
        log.info("catalog: %d parts compacted into 1 file (%d rows)", n_units, rows)
        return
    groups = enumerate(_listing_groups(run))  # (file index, unit ids), read from the listing as they go
    rows = files = 0
    if pool is not None:  # a few groups' unit ids at a time, as Ray's tasks in flight below
        while chunk := list(itertools.islice(groups, 4 * pool.workers)):
            got = list(pool.results(compact_mod.compact_group, [(str(i), (str(run), i, g)) for i, g in chunk]))
            if len(got) < len(chunk):
                raise RunError("catalog compaction failed (see the warnings above); rerun the same command")
            rows, files = rows + sum(got), files + len(chunk)
    else:
        import ray
        init_ray(cfg)
        task = ray.remote(num_cpus=1, max_retries=retries_of(cfg))(compact_mod.compact_group)
        limit = max(1, int(4 * ray.cluster_resources().get("CPU", 1)))
        pending: list = []
        for i, group in groups:
            pending.append(task.remote(str(run), i, group))
            files = i + 1
            while len(pending) >= limit:  # at most `limit` in flight
                ready, pending = ray.wait(pending, num_returns=1)
                rows += ray.get(ready[0])
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            rows += ray.get(ready[0])
    compact_mod.finish(run, files, rows, n_units)
    log.info("catalog: %d parts compacted into %d files (%d rows)", n_units, files, rows)
