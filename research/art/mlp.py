"""The art probe as a one-hidden-layer network instead of a logistic regression, on the same features, data and recipe.
Not used by the product.

The shipped probe is linear on 2,304 pooled statistics of the person model's backbone. Refitted with more tune
batches it trades painted people against photos of people (docs/quality.md, "The non-photo filter"): a linear
boundary may be what is short. This runs bench/train_art.py unchanged, with its model swapped: standardisation,
then sklearn's MLPClassifier with the settings below, fixed before any fit (the same sample weights; `--c` is
ignored). Every option of bench/train_art.py applies but `--out` (the probe file holds a linear model only).

Rule (written 2026-12-07 07:46 UTC, before any fit of it): the same data and recipe as the shipped probe's refit
(--c 0.01 --every-variant, tune batches 1-15, folds from scratch), by image (--folds 5) and by package (--fold-by
package), once with bench/train_art.py as it is and once with this. The network goes on only if, out of fold by
image at each model's own fitted cut, it rejects at least as many non_photo and painted_person together and no more
person_clear, one of the two strictly better, and by package at least as many painted_person at its image cut; then
a gate, once: eval curated with it against the shipped default, shipped only with more wins than losses and no
target the default meets missed.

    python research/art/mlp.py --pool POOL.csv --bench-tune CACHE/images --c 0.01 --every-variant [--fold-by package]
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import train_art  # noqa: E402

HIDDEN, ALPHA, LR, BATCH, MAX_ITER, PATIENCE = (256,), 1e-2, 1e-3, 256, 100, 10


def fit_mlp(x, y, c, w=None, start=None):
    """train_art.fit's contract with a network: (scaler, model), model.predict_proba and model.classes_."""
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(x)
    model = MLPClassifier(hidden_layer_sizes=HIDDEN, activation="relu", alpha=ALPHA, solver="adam",
                          learning_rate_init=LR, batch_size=BATCH, max_iter=MAX_ITER, early_stopping=True,
                          validation_fraction=0.1, n_iter_no_change=PATIENCE, random_state=0)
    model.fit(scaler.transform(x), y, sample_weight=w)
    print(f"mlp: {model.n_iter_} epochs, best validation score {model.best_validation_score_:.4f}", file=sys.stderr)
    return scaler, model


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(x == "--out" or x.startswith("--out=") for x in argv):
        raise SystemExit("--out: the probe file holds a linear model; this script measures only")
    train_art.fit = fit_mlp
    return train_art.main(argv)


if __name__ == "__main__":
    sys.exit(main())
