"""humanset select: new thresholds on stored scores, no models, bytes copied."""
import subprocess
import sys

import pytest

import catalog
from pipeline.select import SelectError, select


def _rows(run):
    return {r["sample_id"]: r for r in catalog.connect(run).sql("SELECT * FROM samples").to_arrow_table().to_pylist()}


def test_stricter_size_rejects_more_and_copies_bytes(demo_run, tmp_path):
    run, _ = demo_run
    out = tmp_path / "strict"
    m = select(str(run), str(out), ["size.min_short_side=500"], progress=False)
    before, after = _rows(run), _rows(out)
    assert set(before) == set(after)
    for sid, r in after.items():
        if r["keep"]:
            assert before[sid]["keep"] and r["short_side"] >= 500
        elif before[sid]["keep"]:
            assert r["reject_reason"] == "size:short_side<500"
    assert 0 < m["counts"]["kept"] < sum(r["keep"] for r in before.values())
    idx = catalog.read_index(out / "shards").to_pylist()
    assert {r["sample_id"] for r in idx} == {s for s, r in after.items() if r["keep"]}
    old = {r["sample_id"]: r for r in catalog.read_index(run / "shards").to_pylist()}
    for r in idx:
        m_new = next(x for x in r["members"] if not x["name"].endswith(".json"))
        m_old = next(x for x in old[r["sample_id"]]["members"] if not x["name"].endswith(".json"))
        assert catalog.read_member(out / "shards" / r["shard"], m_new["offset"], m_new["size"]) == \
            catalog.read_member(run / "shards" / old[r["sample_id"]]["shard"], m_old["offset"], m_old["size"])


def test_looser_dedup_recomputes_clusters_and_reads_sources(demo_run, tmp_path):
    run, _ = demo_run
    out = tmp_path / "nodedup"
    select(str(run), str(out), ["dedup.max_distance=null", "dedup.exact=false"], progress=False)  # dedup off
    before, after = _rows(run), _rows(out)
    revived = [s for s, r in after.items() if r["keep"] and not before[s]["keep"]]
    was = {before[s]["reject_reason"] for s in revived}
    assert was == {"dedup:near_duplicate", "dedup:exact_duplicate"}
    assert not any((r["reject_reason"] or "").startswith("dedup:") for r in after.values())
    shard_ids = set(catalog.read_index(out / "shards").column("sample_id").to_pylist())
    assert set(revived) <= shard_ids  # their bytes came from the input tars


def test_refuses_thresholds_of_stages_that_did_not_run(demo_run, tmp_path):
    with pytest.raises(SelectError, match="rerun `humanset curate` with the watermark stage"):
        select(str(demo_run[0]), str(tmp_path / "x"), ["watermark.max_score=0.5"], progress=False)
    p = subprocess.run([sys.executable, "-m", "humanset.cli", "select", str(demo_run[0]), "--set",
                        "watermark.max_score=0.5", "--output", str(tmp_path / "y")], capture_output=True, text=True)
    assert p.returncode == 2 and "watermark" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "y").exists()
