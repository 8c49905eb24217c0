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
