"""`humanset select`'s work on units (pipeline/select/recut.py drives it, docs/dedup.md "Select").

Each function here takes a window of units (or one partition), reads each unit's files and writes
its outputs, one unit at a time, and returns small counts; so it runs as a Ray task or in the
select process alike and never holds more than one unit's rows (a partition: its clusters'
members). SRC is the finished run, OUT the new one (local paths or URIs; both may be on an object
store). The files select writes under OUT:

  OUT/work/measure/{unit}.parquet   the unit's dedup candidates under the new thresholds (the measure
                                    files' columns, `_alive` = passes decode and size): the input of
                                    pipeline/dedup_dist.run_dedup, which writes OUT/work/dedup/{unit}.parquet;
  OUT/work/select/x/m-{first}.parquet      the members of multi-member clusters, row group p = hash partition p of the cluster key;
  OUT/work/select/t/p{p}.parquet           partition p's choices, row group w = the units of window w;
  OUT/work/select/choice/{unit}.parquet   the unit's members' dup_of / dup_kind / dup_scored;
  then OUT/catalog/samples/{unit}.parquet, OUT/shards/{unit}-*.tar and, last, OUT/stats/{unit}.json.
"""
from __future__ import annotations

import itertools
from collections import defaultdict

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import catalog
from catalog import SAMPLES
from catalog.schema import MEASURE
from catalog.source_bytes import read_source

from pipeline.dedup import clusters as dedup_mod
from pipeline.dedup import fallback
from pipeline.decide import decide
from pipeline.dedup.fallback_rounds import read_partition, route, write_by_key, write_by_window
from pipeline.stages import build_stages
from pipeline.engine.unit_io import now, run_store, with_dup_scored, write_curated

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
