"""DuckDB over a run directory: every Parquet table of the run as a view, read in place.

How the views are typed (the cost of a view must not grow with the number of parts; a billion-image
run has ~10^6 catalog parts):

- A view's columns and types come from its declared schema in catalog/schema.py, handed to DuckDB's
  `read_parquet(..., bound_schema=...)` (DuckDB >= 2.0). Making the view reads no part's footer;
  each part is opened, mapped by column name and cast only when a query scans it, so a part with a
  corrupt footer fails that scan, naming the file, never the view. `union_by_name = true` is not
  used on this path: it reads and keeps every part's footer when the view is made (135 MB per
  1,000 parts).
- One part is sniffed (the first the directory listing yields, one footer): its key-value metadata
  names its schema (`humanset.schema`: RUN/shards/*.parquet of a render run are `frames`, of a
  curation run `curated_index`), and its columns say whether it holds every declared column.
- Generations. Columns are only ever added (catalog/schema.py: a new nullable column is
  compatible), so the declared schema is the union of every version written so far and older
  parts hold a subset of it. DuckDB's `bound_schema` and `schema` (field-id) options give no
  per-file NULL for a column a part lacks by name, so a run with parts of an older generation is
  read by generations: every part's columns are listed once, streamed (pyarrow, one footer at a
  time, nothing kept but the distinct column sets). One generation (an old run read by a newer
  humanset) binds to the columns it has and gives the others as typed NULLs. Several generations
  (a run resumed across an upgrade) fall back to `union_by_name` over the parts, with the NULLs
  projected in the same way.
- A run whose sniffed part is current but which also holds older parts (a resumed run) fails a scan
  that reads a newer column of an older part with DuckDB's "schema mismatch" error, naming the file:
  `is_generation_mismatch(e)` tells the callers (`humanset stats`, `query`, `report`, `select`) to
  open the run again with `by_generation=True`. No part's column is ever dropped silently: the bound
  schema is the newest, and a part lacking one of its columns is an error, never a NULL.
"""
from __future__ import annotations

import fnmatch
import os
from pathlib import Path

import duckdb
import pyarrow as pa

from catalog.schema import CURATED_INDEX, FRAMES, HDRIS, SAMPLES, SCANS, SCHEMAS

# view name -> glob inside a run directory
VIEWS = {
    "samples": "catalog/samples/*.parquet",
    "shards": "shards/*.parquet",
    "scans": "catalog/scans/*.parquet",
    "hdris": "catalog/hdris/*.parquet",
    "frames": "catalog/frames/*.parquet",
}
# the schema a view's parts declare when their metadata does not say
DECLARED = {"samples": SAMPLES, "shards": CURATED_INDEX, "scans": SCANS, "hdris": HDRIS, "frames": FRAMES}

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

_SCALARS = {pa.string(): "VARCHAR", pa.large_string(): "VARCHAR", pa.bool_(): "BOOLEAN",
            pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INTEGER", pa.int64(): "BIGINT",
            pa.uint8(): "UTINYINT", pa.uint16(): "USMALLINT", pa.uint32(): "UINTEGER", pa.uint64(): "UBIGINT",
            pa.float32(): "FLOAT", pa.float64(): "DOUBLE", pa.binary(): "BLOB", pa.large_binary(): "BLOB"}


def duck_type(t: pa.DataType) -> str:
    """The DuckDB type of an Arrow column as DuckDB reads it back from Parquet (a fixed-size list is a
    plain list in Parquet)."""
    if t in _SCALARS:
        return _SCALARS[t]
    if pa.types.is_timestamp(t):
        return "TIMESTAMP WITH TIME ZONE" if t.tz else "TIMESTAMP"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return duck_type(t.value_type) + "[]"
    if pa.types.is_struct(t):
        return "STRUCT(" + ", ".join(f"{_ident(f.name)} {duck_type(f.type)}" for f in t) + ")"
    raise TypeError(f"no DuckDB type for Arrow type {t}")


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def glob_escape(path: str) -> str:
    """`path` as a DuckDB glob that matches only itself: a run folder named `exp[1]` or `a*b` must
    not read another run's files. Each glob character becomes a one-character class."""
    return "".join(f"[{c}]" if c in "[*?" else c for c in str(path))


def _pattern(run, view: str) -> str:
    """The view's files inside the run: a finished local run's samples and shard index from their
    compacted copy (catalog/compact.py), else the parts."""
    if view in ("samples", "shards"):
        from catalog.compact import FOLDER, is_compacted
        if is_compacted(run):
            return f"{FOLDER}/{view}/*.parquet"
    return VIEWS[view]


def _glob(run: Path, view: str) -> str:
    return f"{glob_escape(run)}/{_pattern(run, view)}"


def _bound(schema: pa.Schema, names=None) -> str:
    """A `bound_schema` struct literal: column -> DuckDB type, for the columns in `names` (all)."""
    fields = [f for f in schema if names is None or f.name in names]
    return "{" + ", ".join(f"{_lit(f.name)}: {_lit(duck_type(f.type))}" for f in fields) + "}"


def _projection(schema: pa.Schema, present) -> str:
    """Every declared column, in declared order: the part's own, or a typed NULL where it has none."""
    return ", ".join(_ident(f.name) if f.name in present else f"NULL::{duck_type(f.type)} AS {_ident(f.name)}"
                     for f in schema)


def typed_scan(glob: str, schema: pa.Schema) -> str:
    """`read_parquet` over parts of `schema`'s current generation, typed from the schema: no footer
    is read until a query scans the parts."""
    return (f"read_parquet({_lit(glob)}, bound_schema = {_bound(schema)}, hive_partitioning = false)")


def run_location(run_dir):
    """A local run as a Path, a run on an object store (s3://...) as its URI string: DuckDB reads
    the latter through the storage layer registered as an fsspec file system (duckdb_connect_for)."""
    from catalog.storage import is_uri, run_root
    text = os.fspath(run_dir)
    return run_root(text) if is_uri(text) else Path(run_dir)


def _remote(run) -> bool:
    return isinstance(run, str)


def run_exists(run) -> bool:
    """A local run folder, or a URI under which the run has written its manifest or a catalog part."""
    if not _remote(run):
        return run.is_dir()
    from catalog.storage import storage_for
    store = storage_for(run)
    return store.exists("manifest.json") or next(iter(store.list("catalog")), None) is not None


def parts_sql(run_dir, view: str) -> str:
    """A typed `read_parquet(...)` over one view's files of a run this humanset wrote (the engine's
    final counts): every part holds the current declared columns, and no footer is read up front."""
    return typed_scan(_glob(run_location(run_dir), view), DECLARED[view])


def _parts(run, view: str):
    """The view's parts, from a directory listing read lazily (never the whole listing in memory:
    a folder may hold 10^6 parts; on an object store one page of keys at a time). Our writers'
    temporary files start with a dot."""
    if _remote(run):
        from catalog.storage import storage_for
        store = storage_for(run)
        folder, pattern = VIEWS[view].rsplit("/", 1)
        for e in store.list(folder):
            name = e.path[len(folder) + 1:]
            if "/" not in name and fnmatch.fnmatchcase(name, pattern) and not name.startswith("."):
                yield store.uri_of(e.path)
        return
    folder, pattern = (run / _pattern(run, view)).parent, Path(_pattern(run, view)).name
    try:
        with os.scandir(folder) as it:
            for e in it:
                if fnmatch.fnmatchcase(e.name, pattern) and not e.name.startswith("."):
                    yield Path(e.path)
    except (FileNotFoundError, NotADirectoryError):
        return


SNIFF_TRIES = 8  # parts tried for a readable footer before the view is typed as current unseen


def sniff(run: Path, view: str) -> tuple[bool, pa.Schema | None]:
    """(the view has parts, the schema of the first of them whose footer reads). A damaged part is
    not an error here: it fails the scan that reaches it, naming the file."""
    n = 0
    for path in _parts(run, view):
        try:
            return True, _part_schema(path)
        except duckdb.Error:
            n += 1
            if n >= SNIFF_TRIES:
                break
    return n > 0, None


def _declared_for(view: str, part_schema: pa.Schema) -> pa.Schema:
    name = (part_schema.metadata or {}).get(b"humanset.schema", b"").decode()
    return SCHEMAS.get(name, DECLARED[view])


def _part_schema(path) -> pa.Schema:
    import pyarrow.parquet as pq

    from catalog.storage import is_uri, read_schema_at
    try:
        return read_schema_at(path) if is_uri(os.fspath(path)) else pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise duckdb.InvalidInputException(f"{path}: not a readable Parquet file ({e}); "
                                           "remove it or rerun the command that wrote it") from e


def column_sets(run: Path, view: str) -> set[frozenset]:
    """The distinct column sets of a view's parts: every footer read once, one at a time, nothing kept
    but the sets (a run has a handful of generations, not one per part)."""
    return {frozenset(_part_schema(path).names) for path in _parts(run, view)}


def view_sql(run: Path, view: str, by_generation: bool = False) -> str | None:
    """The SELECT of one view, or None when the run has no part of it."""
    found, sniffed = sniff(run, view)
    if not found:
        return None
    declared = DECLARED[view] if sniffed is None else _declared_for(view, sniffed)
    glob = _glob(run, view)
    if not by_generation and (sniffed is None or set(declared.names) <= set(sniffed.names)):
        return f"SELECT * FROM {typed_scan(glob, declared)}"
    sets = column_sets(run, view)
    if len(sets) == 1:  # one generation: bind the columns it has, NULL for the rest
        present = set(declared.names) & next(iter(sets))
        return (f"SELECT {_projection(declared, present)} FROM read_parquet({_lit(glob)}, "
                f"bound_schema = {_bound(declared, present)}, hive_partitioning = false)")
    present = set(declared.names) & set().union(*sets)
    return f"SELECT {_projection(declared, present)} FROM read_parquet({_lit(glob)}, union_by_name = true)"


def is_generation_mismatch(e: BaseException) -> bool:
    """DuckDB's error for a part lacking a column the view was bound with (a part of an older
    generation in a run whose views were typed as current): open the run with by_generation=True."""
    return isinstance(e, duckdb.Error) and "schema mismatch in glob" in str(e)


def connect(run_dir, database: str = ":memory:", prefix: str = "",
            by_generation: bool = False) -> duckdb.DuckDBPyConnection:
    """Open DuckDB with the run's Parquet files registered as views.

    Views exist only for tables the run has. `prefix` names them `{prefix}samples`, ... so that
    several runs can be registered on one connection.
    """
    run = run_location(run_dir)
    if not run_exists(run):
        raise FileNotFoundError(f"{run}: no such run directory; pass a run's folder (humanset curate --output RUN)")
    con = duckdb.connect(database)
    try:
        register(con, run, prefix, by_generation)
    except BaseException:
        con.close()
        raise
    return con


def sample_rows(run_dir, columns: list[str], ids=None) -> tuple[list[str], list[tuple]]:
    """The samples view's rows of `ids` (None: all), with those of `columns` the run has: (columns read, rows). DuckDB
    semi-joins the view with the ids, so what is held grows with the ids, not the run (bench/calibrate_scale.py)."""
    from catalog.compact import is_compacted
    con = connect(run_dir)
    try:
        if is_compacted(run_location(run_dir)):  # prefetching held more as the run grew; parts read faster with it
            con.execute("SET disable_parquet_prefetching = true")
        have = {r[0] for r in con.execute("DESCRIBE samples").fetchall()}
        got = [c for c in columns if c in have]
        where = ""
        if ids is not None:
            con.register("wanted_ids", pa.table({"sample_id": pa.array(sorted(set(ids)), pa.string())}))
            where = " WHERE sample_id IN (SELECT sample_id FROM wanted_ids)"
        return got, con.execute(f"SELECT {', '.join(_ident(c) for c in got)} FROM samples{where}").fetchall()
    finally:
        con.close()


def register(con: duckdb.DuckDBPyConnection, run_dir, prefix: str = "", by_generation: bool = False,
             load: tuple[str, ...] = ()) -> list[str]:
    """Create the run's views on `con`; those named in `load` become temporary tables (load_table).
    A run on an object store: its store is registered on `con` (an fsspec file system) first."""
    run = run_location(run_dir)
    if _remote(run):
        from catalog.storage import duckdb_connect_for
        duckdb_connect_for(run, con)
    made = []
    for view in VIEWS:
        if view in load:
            if sniff(run, view)[0]:
                load_table(con, run, view, prefix + view)
                made.append(prefix + view)
            continue
        sql = view_sql(run, view, by_generation)
        if sql is not None:
            con.execute(f"CREATE OR REPLACE VIEW {prefix}{view} AS {sql}")
            made.append(prefix + view)
    if f"{prefix}samples" in made:
        con.execute(f"CREATE OR REPLACE VIEW {prefix}persons AS "
                    + PERSONS_SQL.replace("FROM samples", f"FROM {prefix}samples"))
        made.append(prefix + "persons")
    return made


CHUNK_FILES = 1000  # parts per scan when a view is loaded into a table: DuckDB holds ~4 KB per file a scan reads
LOAD_MAX_ROWS = 20_000_000  # load_table only below this estimate: above, the parts are large and few per row


def estimated_rows(run_dir, view: str) -> int:
    """Rows of a view guessed from one footer: the first readable part's rows times the parts (one
    directory listing, counted, not kept)."""
    import pyarrow.parquet as pq

    from catalog.storage import locate
    run = run_location(run_dir)
    n, rows = 0, None
    for path in _parts(run, view):
        n += 1
        if rows is None:
            try:
                if _remote(run):
                    store, name = locate(path)
                    with store.open_input(name) as f:
                        rows = pq.read_metadata(f).num_rows
                else:
                    rows = pq.read_metadata(path).num_rows
            except (pa.ArrowInvalid, OSError):
                pass
    return n * (rows or 0)


def worth_loading(run_dir, view: str = "samples") -> bool:
    """Load the view into a table for a command that scans it many times: when it has many small parts
    (the per-file cost of a scan dominates), not when it is large (a table would copy the catalog)."""
    return estimated_rows(run_dir, view) <= LOAD_MAX_ROWS


def load_table(con: duckdb.DuckDBPyConnection, run_dir, view: str, name: str, chunk: int = CHUNK_FILES) -> int:
    """Replace the view `name` by a temporary table of the view's parts, read `chunk` parts per scan;
    return its rows.

    DuckDB 2.0.1 holds ~4 KB per file for as long as a scan over many files runs (measured with
    3-column files too, freed when the query ends), so a command that scans a run a dozen times
    (`humanset stats`, `report`) reads it once, in chunks: its memory is the rows', not the parts'.
    A chunk with parts of an older generation is read by name (`union_by_name` over that chunk only),
    the columns it lacks NULL."""
    run = run_location(run_dir)
    found, sniffed = sniff(run, view)
    declared = DECLARED[view] if sniffed is None else _declared_for(view, sniffed)
    cols = ", ".join(f"{_ident(f.name)} {duck_type(f.type)}" for f in declared)
    con.execute(f"DROP VIEW IF EXISTS {name}")
    con.execute(f"CREATE OR REPLACE TEMP TABLE {name} ({cols})")
    names = ", ".join(_ident(f.name) for f in declared)
    parts = _parts(run, view)
    # with insertion order kept, DuckDB buffers each file's rows apart (~150 KB per part); order is no contract
    con.execute("SET preserve_insertion_order = false")
    try:
        _load_chunks(con, parts, name, names, declared, chunk)
    finally:
        con.execute("RESET preserve_insertion_order")
    return con.execute(f"SELECT count(*) FROM {name}").fetchone()[0]


def _load_chunks(con, parts, name: str, names: str, declared: pa.Schema, chunk: int) -> None:
    import itertools

    while True:
        batch = [str(p) for p in itertools.islice(parts, chunk)]
        if not batch:
            break
        files = "[" + ", ".join(_lit(glob_escape(b)) for b in batch) + "]"
        try:
            con.execute(f"INSERT INTO {name} SELECT {names} FROM read_parquet({files}, bound_schema = "
                        f"{_bound(declared)}, hive_partitioning = false)")
        except duckdb.Error as e:
            if not is_generation_mismatch(e):
                raise
            present = set(declared.names) & set().union(*(set(_part_schema(b).names) for b in batch))
            con.execute(f"INSERT INTO {name} SELECT {_projection(declared, present)} FROM read_parquet({files}, "
                        "union_by_name = true)")


def retry_by_generation(fn):
    """fn(by_generation=False); again with by_generation=True when a part of an older generation
    turns up in a run whose views were typed as current."""
    try:
        return fn(by_generation=False)
    except duckdb.Error as e:
        if not is_generation_mismatch(e):
            raise
        return fn(by_generation=True)


__all__ = ["VIEWS", "DECLARED", "connect", "register", "parts_sql", "typed_scan", "duck_type", "glob_escape",
           "is_generation_mismatch", "retry_by_generation", "view_sql", "column_sets"]
