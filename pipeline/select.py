"""`humanset select`: re-cut a finished run with new thresholds from its stored scores.

No model runs. Dedup clusters are recomputed from the stored hashes when dedup settings change.
A threshold that needs a score the run never computed is refused, naming the stage to rerun.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

import catalog
from catalog import SAMPLES
from catalog.sources import read_source

from . import console
from . import dedup as dedup_mod
from .config import apply_sets
from .decide import decide, funnel
from .engine import _now, _versions, write_curated
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


def plan(run: Path, sets: list[str]) -> tuple[dict, dict, list[str]]:
    manifest = catalog.read_json(run / "manifest.json")
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
    run_p, out = Path(run), Path(output)
    manifest, cfg, changed = plan(run_p, sets)
    if (out / "manifest.json").exists():
        raise SelectError(f"{out}: already holds a run; choose a new --output")
    stages = [s for s in build_stages(cfg) if s.name in manifest["stages"]]
    con = catalog.connect(run_p)
    table = con.sql("SELECT * FROM samples ORDER BY shard, key").to_arrow_table()
    table = catalog.conform(table, SAMPLES)
    if any(k.startswith("dedup.") or k.startswith("size.") for k in changed):
        table = _redo_dedup(table, stages, cfg)
    table = decide(table, stages)
    _refuse_unscored(table, stages)

    kept = table.filter(table.column("keep"))
    log.info("select: %d of %d samples kept (was %d)", kept.num_rows, table.num_rows,
             manifest["counts"]["kept"])
    stored = _stored_members(run_p)
    by_unit = defaultdict(list)
    for i, u in enumerate(table.column("shard").to_pylist()):
        by_unit[u].append(i)
    for unit, rows in console.progress(iterable=sorted(by_unit.items()), desc="select", enabled=progress):
        part = table.take(pa.array(rows, pa.int64()))
        keep = part.filter(part.column("keep"))
        images = _images(run_p, keep, stored)
        written = write_curated(out / "shards", unit, keep, images, cfg)
        catalog.write_parquet(out / "catalog" / "samples" / f"{unit}.parquet", part)
        reasons = defaultdict(int)
        for r in part.column("reject_reason").to_pylist():
            if r:
                reasons[r] += 1
        catalog.write_json(out / "stats" / f"{unit}.json", {
            "unit": unit, "inputs": part.num_rows, "kept": keep.num_rows, "rejected": dict(sorted(reasons.items())),
            "shards": written, "selected_from": str(run_p), "finished": _now()})
    first = table.column("reject_reason").to_pylist()
    result = {**{k: manifest.get(k) for k in ("inputs", "stages", "skipped_stages", "score_all", "units")},
              "config": cfg, "selected_from": str(run_p.resolve()), "changed": changed, "started": _now(),
              "finished": _now(), "status": "complete", "versions": _versions(),
              "funnel": funnel(first, manifest["stages"]),
              "counts": {"inputs": table.num_rows, "kept": kept.num_rows}}
    catalog.write_json(out / "manifest.json", result)
    return result


def _redo_dedup(table: pa.Table, stages, cfg: dict) -> pa.Table:
    """Recluster among samples passing decode and size under the new thresholds."""
    early = [s for s in stages if s.name in ("decode", "size")]
    reasons = [s.reject(table) for s in early]
    alive = pa.array([not any(r[i] for r in reasons) for i in range(table.num_rows)], pa.bool_())
    cand = table.filter(alive).select(["sample_id", "sha256", "phash", "width", "height"])
    d = cfg.get("dedup", {})
    result = dedup_mod.cluster(cand, d.get("max_distance", 4), d.get("exact", True))
    row = pc.index_in(table.column("sample_id"), value_set=result.column("sample_id"))  # null: not a candidate
    for col in ("dup_of", "dup_kind", "dup_cluster_size"):
        idx = table.schema.get_field_index(col)
        table = table.set_column(idx, col, result.column(col).take(row).cast(SAMPLES.field(col).type))
    return table


def _refuse_unscored(table: pa.Table, stages) -> None:
    """A sample that now reaches a stage it was never scored by cannot be decided from the run."""
    order = [s.name for s in stages]
    scored = table.column("scored_stages").to_pylist()
    reasons = table.column("reject_reasons").to_pylist()
    decoded = pc.is_null(table.column("decode_error")).to_pylist()
    for s in stages:
        if s.phase != "score":
            continue
        pos = order.index(s.name)
        missing = sum(1 for sc, rs, ok in zip(scored, reasons, decoded)
                      if ok and s.name not in (sc or [])
                      and all(order.index(r.split(":")[0]) >= pos for r in rs or []))
        if missing:
            raise SelectError(f"{missing} samples now reach the {s.name} stage but were never scored by it "
                              f"(the cascade skipped them); rerun `humanset curate` with these thresholds or "
                              f"with --score-all")


def _stored_members(run: Path) -> dict[str, tuple[Path, int, int]]:
    out = {}
    if not catalog.list_shards(run / "shards"):
        return out
    for r in catalog.read_index(run / "shards").select(["sample_id", "shard", "members"]).to_pylist():
        m = next(m for m in r["members"] if not m["name"].endswith(".json"))
        out[r["sample_id"]] = (run / "shards" / r["shard"], m["offset"], m["size"])
    return out


def _images(run: Path, keep: pa.Table, stored: dict) -> dict[str, bytes]:
    """Original bytes of the kept samples: from the run's shards, else from their sources."""
    out = {}
    for sid, uri in zip(keep.column("sample_id").to_pylist(), keep.column("source_uri").to_pylist()):
        try:
            out[sid] = catalog.read_member(*stored[sid]) if sid in stored else read_source(uri)
        except (FileNotFoundError, OSError) as e:
            raise SelectError(f"sample {sid}: cannot read its bytes from {run}/shards or {uri}: {e}") from e
    return out
