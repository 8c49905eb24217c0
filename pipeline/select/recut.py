"""`humanset select`: re-cut a finished run with new thresholds from its stored scores.

No model runs. Dedup clusters are recomputed from the stored hashes when dedup settings change.
A threshold that needs a score the run never computed is refused, naming the stage to rerun.

No step holds the run's samples in one process (docs/dedup.md, "Select"): the work on units is in
the first half of this module, run over windows of units as Ray tasks (at most 4 per CPU in flight) when
Ray is initialised, else one window after another here; this driver holds a window of unit ids
and counts. The steps, each reading and writing files of the new run:
  1. candidates (only when dedup.* or size.* change): each unit's dedup candidates under the new
     thresholds into OUT/work/measure; dedup: pipeline/dedup/partitioned.run_dedup on them, partitioned by
     hash or in one process as `dedup.partitioned` picks (as in curate), one verdict file per unit;
  2. fallback choice: a shuffle by cluster on files (pipeline/dedup/fallback_rounds' map / reduce / route):
     each hash partition of cluster keys re-cut by fallback.recut on its members only, the choices
     routed back to one file per unit;
  3. check: refuse thresholds the stored scores cannot decide, before anything is written;
  4. write: each unit's catalog part, shards and stats marker.

Size: one concern, `select`: the work on units and the driver that orders it (each step of the
driver names one function of the first half); apart, neither was readable alone.
"""
from __future__ import annotations

import itertools
import logging
import math
from collections import defaultdict

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import catalog
from catalog import SAMPLES, console, run_kind
from catalog.storage import retry
from catalog.schema import MEASURE
from catalog.source_bytes import read_source
from pipeline.config import apply_sets, with_defaults
from pipeline.decide import decide
from pipeline.dedup import clusters as dedup_mod
from pipeline.dedup import fallback
from pipeline.dedup.fallback_rounds import fold, read_partition, route, tasks_in_flight, write_by_key, write_by_window
from pipeline.dedup.ranges import TASK_BASE_BYTES
from pipeline.engine.cleanup import SCRATCH, remove_scratch, remove_tree
from pipeline.engine.driver import library_versions
from pipeline.engine.funnel import funnel_from_counts
from pipeline.engine.unit_io import now, run_store, with_dup_scored, write_curated
from pipeline.settings import DEFAULTS
from pipeline.stages import REGISTRY, build_stages
from pipeline.stages.person import score_kind

# ----------------------------------------------------------------------------------------------------
# `humanset select`'s work on units (the driver below orders it; docs/dedup.md "Select").
#
# Each function here takes a window of units (or one partition), reads each unit's files and writes
# its outputs, one unit at a time, and returns small counts; so it runs as a Ray task or in the
# select process alike and never holds more than one unit's rows (a partition: its clusters'
# members). SRC is the finished run, OUT the new one (local paths or URIs; both may be on an object
# store). The files select writes under OUT:
#
#   OUT/work/measure/{unit}.parquet   the unit's dedup candidates under the new thresholds (the measure
#                                     files' columns, `_alive` = passes decode and size): the input of
#                                     pipeline/dedup_dist.run_dedup, which writes OUT/work/dedup/{unit}.parquet;
#   OUT/work/select/x/m-{first}.parquet      the members of multi-member clusters, row group p = hash partition p of the cluster key;
#   OUT/work/select/t/p{p}.parquet           partition p's choices, row group w = the units of window w;
#   OUT/work/select/choice/{unit}.parquet   the unit's members' dup_of / dup_kind / dup_scored;
#   then OUT/catalog/samples/{unit}.parquet, OUT/shards/{unit}-*.tar and, last, OUT/stats/{unit}.json.

SELECT_DIR = "work/select"
# a recut or route task's peak per cluster member it holds (member records as dicts and the choices;
# tracemalloc, 100k members, docs/dedup.md "Select"), and the skew of a hash partition allowed for
MEMBER_BYTES, SKEW = 1200, 2
MEMBER = pa.schema([("key", pa.string()), ("rank", pa.int32()), ("sample_id", pa.string()), ("sha256", pa.string()),
                    ("scored", pa.bool_()), ("passes", pa.bool_()), ("kept", pa.bool_()), ("unit", pa.string()),
                    ("win", pa.int64())])
CHOICE = pa.schema([("sample_id", pa.string()), ("unit", pa.string()), ("win", pa.int64()),
                    ("dup_of", pa.string()), ("dup_kind", pa.string()), ("dup_scored", pa.bool_())])
DUP_COLUMNS = ("dup_of", "dup_kind", "dup_cluster_size", "dup_rank")


class SelectError(Exception):
    pass


def choice_path(unit: str) -> str:
    return f"{SELECT_DIR}/choice/{unit}.parquet"


def stages_of(cfg: dict, names: list[str]):
    """The stages the run ran (manifest "stages"), built from the new config."""
    return [s for s in build_stages(cfg) if s.name in names]


def unit_names(store):
    """The run's unit ids, streamed from the listing of its catalog parts (store order)."""
    for e in store.list("catalog/samples", suffix=".parquet"):
        name = e.path[len("catalog/samples/"):]
        if "/" not in name and not name.startswith("."):
            yield name[:-len(".parquet")]


def read_part(store, unit: str) -> pa.Table:
    """The unit's catalog rows conformed to SAMPLES (columns added since an older schema generation
    are nulls), in key order."""
    rel = f"catalog/samples/{unit}.parquet"
    try:
        table = pq.read_table(store.fs_path(rel), filesystem=store.fs)
    except (pa.ArrowInvalid, OSError) as e:
        raise SelectError(f"{store.uri_of(rel)}: not a readable catalog part ({e}); rerun `humanset curate` on "
                          f"{store} to rewrite it") from e
    table = catalog.conform(table.select([c for c in table.column_names if c in SAMPLES.names]), SAMPLES)
    return table.sort_by("key")


def _set(table: pa.Table, col: str, arr) -> pa.Table:
    return table.set_column(table.schema.get_field_index(col), col, arr.cast(SAMPLES.field(col).type))


def with_verdicts(table: pa.Table, v: pa.Table) -> pa.Table:
    """The unit's dup columns from its verdict file (null for rows that were no candidate), and
    dup_scored as curate sets it before any fallback (the re-cut's choice then sets the members')."""
    pos = pc.index_in(table.column("sample_id"), value_set=v.column("sample_id").cast(pa.string()))
    for col in DUP_COLUMNS:
        table = _set(table, col, v.column(col).take(pos))
    return with_dup_scored(table, pc.is_null(table.column("dup_kind")))


def with_choice(table: pa.Table, c: pa.Table) -> pa.Table:
    """dup_of / dup_kind / dup_scored of the unit's cluster members as the re-cut chose them."""
    pos = pc.index_in(table.column("sample_id"), value_set=c.column("sample_id"))
    hit = pc.is_valid(pos)
    for col in ("dup_of", "dup_kind", "dup_scored"):
        table = _set(table, col, pc.if_else(hit, c.column(col).take(pos).cast(SAMPLES.field(col).type),
                                            table.column(col)))
    return table


def resolved(src, out, unit: str, redo: bool, choice: bool = True) -> pa.Table:
    """The unit's catalog rows with the new clusters (redo: its verdict file in OUT) and, with
    `choice`, the re-cut's kept members (its choice file, when it has one)."""
    table = read_part(src, unit)
    if redo:
        table = with_verdicts(table, dedup_mod.read_verdicts(out.base if out.posix else out.uri, unit))
    if choice and out.exists(choice_path(unit)):
        table = with_choice(table, pq.read_table(out.fs_path(choice_path(unit)), filesystem=out.fs))
    return table


def write_candidates(src: str, out: str, units: list[str], cfg: dict, names: list[str]) -> dict:
    """Each unit's dedup candidates under the new decode and size thresholds into OUT/work/measure."""
    src_s, out_s = run_store(src), run_store(out)
    early = [s for s in stages_of(cfg, names) if s.name in ("decode", "size")]
    n = 0
    for unit in units:
        part = decide(read_part(src_s, unit), early)  # derive + the early stages' reasons, as the cascade saw them
        cols = {c: part.column(c).cast(MEASURE.field(c).type) for c in dedup_mod.MEASURE_COLUMNS if c != "_alive"}
        cols["_alive"] = part.column("keep")
        out_s.write_parquet(f"work/measure/{unit}.parquet", pa.table(cols))
        n += pc.sum(part.column("keep")).as_py() or 0
    return {"units": len(units), "candidates": n}


def dedup_units(out: str, cfg: dict) -> dict:
    """Ray task (or here, without Ray): the partitioned or in-process dedup of OUT's candidate files
    (pipeline/dedup_dist.run_dedup, as curate's phase 2). This task, not select's driver, holds
    the unit ids (one listing of OUT/work/measure), as curate's dedup task does."""
    from pipeline.dedup import partitioned as dedup_dist
    store = run_store(out)
    ids = [e.path.rsplit("/", 1)[-1][:-len(".parquet")] for e in store.list("work/measure", suffix=".parquet")
           if "/" not in e.path[len("work/measure/"):] and not e.path.rsplit("/", 1)[-1].startswith(".")]
    return dedup_dist.run_dedup(out, ids, cfg)


def _member_records(part: pa.Table, stages, unit: str, w: int) -> list[dict]:
    """The unit's members of multi-member clusters, as fallback.recut reads them: scored = its stored
    scores decide it under the new thresholds, passes = its own reasons are none, kept = the run
    kept it."""
    score = [s.name for s in stages if s.phase == "score"]
    multi = pc.fill_null(pc.greater(part.column("dup_cluster_size"), 1), False)
    if not pc.any(multi).as_py():
        return []
    part = part.filter(multi)
    was_kept = part.column("keep").to_pylist()
    own = decide(part.set_column(part.schema.get_field_index("dup_kind"), "dup_kind",
                                 pa.nulls(part.num_rows, pa.string())), stages)  # its own reasons only
    out = []
    for r, kept in zip(own.select(["sample_id", "dup_of", "dup_rank", "sha256", "scored_stages",
                                   "reject_reasons"]).to_pylist(), was_kept):
        done = set(r["scored_stages"] or [])
        first = (r["reject_reasons"] or [None])[0]
        scored = (first.split(":")[0] not in score or first.split(":")[0] in done) if first else \
            all(s in done for s in score)  # its stored scores decide it
        out.append({"key": r["dup_of"] or r["sample_id"], "rank": r["dup_rank"] or 0, "sample_id": r["sample_id"],
                    "sha256": r["sha256"], "scored": scored, "passes": first is None, "kept": bool(kept),
                    "unit": unit, "win": w})
    return out


def map_members(src: str, out: str, first: int, units: list[str], cfg: dict, names: list[str], redo: bool,
                window: int, parts: int) -> dict:
    """The cluster members of the units numbered first, first + 1, ... (their route window: number //
    window), in one file whose row group p holds hash partition p of the cluster key (dup_of or
    sample_id): OUT/work/select/x/m-{first}.parquet."""
    src_s, out_s = run_store(src), run_store(out)
    stages = stages_of(cfg, names)
    recs: list[dict] = []
    for i, unit in enumerate(units):
        recs += _member_records(resolved(src_s, out_s, unit, redo, choice=False), stages, unit, (first + i) // window)
    write_by_key(out_s, f"{SELECT_DIR}/x", f"m-{first:09d}", recs, MEMBER, parts)
    return {"units": len(units), "members": len(recs)}


def recut_partition(out: str, p: int, max_fallbacks: int, windows: int) -> dict:
    """Partition p's clusters re-cut by fallback.recut (on its members only), the choices written
    in one file whose row group w holds destination window w: OUT/work/select/t/p{p}.parquet. Returns its counts."""
    store = run_store(out)
    members = [m for _, t in read_partition(store, f"{SELECT_DIR}/x", p) for m in t.to_pylist()]
    choice, counts = fallback.recut(members, max_fallbacks)
    write_by_window(store, f"{SELECT_DIR}/t", p, [{"sample_id": m["sample_id"], "unit": m["unit"], "win": m["win"],
                                                   **choice[m["sample_id"]]} for m in members], CHOICE, windows)
    return counts


def route_choices(out: str, w: int) -> int:
    """Window w's choices, one file per unit: OUT/work/select/choice/{unit}.parquet."""
    return route(run_store(out), f"{SELECT_DIR}/t", w, choice_path,
                 ["sample_id", "dup_of", "dup_kind", "dup_scored"])


def unscored(table: pa.Table, stages) -> dict[str, int]:
    """Per score stage, samples that now reach it but were never scored by it (the cascade skipped
    them): a threshold the run's stored scores cannot decide."""
    order = [s.name for s in stages]
    scored = table.column("scored_stages").to_pylist()
    reasons = table.column("reject_reasons").to_pylist()
    decoded = pc.is_null(table.column("decode_error")).to_pylist()
    out = {}
    for s in stages:
        if s.phase != "score":
            continue
        pos = order.index(s.name)
        missing = sum(1 for sc, rs, ok in zip(scored, reasons, decoded)
                      if ok and s.name not in (sc or [])
                      and all(order.index(r.split(":")[0]) >= pos for r in rs or []))
        if missing:
            out[s.name] = missing
    return out


def check_units(src: str, out: str, units: list[str], cfg: dict, names: list[str], redo: bool) -> dict:
    """Per score stage (`missing`), the window's samples the new thresholds send to it that it never
    scored."""
    src_s, out_s = run_store(src), run_store(out)
    stages = stages_of(cfg, names)
    got: dict[str, int] = {}
    for unit in units:
        for name, n in unscored(decide(resolved(src_s, out_s, unit, redo), stages), stages).items():
            got[name] = got.get(name, 0) + n
    return {"units": len(units), "missing": got}


def write_units(src: str, out: str, units: list[str], cfg: dict, names: list[str], redo: bool) -> dict:
    """Each unit's catalog part, curated shards and, last, stats marker in OUT; returns the window's
    counts: rows, kept, rejections by first stage and by reason."""
    src_s, out_s = run_store(src), run_store(out)
    stages = stages_of(cfg, names)
    counts = {"units": len(units), "rows": 0, "kept": 0, "first": {}, "reasons": {}}
    for unit in units:
        part = decide(resolved(src_s, out_s, unit, redo), stages)
        keep = part.filter(part.column("keep"))
        images = _images(src_s, keep, _unit_members(src_s, unit))
        written = write_curated(out_s.child("shards"), unit, keep, images, cfg) if keep.num_rows else []
        out_s.write_parquet(f"catalog/samples/{unit}.parquet", part)
        reasons: dict[str, int] = defaultdict(int)
        for r in part.column("reject_reason").to_pylist():
            if r:
                reasons[r] += 1
                counts["reasons"][r] = counts["reasons"].get(r, 0) + 1
                stage = r.split(":", 1)[0]
                counts["first"][stage] = counts["first"].get(stage, 0) + 1
        marker = {"unit": unit, "inputs": part.num_rows, "kept": keep.num_rows, "rejected": dict(sorted(reasons.items())),
                  "shards": written, "selected_from": src_s.uri, "finished": now()}
        marker.update(_unit_error(src_s, unit))  # a failed unit stays failed in the selection
        out_s.write_json(f"stats/{unit}.json", marker)
        counts["rows"] += part.num_rows
        counts["kept"] += keep.num_rows
    return counts


def _unit_error(store, unit: str) -> dict:
    """The unit error fields of the unit's marker in the run (none when it read cleanly)."""
    try:
        old = store.read_json(f"stats/{unit}.json")
    except (OSError, ValueError):
        return {}
    return {k: old[k] for k in ("unit_error", "unit_error_kind") if old.get(k)} if isinstance(old, dict) else {}


def _unit_members(store, unit: str) -> dict[str, tuple[str, int, int]]:
    """sample_id -> (tar relative to the run, offset, size) of the image member, from the unit's
    curated shards ({unit}-00000.tar, -00001, ... as engine.write_curated names them)."""
    out = {}
    for i in itertools.count():
        index = f"shards/{unit}-{i:05d}.parquet"
        if not store.exists(index):
            return out
        for r in pq.read_table(store.fs_path(index), filesystem=store.fs,
                               columns=["sample_id", "shard", "members"]).to_pylist():
            m = next(m for m in r["members"] if not m["name"].endswith(".json"))
            out[r["sample_id"]] = (f"shards/{r['shard']}", m["offset"], m["size"])


def _images(store, keep: pa.Table, stored: dict) -> dict[str, bytes]:
    """Original bytes of the kept samples: from the run's shards, else from their sources."""
    out = {}
    for sid, uri in zip(keep.column("sample_id").to_pylist(), keep.column("source_uri").to_pylist()):
        try:
            out[sid] = store.read_range(*stored[sid]) if sid in stored else read_source(uri)
        except (FileNotFoundError, OSError) as e:
            raise SelectError(f"sample {sid}: cannot read its bytes from {store}/shards or {uri}: {e}") from e
    return out


# ----------------------------------------------------------------------------------------------------
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


def _as_cut(cfg: dict) -> dict:
    """A run's config with the person score its cut read spelled out: a run written before person.score
    existed cut the raw score (person.score_kind), not today's default, and a re-cut keeps that."""
    person = cfg.get("person") if isinstance(cfg, dict) else None
    if not isinstance(person, dict) or "score" in person:
        return cfg
    return {**cfg, "person": {**person, "score": score_kind(person)}}


def plan(run, sets: list[str]) -> tuple[dict, dict, list[str]]:
    store = _store(run)
    kind = run_kind.kind_of(store.uri)
    if kind not in ("curate", "select") or not store.exists("manifest.json"):
        if kind is None:  # a GET names what a HEAD's bare 404 cannot: a missing bucket (StoreRefused, exit 3)
            try:
                store.read_bytes("manifest.json")
            except FileNotFoundError:
                pass
        what = f"it holds {run_kind.describe(kind)}" if kind else "no curation run there (no manifest.json)"
        raise SelectError(f"RUN {run}: {what}; pass a finished curation run (humanset curate --output RUN)")
    manifest = store.read_json("manifest.json")
    if manifest.get("status") != "complete":
        raise SelectError(f"{run}: the run is not complete; finish it first (rerun the same curate command)")
    old = with_defaults(_as_cut(manifest["config"]))  # a run older than a section (e.g. storage) takes its defaults
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


def _no_storage(cfg) -> dict:
    return {k: v for k, v in (cfg or {}).items() if k != "storage"}


def _at(cfg: dict, key: str):
    for part in key.split("."):
        cfg = cfg.get(part) if isinstance(cfg, dict) else None
    return cfg


def select(run: str, output: str, sets: list[str], progress: bool = True) -> dict:
    """Re-cut `run` with `sets` into `output`; rerunning the same selection finishes or returns it."""
    run_p, out = _store(run), _store(output)  # either may be local or on an object store
    manifest, cfg, changed = plan(run_p, sets)
    retry.configure(cfg)  # the run's storage.retry_*, or this command's --set storage.retry_*=...
    # how the store is talked to (storage.*) is not part of what a selection is
    identity = {"selected_from": run_p.uri, "changed": {k: _at(cfg, k) for k in changed if not k.startswith("storage.")}}
    flag = "--output"
    run_kind.check(output, "select", identity, flag)  # before anything is written
    try:
        with out.run_lock():
            run_kind.claim(out, "select", identity, flag)
            if out.exists("manifest.json"):
                done = out.read_json("manifest.json")
                if done.get("selected_from") != run_p.uri or _no_storage(done.get("config")) != _no_storage(cfg):
                    raise SelectError(f"{output}: holds another selection (of {done.get('selected_from')}, "
                                      f"changed {done.get('changed')}); pass another --output")
                if done.get("status") == "complete":
                    log.info("select: %s already holds this selection (finished %s)", output, done.get("finished"))
                    return done
            try:
                return _select(run_p, out, manifest, cfg, changed, progress)
            except SelectError:  # thresholds refused: the folder is left unclaimed, for other ones
                if not out.exists("manifest.json"):
                    remove_scratch(out.uri, (*SCRATCH, SELECT_DIR))
                    out.delete(run_kind.MARKER)
                raise
    except catalog.RunLocked as e:
        raise SelectError(str(e)) from None


def _select(run_p, out, manifest: dict, cfg: dict, changed: list[str], progress: bool) -> dict:
    started = now()
    names = list(manifest["stages"])
    stages = stages_of(cfg, names)
    src, dst = _root(run_p), _root(out)
    redo = any(k.startswith(("dedup.", "size.")) for k in changed)
    n_units = sum(1 for _ in unit_names(run_p))  # counts only: the listing is streamed again per step
    size, limit, window = _sizes(n_units, cfg)
    groups = max(1, math.ceil(n_units / window))  # the exchange's partitions and route windows
    retries = int((cfg.get("engine") or {}).get("max_retries", DEFAULTS.engine.max_retries))

    def each(*extra):
        return ((src, dst, units, cfg, names, *extra) for _, units in _unit_windows(run_p, size))

    def run_step(fn, args, total, desc):
        return _step(fn, args, total, desc, n_units, progress, limit, retries)

    if redo:
        got = run_step(write_candidates, each(), {}, "candidates")
        st = _unwrapped(fold, dedup_units, [(dst, dict(cfg, stages=names))], 1, retries, lambda a, b: b, {})
        log.info("select: %d of %d candidates are duplicates", st.get("duplicates", 0), got.get("candidates", 0))
    fb_counts = _fallback_choice(run_p, dst, stages, cfg, names, redo, size, window, groups, limit, retries,
                                 run_step)

    # then two passes over the units: the first refuses thresholds the stored scores cannot decide,
    # before anything of the selection is written
    missing = run_step(check_units, each(redo), {}, "check").get("missing", {})
    for name, n in missing.items():
        raise SelectError(f"{n} samples now reach the {name} stage but were never scored by it "
                          f"(the cascade skipped them); rerun `humanset curate` with these thresholds or "
                          f"with --score-all")
    got = run_step(write_units, each(redo), {"rows": 0, "kept": 0, "first": {}, "reasons": {}}, "select")
    log.info("select: %d of %d samples kept (was %d)", got["kept"], got["rows"], manifest["counts"]["kept"])
    result = {**{k: manifest.get(k) for k in ("inputs", "stages", "skipped_stages", "score_all", "units")},
              "config": cfg, "selected_from": run_p.uri, "changed": changed, "started": started,
              "finished": now(), "status": "complete", "versions": library_versions(),
              "funnel": funnel_from_counts(got["first"], got["rows"], manifest["stages"]),
              "counts": {"inputs": got["rows"], "kept": got["kept"]}, "fallbacks": fb_counts,
              "reject_reasons": dict(sorted(got["reasons"].items(), key=lambda kv: (-kv[1], kv[0])))}
    out.write_json("manifest.json", result)
    if not (cfg.get("engine") or {}).get("keep_work", DEFAULTS.engine.keep_work):  # as curate does at its end
        remove_scratch(out.uri, (*SCRATCH, SELECT_DIR))
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
    _clear(_store(dst), SELECT_DIR)  # what an interrupted select into this OUT left: never mixed in
    score = [s.name for s in stages if s.phase == "score"]
    d = cfg.get("dedup") or {}
    n_fb = int(d.get("max_fallbacks", DEFAULTS.dedup.max_fallbacks) or 0) if score else 0
    args = ((src, dst, first, units, cfg, names, redo, window, groups)
            for first, units in _unit_windows(run_p, size))
    members = step(map_members, args, {}, "clusters").get("members", 0)
    counts = {"promoted": 0, "unscored": 0, "lost": 0}
    if members:
        # each partition and window holds ~1 / groups of the members: declared, so Ray never packs
        # more of them on a node than fit
        mem = TASK_BASE_BYTES + MEMBER_BYTES * SKEW * math.ceil(members / groups)
        fix = "lower engine.window_units (more, smaller partitions)"
        counts = _unwrapped(fold, recut_partition, ((dst, p, n_fb, groups) for p in range(groups)), limit, retries, _add,
                            counts, None, mem, fix)
        _unwrapped(fold, route_choices, ((dst, g) for g in range(groups)), limit, retries, _add, 0, None, mem, fix)
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
    it = unit_names(store)
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
    store = _store(run)
    cfg = (store.read_json("manifest.json").get("config") or {}) if store.exists("manifest.json") else {}
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


