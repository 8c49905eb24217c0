"""Fuzzing the containers: damaged shards of every kind (bench/fuzz_tars.py) never stop a run.

The reader-level fuzz reads 2,000 damaged shards with UnitReader: no exception, every sample whole
before the damage comes back with its bytes, every outcome a fixed kind. The curate-level fuzz runs
500 more damaged shards through `humanset curate` in one CLI call: exit 0, every intact sample in the
catalog with its measurements, each shard's stats marker classifying its outcome as the reader
does, nothing written outside RUN whatever the member names say, and no hang (a timeout).
bench/fuzz.py --tars N runs 20,000 and more.
"""
import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from pipeline.stages.decode import UNIT_ERROR_KINDS, unit_error_kind

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("bench_fuzz_tars", ROOT / "bench" / "fuzz_tars.py")
fuzz_tars = importlib.util.module_from_spec(_spec)
sys.modules["bench_fuzz_tars"] = fuzz_tars
_spec.loader.exec_module(fuzz_tars)


def test_2000_damaged_shards_through_the_reader():
    r = fuzz_tars.run(2000, seed=1, trace_memory=False)  # bench/fuzz.py reports the memory; tracing costs 6x
    assert r["shards_tried"] == 2000 and sum(r["outcomes"].values()) == 2000
    assert r["aborts"] == 0 and r["intact_samples_lost"] == 0, r["examples"]
    assert r["slow_reads_over_2s"] == 0
    assert set(r["outcomes"]) <= set(UNIT_ERROR_KINDS) | {"ok"}
    # every damage is tried and the corpus reaches each tar-level kind
    assert set(r["per_damage"]) == set(fuzz_tars.DAMAGES)
    assert {"not_a_tar", "truncated_tar", "corrupt_tar", "bad_index", "index_mismatch", "ok"} <= set(r["outcomes"])


@pytest.mark.e2e
def test_500_damaged_shards_through_curate(tmp_path):
    crawl, run, cwd = tmp_path / "crawl", tmp_path / "run", tmp_path / "cwd"
    crawl.mkdir()
    cwd.mkdir()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    expected = {}
    for i, case in enumerate(fuzz_tars.cases(500, seed=2)):
        name = f"{i:04d}-{case.damage}"
        fuzz_tars.write_case(case, crawl, name)
        outcome = fuzz_tars.read_case(case, scratch, "c")  # what the reader alone says
        for f in scratch.iterdir():
            f.unlink()
        expected[name] = (case, outcome)
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if run not in p.parents)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "humanset.cli", "curate", "--input", str(crawl), "--output", str(run),
                        "--set", "stages=[decode,size,dedup]", "--set", "size.min_short_side=1"],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-4000:])
    after = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if run not in p.parents and p != run)
    assert after == before  # nothing written outside RUN (nor extracted anywhere)
    import duckdb
    rows = duckdb.connect().execute(
        f"SELECT shard, key, sha256 FROM read_parquet('{run}/catalog/samples/*.parquet', union_by_name=true)").fetchall()
    measured = {(s, k) for s, k, sha in rows if sha is not None}
    kinds = Counter()
    for name, (case, outcome) in expected.items():
        lost = [k for k in case.intact if (name, k) not in measured]
        assert not lost, (name, case.detail, lost)
        marker = json.loads((run / "stats" / f"{name}.json").read_text())
        kind = unit_error_kind(marker["unit_error"]) if marker.get("unit_error") else "ok"
        if "unit_error_kind" in marker:  # the engine's own field, where it writes one
            assert marker["unit_error_kind"] == (None if kind == "ok" else kind)
        assert kind == outcome["kind"], (name, marker.get("unit_error"), outcome["error"])
        kinds[kind] += 1
    assert {"ok", "not_a_tar", "truncated_tar", "corrupt_tar"} <= set(kinds), kinds
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["counts"]["inputs"] == len(rows)


@pytest.mark.parametrize("seed", [3])
def test_the_generator_is_deterministic(seed):
    a = [(c.damage, c.detail, c.tar, c.index) for c in fuzz_tars.cases(40, seed)]
    b = [(c.damage, c.detail, c.tar, c.index) for c in fuzz_tars.cases(40, seed)]
    assert a == b and len({d for d, *_ in a}) == len(fuzz_tars.DAMAGES)
