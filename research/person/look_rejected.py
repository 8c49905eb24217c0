"""Does the second look's fit do better when it is fitted only on the rows it acts on? The shipped `look` fit
(research/person/movenet_look.py, "refit_with_pose") was fitted on every calibration row of tune, most of which the
calibrated cut already passes (89 of 135, counted after the rule); the look only ever reads a box whose calibrated
score is <= 0.9. Measured on the quality bench's tune split. Not used by the product.

Result (2026-12-07 16:42 UTC, tune, load 1.0): 46 main rows under the cut, 14 people; C 1.0 for both fits. 0 wins, 2
losses (mdl-backlit-behind 0.933 -> 0.863, uantwerp-field-group-bending 0.936 -> 0.883): fails; the candidate gives
each of the nine people the baseline fails less than the baseline does. Nothing further computed; eval not scored.
docs/benchmarks.md, "the second look's fit on the rows it acts on".

    python bench/quality.py --split tune --output RUN --write-labels labels.csv   (and the same for eval)
    python research/person/look_rejected.py RUN labels.csv --onnx pipeline/stages/movenet_thunder.onnx \
        [--cascade] [--eval-run EVAL_RUN --eval-labels eval-labels.csv]

Rule, written 2026-12-07 16:04 UTC before the tune or eval run of this session was curated or any row computed:
- run: a tune run curated by `bench/quality.py --split tune --set person.second_look=none` (score-all; without the
  look, so every image the calibrated cut rejects is decided below by the fit under test), its labels by
  --write-labels; rows: movenet_look.run_rows of that run (main rows, painted rows, extra rows) and their pose scores
  from the shipped pipeline/stages/movenet_thunder.onnx;
- baseline: the shipped recipe held out by package (movenet_look's refit_with_pose: a logistic fit of
  logit(calibrated) and logit(pose) on all main rows, C by leave-one-package-out log loss over (0.1, 1, 10), each row
  scored by the fit without its package), a row under the cut (calibrated <= 0.9) passing when it gives >= 0.9;
- candidate "refit_rejected": the same recipe fitted only on the main rows under the cut, each row held out by package;
- wins: person_clear main rows under the cut the candidate passes and the baseline does not; losses: label-0 rows
  (main or extra) under the cut the candidate passes and the baseline does not, and person_clear rows the baseline
  passes and the candidate does not; painted rows newly passing reported beside them;
- it goes on only with at least 5 wins and no loss (sign test p <= 0.1) to the cascade's check on tune (an image
  whose only person reason is the calibrated cut passes the person stage when its row's fit is >= 0.9, every other
  verdict the run's; the candidate's cascade against the baseline's, image by image: no loss, tune's kept-set targets
  met) and then one eval gate: fitted on all tune main rows under the cut at the chosen C, applied to an eval run
  curated the same way, its cascade against the cascade of the shipped `look` fit (Calibration.look_probability);
  it replaces the shipped `look` fit only with more eval wins than losses and no target the shipped fit meets on eval
  missed.
(Amended 16:04 UTC, still before anything was computed: the runs without the look, and the cascades compared with
each other rather than with the run, since a run curated with the look already passes what the shipped fit passes.)
- If fewer than 5 person_clear main rows under the cut fail the baseline, the rule cannot pass: that is reported and
  nothing further is computed.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CUT = 0.9


def verdicts(rows: list[dict], pose: np.ndarray, package: dict, only_under: bool):
    """Each row's held-out P from the shipped recipe, fitted on the main rows (all, or those under the cut)."""
    from research.bench_tune import held_out_logistic
    from research.person.blazepose_look import logit

    shipped = np.array([r["shipped"] for r in rows])
    train = np.array([r["role"] == "row" for r in rows]) & ((shipped <= CUT) if only_under else True)
    X = np.c_[logit(shipped), logit(pose)]
    y = np.array([r["y"] for r in rows])
    p, c, loss = held_out_logistic(X, y, np.array([package[r["id"]] for r in rows]), train)
    return p, c, loss, X, y, train


def cascade(run: Path, split: str, rows: list[dict], fit: np.ndarray, baseline: np.ndarray) -> dict:
    """The cascade's keep with the candidate's fit against the cascade with the baseline's (an image whose only person
    reason is the calibrated cut passes the person stage when its row's fit is >= CUT), image by image, and the
    candidate's targets beside the baseline's."""
    from bench import quality_data
    from research.bench_tune import bench_quality, with_person_verdict
    from research.person.movenet_look import CUT_ONLY

    quality = bench_quality()
    cats = quality_data.split_categories(split)
    samples = quality.split_samples(run, cats, split)
    person = {s["id"]: [r for r in s["reject_reasons"] if r.split(":")[0] == "person"] for s in samples}
    keep = {}
    for name, p in (("candidate", fit), ("baseline", baseline)):
        look = {r["id"]: float(f) for r, f in zip(rows, p)}
        keep[name] = with_person_verdict(samples, {i: not rs or (rs == [CUT_ONLY] and look.get(i, 0.0) >= CUT)
                                                   for i, rs in person.items()})
    cmp = quality.compare(keep["candidate"], keep["baseline"], cats)
    return {"wins": cmp["wins"], "losses": cmp["losses"], "sign_test_p": cmp["sign_test_p"],
            "categories": cmp["categories"],
            "cut_only_images_without_a_row": sorted(i for i, rs in person.items() if rs == [CUT_ONLY]
                                                    and i not in {r["id"] for r in rows}),
            "targets": quality.score(keep["candidate"], cats)["targets"],
            "targets_of_the_baseline": quality.score(keep["baseline"], cats)["targets"]}


def main() -> int:
    from research.bench_tune import bench_quality, report
    from research.person.movenet_look import look_parser, run_rows

    a = look_parser(__doc__).parse_args()
    quality = bench_quality()
    rows, pose, _, bench, package = run_rows(a.run, a.labels, a.onnx)
    base, base_c, _, _, _, _ = verdicts(rows, pose, package, only_under=False)
    cand, c, loss, X, y, train = verdicts(rows, pose, package, only_under=True)
    under = [r["shipped"] <= CUT for r in rows]
    desc = {i: f'{r["id"]} ({bench[r["id"]]["category"]}, pose {q:.3f}, calibrated {r["shipped"]:.3f}, '
               f'baseline {b:.3f}, candidate {f:.3f})' for i, (r, q, b, f) in enumerate(zip(rows, pose, base, cand))}
    wins, losses, painted = [], [], []
    for i, r in enumerate(rows):
        if not under[i]:
            continue
        new, old = cand[i] >= CUT, base[i] >= CUT
        if r["role"] == "painted":
            if new and not old:
                painted.append(desc[i])
        elif new and not old:
            (wins if r["y"] == 1 and r["role"] == "row" else losses).append(desc[i])
        elif old and not new and r["y"] == 1 and r["role"] == "row":
            losses.append(desc[i])
    open_people = [desc[i] for i, r in enumerate(rows)
                   if under[i] and r["role"] == "row" and r["y"] == 1 and base[i] < CUT]
    out = {"run": a.run.name, "baseline_C": base_c, "candidate_C": c,
           "candidate_lopo_log_loss": {str(k): round(v, 4) for k, v in loss.items()},
           "main_rows": sum(r["role"] == "row" for r in rows), "main_rows_under_the_cut": int(train.sum()),
           "positives_under_the_cut": int(y[train].sum()),
           "person_clear_under_the_cut_the_baseline_fails": open_people,
           "wins": wins, "losses": losses, "sign_test_p": round(quality.sign_test(len(wins), len(losses)), 4),
           "painted_newly_passing": painted}
    passes = len(wins) >= 5 and not losses
    out["rule"] = "passes" if passes else ("cannot pass: fewer than 5 people open" if len(open_people) < 5
                                           else "fails")
    if passes and a.cascade:
        out["cascade_tune"] = cascade(a.run, "tune", rows, cand, base)
    if passes and a.eval_run:
        from sklearn.linear_model import LogisticRegression

        from research.person.blazepose_look import logit

        fit = LogisticRegression(C=c, max_iter=2000).fit(X[train], y[train])
        out["fit_on_tune_rows_under_the_cut"] = {"coef": [round(float(v), 6) for v in fit.coef_[0]],
                                                 "intercept": round(float(fit.intercept_[0]), 6)}
        erows, epose, _, _, _ = run_rows(a.eval_run, a.eval_labels, a.onnx)
        ex = np.c_[logit(np.array([r["shipped"] for r in erows])), logit(epose)]
        from pipeline.stages.person_calibration import load_calibration

        shipped = load_calibration()
        ship = np.array([shipped.look_probability(r["shipped"], q) for r, q in zip(erows, epose)])
        out["eval_gate"] = cascade(a.eval_run, "eval", erows, fit.predict_proba(ex)[:, 1], ship)
    return report(out, [{"id": r["id"], "role": r["role"], "label": r["y"], "category": bench[r["id"]]["category"],
                         "shipped": round(float(r["shipped"]), 4), "pose": round(float(q), 4),
                         "baseline": round(float(b), 4), "candidate": round(float(f), 4)}
                        for r, q, b, f in zip(rows, pose, base, cand)], a.rows)


if __name__ == "__main__":
    sys.exit(main())
