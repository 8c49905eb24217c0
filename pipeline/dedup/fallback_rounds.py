"""The fallback rounds of phase 3 (dedup.max_fallbacks; pipeline/dedup/fallback.py has the worker side).

Order: round 0 scores every unit (RUN/work/scored/); then, for r = 1..max_fallbacks, an exchange
plans round r and round r scores the units it named; a last exchange finds each cluster's kept
member; the write pass writes every unit. Each exchange is a shuffle by cluster in three steps of
Ray tasks, all on files:
  map (one task per window of units): each unit's member records (multi-member clusters: cluster
    key = the canonical's sample_id, rank, sha256, unit, the window it belongs to) and the outcome of
    each scored member, written into one file whose row group p holds hash partition p of the key
    (pipeline/dedup_files.write_parts): RUN/work/fallback/x/{step}-w{w}.parquet;
  reduce (one task per partition): row group p of every map file, its clusters' records -> the
    members to score next (or the new dup_of of the members of clusters that keep a fallback), in
    one file whose row group w holds destination window w: RUN/work/fallback/t/{step}/p{p}.parquet;
  route (one task per window): row group w of the step's reduce files, one file per unit
    (RUN/work/fallback/todo/r{r}/, .../kept/).
The driver holds a window of unit ids and counts; a partition holds its clusters' records only
(about 100 bytes per duplicate / partitions). Each step is marked done (RUN/work/fallback/_{step}.json)
after its last task; a crash resumes at the first unmarked step, and a round's scoring skips the units
whose round file exists, like any phase.
"""
from __future__ import annotations

import contextlib
import logging
import operator
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from catalog import console
from pipeline.dedup import fallback as fb
from pipeline.dedup.files import read_part, write_parts as write_row_groups
from pipeline.engine.run_state import NameSet, unit_windows
from pipeline.engine.unit_io import run_store

log = logging.getLogger("humanset.curate")

_REC = pa.schema([("key", pa.string()), ("rank", pa.int32()), ("sample_id", pa.string()), ("sha256", pa.string()),
                  ("unit", pa.string()), ("win", pa.int64()), ("outcome", pa.int8())])
_ROUTED = pa.schema([("sample_id", pa.string()), ("unit", pa.string()), ("win", pa.int64()), ("dup_of", pa.string()),
                     ("dup_kind", pa.string())])


def key_partition(key: str, parts: int) -> int:
    return int(key[:12], 16) % parts if parts > 1 else 0  # sample ids are blake2b hex digests


def _read(store, rel: str, columns=None) -> pa.Table:
    return pq.read_table(store.fs_path(rel), filesystem=store.fs, columns=columns)


# --------------------------------------------------------------------------------------------
# The shuffle by cluster on files, shared with `humanset select` (pipeline/select/recut.py): records with
# a cluster `key`, a `unit` and a destination window `win`, under a ROOT folder of the run.

def map_files(store, folder: str) -> list[str]:
    """The files of an exchange step's FOLDER (one per task), as URIs read_part opens."""
    return [store.uri_of(e.path) for e in store.list(folder, suffix=".parquet")
            if not e.path.rsplit("/", 1)[-1].startswith(".")]


def write_by_key(store, folder: str, name: str, recs: list[dict], schema: pa.Schema, parts: int) -> None:
    """Map side: recs into ONE file FOLDER/{name}.parquet whose row group p holds hash partition p
    of their cluster key."""
    part = np.array([key_partition(rec["key"], parts) for rec in recs], np.int64)
    write_row_groups(store.uri_of(folder), f"{name}.parquet", pa.Table.from_pylist(recs, schema=schema), part, parts)


def read_partition(store, folder: str, p: int):
    """Reduce side: (file name, its row group p) of every map file in FOLDER."""
    for uri in map_files(store, folder):
        yield uri.rsplit("/", 1)[-1], read_part(uri, p)


def write_by_window(store, folder: str, p: int, rows: list[dict], schema: pa.Schema, windows: int) -> None:
    """Reduce side: partition p's results (each with its destination window `win`) into ONE file
    FOLDER/p{p}.parquet whose row group w holds window w's rows."""
    part = np.array([g["win"] for g in rows], np.int64)
    write_row_groups(store.uri_of(folder), f"p{p:05d}.parquet", pa.Table.from_pylist(rows, schema=schema), part,
                     windows)


def route(store, folder: str, w: int, dest, columns: list[str]) -> int:
    """Route side: row group w of every reduce file in FOLDER, one file per unit at dest(unit),
    sorted by sample_id, with `columns`. Returns the rows routed."""
    parts = [read_part(uri, w) for uri in map_files(store, folder)]
    if not parts or not sum(x.num_rows for x in parts):
        return 0
    t = pa.concat_tables(parts).sort_by([("unit", "ascending"), ("sample_id", "ascending")])
    units = t.column("unit").to_pylist()
    start = 0
    for i in range(1, len(units) + 1):
        if i == len(units) or units[i] != units[start]:
            store.write_parquet(dest(units[start]), t.slice(start, i - start).select(columns))
            start = i
    return len(units)


TASKS_PER_CPU = 4  # a driver's streamed Ray tasks in flight per CPU of the cluster: enough queued that no CPU
# waits on the driver, few enough that the driver holds a bounded number of refs and arguments


def tasks_in_flight() -> int:
    """The `limit` of fold for this driver: TASKS_PER_CPU per CPU of the Ray cluster; without Ray, as
    for one CPU (the tasks then run one after another in this process)."""
    import sys
    ray = sys.modules.get("ray")
    cpus = ray.cluster_resources().get("CPU", 1) if ray is not None and ray.is_initialized() else 1
    return max(1, int(TASKS_PER_CPU * cpus))


def fold(fn, args, limit: int, retries: int = 0, add=operator.add, total=0, done=None, memory: int = 0,
         fix: str = ""):
    """fn(*a) for every a of the iterable `args` (streamed: the caller's windows are never listed),
    their results folded into `total` with `add`: Ray tasks, at most `limit` in flight, when Ray is
    initialised, else one after another in this process. done(result) after each, e.g. a bar.
    memory: the bytes each task declares to Ray (0: none), refused with `fix` when no node has them."""
    import sys
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        for a in args:
            got = fn(*a)
            total = add(total, got)
            if done:
                done(got)
        return total
    opts = {"num_cpus": 1, "max_retries": retries}
    if memory:
        node = max((n["Resources"].get("memory", 0) for n in ray.nodes() if n.get("Alive")), default=0)
        if node and memory > node:
            raise RuntimeError(f"a {fn.__name__} task needs {memory / 2**30:.1f} GiB, more than any node has "
                               f"({node / 2**30:.1f} GiB); {fix or 'use nodes with more memory'}")
        opts["memory"] = int(memory)
    task = ray.remote(**opts)(fn)
    pending: list = []

    def take(n_left: int) -> None:
        nonlocal pending, total
        while len(pending) > n_left:
            ready, pending = ray.wait(pending, num_returns=1)
            got = ray.get(ready[0])
            total = add(total, got)
            if done:
                done(got)
    for a in args:
        pending.append(task.remote(*a))
        take(max(0, limit - 1))
    take(0)
    return total


def map_window(run: str, r: int, w: int, unit_ids: list[str], parts: int) -> int:
    """Ray task. r = 0: every multi-member cluster's members among the window's units (with round
    0's outcome on the canonical); r >= 1: the outcomes of round r's rows."""
    store = run_store(run)
    cols = ["sample_id", "dup_of", "dup_rank", "dup_cluster_size", "sha256", "_alive", "decode_error"]
    recs: list[dict] = []
    for uid in unit_ids:
        rel = fb.scored_path(uid, r)
        if not store.exists(rel):  # not in round r; in round 0, a unit outside every cluster (written then)
            continue
        t = _read(store, rel, cols)
        t = t.filter(pc.fill_null(pc.greater(t.column("dup_cluster_size"), 1), False))
        if not t.num_rows:
            continue
        ranks = t.column("dup_rank").to_pylist()
        out = fb.outcomes(t, [True if r else rk == 0 for rk in ranks])
        for sid, of, rk, sha, o in zip(t.column("sample_id").to_pylist(), t.column("dup_of").to_pylist(), ranks,
                                       t.column("sha256").to_pylist(), out):
            recs.append({"key": of if rk else sid, "rank": rk, "sample_id": sid, "sha256": sha, "unit": uid,
                         "win": w, "outcome": o})
    write_by_key(store, f"{fb.FALLBACK_DIR}/x", f"{'m' if r == 0 else f'r{r}'}-w{w:06d}", recs, _REC, parts)
    return len(recs)


def reduce_part(run: str, step: str, p: int, windows: int) -> int:
    """Ray task: partition p's clusters -> round `step`'s members to score, or ('kept') the new
    dup_of / dup_kind of the members of clusters that keep a fallback; a row group per window."""
    store = run_store(run)
    members: list[dict] = []
    outcome: dict[str, int] = {}
    later = []
    for name, t in read_partition(store, f"{fb.FALLBACK_DIR}/x", p):
        (members if name.startswith("m-") else later).extend(t.to_pylist())
    for m in members:
        outcome[m["sample_id"]] = m["outcome"]
    for m in later:  # a round's outcome replaces round 0's UNSCORED
        outcome[m["sample_id"]] = m["outcome"]
    got = fb.resolve(members, outcome) if step == "kept" else fb.next_todo(members, outcome, int(step[1:]))
    write_by_window(store, f"{fb.FALLBACK_DIR}/t/{step}", p,
                    [{"sample_id": g["sample_id"], "unit": g["unit"], "win": g["win"], "dup_of": g.get("dup_of"),
                      "dup_kind": g.get("dup_kind")} for g in got], _ROUTED, windows)
    return len(got)


def route_window(run: str, step: str, w: int) -> int:
    """Ray task: window w's records of `step`, one file per unit (todo of round r, or kept)."""
    kept = step == "kept"
    return route(run_store(run), f"{fb.FALLBACK_DIR}/t/{step}", w,
                 fb.kept_path if kept else (lambda u: fb.todo_path(u, int(step[1:]))),
                 ["sample_id", "dup_of", "dup_kind"] if kept else ["sample_id"])


def exchange(run, step: str, window: int, retries: int, map_round: int | None) -> dict:
    """One exchange (module docstring): map round `map_round`'s files (0: the members; None: no map),
    reduce for `step` ('m' has no reduce), route. Returns its counts, from its marker when it ran."""
    store = run_store(run)
    marker = f"{fb.FALLBACK_DIR}/_{step}.json"
    if store.exists(marker):
        return store.read_json(marker)
    limit = tasks_in_flight()
    windows = None if step == "m" else store.read_json(f"{fb.FALLBACK_DIR}/_m.json")["windows"]
    if map_round is not None:
        have = NameSet((store, fb.scored_dir(map_round)), ".parquet") if map_round else None
        keep = (lambda uid: uid in have) if map_round else (lambda uid: True)
        if step == "m":  # as many partitions as windows of units: a partition holds ~1 / windows of the records
            windows = max(1, sum(1 for _ in unit_windows(run, keep, window)))
        args = ((str(run), map_round, n, [u.unit_id for u in units], windows)  # streamed: one window held
                for n, units in enumerate(unit_windows(run, keep, window)))
        fold(map_window, args, limit, retries)
    counts = {"windows": windows}
    if step != "m":
        counts["rows"] = fold(reduce_part, ((str(run), step, p, windows) for p in range(windows)), limit, retries)
        counts["units"] = fold(route_window, ((str(run), step, w) for w in range(windows)), limit, retries)
    store.write_json(marker, counts)
    return counts


def passes(n_fallbacks: int) -> list[str]:
    """The passes of phase 3 with fallbacks, in order: round 0, each fallback round, the write pass."""
    return [str(r) for r in range(n_fallbacks + 1)] + [fb.WRITE]


def one_pipeline(run, n_todo: int, window: int) -> bool:
    """Whether phase 3 runs as one pipeline of all its passes (the model actors start once): when
    its units fit one window and no pass has started (a resumed phase 3 goes pass by pass, from its
    files)."""
    store = run_store(run)
    return 0 < n_todo <= window and not len(NameSet((store, fb.SCORED_DIR), ".parquet")) \
        and not store.exists(f"{fb.FALLBACK_DIR}/_m.json")


def _rounds(run, store, n_fb: int, window: int, retries: int, span, score_round) -> dict:
    """The exchanges and fallback rounds after round 0; score_round(r, todo NameSet) scores round r."""
    stats = {"rounds": {}}
    done = NameSet((store, "stats"), ".json")  # units round 0 finished are out of the exchanges
    if not any(True for _ in unit_windows(run, lambda uid: uid not in done, 1)):
        return stats
    with span("exchange_m"):
        exchange(run, "m", window, retries, 0)
    for r in range(1, n_fb + 1):  # round r-1's outcomes are mapped by the exchange planning round r
        with span(f"exchange_r{r}"):
            got = exchange(run, f"r{r}", window, retries, r - 1 if r > 1 else None)
        stats["rounds"][str(r)] = got.get("rows", 0)
        if not got.get("rows"):
            break
        with span(f"fallback_{r}"):
            score_round(r, NameSet((store, f"{fb.FALLBACK_DIR}/todo/r{r}"), ".parquet"))
    last = max([int(r) for r, n in stats["rounds"].items() if n] or [0])
    with span("exchange_kept"):
        stats["kept_fallbacks"] = exchange(run, "kept", window, retries, last or None).get("rows", 0)
    return stats


def run_one_pipeline(run, cfg: dict, score_stages, progress: bool, pipe, window: int, retries: int, span) -> dict:
    """Phase 3 with fallbacks as the passes of one pipeline (`pipe`: early.EarlyScore built with
    passes(n)): the driver opens round 0, runs each exchange while the pipeline waits at its gate,
    opens the next round for the units it named, and last the write pass for the units not finished."""
    store = run_store(run)
    n_fb = fb.max_fallbacks(cfg, score_stages)
    names = [u.unit_id for u in pipe.units]
    with span("score"), console.progress(len(names), "score", enabled=progress) as bar:
        pipe.run_pass("0", True, bar)

    def score_round(r: int, todo) -> None:
        work = {uid for uid in names if uid in todo}
        with console.progress(len(work), f"fallback {r}", enabled=progress) as bar:
            pipe.run_pass(str(r), work, bar)

    stats = _rounds(run, store, n_fb, window, retries, span, score_round)
    for r in range(1, n_fb + 1):  # rounds the exchanges found nothing for: their items leave at once
        if str(r) not in stats["rounds"] or not stats["rounds"][str(r)]:
            pipe.run_pass(str(r), set())
    done = NameSet((store, "stats"), ".json")
    work = {uid for uid in names if uid not in done}
    with span("write"), console.progress(len(work), "write", enabled=progress) as bar:
        pipe.run_pass(fb.WRITE, work, bar)
    pipe.finish()
    return stats


def run_rounds(run, cfg: dict, score_stages, progress: bool, early, window: int, retries: int,
               score_pass, span=None, pipeline=None) -> dict:
    """Phase 3 with fallbacks. score_pass(units, stages, cfg, bar, early, marker folder) runs one
    pass of phase 3 over a window; span(name) times a step (the driver's Spans). pipeline(units)
    builds the pipeline of all passes when phase 3 fits one (one_pipeline), unless `early` is one
    already; should it fail (a unit that fails for good stops it), phase 3 goes on pass by pass from
    the files written, where a failing unit is isolated as in every phase. Returns the rounds' counts
    (rows scored per round, kept)."""
    span = span or (lambda name: contextlib.nullcontext())
    store = run_store(run)
    n_fb = fb.max_fallbacks(cfg, score_stages)
    if store.posix:  # temporaries a crashed round left (the engine's clean_tmp lists fixed folders only)
        import catalog
        catalog.clean_tmp(run, [fb.scored_dir(r) for r in range(1, n_fb + 1)])
        if os.path.isdir(os.path.join(run, fb.FALLBACK_DIR)):
            catalog.clean_tmp(os.path.join(run, fb.FALLBACK_DIR))
    done = NameSet((store, "stats"), ".json")
    pipe = early if early is not None and early.passes else None
    if pipe is None and pipeline is not None:
        units = [u for w in unit_windows(run, lambda uid: uid not in done, window) for u in w]
        if one_pipeline(run, len(units), window):
            if early is not None:
                early.abort()
            early, pipe = None, pipeline(units)
    if pipe is not None:
        from pipeline.engine.errors import EnvironmentFault
        try:
            return run_one_pipeline(run, cfg, score_stages, progress, pipe, window, retries, span)
        except (EnvironmentFault, KeyboardInterrupt):
            pipe.abort()
            raise
        except Exception as e:  # a unit failed for good: on pass by pass, resuming from the files written
            pipe.abort()
            log.warning("phase 3 as one pipeline stopped (%s: %s); going on pass by pass", type(e).__name__, e)
            early = None
            done = NameSet((store, "stats"), ".json")
    scored0 = NameSet((store, fb.SCORED_DIR), ".parquet")
    todo0 = lambda uid: uid not in done and uid not in scored0  # noqa: E731
    n0 = sum(1 for units in unit_windows(run, todo0, window) for _ in units)
    with span("score"), console.progress(n0, "score", enabled=progress) as bar:
        for units in unit_windows(run, todo0, window):
            score_pass(units, score_stages, fb.round_cfg(cfg, 0), bar, early, fb.SCORED_DIR)
            early = None
    if early is not None:
        early.abort()

    def score_round(r: int, todo_r) -> None:
        have_r = NameSet((store, fb.scored_dir(r)), ".parquet")
        keep = lambda uid: uid in todo_r and uid not in have_r  # noqa: E731
        n_r = sum(len(units) for units in unit_windows(run, keep, window))
        with console.progress(n_r, f"fallback {r}", enabled=progress) as bar:
            for units in unit_windows(run, keep, window):
                score_pass(units, score_stages, fb.round_cfg(cfg, r), bar, None, fb.scored_dir(r))

    stats = _rounds(run, store, n_fb, window, retries, span, score_round)
    done = NameSet((store, "stats"), ".json")  # round 0 finished the units outside every cluster
    todo = lambda uid: uid not in done  # noqa: E731
    with span("write"), console.progress(sum(len(u) for u in unit_windows(run, todo, window)), "write",
                                         enabled=progress) as bar:
        for units in unit_windows(run, todo, window):
            score_pass(units, [], fb.round_cfg(cfg, fb.WRITE), bar, None, "stats")
    return stats
