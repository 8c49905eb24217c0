"""Filter training, a sub-room of training/: the watermark and art classifiers behind `humanset
train-filter`, trained on synthetic data made from clean photos and written as filter cards (the card
contract is catalog/cards.py; the pipeline's watermark and art stages read the cards with timm alone).

It stands apart from the MAE/fine-tuning modules because it has its own generators and dependencies
(Chromium for HTML screenshots, fonts, OpenCV) and its own output format; it shares the training
engine, the ViT and the encoder loading with the rest of training/ (imported as `..engine`, ...).

  train.py       FilterConfig, the model, training, validation on held-out families, the card
  samples.py     families, splits and samples as pure functions of (seed, index)
  overlays.py, styles.py, lettering.py, pages.py, browser.py   the generators (browser: headless Chromium)
  inputs.py      clean photos and scene text from runs, shards or files
  thresholds.py  ROC AUC, thresholds at a target precision, the chance test
  cli.py         `humanset train-filter`
"""
_EXPORTS = {  # name -> the module of training/filters that defines it
    **dict.fromkeys(("CARD_FORMAT", "CARD_NAME", "WEIGHTS_NAME", "FilterConfig", "FilterModel", "build_model",
                     "config_from", "demo_config", "summary_line", "train_filter"), "train"),
    **dict.fromkeys(("WATERMARK_LIKE", "read_photos", "read_scene_text"), "inputs"),
    **dict.fromkeys(("at_threshold", "beats_chance", "choose_threshold", "roc_auc"), "thresholds"),
}
__all__ = list(_EXPORTS)


def __getattr__(name):  # lazy, so `humanset --help` (which imports filters/cli.py) does not import torch
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(f"training.filters.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'training.filters' has no attribute {name!r}")
