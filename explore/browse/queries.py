"""What `humanset browse` asks the catalog: a filter from the page's query string, one page of rows,
the count of a filter, the run's funnel, one sample with its persons, text boxes and duplicate cluster.

Every value from a request reaches DuckDB as a bound parameter; column names come from the tables
below, never from the request. A page never scans the catalog whole when it need not: in catalog
order it is a streamed LIMIT (DuckDB stops reading row groups once the page is full), sorted by a score
it is a top-N over the few columns the grid shows, and the pages after the first continue from a
cursor (keyset: the last row's value and sample_id), so page 1,000 costs what page 1 does. Counts
(a scan of the filter's columns) are a request of their own, cached per filter, so the grid never
waits for one. DuckDB connections are not thread-safe: each call takes a cursor of its own.
"""
from __future__ import annotations

import json
import math
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import duckdb

from catalog.duck import connect, is_generation_mismatch, run_location
from catalog.rules import PERSON_BOX, PERSON_SCORE, box_side
from catalog.source_bytes import split_source_uri
from explore import stats as st

PAGE_SIZE, MAX_PAGE_SIZE = 60, 240
# score filters and sorts: the query-string name -> the catalog column
SCORES = {"person": "person_score_max", "text": "text_area_frac", "watermark": "watermark_score",
          "art": "art_score"}
SORTS = {**SCORES, "short_side": "short_side", "file_bytes": "file_bytes", "n_persons": "n_persons",
         "cluster": "dup_cluster_size"}
DUP = {  # the duplicate filter: value -> condition (no parameter)
    "duplicate": "dup_of IS NOT NULL",  # another member of its cluster is the one dedup kept
    "exact": "dup_of IS NOT NULL AND dup_kind = 'exact'",
    "near": "dup_of IS NOT NULL AND dup_kind = 'near'",
    "kept_member": "dup_cluster_size > 1 AND dup_of IS NULL",  # the member its cluster keeps
    "in_cluster": "dup_cluster_size > 1",
    "unique": "coalesce(dup_cluster_size, 1) = 1",
}
GRID_COLUMNS = ("sample_id", "source_uri", "shard", "key", "width", "height", "keep", "reject_reason", "decode_error",
                "person_score_max", "text_area_frac", "watermark_score", "art_score", "n_persons",
                "person_n_pass", "dup_kind", "dup_cluster_size", "dup_rank", "dup_of", "short_side", "file_bytes")
CLUSTER_COLUMNS = ("sample_id", "source_uri", "shard", "key", "width", "height", "keep", "reject_reason", "decode_error",
                   "dup_of", "dup_kind", "dup_rank", "dup_cluster_size", "dup_scored", "sha256", "phash")
IMAGE_COLUMNS = ("sample_id", "source_uri", "shard", "keep", "decode_error")  # what an image is read by
RECENT_ROWS = 20_000  # rows of recent pages kept for their images: a thumbnail costs no catalog lookup
MAX_CLUSTER = 200  # members listed on a sample page (a cluster may hold thousands of copies)
IN_LIST_MAX = 500  # a reason kind with more raw spellings than this is matched by prefix
SAMPLE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")  # what a sample id in a URL may look like
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


def parse_filter(params: dict[str, str], reason_spellings) -> Filter:
    """The WHERE clause of the grid's filter. `reason_spellings(kind)` -> the raw reject_reason
    strings of a reason kind (or None: too many, match by prefix)."""
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
    for name, col in SCORES.items():
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


def parse_order(params: dict[str, str]) -> Order:
    sort = params.get("sort", "") or "catalog"
    if sort != "catalog" and sort not in SORTS:
        raise BadRequest(f"sort={sort!r}: expected catalog or one of {', '.join(SORTS)}")
    desc = params.get("order", "desc") != "asc"
    return Order(SORTS.get(sort), desc)


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


def jsonable(v):
    """A catalog value as JSON: NaN and infinities become null, a uint64 pHash hex text."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    return v


def _rows(cur) -> list[dict]:
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


class TTLCache:
    """A bounded map whose entries expire after `ttl` seconds (None: never, for a finished run)."""

    def __init__(self, maxsize: int = 256, ttl: float | None = None):
        self.maxsize, self.ttl = maxsize, ttl
        self._d: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, make):
        with self._lock:
            hit = self._d.get(key)
            if hit is not None and (self.ttl is None or time.monotonic() - hit[0] < self.ttl):
                self._d.move_to_end(key)
                return hit[1]
        value = make()  # outside the lock: two threads may both compute it once; the last one stays
        with self._lock:
            self._d[key] = (time.monotonic(), value)
            while len(self._d) > self.maxsize:
                self._d.popitem(last=False)
        return value


class RunCatalog:
    """The run's views on one DuckDB connection, a cursor per call; caches for counts and the funnel.

    A run still being written (no `finished` in its manifest) is read as it grows: its cached counts
    expire after `live_ttl` seconds."""

    live_ttl = 30.0

    def __init__(self, run):
        self.run = run_location(run)
        self.manifest = st.read_manifest(self.run)
        self.finished = bool(self.manifest.get("finished"))
        self._lock = threading.Lock()
        self._by_generation = False
        self.con = connect(self.run)
        if not st.has_view(self.con, "samples"):
            self.con.close()
            raise FileNotFoundError(f"{run}: no catalog/samples/*.parquet in it; is it a curation run directory?")
        ttl = None if self.finished else self.live_ttl
        self.counts = TTLCache(1024, ttl)
        self.cached = TTLCache(16, ttl)
        self._recent: OrderedDict[str, dict] = OrderedDict()

    def close(self) -> None:
        self.con.close()

    def _cursor(self):
        with self._lock:
            return self.con.cursor()

    def query(self, sql: str, args=None) -> list[dict]:
        """Rows of `sql` as dicts, on a cursor of this call's own. A part of an older schema turning up
        (a run read by generations) reopens the views that way and asks again."""
        for attempt in (0, 1):
            cur = self._cursor()
            try:
                return _rows(cur.execute(sql, args or []))
            except duckdb.Error as e:
                if attempt or not is_generation_mismatch(e):
                    raise
                self._reopen(by_generation=True)
            finally:
                cur.close()

    def _reopen(self, by_generation: bool) -> None:
        with self._lock:
            if self._by_generation == by_generation:
                return
            old, self.con = self.con, connect(self.run, by_generation=by_generation)
            self._by_generation = by_generation
        old.close()

    # --- the run as a whole ----------------------------------------------------------------------
    def reason_kinds(self) -> dict[str, list[str] | None]:
        """reason kind -> its raw reject_reason strings (None above IN_LIST_MAX of them)."""
        def make():
            out: dict[str, list[str] | None] = {}
            for r in self.query("SELECT reject_reason AS r FROM samples WHERE reject_reason IS NOT NULL "
                                "GROUP BY 1 ORDER BY 1"):
                kind = st.reason_kind(r["r"])
                raw = out.setdefault(kind, [])
                if raw is not None:
                    raw.append(r["r"])
                    if len(raw) > IN_LIST_MAX:
                        out[kind] = None
            return out
        return self.cached.get("reason_kinds", make)

    def summary(self) -> dict:
        """Run, totals, funnel, reasons, thresholds and the filter's choices: what the app starts with."""
        def make():
            cur = self._cursor()
            try:
                n = cur.execute("SELECT count(*) FROM samples").fetchone()[0]
                funnel = st.funnel(cur, self.manifest, "", n)
                reasons = st.reasons(cur, "", n)
                kept = cur.execute("SELECT count(*) FROM samples WHERE keep").fetchone()[0]
            finally:
                cur.close()
            thresholds = {}
            for name, col in SCORES.items():
                rule = next((r for r in (st.RULES.get(name) or ()) if r.column == col), None)
                t = st.threshold(self.manifest, rule)
                thresholds[name] = {"column": col, "value": t, "keep": rule.keep if rule else None}
            return {"run": str(self.run), "finished": self.manifest.get("finished"), "inputs": n, "kept": kept,
                    "stages": self.manifest.get("stages"), "funnel": funnel, "reasons": reasons,
                    "thresholds": thresholds, "sorts": ["catalog", *SORTS], "dup": list(DUP),
                    "page_size": PAGE_SIZE}
        return self.cached.get("summary", make)

    def person_rule(self) -> dict:
        section = (self.manifest.get("config") or {}).get("person") or {}
        return {"min_score": st.threshold(self.manifest, PERSON_SCORE),
                "min_box_px": st.threshold(self.manifest, PERSON_BOX),
                "box_rule": section.get("box_rule") if isinstance(section, dict) else None}

    # --- the grid --------------------------------------------------------------------------------
    def filter(self, params: dict[str, str]) -> Filter:
        kinds = self.reason_kinds() if params.get("reason") else {}
        return parse_filter(params, lambda kind: kinds.get(kind, []))

    def page(self, params: dict[str, str]) -> dict:
        f, order = self.filter(params), parse_order(params)
        size = _int(params, "size", PAGE_SIZE, 1, MAX_PAGE_SIZE)
        after = parse_cursor(params["after"]) if params.get("after") and order.column else None
        offset = 0 if order.column else _int(params, "offset", 0, 0, 10 ** 12)
        sql, args = page_sql(f, order, size, offset, after)
        rows = [jsonable(r) for r in self.query(sql, args)]
        self._remember(rows)
        nxt = None
        if len(rows) == size:
            last = rows[-1]
            nxt = ({"after": json.dumps([last[order.column], last["sample_id"]])} if order.column
                   else {"offset": offset + size})
        return {"rows": rows, "next": nxt, "offset": offset}

    def count(self, params: dict[str, str]) -> int:
        f = self.filter(params)
        return self.counts.get(f.key, lambda: self.query(f"SELECT count(*) AS n FROM samples WHERE {f.where}",
                                                         f.args)[0]["n"])

    def _remember(self, rows: list[dict]) -> None:
        with self._lock:
            for r in rows:
                self._recent[r["sample_id"]] = {c: r.get(c) for c in IMAGE_COLUMNS}
                self._recent.move_to_end(r["sample_id"])
            while len(self._recent) > RECENT_ROWS:
                self._recent.popitem(last=False)

    def image_row(self, sample_id: str, shard: str | None = None) -> dict | None:
        """What the image of a sample is read by: from a recent page, else from the catalog."""
        with self._lock:
            hit = self._recent.get(sample_id)
        return hit if hit is not None else self.row(sample_id, shard)

    def curated_member(self, sample_id: str):
        """(shard tar, offset, size) of a sample's image in the curated shards, from the `shards` view
        (a scan of the curated index: the fallback for shards not named after their unit)."""
        if not st.has_view(self.con, "shards"):
            return None
        rows = self.query("SELECT shard, members FROM shards WHERE sample_id = ? LIMIT 1", [sample_id])
        for r in rows:
            m = next((m for m in r["members"] or [] if not m["name"].lower().endswith(".json")), None)
            if m is not None and r["shard"]:
                return r["shard"], m["offset"], m["size"]
        return None

    # --- one sample ------------------------------------------------------------------------------
    def row(self, sample_id: str, shard: str | None = None) -> dict | None:
        """Every column of one sample, or None. `shard` (a hint from the page that linked here) narrows
        the scan to that unit's row groups; a wrong hint only costs the second, plain lookup."""
        if not SAMPLE_ID.match(sample_id):
            return None
        if shard:
            rows = self.query("SELECT * FROM samples WHERE shard = ? AND sample_id = ? LIMIT 1", [shard, sample_id])
            if rows:
                return rows[0]
        rows = self.query("SELECT * FROM samples WHERE sample_id = ? LIMIT 1", [sample_id])
        return rows[0] if rows else None

    def cluster(self, row: dict) -> dict | None:
        """The duplicate cluster of `row`: every member (up to MAX_CLUSTER) by dup_rank, which one dedup
        kept, and why (None for a sample without duplicates)."""
        if (row.get("dup_cluster_size") or 1) <= 1:
            return None
        kept_id = row.get("dup_of") or row["sample_id"]
        cols = ", ".join(CLUSTER_COLUMNS)
        # two scans each with its filter pushed into the Parquet reader (an OR of two columns is not)
        members = self.query(f"SELECT {cols} FROM samples WHERE dup_of = ? ORDER BY dup_rank NULLS LAST, sample_id "
                             f"LIMIT {MAX_CLUSTER - 1}", [kept_id])
        if row["sample_id"] == kept_id:
            members.insert(0, {c: row.get(c) for c in CLUSTER_COLUMNS})
        else:
            members = self.query(f"SELECT {cols} FROM samples WHERE sample_id = ? LIMIT 1", [kept_id]) + members
        members.sort(key=lambda m: (m.get("dup_rank") is None, m.get("dup_rank") or 0, m["sample_id"]))
        self._remember(members)
        for m in members:
            m["phash"] = phash_hex(m.get("phash"))
        kept = next((m for m in members if m["sample_id"] == kept_id), None)
        return {"size": row.get("dup_cluster_size"), "listed": len(members), "kept_id": kept_id,
                "members": jsonable(members), "why": why_kept(kept, members)}

    def sample(self, sample_id: str, shard: str | None = None) -> dict | None:
        """The sample page's data: the row, its persons and text boxes to draw, its source, its cluster."""
        row = self.row(sample_id, shard)
        if row is None:
            return None
        rule = self.person_rule()
        cluster = self.cluster(row)
        row["phash"] = phash_hex(row.get("phash"))
        return {"row": jsonable(row), "persons": persons(row, rule), "person_rule": rule,
                "text_boxes": text_boxes(row), "source": source(row), "cluster": cluster}


def phash_hex(v) -> str | None:
    """A 64-bit pHash as 16 hex digits (JSON numbers lose the low bits of a uint64)."""
    return f"{v:016x}" if isinstance(v, int) else v


def _int(params: dict, name: str, default: int, lo: int, hi: int) -> int:
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


# --- what the sample page draws: pure functions of a row -----------------------------------------
def persons(row: dict, rule: dict) -> list[dict]:
    """Each detected person: box (xyxy, stored pixels), score, keypoints (x, y, conf triples) and
    whether it passes the run's person rule (score and the box side in judged pixels)."""
    out = []
    scale = row.get("resolution_scale") or 1.0
    kps = row.get("person_keypoints") or []
    for i, (box, score) in enumerate(zip(row.get("person_boxes") or [], row.get("person_scores") or [])):
        passes = None
        if None not in (score, rule["min_score"], rule["min_box_px"]) and box is not None:
            side = box_side(box, rule["box_rule"] or "longer_side") * scale
            passes = PERSON_SCORE.keeps(score, rule["min_score"]) and PERSON_BOX.keeps(side, rule["min_box_px"])
        kp = kps[i] if i < len(kps) else None
        out.append(jsonable({"box": box, "score": score, "passes": passes,
                             "keypoints": [kp[j:j + 3] for j in range(0, len(kp), 3)] if kp else None}))
    return out


def text_boxes(row: dict) -> list[dict]:
    """Each box the text detector found (4 corners), its score, the text read from it (null where not
    read) and whether the watermark stage read the same string. The watermark stage stores no boxes of
    its own: it scores the text stage's boxes (and corner crops, which have none)."""
    marks = set(row.get("watermark_strings") or [])
    strings = row.get("text_det_strings") or []
    scores = row.get("text_det_scores") or []
    out = []
    for i, quad in enumerate(row.get("text_det_boxes") or []):
        text = strings[i] if i < len(strings) else None
        out.append(jsonable({"quad": quad, "score": scores[i] if i < len(scores) else None, "text": text,
                             "mark": bool(text) and text in marks}))
    return out


def source(row: dict) -> dict:
    path, member = split_source_uri(row.get("source_uri") or "")
    return {"uri": row.get("source_uri"), "file": path, "member": member, "shard": row.get("shard"),
            "key": row.get("key"), "url": row.get("url")}


def why_kept(kept: dict | None, members: list[dict]) -> str:
    """One sentence: which member the cluster keeps and why (catalog/schema.py, dup_of and dup_rank)."""
    if kept is None:
        return "the member the cluster keeps is not in the catalog"
    rank = kept.get("dup_rank")
    if not rank:
        why = ("dedup keeps it: rank 0, the canonical member (largest area, then smallest sample_id)")
    else:
        before = [m for m in members if (m.get("dup_rank") or 0) < rank]
        reasons = sorted({m["reject_reason"] for m in before if m.get("reject_reason")})
        why = (f"dedup keeps it: rank {rank}, a fallback: every member before it was rejected by a model stage"
               + (f" ({', '.join(reasons)})" if reasons else ""))
    if not kept.get("keep"):
        why += f"; a later stage rejected it ({kept.get('reject_reason') or 'no reason recorded'})"
    return why
