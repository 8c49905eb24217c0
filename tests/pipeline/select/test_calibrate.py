"""humanset calibrate: the precision/recall math on known inputs, and the command on a small run."""
from __future__ import annotations

import math

import pytest

import catalog
from humanset.cli import main
from pipeline.select.calibrate import at_threshold, pr_curve, read_labels, threshold_for_precision


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
