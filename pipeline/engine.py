"""The curation engine: stages as data, turned into Ray Data operations in this one place.

A run has three phases, each resumable:
  1. measure (per input unit): read -> decode -> size -> pHash, streaming through Ray Data;
     the driver writes RUN/work/measure/{unit}.parquet when every sample of a unit is back.
  2. dedup (whole run, once every unit is measured): clusters by sha256 and pHash distance
     -> RUN/work/dedup/{unit}.parquet verdicts (pipeline/dedup.run_dedup; a pure function of
     phase 1, so reruns agree).
  3. score + write (per unit): the model stages see only survivors (all with --score-all);
     then one Ray task per unit writes RUN/catalog/samples/{unit}.parquet, the curated shards
     RUN/shards/{unit}-NNNNN.tar|.parquet (original bytes) and last RUN/stats/{unit}.json,
     the unit's completion marker.
Rerunning on the same RUN skips every unit with a marker and every phase-1 file already written.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import sys
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import catalog
from catalog import CURATED_INDEX, SAMPLES

from . import console
from . import dedup as dedup_mod
from .config import load_config
from .decide import decide, funnel
from .sources import Unit, list_units, read_unit
from .stages import Stage, build_stages

log = logging.getLogger("humanset.curate")

# columns carried through Ray Data besides SAMPLES columns


class RunError(Exception):
    """The run cannot go on (bad config for this RUN, a model that does not load, ...)."""


# --------------------------------------------------------------------------------------------
# Stage application: one function for task stages, one class for actor-pool stages.

# stage-to-stage columns that never reach the catalog
INTERNAL_TYPES = {"_thumb": pa.binary()}


def _typed(col: str, values: list) -> pa.Array:
    return pa.array(values, type=INTERNAL_TYPES[col] if col in INTERNAL_TYPES else SAMPLES.field(col).type)


def _set(table: pa.Table, col: str, arr) -> pa.Table:
    idx = table.schema.get_field_index(col)
    return table.set_column(idx, col, arr) if idx >= 0 else table.append_column(col, arr)


def _flag(batch: pa.Table, col: str, default: bool) -> np.ndarray:
    return pc.fill_null(batch.column(col), default).to_numpy(zero_copy_only=False).astype(bool)


def _scatter(values: pa.Array, idx: np.ndarray, n: int) -> pa.Array:
    """values for rows idx of an n-row batch; null elsewhere."""
    if len(idx) == n:
        return values
    pos = np.full(n, -1, np.int64)
    pos[idx] = np.arange(len(idx))
    return values.take(pa.array(pos, mask=pos < 0))


def _append_name(lists: pa.Array, todo: np.ndarray, name: str) -> pa.Array:
    """list<string> column with `name` appended on rows where todo (a null list becomes [name])."""
    lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    n = len(lists)
    old_len = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    new_len = old_len + todo
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(new_len, out=offsets[1:])
    flat = pc.list_flatten(lists)
    parent = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False).astype(np.int64)
    old_starts = np.zeros(n + 1, np.int64)
    np.cumsum(old_len, out=old_starts[1:])
    src = np.empty(offsets[-1], np.int64)
    src[offsets[parent] + np.arange(len(parent)) - old_starts[parent]] = np.arange(len(parent))
    src[(offsets[:-1] + old_len)[todo]] = len(flat)
    values = pa.concat_arrays([flat.cast(pa.string()), pa.array([name], pa.string())]).take(pa.array(src))
    mask = pa.array(~todo & np.asarray(lists.is_null().to_numpy(zero_copy_only=False), bool))
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values, mask=mask,
                                    type=SAMPLES.field("scored_stages").type)


def run_stage(stage: Stage, batch: pa.Table, score_all: bool) -> pa.Table:
    """Measure the rows this stage should see and merge its columns into the batch.

    Measure stages see every row. Score stages see rows still alive (all decodable rows with
    score_all); other rows get nulls. Afterwards `_alive` drops rows this stage rejects.
    Columns are assembled with Arrow kernels: no Python loop over rows here.
    """
    n = batch.num_rows
    todo = ~_flag(batch, "_sentinel", False)
    if stage.phase != "measure":
        todo &= pc.is_null(batch.column("decode_error")).to_numpy(zero_copy_only=False).astype(bool)
        if not score_all:
            todo &= _flag(batch, "_alive", False)
    idx = np.flatnonzero(todo)
    t0 = time.perf_counter()
    if len(idx):
        sub = batch.take(pa.array(idx, pa.int64())) if len(idx) < n else batch
        wanted = [c for c in set(stage.reads) | {"sample_id"} if c in sub.column_names]
        result = stage.measure(sub.select(wanted).to_pydict())
    else:
        result = {c: [] for c in stage.writes}
    seconds = time.perf_counter() - t0
    for col in stage.writes:
        got = result.get(col, [None] * len(idx))
        if len(got) != len(idx):
            raise RunError(f"stage {stage.name} returned {len(got)} values of {col} for {len(idx)} rows")
        batch = _set(batch, col, _scatter(_typed(col, got), idx, n))
    batch = _set(batch, "scored_stages", _append_name(batch.column("scored_stages"), todo, stage.name))
    per_row = seconds / len(idx) if len(idx) else 0.0
    batch = _set(batch, f"_t_{stage.name}", pa.array(np.where(todo, per_row, 0.0), pa.float64()))
    if stage.name != "dedup":  # dedup's verdict needs the whole run; it is applied in phase 3
        rejected = pc.is_valid(pa.array(stage.reject(batch), pa.string()))
        alive = pc.and_(pc.fill_null(batch.column("_alive"), False), pc.invert(rejected))
        batch = _set(batch, "_alive", alive)
    return batch


_TASK_STAGES: dict[str, Stage] = {}


def _task_fn(batch: pa.Table, name: str, cfg: dict, score_all: bool) -> pa.Table:
    """Ray Data task: stateless stages, one instance per worker process."""
    key = json.dumps([name, cfg], sort_keys=True, default=str)
    if key not in _TASK_STAGES:
        from .stages import stage_class
        _TASK_STAGES[key] = stage_class(name)(cfg)
        _TASK_STAGES[key].setup()
    return run_stage(_TASK_STAGES[key], batch, score_all)


class _ActorFn:
    """Ray Data actor: stateful stages load their model once per actor."""

    def __init__(self, name: str, cfg: dict, score_all: bool):
        from .stages import stage_class
        self.stage = stage_class(name)(cfg)
        self.stage.setup()
        self.score_all = score_all
        if "torch" in sys.modules:  # torch threads = the actor's CPUs (ONNX Runtime stages set theirs)
            import torch
            torch.set_num_threads(max(1, int(round(self.stage.resources.num_cpus))))

    def __call__(self, batch: pa.Table) -> pa.Table:
        return run_stage(self.stage, batch, self.score_all)


def _pool(stage: Stage):
    """Ray Data's actor pool for a stateful stage: `concurrency` N is a fixed pool, [min, max] an
    autoscaling one; unset (or "auto"), it autoscales from 1 to as many actors as the cluster's
    CPUs (GPUs for a GPU stage) can hold at the stage's resources."""
    import ray

    c = stage.concurrency
    if isinstance(c, int):
        return ray.data.ActorPoolStrategy(size=c)
    res, total = stage.resources, ray.cluster_resources()
    if res.num_gpus:
        fit = max(1, int(total.get("GPU", 0) // res.num_gpus))
    else:
        fit = max(1, int(total.get("CPU", 1) // max(res.num_cpus, 1e-3)))
    if isinstance(c, tuple):  # [min, max]; a null max means "what the cluster holds"
        lo = int(c[0] or 1)
        return ray.data.ActorPoolStrategy(min_size=lo, max_size=max(lo, int(c[1]) if c[1] else fit))
    return ray.data.ActorPoolStrategy(min_size=1, max_size=fit)


def apply_stage(ds, stage: Stage, score_all: bool):
    """The one place a stage becomes a Ray Data operation."""
    res = stage.resources
    kw = dict(batch_size=stage.batch_size, batch_format="pyarrow", num_cpus=res.num_cpus)
    if res.num_gpus:
        kw["num_gpus"] = res.num_gpus
    if res.memory_gb:
        kw["memory"] = int(res.memory_gb * 2**30)
    if stage.stateful:
        return ds.map_batches(_ActorFn, fn_constructor_kwargs=dict(name=stage.name, cfg=stage.cfg,
                              score_all=score_all), compute=_pool(stage), **kw)
    return ds.map_batches(_task_fn, fn_kwargs=dict(name=stage.name, cfg=stage.cfg, score_all=score_all), **kw)


# --------------------------------------------------------------------------------------------
# Reading units into rows.

_READ_FIELDS = [SAMPLES.field(c) for c in ("sample_id", "source_uri", "shard", "key", "caption", "source_meta")] + [
    pa.field("image", pa.binary()), pa.field("read_error", pa.string()), pa.field("_unit_total", pa.int64()),
    pa.field("_unit_error", pa.string()), pa.field("_sentinel", pa.bool_()), pa.field("_alive", pa.bool_()),
    SAMPLES.field("scored_stages")]
READ_SCHEMA = pa.schema(_READ_FIELDS)


def _units_ds(units: list[Unit]):
    import ray
    return ray.data.from_items([{"unit": json.dumps(u.to_dict())} for u in units], override_num_blocks=len(units))


def _read_units(batch: pa.Table) -> pa.Table:
    """Ray Data task: unit descriptions -> one row per sample, with the original bytes."""
    out = []
    for item in batch.column("unit").to_pylist():
        unit = Unit.from_dict(json.loads(item))
        rows, unit_error = read_unit(unit)
        if not rows:  # a unit with no samples still has to reach the driver to be marked done
            rows = [{"shard": unit.unit_id, "_sentinel": True, "_alive": False}]
        for r in rows:
            r.setdefault("_sentinel", False)
            r.setdefault("_alive", True)
            r.update(_unit_total=0 if r["_sentinel"] else len(rows), _unit_error=unit_error)
        out += rows
    return pa.Table.from_pylist(out, schema=READ_SCHEMA)


def _score_units(batch: pa.Table, run: str, score_all: bool) -> pa.Table:
    """Phase 3 input: the unit's measurements + dedup verdicts, with bytes for rows to score."""
    parts = []
    for item in batch.column("unit").to_pylist():
        unit = Unit.from_dict(json.loads(item))
        table = _measured_table(Path(run), unit.unit_id)
        ids = table.column("sample_id").to_pylist()
        need = {sid for sid, a, e in zip(ids, table.column("_alive").to_pylist(),
                                          table.column("decode_error").to_pylist()) if (a or score_all) and e is None}
        images = {}
        if need:
            rows, _ = read_unit(unit)
            images = {r["sample_id"]: r["image"] for r in rows if r["sample_id"] in need}
        n = table.num_rows
        sentinel = n == 0
        if sentinel:
            table = pa.Table.from_pylist([{"shard": unit.unit_id}], schema=table.schema)
            ids, n = [None], 1
        table = table.append_column("image", pa.array([images.get(s) for s in ids], pa.binary()))
        table = table.append_column("_unit_total", pa.array([0 if sentinel else n] * n, pa.int64()))
        table = table.append_column("_sentinel", pa.array([sentinel] * n, pa.bool_()))
        parts.append(table)
    return pa.concat_tables(parts, promote_options="default")


def _measured_table(run: Path, unit_id: str) -> pa.Table:
    """Phase-1 rows of a unit joined with the run's dedup verdicts; `_alive` after dedup."""
    t = pq.read_table(run / "work" / "measure" / f"{unit_id}.parquet")
    dup = {r["sample_id"]: r for r in dedup_mod.read_verdicts(run, unit_id).to_pylist()}
    ids = t.column("sample_id").to_pylist()
    for col in ("dup_of", "dup_kind", "dup_cluster_size"):
        t = _set(t, col, _typed(col, [dup.get(i, {}).get(col) for i in ids]))
    alive = [a and k is None for a, k in zip(t.column("_alive").to_pylist(), t.column("dup_kind").to_pylist())]
    return _set(t, "_alive", pa.array(alive, pa.bool_()))


# --------------------------------------------------------------------------------------------
# Driver side: collect rows per unit, write files.

class _Collector:
    """Groups streamed rows by unit; calls `done(unit_id, table, unit_error)` when a unit is whole."""

    def __init__(self, done, total_units: int, desc: str, progress: bool):
        self.parts: dict[str, list[pa.Table]] = defaultdict(list)
        self.counts: dict[str, int] = defaultdict(int)
        self.done = done
        self.bar = console.progress(total_units, desc, enabled=progress)

    def add(self, batch: pa.Table):
        if "image" in batch.column_names:
            batch = batch.drop_columns(["image"])
        for unit_id in pc.unique(batch.column("shard")).to_pylist():
            part = batch.filter(pc.equal(batch.column("shard"), unit_id))
            total = part.column("_unit_total")[0].as_py()
            error = part.column("_unit_error")[0].as_py() if "_unit_error" in part.column_names else None
            real = part.filter(pc.invert(part.column("_sentinel")))
            self.parts[unit_id].append(real)
            self.counts[unit_id] += real.num_rows
            if self.counts[unit_id] >= total:
                table = pa.concat_tables(self.parts.pop(unit_id), promote_options="default")
                self.counts.pop(unit_id)
                self.done(unit_id, table, error)
                self.bar.update(1)

    def close(self):
        self.bar.close()
        if self.parts:
            raise RunError(f"units left incomplete by the stream: {sorted(self.parts)}")


def _stream(ds, collector: _Collector):
    for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
        collector.add(batch)
    collector.close()


SIDECAR = ("sample_id", "source_uri", "key", "caption", "width", "height", "person_boxes", "person_scores",
           "person_keypoints")
INDEX_EXTRA = ("sample_id", "source_uri", "format", "width", "height", "sha256", "n_persons")


def write_curated(folder: Path, unit_id: str, kept: pa.Table, images: dict[str, bytes], cfg: dict) -> list[str]:
    """Curated shards of one unit: {sample_id}.{ext} original bytes + {sample_id}.json sidecar."""
    out = cfg["output"]
    with catalog.ShardWriter(folder, unit_id, CURATED_INDEX, max_count=out["shard_max_count"],
                             max_bytes=out["shard_max_bytes"]) as w:
        for r in kept.to_pylist():
            ext = (r["format"] or "bin").lower().replace("jpeg", "jpg")
            sidecar = {k: r[k] for k in SIDECAR if r.get(k) is not None}
            w.add(r["sample_id"], {ext: images[r["sample_id"]], "json": sidecar}, {k: r.get(k) for k in INDEX_EXTRA})
    return w.written


def _write_unit(run: str, unit: dict, table: pa.Table, cfg: dict, unit_error: str | None) -> dict:
    """Ray task: decide, write the unit's catalog part and curated shards, then its stats marker."""
    run_p = Path(run)
    u = Unit.from_dict(unit)
    stages = build_stages(cfg)
    t0 = time.perf_counter()
    timings = {}
    for s in stages:
        col = f"_t_{s.name}"
        if col in table.column_names:
            timings[s.name] = timings.get(s.name, 0.0) + float(pc.sum(table.column(col)).as_py() or 0.0)
    table = decide(table, stages)
    keep_ids = [sid for sid, k in zip(table.column("sample_id").to_pylist(), table.column("keep").to_pylist()) if k]
    written = []
    if keep_ids:
        from .sources import iter_unit_images
        images = dict(iter_unit_images(u, set(keep_ids)))
        missing = set(keep_ids) - set(images)
        if missing:  # the source changed between phases: say so instead of writing a partial shard
            raise RunError(f"unit {u.unit_id}: {len(missing)} kept samples could not be re-read from {u.uri}")
        written = write_curated(run_p / "shards", u.unit_id, table.filter(table.column("keep")), images, cfg)
    samples = catalog.conform(table.select([c for c in table.column_names if c in SAMPLES.names]), SAMPLES)
    catalog.write_parquet(run_p / "catalog" / "samples" / f"{u.unit_id}.parquet", samples)
    reasons = defaultdict(int)
    for r in table.column("reject_reason").to_pylist():
        if r:
            reasons[r] += 1
    stats = {"unit": u.unit_id, "source": u.uri, "inputs": table.num_rows, "kept": len(keep_ids),
             "rejected": dict(sorted(reasons.items())), "shards": written, "unit_error": unit_error,
             "seconds": {**{k: round(v, 4) for k, v in timings.items()},
                         "write": round(time.perf_counter() - t0, 4)},
             "finished": _now()}
    catalog.write_json(run_p / "stats" / f"{u.unit_id}.json", stats)
    return stats


# --------------------------------------------------------------------------------------------

def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _versions() -> dict:
    import importlib.metadata as md
    out = {"python": platform.python_version()}
    for pkg in ("humanset", "ray", "pyarrow", "duckdb", "pillow", "imagehash", "torch", "ultralytics",
                "rapidocr", "timm", "open_clip_torch"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def loopback_only() -> None:
    """Keep a single-machine Ray on 127.0.0.1: by default Ray swaps loopback for the machine's
    network address. Set before the cluster starts; its processes inherit the variable."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if "ray" in sys.modules:
        import ray._private.ray_constants as rc
        rc.ENABLE_RAY_CLUSTER = False


def init_ray(cfg: dict):
    """Connect to the cluster this driver runs in (ray submit / ray job submit), else start one here."""
    address = cfg.get("ray", {}).get("address")
    local = address is None and not os.environ.get("RAY_ADDRESS") and not Path(
        "/tmp/ray/ray_current_cluster").exists()
    if local:
        loopback_only()
    import ray
    console.quiet_ray()
    if ray.is_initialized():
        return
    kw = dict(include_dashboard=False, log_to_driver=True, logging_level=logging.WARNING)
    if local:  # a private single-node cluster, reachable on loopback only
        console.token_auth_notice()
        ray.init(num_cpus=cfg.get("ray", {}).get("num_cpus"), **kw)
    else:
        ray.init(address=address or "auto", **{k: v for k, v in kw.items() if k != "include_dashboard"})
    res = ray.cluster_resources()
    log.info("ray: %s, %g CPU, %g GPU", "private local cluster on 127.0.0.1 (token authentication on)" if local
             else f"cluster at {address or 'auto'}", res.get("CPU", 0), res.get("GPU", 0))


def curate(inputs: list[str], output: str, config: dict | None = None, score_all: bool = False,
           progress: bool = True) -> dict:
    """Run (or finish) a curation run. Returns the manifest."""
    cfg = config or load_config()
    run = Path(output)
    units, repeated = list_units(inputs, cfg["input"]["files_per_unit"], cfg["input"]["extensions"])
    manifest_path = run / "manifest.json"
    manifest = {"config": cfg, "inputs": [str(i) for i in inputs], "score_all": score_all}
    if manifest_path.exists():
        old = catalog.read_json(manifest_path)
        if old.get("config") != cfg or old.get("inputs") != manifest["inputs"] or old.get("score_all") != score_all:
            raise RunError(f"{run}: holds a run with other inputs or config; resume it with the same "
                           "command, or pass a new --output")
        manifest["started"] = old.get("started")
        log.info("resuming %s", run)
    else:
        manifest["started"] = _now()
    stages = build_stages(cfg)
    skipped = {s.name: s.skip_reason() for s in stages if not s.enabled}
    for name, why in skipped.items():
        log.warning("stage %s skipped: %s", name, why)
    active = [s for s in stages if s.enabled]
    manifest.update(stages=[s.name for s in active], skipped_stages=skipped, versions=_versions(),
                    status="running", units=len(units), repeated_inputs=repeated)
    catalog.write_json(manifest_path, manifest)
    removed = catalog.clean_tmp(run)
    if removed:
        log.info("removed %d temporary files left by an interrupted run", removed)

    done = {u.unit_id for u in units if (run / "stats" / f"{u.unit_id}.json").exists()}
    todo = [u for u in units if u.unit_id not in done]
    measure_dir = run / "work" / "measure"
    to_measure = [u for u in todo if not (measure_dir / f"{u.unit_id}.parquet").exists()]
    log.info("%d units: %d done, %d to measure, %d to write", len(units), len(done), len(to_measure), len(todo))
    measure_stages = [s for s in active if s.phase == "measure"]
    score_stages = [s for s in active if s.phase == "score"]
    cfg_active = dict(cfg, stages=[s.name for s in active])

    if todo:
        init_ray(cfg)  # Ray Data's own progress off: ours (console.progress) counts units
        t_start = time.time()
        if to_measure:
            _measure(run, to_measure, measure_stages, score_all, progress)
        if not dedup_mod.is_done(run):
            t0 = time.perf_counter()
            st = dedup_mod.run_dedup(run, [u.unit_id for u in units], cfg_active)
            log.info("dedup: %d of %d candidates are duplicates (%.2f s)", st["duplicates"], st["candidates"],
                     time.perf_counter() - t0)
        _score_and_write(run, todo, score_stages, cfg_active, score_all, progress)
        log.info("processed %d units in %.1f s", len(todo), time.time() - t_start)

    con = catalog.connect(run)
    first = [r[0] for r in con.execute("SELECT reject_reason FROM samples").fetchall()]
    n_inputs = len(first)
    manifest.update(status="complete", finished=_now(), funnel=funnel(first, [s.name for s in active]),
                    counts={"inputs": n_inputs, "kept": sum(1 for r in first if r is None)})
    catalog.write_json(manifest_path, manifest)
    return manifest


def _measure(run: Path, units: list[Unit], stages: list[Stage], score_all: bool, progress: bool):
    ds = _units_ds(units).map_batches(_read_units, batch_size=1, batch_format="pyarrow")
    for s in stages:
        ds = apply_stage(ds, s, score_all)
    by_id = {u.unit_id: u for u in units}

    def done(unit_id: str, table: pa.Table, error: str | None):
        # the unit error (e.g. truncated tar) travels with the measurements to the stats marker
        keep = [c for c in table.column_names if c in SAMPLES.names or c == "_alive" or c.startswith("_t_")]
        table = table.select(keep).replace_schema_metadata({b"unit_error": (error or "").encode()})
        catalog.write_parquet(run / "work" / "measure" / f"{by_id[unit_id].unit_id}.parquet", table)

    _stream(ds, _Collector(done, len(units), "measure", progress))


def _score_and_write(run: Path, units: list[Unit], stages: list[Stage], cfg: dict, score_all: bool,
                     progress: bool):
    import ray
    write = ray.remote(num_cpus=1)(_write_unit)
    by_id = {u.unit_id: u for u in units}
    refs = []

    def done(unit_id: str, table: pa.Table, _error):
        u = by_id[unit_id]
        meta = pq.read_schema(run / "work" / "measure" / f"{unit_id}.parquet").metadata or {}
        error = (meta.get(b"unit_error") or b"").decode() or None
        keep_cols = [c for c in table.column_names if c in SAMPLES.names or c.startswith("_t_")]
        refs.append(write.remote(str(run), u.to_dict(), table.select(keep_cols), cfg, error))

    if stages:
        ds = _units_ds(units).map_batches(_score_units, fn_kwargs=dict(run=str(run), score_all=score_all),
                                          batch_size=1, batch_format="pyarrow")
        for s in stages:
            ds = apply_stage(ds, s, score_all)
        _stream(ds, _Collector(done, len(units), "score", progress))
    else:
        for u in units:
            done(u.unit_id, _measured_table(run, u.unit_id), None)
    with console.progress(len(refs), "write", enabled=progress) as bar:
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            ray.get(ready)
            bar.update(len(ready))
