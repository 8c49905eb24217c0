"""`humanset stats`: every number checked against the synthetic run's own rows."""
from __future__ import annotations

import json
import shutil
from collections import Counter

import numpy as np
import pytest

import catalog
from explore import cli, stats
from catalog.source_bytes import read_source, split_source_uri
from stats_run import STAGES, make_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("stats"))


def test_totals_funnel_and_reasons_match_the_rows(run):
    run_dir, rows = run
    s = stats.run_stats(run_dir)
    kept = [r for r in rows if r["keep"]]
    assert s["totals"]["inputs"] == len(rows)
    assert s["totals"]["kept"] == len(kept)
    assert s["totals"]["decode_errors"] == sum(r.get("decode_error") is not None for r in rows)

    first_stage = Counter(r["reject_reason"].split(":")[0] for r in rows if not r["keep"])
    funnel = {f["stage"]: f for f in s["funnel"]}
    assert [f["stage"] for f in s["funnel"]] == ["inputs"] + STAGES + ["art", "kept"]
    left = len(rows)
    for stage in STAGES:
        left -= first_stage[stage]
        assert funnel[stage]["count"] == left, stage
        assert funnel[stage]["dropped"] == first_stage[stage]
    assert funnel["art"]["skipped"].startswith("no OpenCLIP")
    assert funnel["kept"]["count"] == len(kept)
    assert funnel["kept"]["pct"] == pytest.approx(100 * len(kept) / len(rows), abs=0.01)

    want = Counter(r["reject_reason"] for r in rows if r["reject_reason"])
    assert {x["reason"]: x["first"] for x in s["reasons"]} == dict(want)
    assert sum(x["first"] for x in s["reasons"]) == len(rows) - len(kept)


def test_decode_errors_persons_and_duplicates(run):
    run_dir, rows = run
    s = stats.run_stats(run_dir)
    kinds = Counter(r["decode_error"].split(":")[0] for r in rows if r.get("decode_error"))
    assert {d["kind"]: d["count"] for d in s["decode_errors"]} == dict(kinds)

    decoded = [r for r in rows if r.get("decode_error") is None]
    assert s["formats"] == [{"format": "JPEG", "count": len(decoded), "kept": sum(r["keep"] for r in rows)}]

    per_image = Counter(min(r["person_n_pass"], 5) for r in rows if r["keep"])
    assert s["persons_per_kept_image"] == {"1": per_image[1], "2": per_image[2], "3": per_image[3],
                                           "4": per_image[4], "5+": per_image[5]}

    looked = [r for r in rows if r.get("person_look_box") is not None]
    assert looked and s["persons"]["second_look"] == {
        "read": len(looked), "passed": sum(r["person_n_pass"] > 0 for r in looked),
        "kept": sum(r["person_n_pass"] > 0 and r["keep"] for r in looked)}
    assert 0 < s["persons"]["second_look"]["kept"] < len(looked)
    look = next(x for x in s["scores"] if x["column"] == "person_look_score")
    assert look["n"] == len(looked) and look["threshold"] is None

    dups = [r for r in rows if r.get("dup_of")]
    assert s["duplicates"]["duplicates"] == len(dups) == s["duplicates"]["exact"]
    assert s["duplicates"]["clusters"] == len({r["dup_of"] for r in dups})
    assert s["duplicates"]["largest_cluster"] == 2
    assert s["curated"]["samples"] == sum(r["keep"] for r in rows)

    by_shard = Counter(r["shard"] for r in rows)
    kept_by_shard = Counter(r["shard"] for r in rows if r["keep"])
    assert {x["shard"]: (x["inputs"], x["kept"]) for x in s["per_source"]} == {
        k: (n, kept_by_shard[k]) for k, n in by_shard.items()}


def test_distributions_match_numpy(run):
    run_dir, rows = run
    s = stats.run_stats(run_dir)
    kept_w = [r["width"] for r in rows if r["keep"]]
    q = s["geometry"]["kept"]["width"]["quantiles"]
    assert q["p50"] == pytest.approx(np.quantile(kept_w, 0.5), abs=1e-3)
    assert q["p95"] == pytest.approx(np.quantile(kept_w, 0.95), abs=1e-3)

    scores = [x for r in rows for x in (r.get("person_scores") or [])]
    d = s["persons"]["detected"]["score"]
    assert d["n"] == len(scores)
    assert d["quantiles"]["p25"] == pytest.approx(np.quantile(np.float32(scores), 0.25), abs=1e-3)
    sides = [max(b[2] - b[0], b[3] - b[1]) for r in rows for b in (r.get("person_boxes") or [])]
    assert s["persons"]["detected"]["box_longer_side"]["quantiles"]["p100"] == pytest.approx(max(sides), abs=0.01)

    by_col = {x["column"]: x for x in s["scores"]}
    assert "art_score" not in by_col  # the art stage never measured anything
    wm = [r["watermark_score"] for r in rows if r.get("watermark_score") is not None]
    assert by_col["watermark_score"]["n"] == len(wm)
    assert by_col["watermark_score"]["threshold"] == {"key": "watermark.max_score", "value": 0.8, "keep": "<= 0.8"}
    assert by_col["watermark_score"]["fail_threshold"] == sum(x > 0.8 for x in wm)
    box = [r["person_box_max_px"] for r in rows if r.get("person_box_max_px") is not None]
    assert by_col["person_box_max_px"]["fail_threshold"] == sum(x < 300 for x in box)


def test_histogram_bins_every_value_once(run):
    run_dir, rows = run
    con, (p,) = stats.open_runs(run_dir)
    h = stats.histogram(con, "short_side", "samples", bins=10)
    decoded = [r["short_side"] for r in rows if r.get("short_side") is not None]
    assert sum(h["counts"]) == len(decoded) and len(h["edges"]) == 11
    h = stats.histogram(con, "score", stats.persons_source(p), bins=20, lo=0.0, hi=1.0)
    assert sum(h["counts"]) == sum(len(r.get("person_scores") or []) for r in rows)
    assert h["counts"][19] == sum(s >= 0.95 for r in rows for s in (r.get("person_scores") or []))
    con.close()


def test_cli_text_and_json(run, capsys):
    run_dir, rows = run
    assert cli.main(["stats", str(run_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["totals"]["inputs"] == len(rows)
    assert cli.main(["stats", str(run_dir)]) == 0
    text = capsys.readouterr().out
    for needle in ["Funnel", "person:no_person", "Persons per kept image", "5+", "watermark.watermark_score",
                   "crawl-00000.tar", "largest cluster", "truncated"]:
        assert needle in text, needle
    # the person rule printed as catalog/rules.py declares it: strictly greater, as in Sapiens
    assert "(rule: raw score > 0.9, box longer_side > 300 px)" in text and ">=" not in text.split("Detected persons")[1][:80]
    looked = sum(r.get("person_look_box") is not None for r in rows)  # the look's pose score, over the images it read
    assert any(line.split()[:2] == ["person.person_look_score", str(looked)] for line in text.splitlines())


def test_two_runs_side_by_side(run, tmp_path, capsys):
    """B re-thresholds A's person scores (what `humanset select` produces): the overlap says who left."""
    run_dir, rows = run
    b = tmp_path / "b"
    shutil.copytree(run_dir, b)
    tighter = [dict(r) for r in rows]
    dropped = 0
    for r in tighter:
        if r["keep"] and r["person_score_max"] < 0.98:
            r.update(keep=False, reject_reason="person:score<0.98", reject_reasons=["person:score<0.98"])
            dropped += 1
    assert dropped > 0
    catalog.write_parquet(b / "catalog" / "samples" / "part-00000.parquet", catalog.conform(tighter, catalog.SAMPLES))
    s = stats.run_stats(run_dir, b)
    assert [x["totals"]["kept"] for x in s["runs"]] == [sum(r["keep"] for r in rows),
                                                       sum(r["keep"] for r in tighter)]
    o = s["overlap"]
    assert (o["kept_only_in_a"], o["kept_only_in_b"], o["only_in_a"]) == (dropped, 0, 0)
    assert o["why_b_rejected_a_kept"] == [{"reason": "person:score<0.98", "count": dropped}]
    assert cli.main(["stats", str(run_dir), str(b)]) == 0
    text = capsys.readouterr().out
    assert "left A" in text and "left B" in text and "kept only in A" in text


def test_without_manifest_stage_order_comes_from_rows(run, tmp_path):
    run_dir, rows = run
    b = tmp_path / "b"
    shutil.copytree(run_dir, b)
    (b / "manifest.json").unlink()
    s = stats.run_stats(b)
    assert not s["run"]["has_manifest"]
    assert [f["stage"] for f in s["funnel"]] == ["inputs"] + STAGES + ["kept"]
    assert all(x["threshold"] is None for x in s["scores"])


def test_stats_into_a_closed_pipe_ends_quietly(run):
    """`humanset stats RUN | head`: the reader is gone; no BrokenPipeError traceback, the status a shell shows."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.Popen([sys.executable, "-m", "humanset.cli", "stats", str(run[0])], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    p.stdout.close()  # before the first line is read
    err = p.stderr.read()
    assert p.wait(timeout=300) == 141 and err == "", err


def test_missing_run_is_a_clear_error(tmp_path, capsys):
    assert cli.main(["stats", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli.main(["stats", str(tmp_path / "empty")]) == 2
    assert "no catalog/samples" in capsys.readouterr().err


def test_read_source_tar_member_file_and_uri(run):
    run_dir, rows = run
    tar_row = next(r for r in rows if "#" in r["source_uri"])
    loose_row = next(r for r in rows if "#" not in r["source_uri"])
    import hashlib

    for r in (tar_row, loose_row):
        assert hashlib.sha256(read_source(r["source_uri"])).hexdigest() == r["sha256"]
    # the same through pyarrow's file system layer
    tar, member = split_source_uri(tar_row["source_uri"])
    assert hashlib.sha256(read_source(f"file://{tar}#{member}")).hexdigest() == tar_row["sha256"]
    with pytest.raises(FileNotFoundError, match="no member 'nope.jpg'"):
        read_source(f"{tar}#nope.jpg")
    with pytest.raises(FileNotFoundError):
        read_source(loose_row["source_uri"] + ".gone")


def test_reservoir_quantiles_for_large_catalogs_agree_on_small_ones(run):
    """Above EXACT_MAX_ROWS quantiles come from a reservoir sample; with fewer values than the
    reservoir holds, they must equal the exact ones."""
    run_dir, _ = run
    con, (p,) = stats.open_runs(run_dir)
    manifest = stats.read_manifest(run_dir)
    exact = stats.collect(con, manifest, run_dir, p, exact=True)
    approx = stats.collect(con, manifest, run_dir, p, exact=False)
    con.close()
    assert approx["geometry"]["kept"]["width"]["approximate"] is True
    for scope, col in [("decoded", "aspect"), ("kept", "short_side")]:
        a, e = approx["geometry"][scope][col]["quantiles"], exact["geometry"][scope][col]["quantiles"]
        assert a["p0"] == e["p0"] and a["p100"] == e["p100"]
        assert a["p50"] == pytest.approx(e["p50"], rel=0.05)
    assert [x["n"] for x in approx["scores"]] == [x["n"] for x in exact["scores"]]
    assert approx["persons"]["detected"]["score"]["n"] == exact["persons"]["detected"]["score"]["n"]


@pytest.mark.parametrize("reason, kind", [
    ("decode:truncated: image file is truncated (12 bytes)", "decode:truncated"),
    ("size:short_side<300", "size:short_side<300"), ("dedup", "dedup"), (" text:area_frac>0.05 ", "text:area_frac>0.05"),
])
def test_reason_kind_in_python_and_sql_agree(reason, kind):
    import duckdb

    assert stats.reason_kind(reason) == kind
    sql = duckdb.connect().execute(f"SELECT {stats.REASON_KIND.format(col='?')}", [reason]).fetchone()[0]
    assert sql == kind
