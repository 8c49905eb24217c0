"""`humanset query`: SQL on a run's views, printed or written; SQL errors are messages, not tracebacks."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from explore import cli
from stats_run import make_run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("query"), n=32)


def test_prints_a_table(run, capsys):
    run_dir, rows = run
    sql = "SELECT reject_reason, count(*) AS n FROM samples WHERE NOT keep GROUP BY 1 ORDER BY 1"
    assert cli.main(["query", str(run_dir), sql]) == 0
    out = capsys.readouterr().out
    assert "reject_reason" in out and "person:no_person" in out and "size:short_side<300" in out


def test_persons_view_has_one_row_per_detection(run, tmp_path):
    run_dir, rows = run
    out = tmp_path / "persons.parquet"
    assert cli.main(["query", str(run_dir), "SELECT * FROM persons", "--out", str(out)]) == 0
    t = pq.read_table(out)
    assert t.num_rows == sum(len(r.get("person_scores") or []) for r in rows)
    assert {"sample_id", "score", "box_longer_side", "keep"} <= set(t.column_names)


def test_writes_parquet_and_csv(run, tmp_path, capsys):
    run_dir, rows = run
    sql = "SELECT s.sample_id, s.width, x.shard FROM samples s JOIN shards x USING (sample_id) ORDER BY 1;"
    kept = sorted(r["sample_id"] for r in rows if r["keep"])
    assert cli.main(["query", str(run_dir), sql, "--out", str(tmp_path / "k.parquet")]) == 0
    assert f"wrote {len(kept)} rows" in capsys.readouterr().out
    assert pq.read_table(tmp_path / "k.parquet").column("sample_id").to_pylist() == kept
    assert cli.main(["query", str(run_dir), sql, "--out", str(tmp_path / "k.csv")]) == 0
    with open(tmp_path / "k.csv") as fh:
        assert [r["sample_id"] for r in csv.DictReader(fh)] == kept
    assert not list(tmp_path.glob(".*tmp*"))  # atomic writes leave no temporary files


def test_bad_output_suffix_and_missing_run(run, tmp_path, capsys):
    run_dir, _ = run
    assert cli.main(["query", str(run_dir), "SELECT 1", "--out", str(tmp_path / "x.xlsx")]) == 2
    assert ".parquet or .csv" in capsys.readouterr().err
    assert cli.main(["query", str(tmp_path / "nope"), "SELECT 1"]) == 2
    assert "no such run directory" in capsys.readouterr().err


@pytest.mark.parametrize("sql, message", [
    ("SELEC * FROM samples", "Parser Error"),
    ("SELECT no_such_column FROM samples", "no_such_column"),
    ("SELECT * FROM no_such_view", "no_such_view"),
])
def test_sql_errors_are_duckdb_messages_without_traceback(run, sql, message):
    run_dir, _ = run
    p = subprocess.run([sys.executable, "-m", "explore.cli", "query", str(run_dir), sql],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2  # the query is the user's to fix
    assert message in p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    assert "views of this run: persons, samples, shards" in p.stderr
