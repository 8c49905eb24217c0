"""humanset select with no run-sized state in one process: a dedup change re-clusters through
pipeline/dedup_dist.run_dedup on per-unit candidate files (partitioned by hash, or in one process as
dedup.partitioned picks), the fallback choice is a group-by on cluster key over hash-partitioned
files, and the per-unit rewrite runs as Ray tasks (or in process without Ray). Every path gives the
catalog a fresh curate with the same settings writes. Real data: the demo crawl, 4 samples a shard."""
from __future__ import annotations

import json

import pytest

import catalog
from catalog.run_kind import RunKindError
from pipeline.config import default_config
from pipeline.dedup.ranges import TASK_BASE_BYTES
from pipeline.engine.driver import curate
from pipeline.select.recut import select

STAGES = ["decode", "size", "dedup"]
NEW = ["dedup.max_distance=2", "size.min_short_side=160"]  # fewer near copies; the thumbnails pass size now
# the partitioned path with 10 kB of room per task over a worker's base (TASK_BASE_BYTES, 256 MiB):
# plan() then cuts these ~40 candidates into 4 hash ranges and batches of ~10 rows (as
# tests/pipeline/dedup/test_dedup_dist.py forces P and batches; select takes only real settings)
PARTITIONED = ["dedup.partitioned=true", f"dedup.task_memory={TASK_BASE_BYTES + 10_000}"]
KEEP = ["engine.keep_work=true"]  # keeps OUT/work/select and the dedup's files to look at
SMALL = ["engine.window_units=3"]  # 4 groups of units: 4 partitions of the fallback exchange
Q = "SELECT * FROM samples ORDER BY sample_id"


def _cfg(sets=()) -> dict:
    from pipeline.config import apply_sets
    cfg = default_config()
    cfg["stages"] = list(STAGES)
    cfg["engine"]["start_actors_early"] = False
    return apply_sets(cfg, list(sets))


def _catalog(run):
    return catalog.connect(run).sql(Q).to_arrow_table()


@pytest.fixture(scope="module")
def crawl(demo_crawl, tmp_path_factory):
    from pipeline.demo.crawl import write_webdataset
    folder = tmp_path_factory.mktemp("seldist") / "crawl"
    write_webdataset(folder, demo_crawl[1], per_shard=4)  # ~12 units: clusters span units
    return folder


@pytest.fixture(scope="module")
def run(crawl, ray_local, tmp_path_factory):
    out = tmp_path_factory.mktemp("seldist") / "run"
    curate([str(crawl)], str(out), _cfg(), progress=False)
    return out


@pytest.fixture(scope="module")
def fresh(crawl, ray_local, tmp_path_factory):
    """curate with the new settings from the start: what the re-cut must equal."""
    out = tmp_path_factory.mktemp("seldist") / "fresh"
    curate([str(crawl)], str(out), _cfg(NEW), progress=False)
    return out


def test_partitioned_reclustering_equals_in_process_and_a_fresh_curate(run, fresh, tmp_path):
    units = len(list((run / "catalog/samples").glob("*.parquet")))
    assert units >= 8
    m_part = select(str(run), str(tmp_path / "part"), NEW + PARTITIONED + SMALL + KEEP, progress=False)
    m_one = select(str(run), str(tmp_path / "one"), NEW + ["dedup.partitioned=false"], progress=False)
    done = json.loads((tmp_path / "part/work/dedup/_done.json").read_text())
    assert done["partitions"] == 4 and done["components"] == "distributed" and done["batches"] > 1
    assert "partitions" not in json.loads((tmp_path / "one/work/dedup/_done.json").read_text())
    # one candidate and one verdict file per unit, each written by its own unit's task
    assert len(list((tmp_path / "part/work/measure").glob("*.parquet"))) == units
    assert len(list((tmp_path / "part/work/dedup").glob("*.parquet"))) == units
    # the choices came back one file per unit holding cluster members, from several partitions (one
    # partition without SMALL)
    assert _groups(tmp_path / "part/work/select/x") == {4} and _filled(tmp_path / "part/work/select/x")
    assert list((tmp_path / "part/work/select/choice").glob("*.parquet"))
    # without engine.keep_work the selection's scratch is gone, its verdicts stay (pipeline/engine/cleanup.py)
    assert not (tmp_path / "one/work/select").exists() and not (tmp_path / "one/work/dedup/pairs").exists()
    assert len(list((tmp_path / "one/work/dedup").glob("*.parquet"))) == units
    before, part, one, new = _catalog(run), _catalog(tmp_path / "part"), _catalog(tmp_path / "one"), _catalog(fresh)
    assert part.equals(one)
    assert part.equals(new)
    assert not part.equals(before)  # the new settings changed clusters and reasons: the test can fail
    was = dict(zip(before.column("sample_id").to_pylist(), before.column("dup_of").to_pylist()))
    assert any(was[s] != d for s, d in zip(part.column("sample_id").to_pylist(), part.column("dup_of").to_pylist()))
    assert m_part["counts"] == m_one["counts"] and m_part["fallbacks"] == m_one["fallbacks"]
    assert m_part["counts"]["kept"] == sum(part.column("keep").to_pylist())
    fresh_m = json.loads((fresh / "manifest.json").read_text())
    assert m_part["counts"] == fresh_m["counts"] and m_part["reject_reasons"] == fresh_m["reject_reasons"]


def test_without_ray_every_step_runs_in_process_with_the_same_catalog(run, fresh, tmp_path, monkeypatch):
    import ray
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # as `humanset select` without a cluster
    select(str(run), str(tmp_path / "local"), NEW + PARTITIONED + SMALL + KEEP, progress=False)
    assert _groups(tmp_path / "local/work/select/x") == {4} and _filled(tmp_path / "local/work/select/x")
    assert json.loads((tmp_path / "local/work/dedup/_done.json").read_text())["nodes"] == 0
    assert _catalog(tmp_path / "local").equals(_catalog(fresh))
    # shards hold exactly the kept samples' bytes
    idx = catalog.read_index(tmp_path / "local" / "shards")
    kept = _catalog(tmp_path / "local").filter(_catalog(tmp_path / "local").column("keep"))
    assert sorted(idx.column("sample_id").to_pylist()) == kept.column("sample_id").to_pylist()


def test_no_dedup_change_reads_the_stored_clusters(run, tmp_path):
    """A change outside dedup and size writes no candidate file and reruns no dedup."""
    select(str(run), str(tmp_path / "same"), ["engine.window_units=2"], progress=False)
    assert not (tmp_path / "same/work/measure").exists() and not (tmp_path / "same/work/dedup").exists()
    assert _catalog(tmp_path / "same").equals(_catalog(run))


def _filled(folder) -> set[int]:
    """The partitions (row groups) holding rows, over the exchange files in folder."""
    import pyarrow.parquet as pq
    return {q for f in folder.glob("*.parquet") for q in range(pq.ParquetFile(f).num_row_groups)
            if pq.ParquetFile(f).metadata.row_group(q).num_rows}


def _groups(folder) -> set[int]:
    """The row-group (partition) counts of the exchange files in folder."""
    import pyarrow.parquet as pq
    return {pq.ParquetFile(f).num_row_groups for f in folder.glob("*.parquet")}


@pytest.fixture(scope="module")
def fb_run(ray_local, tmp_path_factory):
    """tests/captioned_photos.py's crawl (the fallback tests') (two clusters whose captioned canonicals the text stage
    rejects, a clean fallback each), one image a unit: every cluster spans units."""
    from captioned_photos import fallback_config, write_crawl
    tmp = tmp_path_factory.mktemp("selfb")
    cfg = fallback_config(2)
    cfg["input"]["files_per_unit"] = 1
    curate([str(write_crawl(tmp))], str(tmp / "run"), cfg, progress=False)
    return tmp / "run"


@pytest.mark.e2e
def test_fallback_choice_through_partitions_equals_one_partition(fb_run, tmp_path):
    """A looser text threshold promotes both captioned canonicals over the fallbacks the run kept:
    the same catalog with one partition and stored clusters, with six partitions (one unit each) and
    the clusters recomputed by the partitioned dedup, and without Ray."""
    from pathlib import Path
    loose = ["text.max_area_frac=0.5"]
    one = select(str(fb_run), str(tmp_path / "one"), loose + KEEP, progress=False)
    six = select(str(fb_run), str(tmp_path / "six"), loose + ["engine.window_units=1"] + PARTITIONED + KEEP,
                 progress=False)
    assert json.loads((tmp_path / "six/work/dedup/_done.json").read_text())["components"] == "distributed"
    assert _filled(tmp_path / "one/work/select/x") == {0}
    assert len(list((tmp_path / "six/work/select/choice").glob("*.parquet"))) == 5  # coffee is alone
    rows = {Path(r["source_uri"]).stem: r for r in _catalog(tmp_path / "six").to_pylist()}
    # six partitions (a row group each in every map file), each cluster's members in its key's
    # partition (the canonicals' sample ids, which depend on the crawl's paths: they may share one)
    from pipeline.dedup.fallback_rounds import key_partition
    assert _groups(tmp_path / "six/work/select/x") == {6}
    keys = {rows["astro_cap900"]["sample_id"], rows["cat_cap900"]["sample_id"]}
    assert _filled(tmp_path / "six/work/select/x") == {key_partition(k, 6) for k in keys}
    assert {k for k, r in rows.items() if r["keep"]} == {"astro_cap900", "cat_cap900", "coffee"}
    assert rows["astro_clean"]["dup_of"] == rows["astro_cap900"]["sample_id"]
    assert rows["astro_clean"]["reject_reason"] == "dedup:near_duplicate" and not rows["astro_clean"]["dup_scored"]
    assert one["fallbacks"] == six["fallbacks"] == {"promoted": 2, "unscored": 0, "lost": 0}
    assert _catalog(tmp_path / "six").equals(_catalog(tmp_path / "one"))
    assert not _catalog(tmp_path / "one").equals(_catalog(fb_run))


def test_the_cli_connects_to_ray_only_when_a_cluster_is_named(run, monkeypatch):
    from pipeline.select.recut import connect_ray
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert not connect_ray(str(run))  # the run names no ray.address: select runs in its process
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert not connect_ray(str(run))
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    assert connect_ray(str(run))  # the test session's Ray is up: connected, nothing started


@pytest.mark.e2e
def test_a_select_into_an_interrupted_output_mixes_in_none_of_its_files(fb_run, tmp_path):
    """What a select into OUT left before its manifest (here: all but the manifest, with another
    threshold and six partitions) is never mixed into another selection: a select with other settings
    is refused in one line naming OUT (the folder has one owner, catalog/run_kind.py), and the same
    command resumes it into what a clean select makes."""
    out = tmp_path / "out"
    first = ["text.max_area_frac=0.5", "engine.window_units=1"] + KEEP
    select(str(fb_run), str(out), first, progress=False)
    (out / "manifest.json").unlink()
    with pytest.raises(RunKindError, match="other settings"):
        select(str(fb_run), str(out), ["text.max_area_frac=0.04"] + KEEP, progress=False)
    again = select(str(fb_run), str(out), first, progress=False)
    clean = select(str(fb_run), str(tmp_path / "clean"), first, progress=False)
    assert _catalog(out).equals(_catalog(tmp_path / "clean"))
    assert again["fallbacks"] == clean["fallbacks"]


def test_fold_declares_memory_and_refuses_a_task_no_node_can_hold(ray_local):
    """select's recut and route tasks declare memory= (pipeline/recut._fallback_choice); one larger
    than every node is refused with the setting to change, never left pending."""
    from pipeline.dedup.fallback_rounds import fold
    assert fold(lambda x: 2 * x, [(1,), (2,), (3,)], 2, memory=64 << 20) == 12
    with pytest.raises(RuntimeError, match="lower engine.window_units"):
        fold(lambda x: x, [(1,)], 1, memory=1 << 50, fix="lower engine.window_units")
