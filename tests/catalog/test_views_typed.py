"""The run's DuckDB views are typed from catalog/schema.py: no footer read when a view is made, parts of
an older schema generation (fewer columns) give NULL for the columns added since, zero-row parts are
parts, and failed units are listed from the stats markers."""
from __future__ import annotations

import json

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import catalog
from explore import cli, stats
from catalog import duck
from catalog.unit_stats import unit_outcomes

# columns an "older humanset" did not write yet: the art stage, as if added later
ADDED = ["art_score", "art_label", "art_error"]
OLD = pa.schema([f for f in catalog.SAMPLES if f.name not in ADDED], metadata=catalog.SAMPLES.metadata)


def _rows(unit: str, n: int, art: float | None = None) -> list[dict]:
    return [{"sample_id": f"{unit}-{k}", "shard": unit, "key": f"{k:03d}", "keep": k % 2 == 0, "width": 640 + k,
             "height": 480, "reject_reason": None if k % 2 == 0 else "size:short_side<300",
             "reject_reasons": [] if k % 2 == 0 else ["size:short_side<300"], "scored_stages": ["decode", "size"],
             **({"art_score": art, "art_label": "photo"} if art is not None else {})} for k in range(n)]


def _part(run, unit: str, rows: list[dict], old: bool = False) -> None:
    table = catalog.conform(rows, catalog.SAMPLES)
    if old:
        table = table.select(OLD.names).replace_schema_metadata(OLD.metadata)
        assert set(table.column_names) == set(OLD.names)
    catalog.write_parquet(run / "catalog" / "samples" / f"{unit}.parquet", table)


def _art(con) -> dict:
    return dict(con.execute("SELECT sample_id, art_score FROM samples").fetchall())


def _canonical(duck_type: str) -> str:
    con = duckdb.connect()
    try:
        return con.execute(f"SELECT typeof(NULL::{duck_type})").fetchall()[0][0]
    finally:
        con.close()


def test_duck_type_is_what_duckdb_reads_from_our_parquet(tmp_path):
    for name, schema in catalog.SCHEMAS.items():
        pq.write_table(schema.empty_table(), tmp_path / f"{name}.parquet")
        con = duckdb.connect()
        got = con.execute(f"DESCRIBE SELECT * FROM read_parquet('{tmp_path / name}.parquet')").fetchall()
        con.close()
        assert [(r[0], r[1]) for r in got] == [(f.name, _canonical(duck.duck_type(f.type))) for f in schema], name


def test_view_is_made_without_reading_any_footer(tmp_path):
    """A part whose footer is garbage fails the scan that reaches it, naming the file, never the view;
    and the view is typed by bound_schema, not union_by_name (which reads every footer up front)."""
    run = tmp_path / "run"
    for u in ("a", "b"):
        _part(run, u, _rows(u, 2, art=0.1))
    (run / "catalog" / "samples" / "c.parquet").write_bytes(b"PAR1 this is not a parquet footer")
    sql = duck.view_sql(run, "samples")
    assert "bound_schema" in sql and "union_by_name" not in sql
    con = catalog.connect(run)  # no error here: no footer of c.parquet was read
    described = con.execute("DESCRIBE samples").fetchall()
    assert [(r[0], r[1]) for r in described] == [(f.name, _canonical(duck.duck_type(f.type))) for f in catalog.SAMPLES]
    with pytest.raises(duckdb.Error, match="c.parquet"):
        con.execute("SELECT count(*) FROM samples").fetchall()
    # with union_by_name the same folder fails when the view is made: the check above can fail
    with pytest.raises(duckdb.Error, match="c.parquet"):
        duckdb.connect().execute(f"CREATE VIEW v AS SELECT * FROM read_parquet('{run}/catalog/samples/*.parquet', "
                   "union_by_name = true)")


def test_old_generation_parts_give_nulls_for_new_columns(tmp_path):
    run = tmp_path / "old"
    _part(run, "u0", _rows("u0", 3), old=True)
    _part(run, "u1", [], old=True)  # zero rows
    con = catalog.connect(run)
    assert [r[0] for r in con.execute("DESCRIBE samples").fetchall()] == catalog.SAMPLES.names
    assert _art(con) == {"u0-0": None, "u0-1": None, "u0-2": None}
    assert con.execute("SELECT count(*) FILTER (WHERE keep), sum(width) FROM samples").fetchone() == (2, 640 * 3 + 3)
    s = stats.run_stats(run)
    assert s["totals"]["inputs"] == 3 and s["totals"]["kept"] == 2


@pytest.mark.parametrize("old_units", [("a0", "a1"), ("z0", "z1")])  # older parts listed first or last
def test_two_generations_and_zero_row_parts_in_one_run(tmp_path, old_units, capsys):
    run = tmp_path / "mixed"
    _part(run, old_units[0], _rows(old_units[0], 2), old=True)
    _part(run, old_units[1], [], old=True)
    _part(run, "m0", _rows("m0", 2, art=0.25))
    _part(run, "m1", [])
    want = {f"{old_units[0]}-0": None, f"{old_units[0]}-1": None, "m0-0": 0.25, "m0-1": 0.25}

    con = catalog.connect(run, by_generation=True)
    assert _art(con) == pytest.approx(want)
    # plain connect: whichever part the listing sniffs, a new column is never silently dropped; the
    # callers retry by generation on DuckDB's mismatch error
    got = duck.retry_by_generation(lambda by_generation: _art(catalog.connect(run, by_generation=by_generation)))
    assert got == pytest.approx(want)
    s = stats.run_stats(run)
    assert s["totals"]["inputs"] == 4 and s["totals"]["kept"] == 2
    art = next(x for x in s["scores"] if x["column"] == "art_score")
    assert art["n"] == 2
    assert cli.main(["query", str(run), "SELECT count(art_score) AS n, count(*) AS rows FROM samples"]) == 0
    out = capsys.readouterr().out
    assert "│" in out and " 2 " in out and " 4 " in out


def _marker(run, unit: str, inputs: int, error: str | None = None, kind: str | None = None) -> None:
    m = {"unit": unit, "inputs": inputs, "kept": 0, "rejected": {}, "shards": [], "unit_error": error}
    if kind:
        m["unit_error_kind"] = kind
    (run / "stats").mkdir(parents=True, exist_ok=True)
    (run / "stats" / f"{unit}.json").write_text(json.dumps(m))


def test_failed_units_listed_in_stats_json(tmp_path, capsys):
    run = tmp_path / "run"
    _part(run, "u0", _rows("u0", 2))
    _marker(run, "u0", 2)
    _part(run, "u1", _rows("u1", 1))
    _marker(run, "u1", 1, "truncated: crawl/u1.tar: tar ends inside member 001.jpg", kind="truncated")
    _part(run, "u2", [])  # nothing readable: still a marker, counted among the units with errors
    _marker(run, "u2", 0, "not_a_tar: crawl/u2.tar: bad header checksum at byte 0")  # older marker: no kind
    _part(run, "u3", [])
    _marker(run, "u3", 0, "not_a_tar: crawl/u3.tar: bad header checksum at byte 0", kind="not_a_tar")
    (run / "stats" / ".u9.json.tmp-1-0123abcd").write_text("{")  # a writer's temporary file is no unit

    assert cli.main(["stats", str(run), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["totals"]["units"] == 4 and s["totals"]["units_with_errors"] == 3
    u = s["units"]
    assert u["units_without_rows"] == 2
    assert [(k["kind"], k["units"]) for k in u["error_kinds"]] == [("not_a_tar", 2), ("truncated", 1)]
    assert [(f["unit"], f["kind"], f["inputs"]) for f in u["failed_units"]] == \
        [("u1", "truncated", 1), ("u2", "not_a_tar", 0), ("u3", "not_a_tar", 0)]
    assert "tar ends inside member" in u["failed_units"][0]["error"]

    bounded = unit_outcomes(run, max_listed=2)  # the first N by name; the counts still cover all
    assert [f["unit"] for f in bounded["failed_units"]] == ["u1", "u2"] and bounded["units_with_errors"] == 3

    assert cli.main(["stats", str(run)]) == 0
    text = capsys.readouterr().out
    assert "4 input units, 3 units with errors" in text and "Units with errors" in text and "not_a_tar" in text


def test_load_table_reads_parts_in_chunks_of_any_generation(tmp_path):
    """stats and report read the parts once into a table, a chunk of parts per scan: chunks holding
    older parts, newer ones or both give the same rows as the view."""
    run = tmp_path / "mixed"
    _part(run, "a0", _rows("a0", 2), old=True)
    _part(run, "a1", [], old=True)
    _part(run, "m0", _rows("m0", 3, art=0.5))
    _part(run, "m1", [])
    view = _art(catalog.connect(run, by_generation=True))
    for chunk in (1, 2, 1000):
        con = duckdb.connect()
        assert duck.load_table(con, run, "samples", "samples", chunk=chunk) == 5
        assert con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall() == [("samples",)]
        assert _art(con) == pytest.approx(view)
        assert [r[0] for r in con.execute("DESCRIBE samples").fetchall()] == catalog.SAMPLES.names


def test_only_small_catalogs_are_loaded(tmp_path, monkeypatch):
    run = tmp_path / "run"
    for u in ("a", "b", "c"):
        _part(run, u, _rows(u, 4))
    assert duck.estimated_rows(run, "samples") == 12 and duck.worth_loading(run)
    monkeypatch.setattr(duck, "LOAD_MAX_ROWS", 11)
    assert not duck.worth_loading(run)
    con, (p,) = stats.open_runs(run, load=True)  # large: the view stays a view, and the numbers agree
    assert con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'samples'").fetchall() == [(1,)]
    assert stats.totals(con, p)["inputs"] == 12
