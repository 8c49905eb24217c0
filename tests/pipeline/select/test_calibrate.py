"""humanset calibrate: the precision/recall math on known inputs, and the command on a small run."""
from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest

import catalog
from humanset.cli import main
from pipeline.config import default_config
from pipeline.select.calibrate import (at_threshold, pr_curve, read_labels, samples_to_settle, threshold_for_precision,
                                       wilson)
from pipeline.select.person_fit import fit_look
from pipeline.stages.person import PersonStage
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


def test_wilson_interval():
    """The 95 % Wilson interval: closed forms at 0/n and n/n, mirror symmetry, and scipy's value."""
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(3.8415 / (10 + 3.8415), abs=1e-4)  # z^2 / (n + z^2)
    lo, hi = wilson(10, 10)
    assert hi == 1.0 and lo == pytest.approx(10 / (10 + 3.8415), abs=1e-4)
    a, b = wilson(83, 102), wilson(19, 102)
    assert a[0] == pytest.approx(1 - b[1]) and a[1] == pytest.approx(1 - b[0])
    assert wilson(83, 102) == pytest.approx((0.72730, 0.87738), abs=1e-5)  # scipy's binomtest gives the same
    with pytest.raises(ValueError, match="0 <= k <= n"):
        wilson(3, 2)


def test_samples_to_settle():
    """At precision 1, the lower end reaches 0.95 at n = z^2 * 0.95 / 0.05 = 73; a precision at or under the target
    never settles it."""
    assert samples_to_settle(1.0, 0.95) == 73
    assert wilson(73, 73)[0] >= 0.95 > wilson(72, 72)[0]
    n = samples_to_settle(0.98, 0.95)
    assert wilson(round(0.98 * n), n)[0] >= 0.95 > wilson(round(0.98 * (n - 1)), n - 1)[0]
    assert samples_to_settle(0.95, 0.95) is None and samples_to_settle(math.nan, 0.9) is None


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
    assert "--set person.min_score=0.4 (precision 1.000, recall 1.000); 95 % intervals 0.510-1.000, 0.510-1.000" in out
    # four labels cannot show a precision of 1: the command says so
    assert "4 labelled samples pass: precision could be 0.510 (95 % interval), so >= 1 is not settled\n" in out
    # the config's 0.9 keeps only p1 and p4: recall 0.5
    assert "config person.min_score=0.9: precision 1.000, recall 0.500; 95 % intervals 0.342-1.000, 0.150-0.850" in out
    # text: n1 (0.2) and n2 (0.11) have text, n3 (0.04), p1, p2 do not; ghost is not in the run
    assert "text: 5 labelled samples with a score (2 positive), 0 not scored by the stage, 1 not in the run" in out
    assert "--set text.max_area_frac=0.04 (precision 1.000, recall 1.000)" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_calibrate_command_reports_bad_input(tmp_path, capsys):
    run, _ = _run_dir(tmp_path)
    assert main(["calibrate", str(run), "--labels", str(tmp_path / "none.csv")]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and f"humanset browse RUN --labels {tmp_path / 'none.csv'}" in err


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
    assert "no second look fit (the run's second look read none of the labelled samples" in text
    assert cal.look is None


def test_fit_person_fits_the_second_look_on_the_samples_it_read(tmp_path, capsys):
    """Where the run's second look read a sample's top box, its stored pose score joins that box's calibrated
    score under the new fit in the look's own fit; the file turns the look on, and the look raises a person's cut
    score. Too few samples of a class, or a sample whose look read another box, give no look fit."""
    big, other = [0.0, 0.0, 300.0, 480.0], [0.0, 0.0, 320.0, 400.0]
    rng = np.random.default_rng(0)
    rows = []
    for i in range(24):
        y = i % 2
        score, head = (0.75 + 0.1 * rng.random(), 0.3 + 0.4 * rng.random())
        pose = (0.45 if y else 0.12) + 0.25 * rng.random()  # the classes overlap a little in calibrated score only
        rows.append((f"s{i}", score, head, pose, y))
    table = catalog.conform([{"sample_id": s, "person_boxes": [big, other], "person_scores": [sc, 0.5],
                              "person_keypoints": [_kpts(h), _kpts(0.1)], "person_look_box": 0,
                              "person_look_score": pose} for s, sc, h, pose, _ in rows], catalog.SAMPLES)
    run = tmp_path / "run"
    catalog.write_parquet(run / "catalog" / "samples" / "part-0.parquet", table)
    labels = tmp_path / "labels.csv"
    labels.write_text("sample_id,label\n" + "".join(f"{s},person={y}\n" for s, *_, y in rows))
    out = tmp_path / "person.json"
    assert main(["calibrate", str(run), "--labels", str(labels), "--fit-person", str(out),
                 "--out", str(tmp_path / "c.png")]) == 0
    text = capsys.readouterr().out
    assert "second look (24 samples it read, 12 positive" in text
    # the report after the fit cuts with the look: every person passes 0.9, which the calibrated score alone does not
    assert "config person.min_score=0.9: precision 1.000, recall 1.000" in text
    cal = load_calibration(out)
    assert cal.look["fitted_on"]["n"] == 24 and cal.look["model"] == "movenet_thunder.onnx"
    assert min(cal.look["coef"]) >= 0 and cal.look["coef"][1] > 1  # the pose score tells the classes apart here
    cfg = default_config()["person"] | {"calibration": str(out)}
    assert PersonStage(cfg).look_on
    plain = cal.box_scores([big], [0.8], [_kpts(0.5)])[0]
    assert cal.box_scores([big], [0.8], [_kpts(0.5)], look=(0, 0.7))[0] > plain
    assert cal.box_scores([big], [0.8], [_kpts(0.5)], look=(0, 0.1))[0] == plain  # max(): a poor look never lowers

    # the look read box 1, not the top raw box: no sample counts, so no look fit
    moved = table.set_column(table.schema.get_field_index("person_look_box"), "person_look_box",
                             pa.array([1] * len(rows), pa.int32()))
    catalog.write_parquet(run / "catalog" / "samples" / "part-0.parquet", moved)
    assert main(["calibrate", str(run), "--labels", str(labels), "--fit-person", str(out),
                 "--out", str(tmp_path / "c.png")]) == 0
    text = capsys.readouterr().out
    assert "no second look fit (the run's second look read none" in text
    assert "config person.min_score=0.9: precision   -  , recall 0.000" in text
    assert load_calibration(out).look is None
    # four people among the samples read: too few to fit
    X, y = np.array([[0.0, 0.5 * k] for k in range(12)]), np.array([1] * 4 + [0] * 8)
    look, why = fit_look(X, y, {})
    assert look is None and "at least 5 positive and 5 negative" in why and "got 4 and 8" in why


def test_calibrate_a_run_on_s3(s3_server, tmp_path, capsys, monkeypatch):
    """A run an ML engineer curated into an object store: calibrate reads its manifest and catalog there (the
    storage layer, the real S3 server on 127.0.0.1); the labels, the fitted file and the curves stay local, and
    without --out the curves go to the working folder, not to a local path named like the URI."""
    from catalog import storage as st

    run, labels = _run_dir(tmp_path)
    store = st.open_storage(s3_server.prefix("calibrate"))
    for p in sorted(run.rglob("*")):
        if p.is_file():
            store.write_bytes(str(p.relative_to(run)), p.read_bytes())
    png = tmp_path / "curves.png"
    assert main(["calibrate", store.uri, "--labels", str(labels), "--target-precision", "1.0", "--out", str(png)]) == 0
    out = capsys.readouterr().out
    assert "person: 7 labelled samples with a score (4 positive), 1 not scored" in out  # the manifest's raw score
    assert "--set person.min_score=0.4 (precision 1.000, recall 1.000)" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", store.uri + "/", "--labels", str(labels)]) == 0
    name = store.uri.rstrip("/").rsplit("/", 1)[-1]
    assert f"curves: {name}-calibration.png" in capsys.readouterr().out
    assert (tmp_path / f"{name}-calibration.png").is_file() and not (tmp_path / "s3:").exists()
    assert not store.exists("calibration.png")  # nothing written into the run


def test_only_the_labelled_rows_are_read(tmp_path):
    """calibrate holds the labelled samples' rows, not the run's (bench/calibrate_scale.py measures the memory):
    catalog.duck.sample_rows semi-joins the catalog with the ids, and a column the run lacks is left out, not an
    error. A finished run's compacted copy (read without Parquet prefetching) gives the same rows as its parts."""
    from catalog import compact
    from catalog.duck import sample_rows

    run, _ = _run_dir(tmp_path)
    cols, ids = ["sample_id", "person_scores", "art_score", "no_such_column"], {"p1", "n3", "ghost"}
    got, rows = sample_rows(run, cols, ids)
    assert got == ["sample_id", "person_scores", "art_score"]
    assert sorted(r[0] for r in rows) == ["n3", "p1"]
    assert len(sample_rows(run, ["sample_id"])[1]) == 8  # no ids: every row
    assert compact.compact_group(str(run), 0, ["part-0"]) == 8
    compact.finish(run, files=1, rows=8, units=1)
    assert compact.is_compacted(run)
    assert sorted(sample_rows(run, cols, ids)[1]) == sorted(rows)
