"""dedup.max_fallbacks: a cluster keeps its first member in canonical order that the model stages
pass. Real data: skimage's shipped photos, Impact captions the real PP-OCR models (rapidocr) read."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import catalog
from pipeline.engine.driver import curate
from pipeline.select.recut import select
from captioned_photos import fallback_config, write_crawl


@pytest.fixture(scope="module")
def crawl(tmp_path_factory):
    return write_crawl(tmp_path_factory.mktemp("fallback"))


def _rows(run) -> dict[str, dict]:
    rows = catalog.connect(run).sql("SELECT * FROM samples").to_arrow_table().to_pylist()
    return {Path(r["source_uri"]).stem: r for r in rows}


@pytest.fixture(scope="module")
def runs(crawl, ray_local, tmp_path_factory):
    out = {}
    for n in (2, 1, 0):
        run = tmp_path_factory.mktemp(f"fb{n}") / "run"
        out[n] = (run, curate([str(crawl)], str(run), fallback_config(n), progress=False))
    return out


@pytest.mark.e2e
def test_the_clean_copy_is_kept_when_the_captioned_canonical_fails(runs):
    run, manifest = runs[2]
    r = _rows(run)
    assert r["astro_cap900"]["dup_cluster_size"] == 2 and r["cat_cap900"]["dup_cluster_size"] == 3
    kept = {k for k, v in r.items() if v["keep"]}
    assert kept == {"astro_clean", "cat_clean", "coffee"}
    # every scored member carries its own model reason; dup_of names the kept member
    for name, rank in (("astro_cap900", 0), ("cat_cap900", 0), ("cat_cap700", 1)):
        assert r[name]["dup_scored"] and r[name]["dup_rank"] == rank
        assert r[name]["reject_reason"].startswith("text:text_area>"), r[name]["reject_reasons"]
        assert not any(x.startswith("dedup:") for x in r[name]["reject_reasons"])
    assert r["astro_cap900"]["dup_of"] == r["astro_clean"]["sample_id"]
    assert r["cat_cap900"]["dup_of"] == r["cat_cap700"]["dup_of"] == r["cat_clean"]["sample_id"]
    assert (r["astro_clean"]["dup_rank"], r["cat_clean"]["dup_rank"]) == (1, 2)
    assert r["astro_clean"]["dup_of"] is None and r["astro_clean"]["dup_scored"]
    assert r["coffee"]["dup_rank"] == 0 and r["coffee"]["dup_cluster_size"] == 1
    assert manifest["fallbacks"]["rounds"] == {"1": 2, "2": 1}  # rows scored per fallback round (JSON keys)
    assert manifest["counts"] == {"inputs": 6, "kept": 3}
    idx = catalog.read_index(run / "shards").to_pylist()
    assert {x["sample_id"] for x in idx} == {r[k]["sample_id"] for k in kept}


@pytest.mark.e2e
def test_every_pass_of_phase_3_runs_on_the_same_model_actors(runs):
    """Phase 3 fits one pipeline: round 0, both fallback rounds and the write pass ran through it, so the
    rows a fallback round scored were scored by the actor that scored round 0 (the same set-up span)."""
    import pyarrow.parquet as pq

    from pipeline.engine.columns import unit_meta
    run, manifest = runs[2]
    (unit,) = [p.stem for p in (run / "stats").glob("*.json")]
    setup = {r: unit_meta(pq.read_table(run / "work/scored" / sub / f"{unit}.parquet"))["actor_setup"]["text"]
             for r, sub in (("0", ""), ("1", "r1"), ("2", "r2"))}
    assert setup["0"] == setup["1"] == setup["2"]
    names = [name for name, *_ in manifest["timeline"]["spans"]]
    assert names[names.index("score"):names.index("write") + 1] == [
        "score", "exchange_m", "exchange_r1", "fallback_1", "exchange_r2", "fallback_2", "exchange_kept", "write"]


@pytest.mark.e2e
def test_a_unit_outside_every_cluster_is_written_in_round_0(crawl, ray_local, tmp_path):
    """One file a unit: coffee's unit holds no duplicate, so round 0 writes it and no exchange or later
    pass reads it; the verdicts are those of the one-unit run."""
    cfg = fallback_config(2)
    cfg["input"]["files_per_unit"] = 1
    run = tmp_path / "run"
    m = curate([str(crawl)], str(run), cfg, progress=False)
    assert m["fallbacks"]["rounds"] == {"1": 2, "2": 1} and m["counts"] == {"inputs": 6, "kept": 3}
    r = _rows(run)
    assert {k for k, v in r.items() if v["keep"]} == {"astro_clean", "cat_clean", "coffee"}
    units = {p.stem for p in (run / "stats").glob("*.json")}
    scored = {p.stem for p in (run / "work/scored").glob("*.parquet")}  # round 0's rows, kept (keep_work)
    assert len(units) == 6 and len(scored) == 5 and scored < units
    (coffee_unit,) = units - scored
    assert json.loads((run / "stats" / f"{coffee_unit}.json").read_text())["kept"] == 1


@pytest.mark.e2e
def test_one_fallback_loses_the_cluster_whose_first_two_fail(runs):
    r = _rows(runs[1][0])
    assert {k for k, v in r.items() if v["keep"]} == {"astro_clean", "coffee"}
    # cat: canonical and first fallback scored and rejected; the clean copy was never scored
    assert r["cat_cap700"]["dup_scored"] and r["cat_cap700"]["reject_reason"].startswith("text:")
    assert not r["cat_clean"]["dup_scored"] and r["cat_clean"]["reject_reason"] == "dedup:near_duplicate"
    assert r["cat_clean"]["text_area_frac"] is None
    # no member kept: dup_of keeps naming the canonical, as without fallbacks
    assert r["cat_clean"]["dup_of"] == r["cat_cap700"]["dup_of"] == r["cat_cap900"]["sample_id"]


@pytest.mark.e2e
def test_a_complete_run_leaves_no_work_files_of_dedup_and_the_rounds(runs):
    """The partitioned dedup's and the exchanges' files go once the run is complete; what a later
    command reads stays (measure rows, verdicts, dedup's _done.json); keep_work keeps them all."""
    run, manifest = runs[1]
    assert manifest["status"] == "complete" and manifest["fallbacks"]["rounds"]
    for rel in ("work/dedup/dist", "work/dedup/pairs", "work/fallback", "work/scored"):
        assert not (run / rel).exists(), rel
    units = {p.name for p in (run / "stats").glob("*.json")}
    assert {p.stem + ".json" for p in (run / "work/measure").glob("*.parquet")} == units
    assert {p.stem + ".json" for p in (run / "work/dedup").glob("*.parquet")} == units
    assert (run / "work/dedup/_done.json").exists()
    assert json.loads((run / "work/dedup/_done.json").read_text())["components"] == "distributed"
    kept = runs[2][0]
    assert list((kept / "work/fallback").rglob("*.parquet")) and list((kept / "work/scored").glob("*.parquet"))


@pytest.mark.e2e
def test_no_fallbacks_keeps_neither_as_before(runs):
    run, manifest = runs[0]
    r = _rows(run)
    assert {k for k, v in r.items() if v["keep"]} == {"coffee"}
    assert r["astro_cap900"]["reject_reason"].startswith("text:")
    assert r["astro_clean"]["reject_reason"] == "dedup:near_duplicate"
    assert r["astro_clean"]["dup_of"] == r["astro_cap900"]["sample_id"] and not r["astro_clean"]["dup_scored"]
    assert "fallbacks" not in manifest
    assert not (run / "work" / "scored").exists()


@pytest.mark.e2e
def test_select_recut_promotes_the_canonical_and_records_it(runs, tmp_path):
    run, _ = runs[2]
    m = select(str(run), str(tmp_path / "loose"), ["text.max_area_frac=0.5"], progress=False)
    r = _rows(tmp_path / "loose")
    assert {k for k, v in r.items() if v["keep"]} == {"astro_cap900", "cat_cap900", "coffee"}
    assert r["astro_clean"]["reject_reason"] == "dedup:near_duplicate"
    assert r["astro_clean"]["dup_of"] == r["astro_cap900"]["sample_id"] and r["astro_cap900"]["dup_of"] is None
    assert r["cat_cap700"]["dup_of"] == r["cat_cap900"]["sample_id"]
    assert m["fallbacks"]["promoted"] == 2
    # back to the run's thresholds: the run's choice again
    back = select(str(tmp_path / "loose"), str(tmp_path / "back"), ["text.max_area_frac=0.03"], progress=False)
    assert {k for k, v in _rows(tmp_path / "back").items() if v["keep"]} == {"astro_clean", "cat_clean", "coffee"}
    assert back["fallbacks"]["promoted"] == 2


@pytest.mark.e2e
def test_select_never_promotes_an_unscored_member(runs, tmp_path):
    """A re-cut of the one-fallback run with two fallbacks cannot score the clean cat (no model runs):
    the cluster stays lost, counted, and the docs say to rerun curate."""
    m = select(str(runs[1][0]), str(tmp_path / "same"), ["dedup.max_fallbacks=2"], progress=False)
    r = _rows(tmp_path / "same")
    assert {k for k, v in r.items() if v["keep"]} == {"astro_clean", "coffee"}
    assert m["fallbacks"]["unscored"] == 1 and m["fallbacks"]["promoted"] == 0
    assert r["cat_clean"]["reject_reason"] == "dedup:near_duplicate" and not r["cat_clean"]["dup_scored"]


@pytest.mark.e2e
def test_resume_mid_fallback_round_equals_the_clean_run(crawl, runs, tmp_path):
    """What a crash in round 2's scoring leaves (round 2 planned, its unit unscored, no kept
    members, no unit written): the rerun finishes the rounds and writes the clean run's catalog."""
    import shutil
    clean, _ = runs[2]
    run = tmp_path / "run"
    shutil.copytree(clean, run)
    assert (run / "work/fallback/_r2.json").exists() and list((run / "work/scored/r2").glob("*.parquet"))
    for rel in ("work/scored/r2", "work/fallback/kept", "work/fallback/t/kept", "stats", "catalog", "shards"):
        shutil.rmtree(run / rel)
    (run / "work/fallback/_kept.json").unlink()
    m = curate([str(crawl)], str(run), fallback_config(2), progress=False)
    assert m["status"] == "complete" and m["fallbacks"]["rounds"] == {"1": 2, "2": 1}
    q = "SELECT * EXCLUDE (source_uri) FROM samples ORDER BY sample_id"
    assert catalog.connect(run).sql(q).to_arrow_table().equals(catalog.connect(clean).sql(q).to_arrow_table())


def _m(key, rank, sid, sha="x", **kw):
    return {"key": key, "rank": rank, "sample_id": sid, "sha256": sha, "unit": "u", "win": 0, **kw}


def test_cluster_logic_scores_the_next_rank_only_after_a_model_rejection():
    from pipeline.dedup import fallback as fb
    members = [_m("a", 0, "a"), _m("a", 1, "a1", "y"), _m("a", 2, "a2"), _m("b", 0, "b"), _m("b", 1, "b1"),
               _m("c", 0, "c"), _m("c", 1, "c1")]
    out = {"a": fb.REJECTED, "b": fb.PASSED, "c": fb.OTHER}  # c: changed bytes, not a model verdict
    assert [m["sample_id"] for m in fb.next_todo(members, out, 1)] == ["a1"]
    out["a1"] = fb.REJECTED
    assert [m["sample_id"] for m in fb.next_todo(members, out, 2)] == ["a2"]
    out["a2"] = fb.PASSED
    got = {g["sample_id"]: (g["dup_of"], g["dup_kind"]) for g in fb.resolve(members, out)}
    assert got == {"a": ("a2", "exact"), "a1": ("a2", "near"), "a2": (None, None)}  # b keeps its canonical


def test_recut_walk_stops_at_an_unscored_member_and_at_max_fallbacks():
    from pipeline.dedup import fallback as fb
    ms = [_m("k", 0, "k", scored=True, passes=False, kept=False),
          _m("k", 1, "k1", scored=True, passes=True, kept=True),
          _m("k", 2, "k2", scored=False, passes=True, kept=False)]
    choice, n = fb.recut(ms, 2)
    assert choice["k1"] == {"dup_of": None, "dup_kind": None, "dup_scored": True} and n["promoted"] == 0
    assert choice["k2"]["dup_of"] == "k1" and not choice["k2"]["dup_scored"]
    ms[1]["passes"] = False  # stricter: k1 fails now, k2 was never scored -> lost, counted
    choice, n = fb.recut(ms, 2)
    assert n == {"promoted": 0, "unscored": 1, "lost": 1} and choice["k1"]["dup_of"] == "k"
    ms[0]["passes"] = True  # looser: the canonical is promoted over the run's k1
    choice, n = fb.recut(ms, 0)
    assert n["promoted"] == 1 and choice["k"]["dup_of"] is None and choice["k1"]["dup_of"] == "k"
