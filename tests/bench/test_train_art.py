"""bench/train_art.py's out-of-fold scoring: which images a fold's probe may have seen."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("train_art", ROOT / "bench" / "train_art.py")
ta = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ta)


def _data():
    """Pool and tune samples of four packages; feature row i is [i], so a fit's rows name themselves."""
    pool = [{"package": p, "label": "photo", "group": f"{p}:{k}"} for p in ("a", "b", "c", "d") for k in range(3)]
    tune = [{"package": p, "label": "photo", "bench_id": f"{p}-{k}", "category": "person_clear"}
            for p in ("a", "b", "c") for k in range(4)]
    samples = pool + [dict(t, variant=v) for t in tune for v in ("none", "grey")]
    return samples, tune


@pytest.mark.parametrize("by", ["image", "package"])
def test_a_fold_probe_never_saw_what_it_scores(monkeypatch, by):
    samples, tune = _data()
    x = np.arange(len(samples), dtype=float)[:, None]
    x_tune = np.arange(len(tune), dtype=float)[:, None]
    scored = {}

    def fake_fit(xs, ys, c, w, start):
        return set(xs[:, 0].astype(int)), None

    def fake_scores(trained, model, xt):
        for i in xt[:, 0].astype(int):
            scored[i] = {samples[j]["package"] for j in trained}, {samples[j].get("bench_id") for j in trained}
        return np.zeros(len(xt))
    monkeypatch.setattr(ta, "fit", fake_fit)
    monkeypatch.setattr(ta, "art_scores", fake_scores)
    ta.out_of_fold(x, samples, tune, x_tune, 0.3, np.ones(len(samples)), None, 3, by)
    assert sorted(scored) == list(range(len(tune)))  # every tune image scored once
    for i, (packages, ids) in scored.items():
        assert tune[i]["bench_id"] not in ids  # never its own image, in any variant
        if by == "package":
            assert tune[i]["package"] not in packages  # nor any image of its package, pool or tune
    if by == "image":  # folds of images do share packages: that is the difference
        assert any(tune[i]["package"] in packages for i, (packages, _) in scored.items())


@pytest.mark.parametrize("warm", [True, False])
def test_cold_folds_start_from_nothing_the_whole_probe_saw(monkeypatch, warm):
    """--no-warm-folds: no fold's fit starts from the whole probe (which saw the fold); --warm-folds: each does."""
    samples, tune = _data()
    whole = ("scaler of the whole probe", "model of the whole probe")
    starts = []

    def fake_fit(xs, ys, c, w, start):
        starts.append(start)
        return None, None
    monkeypatch.setattr(ta, "fit", fake_fit)
    monkeypatch.setattr(ta, "art_scores", lambda scaler, model, xt: np.zeros(len(xt)))
    ta.out_of_fold(np.zeros((len(samples), 1)), samples, tune, np.zeros((len(tune), 1)), 0.3,
                   np.ones(len(samples)), whole if warm else None, 3)
    assert starts == [whole if warm else None] * 3


def test_the_held_out_cut_judges_each_fold_at_a_cut_fitted_without_it():
    """On its own photos fit_cut rejects at most 3 % by construction; held out, a fold whose photos score above
    every other fold's is judged at the others' cut and rejected whole."""
    tune = [{"bench_id": f"img-{k}", "category": "person_clear"} for k in range(60)]
    fold = np.array([int(ta.unit(f"fold:{r['bench_id']}") * 5) for r in tune])
    scores = np.where(fold == 0, 0.95, np.linspace(0.1, 0.5, len(tune)))
    cats = [r["category"] for r in tune]
    assert ta.per_category(scores, cats, ta.fit_cut(scores, cats, 0.03))["person_clear"]["rejected"] <= 1
    held = ta.held_out_cut(scores, tune, 0.03, 5)
    assert held["categories"]["person_clear"] == {"n": 60, "rejected": int((fold == 0).sum())} and (fold == 0).any()
    assert held["cuts"][0] < 0.95 and all(c >= 0.95 for c in held["cuts"][1:])


def test_write_scores_lists_every_image_highest_first_and_names_no_path(tmp_path):
    rows = [{"bench_id": f"img-{k}", "category": c} for k, c in enumerate(("person_clear", "non_photo", "no_person"))]
    name = ta.write_scores(tmp_path / "scores.csv", rows, np.array([0.2, 0.97, 0.5]))
    assert name == "scores.csv"
    text = (tmp_path / "scores.csv").read_bytes().decode()
    assert "\r" not in text and text.splitlines() == [
        "id,category,art_score_out_of_fold", "img-1,non_photo,0.9700", "img-2,no_person,0.5000",
        "img-0,person_clear,0.2000"]
