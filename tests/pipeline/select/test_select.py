"""humanset select: new thresholds on stored scores, no models, bytes copied."""
import json
import shutil
import subprocess
import sys

import pytest

import catalog
from pipeline.select.recut import SelectError
from pipeline.select.recut import select


def _rows(run):
    return {r["sample_id"]: r for r in catalog.connect(run).sql("SELECT * FROM samples").to_arrow_table().to_pylist()}


def test_stricter_size_rejects_more_and_copies_bytes(demo_run, tmp_path):
    run, _ = demo_run
    out = tmp_path / "strict"
    # 600: the 512-px shipped photos kept by the demo run fall below it (its 384-px crop is now a watermark reject)
    m = select(str(run), str(out), ["size.min_short_side=600"], progress=False)
    before, after = _rows(run), _rows(out)
    assert set(before) == set(after)
    for sid, r in after.items():
        if r["keep"]:
            assert before[sid]["keep"] and r["short_side"] >= 600
        elif before[sid]["keep"]:
            assert r["reject_reason"] == "size:short_side<600"
    assert 0 < m["counts"]["kept"] < sum(r["keep"] for r in before.values())
    idx = catalog.read_index(out / "shards").to_pylist()
    assert {r["sample_id"] for r in idx} == {s for s, r in after.items() if r["keep"]}
    old = {r["sample_id"]: r for r in catalog.read_index(run / "shards").to_pylist()}
    for r in idx:
        m_new = next(x for x in r["members"] if not x["name"].endswith(".json"))
        m_old = next(x for x in old[r["sample_id"]]["members"] if not x["name"].endswith(".json"))
        assert catalog.read_member(out / "shards" / r["shard"], m_new["offset"], m_new["size"]) == \
            catalog.read_member(run / "shards" / old[r["sample_id"]]["shard"], m_old["offset"], m_old["size"])


def test_cascade_skipped_samples_cannot_be_revived(demo_run, tmp_path):
    """With dedup off, duplicates would reach the person stage, which never scored them."""
    with pytest.raises(SelectError, match="never scored by it"):
        select(str(demo_run[0]), str(tmp_path / "x"), ["dedup.max_distance=null", "dedup.exact=false"],
               progress=False)
    assert not (tmp_path / "x" / "manifest.json").exists()


@pytest.fixture(scope="module")
def score_all_run(ray_local, tmp_path_factory):
    """A small crawl curated with --score-all: every stage scores every decodable sample."""
    import io

    from PIL import Image

    from pipeline.demo.crawl import demo_config, encode, shipped_photos, with_caption, write_webdataset
    from pipeline.engine.driver import curate
    photos = shipped_photos()
    bus = Image.open(io.BytesIO(photos["bus"]))
    samples = [("000", "jpg", photos["bus"], "bus"),
               ("001", "jpg", encode(bus.resize((bus.width * 3 // 4, bus.height * 3 // 4)), quality=70), "bus small"),
               ("002", "jpg", encode(bus.resize((bus.width // 4, bus.height // 4))), "bus thumb"),
               ("003", "png", photos["coffee"], "coffee"),
               ("004", "jpg", encode(with_caption(Image.open(io.BytesIO(photos["zidane"])))), "zidane meme")]
    folder = tmp_path_factory.mktemp("scoreall")
    write_webdataset(folder / "crawl", samples, per_shard=3)
    curate([str(folder / "crawl")], str(folder / "run"), demo_config(), score_all=True, progress=False)
    return folder / "run"


@pytest.mark.e2e
def test_score_all_scores_every_decodable_sample(score_all_run):
    rows = _rows(score_all_run)
    assert len(rows) == 5
    for r in rows.values():
        assert {"person", "text"} <= set(r["scored_stages"]), r["caption"]
    thumb = next(r for r in rows.values() if r["caption"] == "bus thumb")
    assert thumb["reject_reason"].startswith("size:") and thumb["n_persons"] is not None
    assert len(thumb["reject_reasons"]) >= 1


@pytest.mark.e2e
def test_looser_dedup_recomputes_clusters_and_reads_sources(score_all_run, tmp_path):
    before_run = score_all_run
    out = tmp_path / "nodedup"
    select(str(before_run), str(out), ["dedup.max_distance=null", "dedup.exact=false"], progress=False)
    before, after = _rows(before_run), _rows(out)
    revived = [s for s, r in after.items() if r["keep"] and not before[s]["keep"]]
    assert revived and all(before[s]["reject_reason"].startswith("dedup:") for s in revived)
    assert not any((r["reject_reason"] or "").startswith("dedup:") for r in after.values())
    shard_ids = set(catalog.read_index(out / "shards").column("sample_id").to_pylist())
    assert set(revived) <= shard_ids  # their bytes came from the input tars


@pytest.mark.e2e
def test_stricter_person_threshold(score_all_run, tmp_path):
    out = tmp_path / "strict"
    # the raw score: the nano model gives no one 0.99 (the calibrated score gives clear faces 0.999+)
    select(str(score_all_run), str(out), ["person.score=raw", "person.min_score=0.99"], progress=False)
    after = _rows(out)
    assert not any(r["keep"] for r in after.values())
    assert any(r["reject_reason"] == "person:score<=0.99" for r in after.values())


def test_select_recuts_with_a_calibration_file_and_with_the_raw_score(score_all_run, tmp_path):
    """A file in the form `humanset calibrate --fit-person` writes is read by select, which recomputes
    person_score_calibrated from the stored boxes and keypoints; person.score=raw cuts the raw scores."""
    from pipeline.stages.person_calibration import load_calibration

    before = _rows(score_all_run)
    shipped = load_calibration(None)
    strict = shipped.__class__(**{**shipped.__dict__, "intercept": shipped.intercept - 40.0})
    path = strict.save(tmp_path / "strict.json")
    out = tmp_path / "cal"
    select(str(score_all_run), str(out), [f"person.calibration={path}"], progress=False)
    after = _rows(out)
    scored = [s for s, r in before.items() if r["n_persons"]]
    assert scored and all(after[s]["person_score_calibrated"] < 1e-6 for s in scored)
    assert any(before[s]["person_score_calibrated"] > 0.9 for s in scored)
    assert not any(r["keep"] for r in after.values())
    assert any(r["reject_reason"] == "person:calibrated_score<=0.9" for r in after.values())


def test_refuses_thresholds_of_stages_that_did_not_run(demo_run, tmp_path):
    # the demo runs all seven stages: a copy whose manifest says the art stage was skipped stands for a
    # run curated without art weights (select reads which stages ran from the manifest alone)
    run = tmp_path / "no_art"
    shutil.copytree(demo_run[0], run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["stages"] = [s for s in manifest["stages"] if s != "art"]
    manifest["skipped_stages"] = {"art": "art.weights not set"}
    (run / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SelectError, match="rerun `humanset curate` with the art stage"):
        select(str(run), str(tmp_path / "x"), ["art.max_score=0.3"], progress=False)
    p = subprocess.run([sys.executable, "-m", "humanset.cli", "select", str(run), "--set",
                        "art.max_score=0.3", "--output", str(tmp_path / "y")], capture_output=True, text=True)
    assert p.returncode == 2 and "art" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "y").exists()


def test_an_identical_rerun_returns_the_selection_and_another_is_refused(score_all_run, tmp_path):
    out = tmp_path / "strict"
    first = select(str(score_all_run), str(out), ["person.min_score=0.99"], progress=False)
    again = select(str(score_all_run), str(out), ["person.min_score=0.99"], progress=False)  # as curate resumes
    assert again["finished"] == first["finished"] and again["counts"] == first["counts"]
    with pytest.raises(ValueError, match=r"strict: holds a re-cut of a curation run \(humanset select\) with other "
                                         r"settings .*pass another --output"):
        select(str(score_all_run), str(out), ["person.min_score=0.5"], progress=False)
    assert not (out / ".lock").exists()


def test_curate_refuses_a_folder_select_made_naming_its_kind(score_all_run, tmp_path):
    from pipeline.demo.crawl import demo_config
    from pipeline.engine.driver import curate

    out = tmp_path / "sel"
    select(str(score_all_run), str(out), ["person.min_score=0.99"], progress=False)
    with pytest.raises(ValueError, match=r"sel: holds a re-cut of a curation run \(humanset select\), not a curation "
                                         r"run \(humanset curate\); pass another --output"):
        curate([str(score_all_run.parent / "crawl")], str(out), demo_config(), progress=False)


def test_refused_thresholds_leave_the_output_free_for_others(demo_run, tmp_path):
    out = tmp_path / "x"
    with pytest.raises(SelectError, match="never scored by it"):
        select(str(demo_run[0]), str(out), ["dedup.max_distance=null", "dedup.exact=false"], progress=False)
    select(str(demo_run[0]), str(out), ["size.min_short_side=600"], progress=False)  # not refused as "another"


def test_a_run_from_before_person_score_keeps_its_raw_cut_and_accepts_the_key(tmp_path):
    """A manifest without person.score (written before it existed) cut the raw score: a re-cut keeps
    that meaning rather than taking today's default (calibrated), and --set person.score=... is known."""
    from pipeline.config import default_config
    from pipeline.select.recut import plan

    config = default_config()
    del config["person"]["score"]
    (tmp_path / "manifest.json").write_text(json.dumps({"status": "complete", "config": config, "inputs": ["crawl"],
                                                        "stages": config["stages"]}))
    _, new, changed = plan(str(tmp_path), ["person.min_score=0.95"])
    assert new["person"]["score"] == "raw" and changed == ["person.min_score"]
    _, new, changed = plan(str(tmp_path), ["person.score=calibrated"])
    assert new["person"]["score"] == "calibrated" and changed == ["person.score"]
    with pytest.raises(ValueError, match="person.score must be one of calibrated, raw"):
        plan(str(tmp_path), ["person.score=bogus"])
