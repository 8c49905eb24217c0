"""DuckDB over a run directory: every Parquet table of the run as a view, read in place."""
from __future__ import annotations

from pathlib import Path

import duckdb

# view name -> glob inside a run directory
VIEWS = {
    "samples": "catalog/samples/*.parquet",
    "shards": "shards/*.parquet",
    "scans": "catalog/scans/*.parquet",
    "hdris": "catalog/hdris/*.parquet",
    "frames": "catalog/frames/*.parquet",
}

# one row per detected person, from the samples' list columns
PERSONS_SQL = """
SELECT s.sample_id, s.shard, s.keep, p.i - 1 AS person_index,
       s.person_scores[p.i] AS score,
       s.person_boxes[p.i][1] AS x1, s.person_boxes[p.i][2] AS y1,
       s.person_boxes[p.i][3] AS x2, s.person_boxes[p.i][4] AS y2,
       greatest(s.person_boxes[p.i][3] - s.person_boxes[p.i][1],
                s.person_boxes[p.i][4] - s.person_boxes[p.i][2]) AS box_longer_side,
       least(s.person_boxes[p.i][3] - s.person_boxes[p.i][1],
             s.person_boxes[p.i][4] - s.person_boxes[p.i][2]) AS box_shorter_side,
       s.person_keypoints[p.i] AS keypoints
FROM samples s, (SELECT unnest(range(1, 1 + max(len(person_scores)))) AS i FROM samples) p
WHERE p.i <= len(s.person_scores)
"""


def glob_escape(path: str) -> str:
    """`path` as a DuckDB glob that matches only itself: a run folder named `exp[1]` or `a*b` must
    not read another run's files. Each glob character becomes a one-character class."""
    return "".join(f"[{c}]" if c in "[*?" else c for c in str(path))


def parts_sql(run_dir, view: str) -> str:
    """`read_parquet(...)` over one view's files, for a query that scans a whole run (the engine's
    final counts). The views unify the parts' schemas by name, which reads every file's footer when
    the view is made: 135 MB more at 1,000 parts, so O(parts) on one process. The parts of one view
    of one run come from one writer with one schema, so this reads them as they are."""
    glob = f"{glob_escape(Path(run_dir))}/{VIEWS[view]}".replace("'", "''")
    return f"read_parquet('{glob}')"


def connect(run_dir, database: str = ":memory:", prefix: str = "") -> duckdb.DuckDBPyConnection:
    """Open DuckDB with the run's Parquet files registered as views.

    Views exist only for tables the run has. `prefix` names them `{prefix}samples`, ... so that
    several runs can be registered on one connection.
    """
    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"{run}: no such run directory")
    con = duckdb.connect(database)
    register(con, run, prefix)
    return con


def register(con: duckdb.DuckDBPyConnection, run_dir, prefix: str = "") -> list[str]:
    run = Path(run_dir)
    made = []
    for view, pattern in VIEWS.items():
        if any(run.glob(pattern)):
            glob = f"{glob_escape(run)}/{pattern}".replace("'", "''")
            con.execute(f"CREATE OR REPLACE VIEW {prefix}{view} AS "
                        f"SELECT * FROM read_parquet('{glob}', union_by_name = true)")
            made.append(prefix + view)
    if f"{prefix}samples" in made:
        con.execute(f"CREATE OR REPLACE VIEW {prefix}persons AS "
                    + PERSONS_SQL.replace("FROM samples", f"FROM {prefix}samples"))
        made.append(prefix + "persons")
    return made
