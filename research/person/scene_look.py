"""Does an image-level "clearly visible person" probe on the art stage's own backbone features keep the people the
calibrated cut loses (seen from behind, under water, faces hidden)? Measured on the quality bench's tune split. Not
used by the product.

The art stage already computes the person model's pooled backbone on two views of every image that reaches it (the
whole image and its centre window, 2304 values: pipeline/stages/art_probe.py). A second look on those features would
cost the art stage's features only for the person stage's rejects that have a box over the size rule.

Rule (written 2026-12-07 07:07 UTC, before any feature or score of it was computed):
- rows: every tune image, with the verdicts of a curated tune run (`bench/quality.py --split tune`, score-all);
- features: bench/train_art.original_features of each image (decoded as the stage decodes it, shipped weights);
- labels: person_clear 1; person_small, no_person, non_photo, painted_person 0; text_or_mark scored, not trained on;
- out of fold: 5 folds by image (train_art.fold_number(id, 5)), each scored by StandardScaler + LogisticRegression
  (C 0.01) fitted from scratch on the other folds' labelled rows;
- second look: an image whose only person reason is `person:calibrated_score<=0.9` passes the person stage when its
  out-of-fold P >= 0.9;
- judged on the cascade: the image's keep with that person verdict and the run's other verdicts. Wins: person_clear
  newly kept; losses: any other category newly kept. Taken only with >= 5 wins and no loss (or sign test p <= 0.1).
Also reported, not deciding: the same at P >= 0.5 and 0.8, and the stage-level passes by category.

    python research/person/scene_look.py RUN [--cache ~/.cache/humanset/quality] [--rows FILE.csv]

Result (tune batches 1-15, 2026-12-07 07:08 UTC): 1 win (a hug) to 1 loss (a concert crowd, person_small); at P >= 0.5,
3 to 2. Not taken. docs/benchmarks.md, "an image-level person probe on the art stage's features".
"""
from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import quality, quality_data, train_art  # noqa: E402
from research.bench_tune import parser, report, tune_images, with_person_verdict  # noqa: E402

LOOK, ALSO, C, FOLDS = 0.9, (0.5, 0.8), 0.01, 5
CUT_ONLY = "person:calibrated_score<=0.9"
TRAINED = ("person_clear", "person_small", "no_person", "non_photo", "painted_person")


def out_of_fold(x: np.ndarray, ids: list[str], cats: list[str]) -> np.ndarray:
    """Each row's P(person_clear) from a probe (train_art.fit: standardised, logistic) fitted from scratch on the
    other folds' labelled rows."""
    fold = np.array([train_art.fold_number(i, FOLDS) for i in ids])
    labelled = np.array([c in TRAINED for c in cats])
    y = np.array([c == "person_clear" for c in cats], int)
    p = np.zeros(len(ids))
    for f in range(FOLDS):
        fit = (fold != f) & labelled
        scaler, model = train_art.fit(x[fit], y[fit], C)
        p[fold == f] = model.predict_proba(scaler.transform(x[fold == f]))[:, 1]
    return p


def person_reasons(s: dict) -> list[str]:
    return [r for r in s["reject_reasons"] if r.split(":")[0] == "person"]


def judge(samples: list[dict], p: dict[str, float], categories: dict[str, str], look: float) -> dict:
    """The second look at `look`: the cascade's keep against the run's (quality.compare), and how many more images
    of each category the person stage alone passes."""
    looked = {s["id"] for s in samples if person_reasons(s) == [CUT_ONLY] and p[s["id"]] >= look}
    passes = {s["id"]: not person_reasons(s) or s["id"] in looked for s in samples}
    cmp = quality.compare(with_person_verdict(samples, passes), samples, categories)
    return {"look": look, **{k: cmp[k] for k in ("wins", "losses", "sign_test_p", "categories")},
            "person_stage_newly_passing": dict(sorted(Counter(categories[i] for i in looked).items()))}


def main() -> int:
    from pipeline.stages.art_probe import Backbone
    from pipeline.stages.person import default_weights

    ap = parser(__doc__)
    ap.add_argument("run", type=Path, help="a curated tune run (bench/quality.py --split tune, score-all)")
    a = ap.parse_args()
    cats = quality_data.split_categories("tune")
    samples = quality.split_samples(a.run, cats, "tune")
    files = {f.stem: f for f in tune_images(a.cache)[1]}
    ids = [s["id"] for s in samples]
    backbone = Backbone(default_weights(), threads=1)
    t0 = time.process_time()
    x = train_art.original_features([{"file": files[i]} for i in ids], backbone, 320).astype(np.float64)
    cpu = (time.process_time() - t0) / len(ids)
    p = dict(zip(ids, out_of_fold(x, ids, [cats[i] for i in ids]).tolist()))
    out = {"run": a.run.name, "images": len(ids), "features": int(x.shape[1]), "C": C, "folds": FOLDS,
           "rule": judge(samples, p, cats, LOOK), "also": [judge(samples, p, cats, t) for t in ALSO],
           "cut_only_rejects": dict(sorted(Counter(cats[s["id"]] for s in samples
                                                   if s["reject_reasons"] == [CUT_ONLY]).items())),
           "p_quartiles": {c: [round(float(q), 3) for q in np.percentile([p[i] for i in ids if cats[i] == c],
                                                                          [25, 50, 75])] for c in TRAINED},
           "features_cpu_s_per_image": round(cpu, 3)}
    return report(out, [{"id": s["id"], "category": cats[s["id"]], "keep": bool(s["keep"]), "p": round(p[s["id"]], 4),
                         "reasons": ";".join(s["reject_reasons"])} for s in sorted(samples, key=lambda s: s["id"])],
                  a.rows)


if __name__ == "__main__":
    sys.exit(main())
