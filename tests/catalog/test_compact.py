"""catalog/compact.py: a finished run's per-unit parts copied into few files that the views read once
the marker is written; the copy equals the parts, and invalidating it sends the views back to them."""
import pyarrow as pa
import pyarrow.parquet as pq

import catalog
from catalog import compact
from catalog.schema import SAMPLES


def _part(run, unit, n, drop=()):
    rows = [{"sample_id": f"{unit}-{i}", "key": f"k{i}", "source_uri": f"/x/{unit}/{i}.jpg", "keep": i % 2 == 0,
             "reject_reason": None if i % 2 == 0 else "size:too_small"} for i in range(n)]
    table = catalog.conform(rows, SAMPLES)
    table = table.drop_columns([c for c in drop if c in table.column_names])
    catalog.write_parquet(run / "catalog" / "samples" / f"{unit}.parquet", table)


def _count(run):
    con = catalog.connect(run)
    return con.execute("SELECT count(*), count(*) FILTER (WHERE keep) FROM samples").fetchone()


def test_the_copy_equals_the_parts_and_the_views_switch_to_it(tmp_path):
    run = tmp_path
    _part(run, "u0", 3)
    _part(run, "u1", 0)  # a unit with no rows
    _part(run, "u2", 4, drop=("reject_reasons",))  # an older generation: a column added since is missing
    before = _count(run)
    assert compact.compact_group(str(run), 0, ["u0", "u1"]) == 3
    assert compact.compact_group(str(run), 1, ["u2", "no-part-unit"]) == 4
    assert not compact.is_compacted(run)  # no marker yet: the views still read the parts
    compact.finish(run, files=2, rows=7, units=4)
    assert compact.is_compacted(run)
    con = catalog.connect(run)
    files = {r[0].rsplit("/", 1)[-1] for r in con.execute("SELECT DISTINCT filename FROM read_parquet("
                                                          f"'{run}/catalog/compact/samples/*.parquet', filename=true)").fetchall()}
    assert files == {"c-000000.parquet", "c-000001.parquet"}
    assert _count(run) == before == (7, 4)
    copied = pa.concat_tables(pq.read_table(p) for p in sorted((run / "catalog" / "compact" / "samples").glob("*.parquet")))
    assert copied.schema.equals(SAMPLES, check_metadata=False)
    assert sorted(copied.column("sample_id").to_pylist()) == sorted(f"u0-{i}" for i in range(3)) + \
        sorted(f"u2-{i}" for i in range(4))


def test_invalidating_sends_the_views_back_to_the_parts(tmp_path):
    run = tmp_path
    _part(run, "u0", 2)
    compact.compact_group(str(run), 0, ["u0"])
    compact.finish(run, 1, 2, 1)
    _part(run, "u1", 5)  # a resumed run writes a part: it must invalidate the copy first
    assert _count(run) == (2, 1)  # what a stale copy would show
    compact.invalidate(run)
    assert _count(run) == (7, 4) and not (run / "catalog" / "compact").exists()
