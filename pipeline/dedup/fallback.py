"""The best member that passes (dedup.max_fallbacks): worker side and the pure cluster logic.

With fallbacks on (dedup in the stages, a model stage, dedup.max_fallbacks > 0) phase 3 scores in
rounds before it writes. Round 0 scores what it scores without fallbacks (unique samples and each
cluster's canonical) and keeps every unit's scored rows in RUN/work/scored/{unit}.parquet instead of
writing the catalog. Round r (1..max_fallbacks) scores the member of rank r (dup_rank, the cluster's
canonical order) of each cluster whose member of rank r-1 a model stage rejected in round r-1, read
from RUN/work/fallback/todo/r{r}/{unit}.parquet, into RUN/work/scored/r{r}/{unit}.parquet. The
write pass then reads a unit's scored rows, its rounds' rows and RUN/work/fallback/kept/{unit}.parquet
(the new dup_of / dup_kind of members of clusters that keep a fallback) and writes the catalog part,
shards and stats marker as phase 3 always did. The exchanges between rounds (which rows to score
next, which member is kept) are in pipeline/dedup/fallback_rounds.py.

Only model-stage rejections trigger a fallback: a canonical rejected for changed bytes (a decode
error) is not passed on. A member is `dup_scored` when it went to the model stages as its cluster's
candidate; a duplicate never scored keeps its dedup reason (`{kind}_duplicate`), a scored one its
own model reason.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.engine.columns import set_column, unit_meta, with_meta
from pipeline.settings import DEFAULTS

ROUND = "_fallback_round"  # cfg key of a pass of phase 3: an int (scoring round) or WRITE
WRITE = "write"
SCORED_DIR, FALLBACK_DIR = "work/scored", "work/fallback"
PASSED, REJECTED, OTHER, UNSCORED = 1, 0, -1, -2  # a member's outcome after a scoring round


def max_fallbacks(cfg: dict, score_stages) -> int:
    """Fallback members a cluster may score after its canonical: 0 without dedup or a model stage."""
    if "dedup" not in (cfg.get("stages") or []) or not score_stages:
        return 0
    return int((cfg.get("dedup") or {}).get("max_fallbacks", DEFAULTS.dedup.max_fallbacks) or 0)


def round_cfg(cfg: dict, r) -> dict:
    return dict(cfg, **{ROUND: r})


def round_of(cfg: dict | None):
    return (cfg or {}).get(ROUND)


def scored_path(unit_id: str, r: int) -> str:
    return f"{SCORED_DIR}/{unit_id}.parquet" if r == 0 else f"{SCORED_DIR}/r{r}/{unit_id}.parquet"


def scored_dir(r: int) -> str:
    return SCORED_DIR if r == 0 else f"{SCORED_DIR}/r{r}"


def todo_path(unit_id: str, r: int) -> str:
    return f"{FALLBACK_DIR}/todo/r{r}/{unit_id}.parquet"


def kept_path(unit_id: str) -> str:
    return f"{FALLBACK_DIR}/kept/{unit_id}.parquet"


# --------------------------------------------------------------------------------------------
# Worker side: the reads and the terminal write of a round (unit_io dispatches here)

def write_scored(store, table: pa.Table, cfg: dict) -> str:
    """A scoring round's terminal: the unit's scored rows (no bytes, its counters in the metadata)
    into the run's `store`. Returns the unit id."""
    meta = unit_meta(table)
    uid = meta["unit"]["unit_id"]
    meta.pop("pass", None)  # which pass of a pipeline scored them (blocks.pass_of) is not theirs to keep
    keep = [c for c in table.column_names if c not in ("image", "_thumb")]
    store.write_parquet(scored_path(uid, int(round_of(cfg))), with_meta(table.select(keep), meta))
    return uid


def final_after_round_0(table: pa.Table) -> bool:
    """A unit none of whose rows is in a cluster of several members: no fallback round can change
    its rows (a round scores, and the last exchange re-points, members of such clusters only), so
    round 0 writes it as the write pass would and it skips the exchanges and the write pass."""
    if "dup_cluster_size" not in table.column_names or not table.num_rows:
        return True
    return not pc.any(pc.fill_null(pc.greater(table.column("dup_cluster_size"), 1), False)).as_py()


def _read(store, rel: str, columns=None) -> pa.Table:
    import pyarrow.parquet as pq
    return pq.read_table(store.fs_path(rel), filesystem=store.fs, columns=columns)


def read_round(store, unit, cfg: dict) -> pa.Table:
    """Input of round r >= 1: the unit's round-0 rows named in its todo file, alive and unscored."""
    r = int(round_of(cfg))
    t = _read(store, scored_path(unit.unit_id, 0))
    meta = unit_meta(t)
    todo = _read(store, todo_path(unit.unit_id, r)).column("sample_id")
    t = t.filter(pc.is_in(t.column("sample_id"), value_set=todo))
    t = set_column(t, "_alive", pa.array([True] * t.num_rows, pa.bool_()))
    t = set_column(t, "dup_scored", pa.array([True] * t.num_rows, pa.bool_()))
    meta["source_changed"] = 0
    meta["seconds"], meta["cpu_seconds"] = {}, {}  # this round's own (the write pass adds them up)
    return with_meta(t, meta)


def _overlay(base: pa.Table, rows: pa.Table) -> pa.Table:
    """`base` with its rows of the same sample_id replaced by `rows` (base's order kept)."""
    if not rows.num_rows:
        return base
    mask = pc.is_in(base.column("sample_id"), value_set=rows.column("sample_id"))
    n = base.num_rows
    pos_base = pc.indices_nonzero(pc.invert(mask))
    pos_rows = pc.index_in(rows.column("sample_id"), value_set=base.column("sample_id"))
    kept = base.filter(pc.invert(mask)).append_column("_pos", pos_base.cast(pa.int64()))
    new = rows.select([c for c in base.column_names if c in rows.column_names])
    new = new.append_column("_pos", pos_rows.cast(pa.int64()))
    out = pa.concat_tables([kept, new], promote_options="default").sort_by("_pos").drop_columns(["_pos"])
    assert out.num_rows == n, "a round's rows are rows of the unit"
    return out.replace_schema_metadata(base.schema.metadata)


def read_final(store, unit, cfg: dict) -> pa.Table:
    """Input of the write pass: round 0's rows, each round's rows over them, the kept members' dup_of."""
    t = _read(store, scored_path(unit.unit_id, 0))
    meta = unit_meta(t)
    for r in range(1, max_fallbacks(cfg, [True]) + 1):
        if store.exists(scored_path(unit.unit_id, r)):
            rows = _read(store, scored_path(unit.unit_id, r))
            t = _overlay(t, rows)
            extra = unit_meta(rows)
            for key in ("seconds", "cpu_seconds"):  # the round's own step times, added to the unit's
                for step, sec in (extra.get(key) or {}).items():
                    meta.setdefault(key, {})[step] = round(meta.get(key, {}).get(step, 0.0) + sec, 4)
    if store.exists(kept_path(unit.unit_id)):
        k = _read(store, kept_path(unit.unit_id))
        pos = pc.index_in(t.column("sample_id"), value_set=k.column("sample_id"))
        hit = pc.is_valid(pos)
        for col in ("dup_of", "dup_kind"):
            t = set_column(t, col, pc.if_else(hit, k.column(col).take(pos), t.column(col)))
    return with_meta(t, meta)


# --------------------------------------------------------------------------------------------
# Pure cluster logic (a partition of the exchange holds its clusters' member records)

def outcomes(t: pa.Table, candidates) -> list[int]:
    """PASSED / REJECTED (by a model stage) / OTHER for scored rows `candidates` (bool per row),
    UNSCORED elsewhere, after a scoring round's stages."""
    alive = pc.fill_null(t.column("_alive"), False).to_pylist()
    err = pc.is_valid(t.column("decode_error")).to_pylist()
    return [UNSCORED if not c else OTHER if e else PASSED if a else REJECTED
            for c, a, e in zip(candidates, alive, err)]


def _clusters(members: list[dict]) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {}
    for m in members:
        out.setdefault(m["key"], {})[m["rank"]] = m
    return out


def next_todo(members: list[dict], outcome: dict[str, int], r: int) -> list[dict]:
    """Members of rank r whose cluster's member of rank r-1 a model stage rejected."""
    out = []
    for ms in _clusters(members).values():
        prev = ms.get(r - 1)
        if prev is not None and r in ms and outcome.get(prev["sample_id"], UNSCORED) == REJECTED:
            out.append(ms[r])
    return out


def resolve(members: list[dict], outcome: dict[str, int]) -> list[dict]:
    """New dup_of / dup_kind of every member of a cluster that keeps a fallback (rank > 0): dup_of
    names the kept member (null for it), dup_kind compares each sha256 with the kept one's."""
    out = []
    for ms in _clusters(members).values():
        passing = sorted(r for r, m in ms.items() if outcome.get(m["sample_id"], UNSCORED) == PASSED)
        if not passing or passing[0] == 0:
            continue
        kept = ms[passing[0]]
        for m in ms.values():
            mine = m is kept
            out.append({**m, "dup_of": None if mine else kept["sample_id"],
                        "dup_kind": None if mine else ("exact" if m["sha256"] == kept["sha256"] else "near")})
    return out


def recut(members: list[dict], max_fallbacks: int) -> tuple[dict[str, dict], dict]:
    """`humanset select`'s walk over each cluster (members: key, rank, sample_id, sha256, scored =
    its stored scores decide it under the new thresholds, passes, kept = the run kept it): the first
    member in canonical order, up to rank max_fallbacks, that is scored and passes is kept. The walk
    stops at a member never scored (a re-cut runs no model: the cluster is lost and counted as
    `unscored`). Returns sample_id -> dup_of / dup_kind / dup_scored, and the counts (`promoted`:
    clusters that now keep another member than the run did)."""
    out: dict[str, dict] = {}
    counts = {"promoted": 0, "unscored": 0, "lost": 0}
    for ms in _clusters(members).values():
        order = [ms[r] for r in sorted(ms)]
        kept, visited = None, set()
        for m in order:
            if m["rank"] > max_fallbacks:
                break
            if not m["scored"]:
                counts["unscored"] += 1
                break
            visited.add(m["sample_id"])
            if m["passes"]:
                kept = m
                break
        before = next((m["sample_id"] for m in order if m["kept"]), None)
        counts["promoted"] += kept is not None and kept["sample_id"] != before
        counts["lost"] += kept is None
        anchor = kept or order[0]  # no member kept: dup_of names the canonical, as without fallbacks
        for m in order:
            mine = m is anchor
            out[m["sample_id"]] = {"dup_of": None if mine else anchor["sample_id"],
                                   "dup_kind": None if mine else ("exact" if m["sha256"] == anchor["sha256"] else "near"),
                                   "dup_scored": m["sample_id"] in visited}
    return out, counts
