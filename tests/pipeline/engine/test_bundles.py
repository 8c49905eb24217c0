"""Small units share a task (engine.bundle_bytes / engine.bundle_units): the same catalog, shards and
markers as one task per unit, and a bundle that crashes loses only its unfinished units."""
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from pipeline.engine.blocks import bundles
from pipeline.inputs.units import Unit

ROOT = Path(__file__).resolve().parents[3]


def _unit(i, size=0, kind="tar", count=0):
    return Unit(f"u{i:03d}", kind, f"/x/u{i:03d}.tar", bytes=size, count=count)


def test_small_units_are_packed_big_and_unknown_ones_ride_alone():
    cfg = {"engine": {"bundle_bytes": 1000, "bundle_units": 4}}
    units = [_unit(i, 100) for i in range(10)] + [_unit(10, 5000), _unit(11, 0)] + [_unit(12 + i, 600) for i in range(3)]
    groups = [[u.unit_id for u in g] for g in bundles(units, cfg, cpus=0.25)]
    assert groups == [["u000", "u001", "u002", "u003"], ["u004", "u005", "u006", "u007"], ["u008", "u009"],
                      ["u010"], ["u011"], ["u012"], ["u013"], ["u014"]]
    assert [u.unit_id for g in bundles(units, cfg, 0.25) for u in g] == [u.unit_id for u in units]  # order kept


def test_a_window_keeps_four_tasks_per_cpu():
    units = [_unit(i, 10) for i in range(64)]
    assert len(bundles(units, {}, cpus=2)) == 8  # 64 tiny units on 2 CPUs: 8 tasks of 8, not one of 64
    assert len(bundles(units, {}, cpus=64)) == 64  # a big cluster: one unit a task


def test_loose_files_weigh_by_their_count():
    cfg = {"engine": {"bundle_bytes": 1 << 20}}
    units = [_unit(i, kind="files", count=2) for i in range(4)]  # 2 files of ~256 KiB each
    assert [len(g) for g in bundles(units, cfg, cpus=0.25)] == [2, 2]


def _crawl(folder: Path, n: int) -> None:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).resize((64, 64)).save(buf, "JPEG")
        with tarfile.open(folder / f"{i:05d}.tar", "w") as tf:
            info = tarfile.TarInfo(f"k{i:05d}.jpg")
            info.size = len(buf.getvalue())
            tf.addfile(info, io.BytesIO(buf.getvalue()))


def _curate(crawl, run, *sets):
    cmd = [sys.executable, str(ROOT / "pipeline" / "curate.py"), "--input", str(crawl), "--output", str(run),
           "--no-progress", "--set", "ray.num_cpus=2", "--set", "stages=[decode,size,dedup]",
           "--set", "size.min_short_side=32", "--set", "engine.executor=ray"]  # Ray tasks (a run this small
    # would run without Ray: tests/pipeline/engine/test_local.py)
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]


def _catalog(run: Path):
    return pq.read_table(sorted((run / "catalog" / "samples").glob("*.parquet"))).sort_by("sample_id")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundles")
    _crawl(root / "crawl", 48)
    _curate(root / "crawl", root / "bundled")  # 48 units of ~1 KB: bundles of up to 6 on 2 CPUs
    _curate(root / "crawl", root / "single", "engine.bundle_units=1")
    return root


@pytest.mark.e2e
def test_bundled_and_single_unit_tasks_give_the_same_run(two_runs):
    a, b = two_runs / "bundled", two_runs / "single"
    ta, tb = _catalog(a), _catalog(b)
    assert ta.num_rows == 48 and ta.equals(tb)
    for folder in ("shards", "stats", "work/measure"):
        assert sorted(os.listdir(a / folder)) == sorted(os.listdir(b / folder))
    for tar in (a / "shards").glob("*.tar"):
        assert tar.read_bytes() == (b / "shards" / tar.name).read_bytes()
    marker = json.loads(next((a / "stats").glob("*.json")).read_text())
    assert marker["inputs"] == 1 and marker["kept"] == 1
    assert not [p for p in a.rglob(".*.tmp-*")]  # every temporary renamed or removed


@pytest.mark.e2e
def test_a_finished_run_reads_its_compacted_catalog_and_a_resume_makes_it_anew(two_runs):
    """The engine compacts the catalog at the end of a local run (catalog/compact.py); a resumed run
    with work left drops the copy first and makes it again from the parts."""
    import catalog
    from catalog import compact
    run = two_runs / "bundled"
    assert compact.is_compacted(run) and compact.marker(run)["rows"] == 48
    con = catalog.connect(run)
    assert con.execute("SELECT count(*) FROM samples").fetchone()[0] == 48
    index = pq.read_table(sorted((run / "shards").glob("*.parquet")))  # the shard indexes, read directly
    assert con.execute("SELECT count(*), count(DISTINCT shard) FROM shards").fetchone() == \
        (index.num_rows, len(set(index.column("shard").to_pylist())))
    assert {p.parent.name for p in (run / "catalog" / "compact").rglob("*.parquet")} == {"samples", "shards"}
    manifest = json.loads((run / "manifest.json").read_text())
    assert "compact" in manifest["seconds"]
    for name in ("00003", "00004"):  # two units lose their markers: the rerun redoes them
        (run / "stats" / f"{name}.json").unlink()
    stamp = (run / compact.MARKER).stat().st_mtime_ns
    _curate(two_runs / "crawl", run)
    assert compact.is_compacted(run) and (run / compact.MARKER).stat().st_mtime_ns != stamp
    assert _catalog(run).equals(_catalog(two_runs / "single"))
    assert catalog.connect(run).execute("SELECT count(*) FROM samples").fetchone()[0] == 48


@pytest.mark.e2e
def test_compaction_in_groups_as_ray_tasks_equals_the_one_file_copy(two_runs, ray_local, tmp_path, monkeypatch):
    """A run of at most catalog.compact.GROUP units is compacted in the driver (one file, no task); a
    larger one in groups, a Ray task each, at most 4 per CPU in flight: the views read the same rows
    either way (groups of 20: the last one short; groups of 1: more tasks than may be in flight)."""
    import shutil

    import catalog
    from catalog import compact
    from pipeline.engine import driver
    run = tmp_path / "run"
    shutil.copytree(two_runs / "single", run)
    before = catalog.connect(run).execute("SELECT * FROM samples ORDER BY sample_id").fetchall()
    assert compact.marker(run)["files"] == 1  # 48 units: one file, copied by the driver
    compact.invalidate(run)
    monkeypatch.setattr(compact, "GROUP", 20)
    from pipeline.config import load_config
    driver._compact(run, load_config(sets=["stages=[decode,size,dedup]"]), 48)
    assert compact.marker(run)["files"] == 3 and compact.marker(run)["rows"] == 48
    assert len(list((run / compact.FOLDER / "samples").glob("*.parquet"))) == 3
    assert catalog.connect(run).execute("SELECT * FROM samples ORDER BY sample_id").fetchall() == before
    compact.invalidate(run)
    monkeypatch.setattr(compact, "GROUP", 1)
    import ray
    assert 48 > 4 * ray.cluster_resources()["CPU"]  # the driver waits for some before it submits the rest
    driver._compact(run, load_config(sets=["stages=[decode,size,dedup]"]), 48)
    assert compact.marker(run)["files"] == 48 and compact.marker(run)["rows"] == 48
    assert len(list((run / compact.FOLDER / "samples").glob("*.parquet"))) == 48
    assert catalog.connect(run).execute("SELECT * FROM samples ORDER BY sample_id").fetchall() == before


def test_compaction_in_groups_in_the_local_pool_equals_the_one_file_copy(two_runs, tmp_path, monkeypatch):
    """The same without Ray (pipeline/engine/local.py): one job of the pool per group, a few groups'
    unit ids at a time (groups of 1: 48 jobs in chunks of 4 per worker); the views read the same rows."""
    import shutil

    import catalog
    from catalog import compact
    from pipeline.config import load_config
    from pipeline.engine import driver
    from pipeline.engine.local import LocalPool
    run = tmp_path / "run"
    shutil.copytree(two_runs / "single", run)
    before = catalog.connect(run).execute("SELECT * FROM samples ORDER BY sample_id").fetchall()
    cfg = load_config(sets=["stages=[decode,size,dedup]", "engine.executor=local"])
    pool = LocalPool(cfg, run, 2)
    try:
        for group, files in ((20, 3), (1, 48)):
            compact.invalidate(run)
            monkeypatch.setattr(compact, "GROUP", group)
            driver._compact(run, cfg, 48, pool)
            assert compact.marker(run)["files"] == files and compact.marker(run)["rows"] == 48
            assert len(list((run / compact.FOLDER / "samples").glob("*.parquet"))) == files
            assert catalog.connect(run).execute("SELECT * FROM samples ORDER BY sample_id").fetchall() == before
    finally:
        pool.close()
