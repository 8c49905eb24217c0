"""humanset calibrate: the precision/recall math on known inputs, and the command on a small run."""
from __future__ import annotations

import json
import math

import pytest

import catalog
from humanset.cli import main
from pipeline.config import default_config
from pipeline.select.calibrate import at_threshold, pr_curve, read_labels, threshold_for_precision
from pipeline.stages.person_calibration import load_calibration


def test_pr_curve_on_known_scores():
    scores = [0.1, 0.4, 0.35, 0.8, 0.9, 0.9]
    labels = [0, 0, 1, 1, 1, 0]
    curve = pr_curve(scores, labels)
    by_t = {round(p.threshold, 6): p for p in curve}
    assert [round(p.threshold, 6) for p in curve] == [round(0.1 - 1e-6, 6), 0.1, 0.35, 0.4, 0.8, 0.9]
    first = curve[0]  # everything predicted positive
    assert (first.tp, first.fp, first.fn, first.tn) == (3, 3, 0, 0) and first.precision == 0.5
    p = by_t[0.35]    # predicted positive: 0.4, 0.8, 0.9, 0.9 -> tp 2 (0.8, 0.9), fp 2 (0.4, 0.9)
    assert (p.tp, p.fp, p.fn, p.tn) == (2, 2, 1, 1)
    p = by_t[0.4]     # 0.8, 0.9, 0.9 -> tp 2, fp 1
    assert p.precision == pytest.approx(2 / 3) and p.recall == pytest.approx(2 / 3)
    last = by_t[0.9]  # nothing above the top score
    assert last.tp == 0 and math.isnan(last.precision) and last.recall == 0


def test_threshold_for_target_precision():
    scores = [0.2, 0.3, 0.5, 0.6, 0.7, 0.95]
    labels = [0, 1, 0, 1, 1, 1]
    curve = pr_curve(scores, labels)
    best = threshold_for_precision(curve, 1.0)
    # above 0.5 everything is positive: precision 1, recall 3/4; above 0.3 one negative sneaks in
    assert best.threshold == 0.5 and best.recall == pytest.approx(0.75)
    assert threshold_for_precision(curve, 0.8).threshold == pytest.approx(0.2)  # 4 tp / 5 -> 0.8
    assert threshold_for_precision(pr_curve([0.9, 0.8], [0, 0]), 0.5) is None
    assert at_threshold(curve, 0.55).threshold == 0.5


def test_read_labels_validates(tmp_path):
    good = tmp_path / "labels.csv"
    good.write_text("sample_id,label\na,person=1\nb,person=0\na,text=0\n\n")
    assert read_labels(good) == {"person": {"a": 1, "b": 0}, "text": {"a": 0}}
    bad = tmp_path / "bad.csv"
    bad.write_text("a,face=1\n")
    with pytest.raises(ValueError, match="bad.csv:1: unknown stage 'face'"):
        read_labels(bad)
    bad.write_text("a,person=yes\n")
    with pytest.raises(ValueError, match="0 or 1"):
        read_labels(bad)


def _run_dir(tmp_path):
    """A run with 8 scored samples: persons with known boxes and scores, text fractions."""
    big, small = [0.0, 0.0, 200.0, 500.0], [0.0, 0.0, 50.0, 100.0]
    rows = [
        # sample, person boxes/scores,                text_area_frac
        ("p1", [big], [0.93], 0.0), ("p2", [big], [0.88], 0.01), ("p3", [big, small], [0.85, 0.99], 0.0),
        ("n1", [small], [0.97], 0.2), ("n2", [], [], 0.11), ("n3", [big], [0.40], 0.04),
        ("u1", None, None, None), ("p4", [big], [0.91], 0.0),
    ]
    table = catalog.conform([{"sample_id": s, "person_boxes": b, "person_scores": sc, "text_area_frac": t}
                             for s, b, sc, t in rows], catalog.SAMPLES)
    run = tmp_path / "run"
    catalog.write_parquet(run / "catalog" / "samples" / "part-0.parquet", table)
    cfg = default_config()
    cfg["person"]["score"] = "raw"  # no keypoints here: the raw score is swept
    (run / "manifest.json").write_text(json.dumps({"config": cfg}))
    labels = tmp_path / "labels.csv"
    labels.write_text("sample_id,label\n" + "".join(
        f"{s},person={int(s.startswith('p'))}\n" for s, *_ in rows) + "n1,text=1\nn2,text=1\nn3,text=0\np1,text=0\n"
        "p2,text=0\nghost,text=1\n")
    return run, labels


def test_calibrate_command_prints_thresholds_and_writes_png(tmp_path, capsys):
    run, labels = _run_dir(tmp_path)
    png = tmp_path / "curves.png"
    assert main(["calibrate", str(run), "--labels", str(labels), "--target-precision", "1.0",
                 "--out", str(png)]) == 0
    out = capsys.readouterr().out
    # person: the small box of p3 (0.99) and of n1 (0.97) do not count under min_box_px 300,
    # so p3's score is 0.85 and n1's 0; n3 scores 0.40. Precision 1 holds above 0.40, recall 4/4.
    assert "person: 7 labelled samples with a score (4 positive), 1 not scored" in out
    assert "--set person.min_score=0.4 (precision 1.000, recall 1.000)" in out
    # the config's 0.9 keeps only p1 and p4: recall 0.5
    assert "config person.min_score=0.9: precision 1.000, recall 0.500" in out
    # text: n1 (0.2) and n2 (0.11) have text, n3 (0.04), p1, p2 do not; ghost is not in the run
    assert "text: 5 labelled samples with a score (2 positive), 0 not scored by the stage, 1 not in the run" in out
    assert "--set text.max_area_frac=0.04 (precision 1.000, recall 1.000)" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_calibrate_command_reports_bad_input(tmp_path, capsys):
    run, _ = _run_dir(tmp_path)
    assert main(["calibrate", str(run), "--labels", str(tmp_path / "none.csv")]) == 2
    assert "no such file" in capsys.readouterr().err


def _kpts(head: float) -> list[float]:
    return [v for k in range(17) for v in (float(k), float(k), head if k < 5 else 0.5)]


def test_fit_person_writes_a_calibration_the_config_reads(tmp_path, capsys):
    """Raw score and head keypoints each overlap between the classes, together they separate them; the
    report after the fit sweeps the calibrated score."""
    big = [0.0, 0.0, 300.0, 480.0]
    pos = [(0.80, 0.55), (0.92, 0.45), (0.78, 0.95), (0.88, 0.80), (0.84, 0.65), (0.90, 0.90), (0.79, 0.85),
           (0.86, 0.60)]
    neg = [(0.82, 0.10), (0.62, 0.60), (0.76, 0.35), (0.70, 0.20), (0.86, 0.05), (0.66, 0.50), (0.74, 0.15),
           (0.80, 0.40)]
    rows = [(f"p{i}", s, h, 1) for i, (s, h) in enumerate(pos)] + [(f"n{i}", s, h, 0) for i, (s, h) in enumerate(neg)] \
        + [("s0", 0.95, 0.9, 0)]
    table = catalog.conform([{"sample_id": s, "person_boxes": [big if s != "s0" else [0, 0, 50, 90]],
                              "person_scores": [sc], "person_keypoints": [_kpts(h)]}
                             for s, sc, h, _ in rows], catalog.SAMPLES)
    run = tmp_path / "run"
    catalog.write_parquet(run / "catalog" / "samples" / "part-0.parquet", table)
    labels = tmp_path / "labels.csv"
    labels.write_text("sample_id,label\n" + "".join(f"{s},person={y}\n" for s, _, _, y in rows))
    out = tmp_path / "cal" / "person.json"
    assert main(["calibrate", str(run), "--labels", str(labels), "--fit-person", str(out),
                 "--out", str(tmp_path / "c.png")]) == 0
    text = capsys.readouterr().out
    assert "person calibration (16 samples, 8 positive" in text  # s0's box is under 300 px: left out
    assert f"--set person.calibration={out}" in text
    cal = load_calibration(out)
    assert cal.fitted_on["n"] == 16 and cal.coef[0] > 0 and cal.coef[2] > 0
    pos = cal.box_scores([big], [0.85], [_kpts(0.90)])[0]
    neg = cal.box_scores([big], [0.60], [_kpts(0.10)])[0]
    assert pos > 0.9 > neg
    assert "config person.min_score=0.9: precision 1.000, recall 0.875" in text  # p0 (0.80, head 0.55): 0.86
