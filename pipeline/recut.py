"""`humanset select`: re-cut a finished run with new thresholds from its stored scores.

No model runs. Dedup clusters are recomputed from the stored hashes when dedup settings change.
A threshold that needs a score the run never computed is refused, naming the stage to rerun.
"""
from __future__ import annotations

import itertools
import logging
from collections import defaultdict

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import catalog
from catalog import SAMPLES
from catalog.source_bytes import read_source

from . import console
from . import dedup as dedup_mod
from . import fallback
from .config import apply_sets
from .decide import decide
from .engine import library_versions, funnel_from_counts, write_curated
from .settings import DEFAULTS
from .unit_io import now
from .stages import REGISTRY, build_stages

log = logging.getLogger("humanset.select")


class SelectError(Exception):
    pass


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
    run_p, out = _store(run), _store(output)  # either may be local or on an object store
    manifest, cfg, changed = plan(run_p, sets)
    if out.exists("manifest.json"):
        raise SelectError(f"{out}: already holds a run; choose a new --output")
    stages = [s for s in build_stages(cfg) if s.name in manifest["stages"]]
    dedup = _redo_dedup(run_p, stages, cfg) if any(k.startswith(("dedup.", "size.")) for k in changed) else None
    choice, fb_counts = _fallback_choice(run_p, dedup, stages, cfg)

    # then two passes over the parts, one unit at a time: the first refuses thresholds the stored
    # scores cannot decide, before anything is written
    unscored: dict[str, int] = {}
    for _, part in _parts(run_p, progress=False):
        for name, n in _unscored(decide(_resolved(part, dedup, choice), stages), stages).items():
            unscored[name] = unscored.get(name, 0) + n
    for name, missing in unscored.items():
        raise SelectError(f"{missing} samples now reach the {name} stage but were never scored by it "
                          f"(the cascade skipped them); rerun `humanset curate` with these thresholds or "
                          f"with --score-all")

    first: dict[str, int] = {}
    all_reasons: dict[str, int] = {}
    n_rows = n_kept = 0
    for unit, part in _parts(run_p, progress):
        part = decide(_resolved(part, dedup, choice), stages)
        keep = part.filter(part.column("keep"))
        images = _images(run_p, keep, _unit_members(run_p, unit))
        written = write_curated(out.child("shards"), unit, keep, images, cfg) if keep.num_rows else []
        out.write_parquet(f"catalog/samples/{unit}.parquet", part)
        reasons = defaultdict(int)
        for r in part.column("reject_reason").to_pylist():
            if r:
                reasons[r] += 1
                all_reasons[r] = all_reasons.get(r, 0) + 1
                first[r.split(":", 1)[0]] = first.get(r.split(":", 1)[0], 0) + 1
        marker = {"unit": unit, "inputs": part.num_rows, "kept": keep.num_rows, "rejected": dict(sorted(reasons.items())),
                  "shards": written, "selected_from": run_p.uri, "finished": now()}
        marker.update(_unit_error(run_p, unit))  # a failed unit stays failed in the selection
        out.write_json(f"stats/{unit}.json", marker)
        n_rows += part.num_rows
        n_kept += keep.num_rows
    log.info("select: %d of %d samples kept (was %d)", n_kept, n_rows, manifest["counts"]["kept"])
    result = {**{k: manifest.get(k) for k in ("inputs", "stages", "skipped_stages", "score_all", "units")},
              "config": cfg, "selected_from": run_p.uri, "changed": changed, "started": now(),
              "finished": now(), "status": "complete", "versions": library_versions(),
              "funnel": funnel_from_counts(first, n_rows, manifest["stages"]),
              "counts": {"inputs": n_rows, "kept": n_kept}, "fallbacks": fb_counts,
              "reject_reasons": dict(sorted(all_reasons.items(), key=lambda kv: (-kv[1], kv[0])))}
    out.write_json("manifest.json", result)
    return result


def _store(run) -> catalog.Storage:
    if isinstance(run, catalog.Storage):
        return run
    from catalog.storage import run_root, storage_for
    return storage_for(run_root(run))


def _parts(run, progress: bool):
    """(unit, its catalog rows conformed to SAMPLES) for every catalog part, read one at a time, in
    name order. Parts of an older schema generation get the columns added since as nulls; a part
    with zero rows is a unit too (its marker and counts carry over)."""
    run = _store(run)
    names = sorted(n for n in (e.path[len("catalog/samples/"):] for e in run.list("catalog/samples", suffix=".parquet"))
                   if "/" not in n and not n.startswith("."))
    for name in console.progress(iterable=names, desc="select", enabled=progress):
        path = run.uri_of(f"catalog/samples/{name}")
        try:
            table = pq.read_table(run.fs_path(f"catalog/samples/{name}"), filesystem=run.fs)
        except (pa.ArrowInvalid, OSError) as e:
            raise SelectError(f"{path}: not a readable catalog part ({e}); rerun `humanset curate` on {run} "
                              "to rewrite it") from e
        table = catalog.conform(table.select([c for c in table.column_names if c in SAMPLES.names]), SAMPLES)
        yield name[:-len(".parquet")], table.sort_by("key")


def _unit_error(run, unit: str) -> dict:
    """The unit error fields of the unit's marker in the run (none when it read cleanly)."""
    try:
        old = _store(run).read_json(f"stats/{unit}.json")
    except (OSError, ValueError):
        return {}
    return {k: old[k] for k in ("unit_error", "unit_error_kind") if old.get(k)} if isinstance(old, dict) else {}


def _redo_dedup(run, stages, cfg: dict) -> dict[str, tuple]:
    """Recluster among samples passing decode and size under the new thresholds: sample_id ->
    (dup_of, dup_kind, dup_cluster_size, dup_rank) of every candidate. The candidates' hashes are read part by
    part; the clustering itself is global."""
    early = [s for s in stages if s.name in ("decode", "size")]
    cols = ["sample_id", "sha256", "phash", "width", "height"]
    cands = []
    for _, part in _parts(run, progress=False):
        part = decide(part, early)  # derive + the early stages' reasons, as the cascade saw them
        cands.append(part.filter(part.column("keep")).select(cols))
    cand = pa.concat_tables(cands) if cands else catalog.conform([], SAMPLES).select(cols)
    d = cfg.get("dedup", {})
    result = dedup_mod.cluster(cand, d.get("max_distance", DEFAULTS.dedup.max_distance),
                               d.get("exact", DEFAULTS.dedup.exact))
    return dict(zip(result.column("sample_id").to_pylist(),
                    zip(*(result.column(c).to_pylist() for c in ("dup_of", "dup_kind", "dup_cluster_size",
                                                                 "dup_rank")))))


def _fallback_choice(run, dedup: dict | None, stages, cfg: dict) -> tuple[dict, dict]:
    """Each cluster's member under the new thresholds (pipeline/fallback.recut): one pass over the
    parts collects the members of multi-member clusters (about 100 bytes each: select holds the
    run's duplicates, as its reclustering holds its candidates)."""
    score = [s.name for s in stages if s.phase == "score"]
    members = []
    for _, part in _parts(run, progress=False):
        part = _with_dedup(part, dedup)
        multi = pc.fill_null(pc.greater(part.column("dup_cluster_size"), 1), False)
        if not pc.any(multi).as_py():
            continue
        part = part.filter(multi)
        was_kept = part.column("keep").to_pylist()
        own = decide(part.set_column(part.schema.get_field_index("dup_kind"), "dup_kind",
                                     pa.nulls(part.num_rows, pa.string())), stages)  # its own reasons only
        for r, kept in zip(own.select(["sample_id", "dup_of", "dup_rank", "sha256", "scored_stages",
                                       "reject_reasons", "decode_error"]).to_pylist(), was_kept):
            done = set(r["scored_stages"] or [])
            first = (r["reject_reasons"] or [None])[0]
            scored = (first.split(":")[0] not in score or first.split(":")[0] in done) if first else \
                all(s in done for s in score)  # its stored scores decide it
            members.append({"key": r["dup_of"] or r["sample_id"], "rank": r["dup_rank"] or 0,
                            "sample_id": r["sample_id"], "sha256": r["sha256"], "scored": scored,
                            "passes": first is None, "kept": bool(kept)})
    d = cfg.get("dedup") or {}
    choice, counts = fallback.recut(members, int(d.get("max_fallbacks", DEFAULTS.dedup.max_fallbacks) or 0) if score else 0)
    if counts["promoted"] or counts["unscored"]:
        log.info("select: %d clusters keep another member than the run did; %d stop at a member the run "
                 "never scored (rerun `humanset curate` to score it)", counts["promoted"], counts["unscored"])
    return choice, counts


def _resolved(table: pa.Table, dedup: dict | None, choice: dict) -> pa.Table:
    """The unit's dup columns after a reclustering and the re-cut's choice of kept members."""
    table = _with_dedup(table, dedup)
    if not choice:
        return table
    got = [choice.get(sid) for sid in table.column("sample_id").to_pylist()]
    for col in ("dup_of", "dup_kind", "dup_scored"):
        old = table.column(col).to_pylist()
        table = table.set_column(table.schema.get_field_index(col), col, pa.array(
            [g[col] if g else o for g, o in zip(got, old)], SAMPLES.field(col).type))
    return table


def _with_dedup(table: pa.Table, dedup: dict | None) -> pa.Table:
    """The unit's dup columns from a reclustering (null for rows that were no candidate)."""
    if dedup is None:
        return table
    got = [dedup.get(sid) for sid in table.column("sample_id").to_pylist()]
    for k, col in enumerate(("dup_of", "dup_kind", "dup_cluster_size", "dup_rank")):
        idx = table.schema.get_field_index(col)
        table = table.set_column(idx, col, pa.array([g[k] if g else None for g in got], SAMPLES.field(col).type))
    return table


def _unscored(table: pa.Table, stages) -> dict[str, int]:
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


def _unit_members(run, unit: str) -> dict[str, tuple[str, int, int]]:
    """sample_id -> (tar relative to the run, offset, size) of the image member, from the unit's
    curated shards ({unit}-00000.tar, -00001, ... as engine.write_curated names them)."""
    run = _store(run)
    out = {}
    for i in itertools.count():
        index = f"shards/{unit}-{i:05d}.parquet"
        if not run.exists(index):
            return out
        for r in pq.read_table(run.fs_path(index), filesystem=run.fs,
                               columns=["sample_id", "shard", "members"]).to_pylist():
            m = next(m for m in r["members"] if not m["name"].endswith(".json"))
            out[r["sample_id"]] = (f"shards/{r['shard']}", m["offset"], m["size"])
    return out


def _images(run, keep: pa.Table, stored: dict) -> dict[str, bytes]:
    """Original bytes of the kept samples: from the run's shards, else from their sources."""
    out = {}
    for sid, uri in zip(keep.column("sample_id").to_pylist(), keep.column("source_uri").to_pylist()):
        try:
            out[sid] = _store(run).read_range(*stored[sid]) if sid in stored else read_source(uri)
        except (FileNotFoundError, OSError) as e:
            raise SelectError(f"sample {sid}: cannot read its bytes from {run}/shards or {uri}: {e}") from e
    return out
