"""The explore room reads the person score the run's person.score cut: `humanset stats`, `report` and
`browse` on a run whose config says calibrated show person_score_calibrated with the threshold; a run
written before person.score existed (no key: raw) keeps the raw score; per box, only the verdicts
the stored columns decide (explore.person_rule.box_verdicts)."""
from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request

import numpy as np
import pytest

from explore import cli, stats
from explore.browse.server import BrowseApp, start
from explore.person_rule import box_verdicts, rule
from explore.report import render_report
from stats_run import make_run

CALIBRATED = {"config": {"person": {"min_score": 0.9, "min_box_px": 300, "box_rule": "longer_side",
                                    "score": "calibrated"}}}
RAW_OLD = {"config": {"person": {"min_score": 0.9, "min_box_px": 300, "box_rule": "longer_side"}}}


@pytest.fixture(scope="module")
def calibrated_run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("calibrated"), n=40, person_score="calibrated")


def _score(s: dict, column: str) -> dict | None:
    return next((x for x in s["scores"] if x["column"] == column), None)


def _f32(v) -> float:
    return float(np.float32(v))


def test_stats_of_a_calibrated_run_put_the_threshold_on_the_calibrated_column(calibrated_run):
    run_dir, rows = calibrated_run
    s = stats.run_stats(run_dir)
    cal, raw = _score(s, "person_score_calibrated"), _score(s, "person_score_max")
    measured = [r for r in rows if r.get("person_score_calibrated") is not None]
    assert cal["threshold"] == {"key": "person.min_score", "value": 0.9, "keep": "> 0.9"}
    assert cal["n"] == len(measured)
    assert cal["fail_threshold"] == sum(_f32(r["person_score_calibrated"]) <= 0.9 for r in measured)
    # the calibrated scores differ from the raw ones here, so the count is the calibrated column's
    assert cal["fail_threshold"] != sum(_f32(r["person_score_max"] or 0) <= 0.9 for r in measured)
    assert raw["threshold"] is None and "fail_threshold" not in raw  # shown, not cut
    assert s["persons"]["score_kind"] == "calibrated" and s["persons"]["column"] == "person_score_calibrated"


def test_stats_text_names_the_calibrated_score(calibrated_run, capsys):
    run_dir, _ = calibrated_run
    assert cli.main(["stats", str(run_dir)]) == 0
    text = capsys.readouterr().out
    assert "(rule: calibrated score > 0.9, box longer_side > 300 px)" in text
    assert "per box the raw score" in text
    line = next(x for x in text.splitlines() if x.strip().startswith("person.person_score_calibrated"))
    assert "> 0.9" in line
    raw_line = next(x for x in text.splitlines() if x.strip().startswith("person.person_score_max"))
    assert "> 0.9" not in raw_line


def test_a_run_from_before_person_score_reads_raw(tmp_path):
    run_dir, rows = make_run(tmp_path, n=24)  # config without person.score
    s = stats.run_stats(run_dir)
    raw = _score(s, "person_score_max")
    assert raw["threshold"]["value"] == 0.9 and s["persons"]["score_kind"] == "raw"
    assert raw["fail_threshold"] == sum(_f32(r["person_score_max"]) <= 0.9 for r in rows
                                        if r.get("person_score_max") is not None)
    assert _score(s, "person_score_calibrated") is None  # an old catalog has no calibrated score


def test_a_run_that_says_raw_shows_the_calibrated_score_without_a_threshold(tmp_path):
    run_dir, _ = make_run(tmp_path, n=24, person_score="raw")
    s = stats.run_stats(run_dir)
    assert _score(s, "person_score_max")["threshold"]["value"] == 0.9
    assert _score(s, "person_score_calibrated")["threshold"] is None


def test_report_of_a_calibrated_run(calibrated_run):
    run_dir, _ = calibrated_run
    page = render_report(run_dir, thumbs=2, max_reasons=2)
    alts = re.findall(r'<img alt="([^"]*)"', page)
    assert "person_score_calibrated histogram, threshold person.min_score = 0.9" in alts
    assert "person_score_max histogram, no threshold" in alts
    assert ("person score histogram, no threshold (the cut reads person_score_calibrated, per image)"
            in [a.replace("&quot;", '"') for a in alts])
    assert "green passes the person rule (calibrated score &gt; 0.9, box longer_side &gt; 300 px)" in page


@pytest.mark.parametrize("manifest, n_pass, want", [
    # boxes: 0 large with raw 0.95, 1 large with raw 0.5, 2 small with raw 0.99
    (RAW_OLD, 1, [True, False, False]),                # raw: every box decided by its own score
    (CALIBRATED, 0, [False, False, False]),           # no person passed: every box fails
    (CALIBRATED, 2, [True, True, False]),             # both large boxes passed (raw 0.5 or not)
    (CALIBRATED, 1, [None, None, False]),             # one of two large boxes: which one is not stored
    (CALIBRATED, None, [None, None, False]),          # not counted: only the box size decides
])
def test_box_verdicts(manifest, n_pass, want):
    row = {"person_boxes": [[0, 0, 100, 400], [0, 0, 320, 100], [0, 0, 100, 100]],
           "person_scores": [0.95, 0.5, 0.99], "person_n_pass": n_pass}
    assert box_verdicts(row, rule(manifest)) == want


def test_box_verdicts_judge_original_pixels():
    row = {"person_boxes": [[0, 0, 100, 200]], "person_scores": [0.95], "resolution_scale": 2.0, "person_n_pass": 1}
    assert box_verdicts(row, rule(RAW_OLD)) == [True] and box_verdicts(row, rule(CALIBRATED)) == [True]
    assert box_verdicts({**row, "resolution_scale": None}, rule(RAW_OLD)) == [False]
    assert box_verdicts(row, rule({})) == [None]  # no config: no threshold known


def _get(url: str, path: str):
    with urllib.request.urlopen(url + path, timeout=60) as r:
        return json.loads(r.read())


def test_browse_filters_sorts_and_judges_on_the_calibrated_score(calibrated_run, tmp_path):
    run_dir, rows = calibrated_run
    app = BrowseApp(run_dir, tmp_path / "labels.csv")
    server, url = start(app)
    try:
        s = _get(url, "/api/summary")
        t = s["thresholds"]["person"]
        assert t["column"] == "person_score_calibrated" and t["value"] == 0.9
        assert t["score_label"] == "calibrated score"
        got = _get(url, "/api/samples?" + urllib.parse.urlencode({"person_min": 0.5, "size": 200}))["rows"]
        want = {r["sample_id"] for r in rows if r.get("person_score_calibrated") is not None
                and _f32(r["person_score_calibrated"]) >= 0.5}
        assert {r["sample_id"] for r in got} == want
        assert want != {r["sample_id"] for r in rows if r.get("person_score_max") is not None
                        and _f32(r["person_score_max"]) >= 0.5}  # the raw column would answer otherwise
        page = _get(url, "/api/samples?sort=person&size=200")["rows"]
        vals = [r["person_score_calibrated"] for r in page if r["person_score_calibrated"] is not None]
        assert vals == sorted(vals, reverse=True)
        assert len(vals) == sum(r.get("person_score_calibrated") is not None for r in rows)
        kept = next(r for r in rows if r["keep"] and r.get("n_persons", 0) >= 2)
        sample = _get(url, f"/api/sample/{kept['sample_id']}")
        assert sample["person_rule"]["score_kind"] == "calibrated"
        # every large box passed (person_n_pass counts them all); the small weak one fails
        assert [p["passes"] for p in sample["persons"]] == [True] * kept["person_n_pass"] + [False]
    finally:
        server.shutdown()
        server.server_close()
        app.close()


def test_browse_of_a_raw_run_keeps_the_raw_column(tmp_path):
    run_dir, _ = make_run(tmp_path, n=12)
    app = BrowseApp(run_dir, None)
    try:
        t = app.catalog.summary()["thresholds"]["person"]
        assert t["column"] == "person_score_max" and t["score_label"] == "raw score"
        assert app.catalog.sample(app.catalog.page({})["rows"][0]["sample_id"])["person_rule"]["score_kind"] == "raw"
    finally:
        app.close()
