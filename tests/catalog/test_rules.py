"""One owner per rule: every stage's thresholds are declared once (catalog.rules), with defaults equal
to pipeline/default.yaml, and reject(), stats, the report and calibrate agree on every value,
equality included."""
from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from catalog import SAMPLES
from explore import stats
from explore.person_rule import box_verdicts
from catalog.rules import ALL_RULES, CALIBRATED, PERSON_BOX, PERSON_SCORE, RULES
from pipeline.select.calibrate import at_threshold, pr_curve
from pipeline.config import default_config
from pipeline.stages import REGISTRY, stage_class


def _passes(box, score, person: dict) -> bool:
    """The report's verdict on one box under a raw-score rule (explore/person_rule.py)."""
    rule = {"min_score": person["min_score"], "min_box_px": person["min_box_px"],
            "box_rule": person.get("box_rule"), "score_kind": "raw"}
    return box_verdicts({"person_boxes": [box], "person_scores": [score]}, rule)[0]


def _schema(names: list[str]) -> pa.Schema:
    return pa.schema([SAMPLES.field(n) for n in names])


def test_declared_defaults_equal_default_yaml():
    yaml_cfg = default_config()
    for rule in ALL_RULES:
        assert rule.key in yaml_cfg[rule.stage], f"{rule.config_key} is not in default.yaml"
        assert yaml_cfg[rule.stage][rule.key] == rule.default, rule.config_key
    for name in REGISTRY:
        cls = stage_class(name)
        assert cls.rules == RULES.get(name, ()), f"stage {name} must use catalog.rules.RULES[{name!r}]"
        section = yaml_cfg.get(name) or {}
        if "batch_size" in section:
            assert cls.default_batch_size == section["batch_size"], name


@pytest.mark.parametrize("name", ["size", "text", "watermark", "art", "person"])
def test_a_stage_without_config_decides_as_default_yaml(name):
    """No code fallback differs from the YAML: an empty section rejects exactly what the YAML rejects."""
    cls = stage_class(name)
    table = _table_around_thresholds(name)
    yaml_section = {k: v for k, v in default_config()[name].items() if k != "weights"}
    assert cls({}).reject(table) == cls(yaml_section).reject(table)


def _around(t: float) -> list[float]:
    d = max(abs(t) * 1e-3, 1e-3)  # still distinct in float32 (boxes and scores are stored as float32)
    return [t - d, t, t + d, 0.0, t * 2 + 1]


def _table_around_thresholds(name: str) -> pa.Table:
    """Rows on, just below and just above each of the stage's default thresholds (and those of the
    other defaults that would differ from the YAML, e.g. text 0.05)."""
    if name == "person":
        boxes, scores = [], []
        for s in _around(PERSON_SCORE.default):
            for side in _around(PERSON_BOX.default):
                boxes.append([[0.0, 0.0, side / 2, side]])
                scores.append([s])
        n = len(boxes)
        return pa.table({"person_boxes": boxes, "person_scores": scores, "person_error": [None] * n},
                        schema=_schema(["person_boxes", "person_scores", "person_error"]))
    values = {r.column: [] for r in RULES[name]}
    for r in RULES[name]:
        for v in _around(r.default) + ([0.05, 0.04] if name == "text" else []):
            for other in RULES[name]:
                values[other.column].append(v if other is r else (1.0 if other.keeps_below else 1e4))
    n = len(next(iter(values.values())))
    cols = dict(values)
    err = f"{name}_error"
    if err in SAMPLES.names:
        cols[err] = [None] * n
    return pa.table(cols, schema=_schema(list(cols)))


@pytest.mark.parametrize("rule", ALL_RULES, ids=lambda r: r.config_key)
def test_reject_stats_and_report_agree_at_and_around_each_threshold(rule):
    # a threshold float32 holds exactly: scores are stored as float32, so a value "at" 0.8 is 0.8000000119
    t = float(np.float32(rule.default))
    values = _around(t)
    # person: the raw score, whose column the stats' SQL cuts (the calibrated one: tests/pipeline/test_person_calibration.py)
    stage = stage_class(rule.stage)({rule.key: t} | ({"score": "raw"} if rule.stage == "person" else {}))
    # the stage
    if rule.stage == "person":
        other = PERSON_BOX.default * 2 if rule is PERSON_SCORE else 0.99
        boxes = [[[0, 0, (v if rule is PERSON_BOX else other) / 2, v if rule is PERSON_BOX else other]]
                 for v in values]
        scores = [[v if rule is PERSON_SCORE else other] for v in values]
        table = pa.table({"person_boxes": boxes, "person_scores": scores, "person_error": [None] * len(values)},
                         schema=_schema(["person_boxes", "person_scores", "person_error"]))
        stage_keeps = [r is None for r in stage.reject(table)]
        report_keeps = [_passes(b[0], s[0], {"min_score": stage.cfg.get("min_score", PERSON_SCORE.default),
                                             "min_box_px": stage.cfg.get("min_box_px", PERSON_BOX.default)})
                        for b, s in zip(boxes, scores)]
        assert report_keeps == stage_keeps
    else:
        passing = {r.column: 1.0 if r.keeps_below else 1e4 for r in RULES[rule.stage]}  # under the defaults
        cols = {r.column: values if r is rule else [passing[r.column]] * len(values) for r in RULES[rule.stage]}
        cols.update({c: [None] * len(values) for c in [f"{rule.stage}_error"] if c in SAMPLES.names})
        table = pa.table(cols, schema=_schema(list(cols)))
        reasons = stage.reject(table)
        stage_keeps = [r is None for r in reasons]
        assert {r for r in reasons if r} <= {rule.reason(t)}
    assert stage_keeps == [rule.keeps(v, t) for v in values]
    assert stage_keeps[1] == (rule.keep in (">=", "<=")), "equality is on the kept side only for >= / <="
    # stats: the SQL of the declaration counts the same rows as failing
    con = duckdb.connect()
    sample = pa.table({rule.column: pa.array(values, SAMPLES.field(rule.column).type)})
    con.register("samples", sample)
    fails = con.execute(f"SELECT count(*) FILTER (WHERE {rule.sql_fails(rule.column, t)}) FROM samples").fetchone()[0]
    assert fails == stage_keeps.count(False)


def test_person_rule_keeps_strictly_above_min_score_in_stats_report_and_calibrate():
    t = 0.9
    manifest = {"config": {"person": {"min_score": t, "min_box_px": 300, "box_rule": "longer_side"}}}
    # a catalog of three images whose best person scores exactly t, just above, just below
    table = pa.table({"person_score_max": [t, t + 1e-3, t - 1e-3], "keep": [False, True, False]})
    con = duckdb.connect()
    con.register("samples", table)
    row = next(r for r in _scores(con, manifest) if r["column"] == "person_score_max")
    assert row["threshold"]["keep"] == "> 0.9" and row["fail_threshold"] == 2
    box = [0, 0, 200, 400]
    assert not _passes(box, t, manifest["config"]["person"]) and _passes(box, t + 1e-3, manifest["config"]["person"])
    # calibrate: a labelled sample at exactly t is predicted as the stage decides it (not kept)
    curve = pr_curve([t, t + 1e-3], [1, 1])
    assert at_threshold(curve, t).tp == 1
    assert CALIBRATED["person"] is PERSON_SCORE


def _scores(con, manifest):
    cols = {"short_side", "aspect", "dup_cluster_size", "person_box_max_px", "person_score_calibrated", "n_persons",
            "text_area_frac",
            "watermark_score", "art_score"}
    con.execute("CREATE OR REPLACE VIEW x_samples AS SELECT *, " + ", ".join(f"NULL::DOUBLE AS {c}" for c in cols)
                + " FROM samples")
    return stats.scores(con, manifest, "x_")


def test_no_module_keeps_its_own_copy_of_the_thresholds():
    import explore.stats
    import pipeline.select.calibrate

    assert not hasattr(explore.stats, "STAGE_SCORES") and not hasattr(pipeline.select.calibrate, "STAGE_KEYS")


def test_stats_of_a_run_whose_manifest_holds_a_nan_threshold(tmp_path):
    """Runs made before thresholds were validated may hold NaN: stats show no threshold for it
    instead of failing with a DuckDB Binder Error."""
    import json

    from stats_run import make_run

    run, rows = make_run(tmp_path, n=16)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["config"]["size"]["min_short_side"] = float("nan")
    (run / "manifest.json").write_text(json.dumps(manifest))
    scores = {s["column"]: s for s in stats.run_stats(run)["scores"]}
    assert scores["short_side"]["threshold"] is None and scores["aspect"]["threshold"]["value"] == 3.0


def test_no_stage_reads_a_threshold_with_a_fallback_of_its_own():
    """A threshold is read through its rule (Rule.threshold: the YAML's value or the declared
    default), never as cfg.get(key, <a number of the module's own>)."""
    import inspect
    import re

    for rule in ALL_RULES:
        source = inspect.getsource(inspect.getmodule(stage_class(rule.stage)))
        own = re.findall(rf"""cfg\.get\(\s*["']{rule.key}["']\s*,[^)]*\)""", source)
        assert not own, f"pipeline/stages/{rule.stage}.py reads {rule.config_key} with its own default: {own}"
