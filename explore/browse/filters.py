"""The grid's query string as SQL: the filter (WHERE, its parameters, and a key for the count cache), the
order, and the SELECT of one page. Pure functions: every value from the request becomes a bound
parameter, every column name comes from the tables below, never from the request.

A page never scans the catalog whole when it need not: in catalog order it is a streamed LIMIT/OFFSET
(DuckDB stops reading row groups once the page is full); sorted by a score it is a top-N over the few
columns the grid shows, and the pages after the first continue from a cursor (keyset: the last row's
value and sample_id, nulls last), so page 1,000 costs about what page 1 does (bench/browse.py).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from catalog.rules import PERSON_SCORE_COLUMNS
from explore import stats as st

PAGE_SIZE, MAX_PAGE_SIZE = 60, 240
# score filters and sorts: the query-string name -> the catalog column. `person` is the score the run's
# person.score cut (scores_for; explore.person_rule): SCORES and SORTS are a raw-score run's.
SCORES = {"person": PERSON_SCORE_COLUMNS["raw"], "text": "text_area_frac", "watermark": "watermark_score",
          "art": "art_score"}
SORTS = {**SCORES, "short_side": "short_side", "file_bytes": "file_bytes", "n_persons": "n_persons",
         "cluster": "dup_cluster_size"}


def scores_for(score_kind: str) -> dict[str, str]:
    """SCORES of a run whose person rule cut `score_kind` (calibrated | raw)."""
    return {**SCORES, "person": PERSON_SCORE_COLUMNS[score_kind]}


def sorts_for(score_kind: str) -> dict[str, str]:
    """SORTS of a run whose person rule cut `score_kind`."""
    return {**SORTS, **scores_for(score_kind)}
DUP = {  # the duplicate filter: value -> condition (no parameter)
    "duplicate": "dup_of IS NOT NULL",  # another member of its cluster is the one dedup kept
    "exact": "dup_of IS NOT NULL AND dup_kind = 'exact'",
    "near": "dup_of IS NOT NULL AND dup_kind = 'near'",
    "kept_member": "dup_cluster_size > 1 AND dup_of IS NULL",  # the member its cluster keeps
    "in_cluster": "dup_cluster_size > 1",
    "unique": "coalesce(dup_cluster_size, 1) = 1",
}
GRID_COLUMNS = ("sample_id", "source_uri", "shard", "key", "width", "height", "keep", "reject_reason", "decode_error",
                "person_score_max", "person_score_calibrated", "text_area_frac", "watermark_score", "art_score", "n_persons",
                "person_n_pass", "dup_kind", "dup_cluster_size", "dup_rank", "dup_of", "short_side", "file_bytes")
IN_LIST_MAX = 500  # a reason kind with more raw spellings than this is matched by prefix
NO_REASON = "(no reason)"


class BadRequest(ValueError):
    """A query-string value this module does not accept: the answer is 400 with this message."""


@dataclass
class Filter:
    where: str = "TRUE"
    args: list = field(default_factory=list)
    key: tuple = ()  # what the filter means, canonical: the count cache's key


def _float(name: str, text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise BadRequest(f"{name}={text!r}: expected a number") from None
    if not math.isfinite(v):
        raise BadRequest(f"{name}={text!r}: expected a finite number")
    return v


def parse_filter(params: dict[str, str], reason_spellings, scores: dict[str, str] = SCORES) -> Filter:
    """The WHERE clause of the grid's filter. `reason_spellings(kind)` -> the raw reject_reason
    strings of a reason kind (or None: too many, match by prefix); `scores` the score filters' columns."""
    conds, args, key = [], [], []
    keep = params.get("keep", "")
    if keep:
        if keep not in ("kept", "rejected"):
            raise BadRequest(f"keep={keep!r}: expected kept or rejected")
        conds.append("keep" if keep == "kept" else st.FAILED)
        key.append(("keep", keep))
    stage = params.get("stage", "")
    if stage:
        if stage == NO_REASON:
            conds.append(f"{st.FAILED} AND nullif(split_part(reject_reason, ':', 1), '') IS NULL")
        else:
            conds.append(f"{st.FAILED} AND split_part(reject_reason, ':', 1) = ?")
            args.append(stage)
        key.append(("stage", stage))
    reason = params.get("reason", "")
    if reason:
        raw = reason_spellings(reason)
        if raw is None:
            conds.append("(reject_reason = ? OR starts_with(reject_reason, ?))")
            args += [reason, reason + ":"]
        elif raw:
            conds.append(f"reject_reason IN ({', '.join('?' * len(raw))})")
            args += raw
        else:
            conds.append("FALSE")
        key.append(("reason", reason))
    if params.get("shard"):
        conds.append("shard = ?")
        args.append(params["shard"])
        key.append(("shard", params["shard"]))
    if params.get("source"):
        conds.append("starts_with(source_uri, ?)")
        args.append(params["source"])
        key.append(("source", params["source"]))
    if params.get("id"):
        conds.append("starts_with(sample_id, ?)")
        args.append(params["id"])
        key.append(("id", params["id"]))
    dup = params.get("dup", "")
    if dup:
        if dup not in DUP:
            raise BadRequest(f"dup={dup!r}: expected one of {', '.join(DUP)}")
        conds.append(DUP[dup])
        key.append(("dup", dup))
    for name, col in scores.items():
        for side, op in (("min", ">="), ("max", "<=")):
            text = params.get(f"{name}_{side}", "")
            if text:
                v = _float(f"{name}_{side}", text)
                conds.append(f"{col} {op} ?")
                args.append(v)
                key.append((f"{name}_{side}", v))
    return Filter(" AND ".join(f"({c})" for c in conds) or "TRUE", args, tuple(key))


@dataclass
class Order:
    column: str | None  # None: catalog order
    desc: bool


def parse_order(params: dict[str, str], sorts: dict[str, str] = SORTS) -> Order:
    sort = params.get("sort", "") or "catalog"
    if sort != "catalog" and sort not in sorts:
        raise BadRequest(f"sort={sort!r}: expected catalog or one of {', '.join(sorts)}")
    desc = params.get("order", "desc") != "asc"
    return Order(sorts.get(sort), desc)


def page_sql(f: Filter, order: Order, size: int, offset: int = 0, after=None) -> tuple[str, list]:
    """The SELECT of one page and its parameters. Catalog order: LIMIT/OFFSET over the filtered scan
    (streamed). Sorted: a top-N, continued after the cursor `after` = (value, sample_id), nulls last."""
    cols = ", ".join(GRID_COLUMNS)
    args = list(f.args)
    if order.column is None:
        return f"SELECT {cols} FROM samples WHERE {f.where} LIMIT ? OFFSET ?", args + [size, offset]
    c = order.column
    where = f.where
    if after is not None:
        value, sid = after
        beyond = "<" if order.desc else ">"
        if value is None:
            where += f" AND ({c} IS NULL AND sample_id > ?)"
            args += [sid]
        else:
            where += f" AND ({c} {beyond} ? OR ({c} = ? AND sample_id > ?) OR {c} IS NULL)"
            args += [value, value, sid]
    direction = "DESC" if order.desc else "ASC"
    return (f"SELECT {cols} FROM samples WHERE {where} ORDER BY {c} {direction} NULLS LAST, sample_id LIMIT ?",
            args + [size])


def parse_cursor(text: str):
    """`after` of the query string: JSON [value or null, sample_id]."""
    try:
        value, sid = json.loads(text)
    except (ValueError, TypeError):
        raise BadRequest("after: expected a JSON pair [value, sample_id]") from None
    if not isinstance(sid, str) or not (value is None or isinstance(value, (int, float))):
        raise BadRequest("after: expected a JSON pair [value, sample_id]")
    return value, sid


def int_param(params: dict, name: str, default: int, lo: int, hi: int) -> int:
    text = params.get(name, "")
    if not text:
        return default
    try:
        v = int(text)
    except ValueError:
        raise BadRequest(f"{name}={text!r}: expected an integer") from None
    if not lo <= v <= hi:
        raise BadRequest(f"{name}={v}: expected {lo}..{hi}")
    return v
