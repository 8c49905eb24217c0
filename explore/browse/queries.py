"""What `humanset browse` asks the catalog (RunCatalog): one page of the grid, the count of a filter,
the run's funnel and reasons, one sample with its duplicate cluster, a curated member's offset.

One DuckDB connection with the run's views (`catalog.connect`); DuckDB connections are not
thread-safe, so each call takes a cursor of its own. Counts (a scan of the filter's columns) are a
request of their own, cached per filter, so the grid never waits for one; for a run still being
written they expire. How a query string becomes SQL: explore/browse/filters.py.
"""
from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict

import duckdb

from catalog.duck import connect, is_generation_mismatch, run_location
from catalog.rules import PERSON_SCORE, RULES
from explore import person_rule
from explore import stats as st
from explore.browse.filters import (DUP, IN_LIST_MAX, MAX_PAGE_SIZE, PAGE_SIZE, Filter, int_param, page_sql, parse_cursor,
                                    parse_filter, parse_order, scores_for, sorts_for)
from explore.browse.sample_page import jsonable, persons, phash_hex, source, text_boxes, why_kept

CLUSTER_COLUMNS = ("sample_id", "source_uri", "shard", "key", "width", "height", "keep", "reject_reason", "decode_error",
                   "dup_of", "dup_kind", "dup_rank", "dup_cluster_size", "dup_scored", "sha256", "phash")
IMAGE_COLUMNS = ("sample_id", "source_uri", "shard", "keep", "decode_error")  # what an image is read by
RECENT_ROWS = 20_000  # rows of recent pages kept for their images: a thumbnail costs no catalog lookup
MAX_CLUSTER = 200  # members listed on a sample page (a cluster may hold thousands of copies)
SAMPLE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")  # what a sample id in a URL may look like


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
        self.score_kind = person_rule.score_kind(self.manifest)  # the score person.min_score cut
        self.scores, self.sorts = scores_for(self.score_kind), sorts_for(self.score_kind)
        self.finished = bool(self.manifest.get("finished"))
        self._lock = threading.Lock()
        self._by_generation = False
        self.con = connect(self.run)
        if not st.has_view(self.con, "samples"):
            self.con.close()
            raise FileNotFoundError(f"{run}: no catalog/samples/*.parquet in it; is it a curation run directory? "
                                    "(a run just started has none until its first unit is written)")
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
        """The run, its thresholds and the grid's choices: what the app starts with (no catalog scan)."""
        thresholds = {}
        for name, col in self.scores.items():
            rules = [person_rule.score_rule(self.manifest)] if name == PERSON_SCORE.stage else RULES.get(name, ())
            rule = next((r for r in rules if r.column == col), None)
            thresholds[name] = {"column": col, "value": st.threshold(self.manifest, rule),
                                "keep": rule.keep if rule else None}
        thresholds[PERSON_SCORE.stage]["score_label"] = person_rule.score_label(self.score_kind)
        return {"run": str(self.run), "finished": self.manifest.get("finished"),
                "stages": self.manifest.get("stages"), "thresholds": thresholds, "sorts": ["catalog", *self.sorts],
                "dup": list(DUP), "page_size": PAGE_SIZE}

    def funnel(self) -> dict:
        """Totals, the funnel and the reject reasons (explore.stats): a few scans of the decision
        columns, made once (for a run still written, again after live_ttl). The app asks for them beside
        the first page, not before it."""
        def make():
            cur = self._cursor()
            try:
                n, kept = cur.execute("SELECT count(*), count(*) FILTER (WHERE keep) FROM samples").fetchone()
                return {"inputs": n, "kept": kept, "funnel": st.funnel(cur, self.manifest, "", n),
                        "reasons": st.reasons(cur, "", n)}
            finally:
                cur.close()
        return self.cached.get("funnel", make)

    def person_rule(self) -> dict:
        return person_rule.rule(self.manifest)

    # --- the grid --------------------------------------------------------------------------------
    def filter(self, params: dict[str, str]) -> Filter:
        kinds = self.reason_kinds() if params.get("reason") else {}
        return parse_filter(params, lambda kind: kinds.get(kind, []), self.scores)

    def page(self, params: dict[str, str]) -> dict:
        f, order = self.filter(params), parse_order(params, self.sorts)
        size = int_param(params, "size", PAGE_SIZE, 1, MAX_PAGE_SIZE)
        after = parse_cursor(params["after"]) if params.get("after") and order.column else None
        offset = 0 if order.column else int_param(params, "offset", 0, 0, 10 ** 12)
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
