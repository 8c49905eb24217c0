"""Thresholds -> keep / reject_reason, from stored measurements only (curate and select share it)."""
from __future__ import annotations

import pyarrow as pa

from catalog import SAMPLES
from catalog.rules import INPUT_STAGE

from pipeline.stages.decode import input_reason


def stage_reasons(table: pa.Table, stages) -> dict[str, list[str | None]]:
    """Per stage, the reason each row fails it (None: passes or was not measured); first the
    'input' reasons (a sample the source never had bytes for, e.g. img2dataset's failed download)."""
    out = {s.name: s.reject(table) for s in stages}
    errors = table.column("decode_error").to_pylist() if "decode_error" in table.column_names else []
    inputs = [input_reason(e) for e in errors]
    if not any(inputs):
        return out
    if "decode" in out:  # decode rejects them too (so no later stage sees them); the reason is input's
        out["decode"] = [None if i else r for i, r in zip(inputs, out["decode"])]
    return {INPUT_STAGE: inputs, **out}


def derive(table: pa.Table, stages) -> pa.Table:
    """Columns that depend on thresholds (e.g. person_n_pass), recomputed from stored scores."""
    for s in stages:
        for col, values in s.derive(table).items():
            arr = pa.array(values, type=SAMPLES.field(col).type)
            idx = table.schema.get_field_index(col)
            table = table.set_column(idx, col, arr) if idx >= 0 else table.append_column(col, arr)
    return table


def decide(table: pa.Table, stages) -> pa.Table:
    """Set keep, reject_reason (first failing stage) and reject_reasons (all) on `table`."""
    table = derive(table, stages)
    per_stage = stage_reasons(table, stages)
    reasons = [[] for _ in range(table.num_rows)]
    for name, rs in per_stage.items():
        for i, r in enumerate(rs):
            if r:
                reasons[i].append(f"{name}:{r}")
    cols = {
        "keep": pa.array([not r for r in reasons], pa.bool_()),
        "reject_reason": pa.array([r[0] if r else None for r in reasons], pa.string()),
        "reject_reasons": pa.array(reasons, pa.list_(pa.string())),
    }
    for col, arr in cols.items():
        idx = table.schema.get_field_index(col)
        table = table.set_column(idx, col, arr) if idx >= 0 else table.append_column(col, arr)
    return table


def funnel_stages(stage_names: list[str], rejected_stages) -> list[str]:
    """The funnel's rows: 'input' first when any sample was rejected there, then the stages."""
    return ([INPUT_STAGE] if INPUT_STAGE in rejected_stages and INPUT_STAGE not in stage_names else []) + list(stage_names)


def funnel(reject_reasons_first: list[str | None], stage_names: list[str]) -> list[dict]:
    """inputs -> survivors after each stage -> kept, from each row's first reject reason."""
    first = [r.split(":", 1)[0] if r else None for r in reject_reasons_first]
    n = len(first)
    rows, alive = [], n
    stage_names = funnel_stages(stage_names, set(first))
    for name in stage_names:
        out = alive - sum(1 for f in first if f == name)
        rows.append({"stage": name, "in": alive, "out": out})
        alive = out
    unknown = sum(1 for f in first if f and f not in stage_names)
    if unknown:  # e.g. read errors reported under 'decode' are covered; anything else shows here
        rows.append({"stage": "other", "in": alive, "out": alive - unknown})
    return rows
