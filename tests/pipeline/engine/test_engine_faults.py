"""The engine under faults: a dying worker, a source that changes, a second run, new files."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import catalog
from pipeline.config import load_config
from pipeline.engine import adapter, columns, unit_io

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "faults"))
import humanset_faults  # noqa: E402  (test-only fault injection: tests/faults)
CHEAP = ["stages=[decode,size,dedup]"]


def _photos(folder, n, start=0):
    from pipeline.demo.crawl import photo_like
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(start, start + n):
        (folder / f"{i:03d}.jpg").write_bytes(photo_like(400, 320, 500 + i))
    return folder


def test_run_lock_keeps_a_second_run_out_and_deletes_nothing(tmp_path):
    from pipeline.engine.errors import RunError
    from pipeline.engine.driver import curate
    run = tmp_path / "run"
    run.mkdir()
    theirs = run / "catalog" / "samples" / ".u.parquet.tmp-4242-deadbeef"  # another run's write in flight
    theirs.parent.mkdir(parents=True)
    theirs.write_bytes(b"x")
    with catalog.run_lock(run):
        with pytest.raises(RunError, match="another run is using this directory"):
            curate([str(_photos(tmp_path / "in", 1))], str(run), load_config(sets=CHEAP), progress=False)
        with pytest.raises(catalog.RunLocked):
            with catalog.run_lock(run):
                pass
    assert theirs.exists() and not (run / "manifest.json").exists()
    with catalog.run_lock(run):  # released with the first holder
        pass


def test_clean_tmp_removes_only_our_writers_temp_files(tmp_path):
    ours = tmp_path / "a" / ".x.parquet.tmp-12-0123abcd"
    ours.parent.mkdir()
    ours.write_bytes(b"")
    keep = [tmp_path / ".notes.tmp-mine", tmp_path / "a" / ".x.tmp-12-ZZZZZZZZ", tmp_path / "data.tmp-1-0123abcd"]
    for p in keep:
        p.write_bytes(b"")
    assert catalog.clean_tmp(tmp_path) == 1
    assert not ours.exists() and all(p.exists() for p in keep)
    deep = tmp_path / "b" / "c" / ".y.json.tmp-12-0123abcd"  # a run's cleanup looks only where it writes
    deep.parent.mkdir(parents=True)
    deep.write_bytes(b"")
    ours.write_bytes(b"")
    assert catalog.clean_tmp(tmp_path, ["a", "b"]) == 1 and deep.exists() and not ours.exists()


def _measured(source, run):
    """Phases 1 and 2 of the cheap path on one unit, in-process (no Ray): (unit, cfg)."""
    from pipeline.dedup import clusters as dedup
    from pipeline.inputs.listing import list_units
    from pipeline.stages import build_stages
    cfg = load_config(sets=CHEAP)
    (unit,), _ = list_units([str(source)])
    table = unit_io.read_for_measure(unit, unit_io.limits_of(cfg))
    for s in build_stages(cfg):
        table = adapter.run_on_unit(s, table, False)
    unit_io.finish_measure(run, table)
    dedup.run_dedup(run, [unit.unit_id], cfg)
    return unit, cfg


def test_changed_source_is_rejected_and_never_written(tmp_path):
    """Phase 1 and phase 3 run here in-process (no Ray); the file changes in between."""
    from pipeline.demo.crawl import photo_like
    folder = _photos(tmp_path / "in", 3)
    run = tmp_path / "run"
    unit, cfg = _measured(folder, run)
    new = photo_like(400, 320, 999)
    (folder / "001.jpg").write_bytes(new)  # same name, other bytes
    table = unit_io.read_for_score(run, unit, unit_io.limits_of(cfg), False)
    summary = unit_io.finish_unit(run, table, cfg).to_pylist()[0]
    assert summary["inputs"] == 3 and summary["kept"] == 2
    rows = {Path(r["source_uri"]).name: r for r in
            catalog.connect(run).sql("SELECT * FROM samples").to_arrow_table().to_pylist()}
    assert rows["001.jpg"]["reject_reason"] == "decode:source_changed"
    assert rows["001.jpg"]["sha256"] != __import__("hashlib").sha256(new).hexdigest()
    stored = [rec.files for tar in catalog.list_shards(run / "shards") for rec in catalog.iter_tar(tar)]
    assert len(stored) == 2 and all(f["jpg"] != new for f in stored)
    assert json.loads((run / "stats" / f"{unit.unit_id}.json").read_text())["source_changed"] == 1


def test_second_read_of_a_tar_seeks_to_its_members_and_a_rewritten_tar_is_parsed_again(tmp_path, monkeypatch):
    """Phase 3 reads a shard's images where phase 1 found them; bytes that no longer match there
    (the tar was rewritten, members moved) are looked up by parsing the tar, never written unchecked."""
    import io
    import shutil
    import tarfile

    from pipeline.inputs import fetch
    from pipeline.demo.crawl import photo_like

    def shard(path, images):
        with tarfile.open(path, "w") as tf:
            for name, data in images.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))

    images = {f"{k}.jpg": photo_like(400, 320, 600 + i) for i, k in enumerate("abcd")}
    tar = tmp_path / "in" / "s.tar"
    tar.parent.mkdir()
    shard(tar, images)
    run = tmp_path / "run"
    unit, cfg = _measured(tar, run)
    shutil.copytree(run, tmp_path / "run2")

    def no_parse(*a, **k):
        raise AssertionError("the tar was parsed again")
    with monkeypatch.context() as m:
        m.setattr(fetch, "UnitReader", no_parse)  # phase 3 reads bytes back through pipeline/inputs/fetch.py
        table = unit_io.read_for_score(run, unit, unit_io.limits_of(cfg), False)
    assert unit_io.finish_unit(run, table, cfg).to_pylist()[0]["kept"] == 4

    new = photo_like(500, 320, 999)  # b changes size: c and d move
    shard(tar, {**images, "b.jpg": new})
    run = tmp_path / "run2"
    table = unit_io.read_for_score(run, unit, unit_io.limits_of(cfg), False)
    assert unit_io.finish_unit(run, table, cfg).to_pylist()[0]["kept"] == 3
    rows = {r["key"]: r for r in catalog.connect(run).sql("SELECT * FROM samples").to_arrow_table().to_pylist()}
    assert rows["b"]["reject_reason"] == "decode:source_changed" and all(rows[k]["keep"] for k in "acd")
    stored = sorted(rec.files["jpg"] for t in catalog.list_shards(run / "shards") for rec in catalog.iter_tar(t))
    assert stored == sorted(images[f"{k}.jpg"] for k in "acd")


def test_units_are_saved_and_files_added_later_are_reported(tmp_path, ray_local):
    from pipeline.engine.driver import curate
    folder = _photos(tmp_path / "in", 4)
    run = tmp_path / "run"
    cfg = load_config(sets=CHEAP + ["input.files_per_unit=2"])
    first = curate([str(folder)], str(run), cfg, progress=False)
    saved = (run / "units.jsonl").read_text()
    _photos(folder, 1, start=100)  # sorts before nothing, after everything: would shift no chunk...
    (folder / "000a.jpg").write_bytes((folder / "100.jpg").read_bytes())  # ...this one shifts every chunk
    again = curate([str(folder)], str(run), cfg, progress=False)
    assert (run / "units.jsonl").read_text() == saved
    assert again["not_in_this_run"] == 2 and again["counts"] == first["counts"]
    units = [json.loads(line)["unit_id"] for line in saved.splitlines()]
    assert len(units) == 2 and all(u.split("-")[-1] not in ("00000", "00001") for u in units)


@pytest.mark.e2e
def test_a_sample_that_kills_its_worker_is_rejected_and_the_run_completes(tmp_path):
    folder = _photos(tmp_path / "in", 5)
    (folder / "killer.jpg").write_bytes((folder / "000.jpg").read_bytes()[:-1] + b"\xd9")  # a valid image
    run = tmp_path / "run"
    env = humanset_faults.env({"stage": "decode", "uri": "killer.jpg"})  # the decoder dies on it (tests/faults)
    cmd = [sys.executable, str(ROOT / "pipeline" / "curate.py"), "--input", str(folder), "--output", str(run),
           "--no-progress", "--set", "ray.num_cpus=2", "--set", "engine.max_retries=1", "--set", "engine.executor=ray",
           "--set", "stages=[decode,size,dedup]", "--set", "dedup.exact=false", "--set", "dedup.max_distance=null"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {Path(r["source_uri"]).name: r for r in
            catalog.connect(run).sql("SELECT * FROM samples").to_arrow_table().to_pylist()}
    assert len(rows) == 6
    assert rows["killer.jpg"]["reject_reason"] == "decode:worker_crash"
    assert "worker crash" in rows["killer.jpg"]["decode_error"]
    assert all(r["keep"] for name, r in rows.items() if name != "killer.jpg")
    (stats,) = [json.loads(p.read_text()) for p in (run / "stats").glob("*.json")]
    assert stats["isolated"] and stats["worker_crashes"] == 1


def test_a_stage_that_raises_on_one_sample_fails_only_that_sample():
    import pyarrow as pa

    from pipeline.stages.size import SizeStage

    class RaisesOn13(SizeStage):  # a stage with a bug that one sample's values trigger
        def measure(self, batch):
            if 13 in batch["width"]:
                raise IndexError("index out of range")
            return super().measure(batch)

    t = pa.table({"sample_id": list("abcd"), "width": [400, 13, 500, 600], "height": [400, 400, 500, 600],
                  "decode_error": pa.nulls(4, pa.string()), "_alive": [True] * 4,
                  "scored_stages": pa.nulls(4, pa.list_(pa.string()))})
    out = adapter.run_on_unit(RaisesOn13({"batch_size": 4}), t, False)
    assert out.column("sample_id").to_pylist() == list("abcd")
    assert out.column("short_side").to_pylist() == [400, None, 500, 600]
    assert out.column("_alive").to_pylist() == [True, False, True, True]
    err = out.column("decode_error").to_pylist()[1]
    assert "IndexError" in err and err.startswith("decoder error")
    assert "size" in columns.unit_meta(out)["seconds"]


def test_render_out_is_locked_too(tmp_path):
    from render.config import load_config as render_config
    from render.run.job import prepare_run
    out = tmp_path / "render"
    with catalog.run_lock(out):
        with pytest.raises(ValueError, match="another run is using this directory"):
            prepare_run(out, "anny", "builtin", 1, 0, render_config())
    assert not (out / "render.json").exists()


@pytest.mark.e2e
def test_a_sample_that_kills_a_model_actor_is_isolated_too(tmp_path):
    """The same for an actor-pool stage of phase 3 (the OCR stage, CPU)."""
    folder = _photos(tmp_path / "in", 3)
    (folder / "killer.jpg").write_bytes((folder / "000.jpg").read_bytes()[:-1] + b"\xd9")
    run = tmp_path / "run"
    env = humanset_faults.env({"stage": "text", "uri": "killer.jpg"})  # the OCR actor dies on it (tests/faults)
    cmd = [sys.executable, str(ROOT / "pipeline" / "curate.py"), "--input", str(folder), "--output", str(run),
           "--no-progress", "--set", "ray.num_cpus=2", "--set", "engine.max_retries=1", "--set", "engine.executor=ray",
           "--set", "stages=[decode,size,dedup,text]", "--set", "dedup.exact=false",
           "--set", "dedup.max_distance=null"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {Path(r["source_uri"]).name: r for r in
            catalog.connect(run).sql("SELECT * FROM samples").to_arrow_table().to_pylist()}
    assert len(rows) == 4 and rows["killer.jpg"]["reject_reason"] == "decode:worker_crash"
    others = [r for name, r in rows.items() if name != "killer.jpg"]
    assert all(r["keep"] and "text" in r["scored_stages"] for r in others)
    (stats,) = [json.loads(p.read_text()) for p in (run / "stats").glob("*.json")]
    assert stats["isolated"] and stats["worker_crashes"] == 1
