"""bench/quality.py's scoring on a tiny synthetic catalog, and the category -> calibrate label mapping."""
import importlib.util
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from catalog.schema import SAMPLES
from pipeline.select.calibrate import read_labels

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_quality", ROOT / "bench" / "quality.py")
quality = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(quality)

# id: (category, keep, reject_reasons, scored_stages, person_n_pass)
ALL = ["decode", "size", "dedup", "person", "text", "watermark"]
ROWS = {
    "pc-kept": ("person_clear", True, [], ALL, 1),
    "pc-kept2": ("person_clear", True, [], ALL, 2),
    "pc-lost": ("person_clear", False, ["watermark:watermark_score>0.8"], ALL, 1),
    "ps-kept": ("person_small", True, [], ALL, 1),            # a false keep of the person rule
    "np-1": ("no_person", False, ["person:persons<1", "watermark:watermark_score>0.8"], ALL, 0),
    "np-2": ("no_person", False, ["person:persons<1"], ALL, 0),
    "tm-1": ("text_or_mark", False, ["person:persons<1", "text:text_area_frac>0.03"], ALL, 0),
    "nph-1": ("non_photo", False, ["size:short_side<300"], ["decode", "size"], None),
    "pp-1": ("painted_person", True, [], ALL, 1),
}


def _run(tmp_path: Path, rows=ROWS) -> Path:
    recs = []
    for i, (rid, (_, keep, reasons, stages, n_pass)) in enumerate(rows.items()):
        recs.append({"sample_id": f"{i:024x}", "source_uri": str(tmp_path / "in" / f"{rid}.jpg"), "keep": keep,
                     "reject_reason": reasons[0] if reasons else None, "reject_reasons": reasons,
                     "scored_stages": stages, "person_n_pass": n_pass})
    folder = tmp_path / "run" / "catalog" / "samples"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(recs, schema=SAMPLES), folder / "part-00000.parquet")
    return tmp_path / "run"


def test_score_of_a_synthetic_catalog(tmp_path):
    run = _run(tmp_path)
    samples = quality.read_samples(run)
    assert {s["id"] for s in samples} == set(ROWS)
    out = quality.score(samples, {k: v[0] for k, v in ROWS.items()})
    assert out["n"] == 9 and out["missing_from_run"] == []
    assert out["categories"]["person_clear"] == {"n": 3, "kept": 2, "keep_rate": 0.6667}
    assert out["categories"]["painted_person"]["keep_rate"] == 1.0
    assert out["kept"] == {"n": 4, "person_clear_share": 0.5, "person_clear_recall": 0.6667}
    # the person stage alone: it passed 3 person_clear, plus person_small and painted_person
    assert out["person_rule"] == {"tp": 3, "fp": 2, "fn": 0, "tn": 4, "recall": 1.0, "precision": 0.6}
    conf = out["confusion"]
    assert conf["first_reject"] == {"watermark": {"person_clear": 1}, "person": {"no_person": 2, "text_or_mark": 1},
                                    "size": {"non_photo": 1}}
    assert conf["any_reject"]["watermark"] == {"person_clear": 1, "no_person": 1}
    assert conf["any_reject"]["text"] == {"text_or_mark": 1}
    assert conf["reasons"]["size:short_side"] == {"non_photo": 1}
    # every clean photo was scored by the watermark stage; two of six rejected
    # reaching: np-1 and np-2 fail the person stage, which runs before the watermark stage, so four reach it
    assert out["watermark"] == {"clean_photos": 6, "scored": 6, "rejected": 2, "ids": ["np-1", "pc-lost"],
                                "false_positive_rate": 0.3333, "must_pass": {},
                                "reaching": {"clean_photos": 4, "rejected": 1, "ids": ["pc-lost"],
                                             "false_positive_rate": 0.25}}
    # in an order where the watermark stage runs first, every scored clean photo reaches it
    first = quality.score(samples, {k: v[0] for k, v in ROWS.items()}, before_watermark=())
    assert first["watermark"]["reaching"] == {"clean_photos": 6, "rejected": 2, "ids": ["np-1", "pc-lost"],
                                              "false_positive_rate": 0.3333}
    # the official portrait of issue 38, by name: passed when the watermark stage did not fail it
    named = quality.score([{"id": "face-recognition-obama", "keep": True, "scored_stages": ALL, "person_n_pass": 1}],
                          {"face-recognition-obama": "person_clear"})
    assert named["watermark"]["must_pass"] == {"face-recognition-obama": True}
    named = quality.score([{"id": "face-recognition-obama", "keep": False, "scored_stages": ALL, "person_n_pass": 1,
                            "reject_reason": "watermark:watermark>0.8", "reject_reasons": ["watermark:watermark>0.8"]}],
                          {"face-recognition-obama": "person_clear"})
    assert named["watermark"]["must_pass"] == {"face-recognition-obama": False}
    assert conf["person_clear_lost_to"] == {"watermark": 1}
    assert out["ids"] == {"person_clear_rejected": ["pc-lost"], "person_clear_lost_to": {"pc-lost": "watermark"},
                          "kept_not_person_clear": {"painted_person": ["pp-1"], "person_small": ["ps-kept"]}}
    t = out["targets"]
    assert t["person_clear_kept"] == {"value": 0.6667, "target": ">= 0.9", "met": False, "k": 2, "n": 3,
                                      "interval": [0.2077, 0.9385], "settled": False}
    assert t["non_photo_kept"]["met"] is True and t["painted_person_kept"]["met"] is False
    assert t["no_person_kept"]["met"] is True and t["watermark_false_positive_rate"]["met"] is False


def test_targets_say_when_the_split_cannot_settle_them():
    """settled: the interval lies wholly on one side of the target (met or missed whatever the draw)."""
    rows = {f"pc-{i}": "person_clear" for i in range(100)} | {f"np-{i}": "no_person" for i in range(100)}
    samples = [{"id": i, "keep": c == "person_clear" and int(i[3:]) < 97, "scored_stages": ALL,
                "person_n_pass": c == "person_clear"} for i, c in rows.items()]
    t = quality.score(samples, rows)["targets"]
    assert t["person_clear_kept"]["met"] is True and t["person_clear_kept"]["settled"] is True  # 97/100: [0.915, 0.990]
    assert t["no_person_kept"]["met"] is True and t["no_person_kept"]["settled"] is False  # 0/100: up to 0.037
    assert t["kept_person_clear_share"]["k"] == 97 and t["kept_person_clear_share"]["n"] == 97
    few = quality.score(samples[:10] + samples[100:110], rows)["targets"]
    assert few["person_clear_kept"]["met"] is True and few["person_clear_kept"]["settled"] is False  # 10/10: from 0.72
    odd = quality.score(samples[1:100:2] + samples[100:], rows)["targets"]["person_clear_kept"]
    assert (odd["k"], odd["n"], odd["met"], odd["settled"]) == (48, 50, True, False)  # 0.96, from 0.865


def test_lost_people_by_the_stages_that_failed_them():
    """What one stage's change can win back: the people only that stage failed (with --score-all)."""
    rows = {"a": ["person:calibrated_score<=0.9"], "b": ["person:calibrated_score<=0.9", "art:art>0.84"],
            "c": ["art:art>0.84", "person:box<=300px"], "d": ["person:box<=300px"], "e": ["text:text_area>0.03"],
            "f": [], "g": []}  # f lost with no failing stage recorded (a cascade run's dedup, say); g kept
    samples = [{"id": i, "keep": i == "g", "reject_reasons": r, "scored_stages": ALL, "person_n_pass": 0}
               for i, r in rows.items()]
    out = quality.score(samples, dict.fromkeys(rows, "person_clear"))
    assert out["confusion"]["person_clear_lost_to"] == {"art+person": 2, "person": 2, "none": 1, "text": 1}
    assert list(out["confusion"]["person_clear_lost_to"]) == ["art+person", "person", "none", "text"]  # most first
    assert out["ids"]["person_clear_lost_to"] == {"a": "person", "b": "art+person", "c": "art+person",
                                                  "d": "person", "e": "text", "f": "none"}


def test_score_refuses_rows_that_are_not_bench_images(tmp_path):
    samples = quality.read_samples(_run(tmp_path))
    with pytest.raises(ValueError, match="not bench images"):
        quality.score(samples, {"pc-kept": "person_clear"})


def test_reason_kind_drops_the_threshold():
    assert quality.reason_kind("size:short_side<300") == "size:short_side"
    assert quality.reason_kind("watermark:watermark_score>0.8") == "watermark:watermark_score"


def test_stage_labels_mapping():
    assert quality.stage_labels("person_clear") == {"person": 1, "art": 0, "text": 0, "watermark": 0}
    assert quality.stage_labels("person_small") == {"person": 0, "art": 0, "text": 0, "watermark": 0}
    assert quality.stage_labels("no_person") == {"person": 0, "art": 0, "text": 0, "watermark": 0}
    assert quality.stage_labels("text_or_mark") == {"text": 1}
    assert quality.stage_labels("non_photo") == {"person": 0, "art": 1}
    assert quality.stage_labels("painted_person") == {"art": 1}  # person: the art stage's call
    with pytest.raises(ValueError, match="unknown category"):
        quality.stage_labels("cat")


def test_written_labels_read_back_by_calibrate(tmp_path):
    samples = quality.read_samples(_run(tmp_path))
    ids = {s["id"]: f"sid-{s['id']}" for s in samples}
    n = quality.write_labels(tmp_path / "labels.csv", samples, ids, {k: v[0] for k, v in ROWS.items()})
    got = read_labels(tmp_path / "labels.csv")
    assert n == sum(len(v) for v in got.values())
    assert got["person"]["sid-pc-kept"] == 1 and got["person"]["sid-ps-kept"] == 0
    assert got["art"]["sid-pp-1"] == 1 and got["text"]["sid-tm-1"] == 1
    assert "sid-tm-1" not in got["watermark"] and got["watermark"]["sid-np-1"] == 0


def test_compare_counts_wins_and_losses_image_by_image(tmp_path):
    cats = {k: v[0] for k, v in ROWS.items()}
    base = quality.read_samples(_run(tmp_path / "a"))
    changed = dict(ROWS)
    changed["pc-lost"] = ("person_clear", True, [], ALL, 1)                       # a win: a person kept
    changed["pp-1"] = ("painted_person", False, ["art:art_score>0.84"], ALL, 1)   # a win: a painting rejected
    changed["pc-kept2"] = ("person_clear", False, ["art:art_score>0.84"], ALL, 2)  # a loss: a person rejected
    del changed["np-2"]                                                            # only in the baseline
    out = quality.compare(quality.read_samples(_run(tmp_path / "b", changed)), base, cats)
    assert out["categories"] == {"person_clear": {"newly_kept": ["pc-lost"], "newly_rejected": ["pc-kept2"]},
                                 "painted_person": {"newly_kept": [], "newly_rejected": ["pp-1"]}}
    assert (out["wins"], out["losses"]) == (2, 1) and out["only_in_one_run"] == ["np-2"]
    assert out["sign_test_p"] == 1.0  # 2 against 1 is what chance gives
    assert quality.compare(base, base, cats)["wins"] == 0


def test_sign_test_is_the_exact_two_sided_binomial():
    assert quality.sign_test(0, 0) == 1.0
    assert quality.sign_test(5, 0) == quality.sign_test(0, 5) == 2 / 32
    assert quality.sign_test(9, 2) == 2 * (1 + 11 + 55) / 2 ** 11
    assert quality.sign_test(3, 3) == 1.0
