"""humanset filter cards: classifiers made by `humanset train-filter`, loaded with timm alone.

A card is a folder (or its card.json) holding:
    card.json   format CARD_FORMAT, filter (watermark | art), weights (a file name in the folder),
                architecture (timm VisionTransformer kwargs), input (size, mean, std), classes,
                keep_class, threshold, generator settings and validation figures
    model.pt    a plain state dict, loaded with torch.load(weights_only=True) and strict=True
The score is 1 - P(keep_class): higher means reject, as for the LAION and OpenCLIP models.

The pipeline never imports training/: the architecture is rebuilt from the card with timm. The
contract itself (names, input size, normalisation, preprocessing) is catalog/cards.py.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np

from catalog.cards import CARD_FORMAT, CARD_NAME, REQUIRED, squash

log = logging.getLogger(__name__)

def find_card(path: Path) -> Path | None:
    """The card.json that `path` names (the card itself, or a folder holding one); None if it names none."""
    if path.is_dir():
        return path / CARD_NAME if (path / CARD_NAME).is_file() else None
    if path.suffix.lower() == ".json":
        return path
    return None


def locate_weights(stage, checkpoint: str) -> tuple[Path | None, Path]:
    """(card, path) of `{stage}.weights`: the card.json it names, or None and the path of a plain
    checkpoint file (`checkpoint` describes that file in errors). Missing weights, a folder without a
    card and a missing file are errors naming the setting."""
    w = stage.cfg.get("weights")
    if not w:
        raise ValueError(stage.skip_reason())
    path = Path(str(w)).expanduser()
    card = find_card(path) if path.exists() else None
    if card is not None:
        return card, path
    if path.is_dir():
        raise FileNotFoundError(f"{stage.name}.weights={path}: a folder without {CARD_NAME}; expected a humanset "
                                f"filter card folder (humanset train-filter {stage.name} --output DIR) or {checkpoint}")
    if not path.is_file():
        raise FileNotFoundError(f"{stage.name}.weights={w}: no such file ({checkpoint}, or a humanset filter card "
                                f"folder; weights are never downloaded)")
    return None, path


def read_card(card_path: Path, expect_filter: str, setting: str) -> dict:
    """Parse and check a card: a clear error naming the file and what was expected otherwise."""
    how = f"humanset train-filter {expect_filter} --output DIR, then {setting}=DIR"
    try:
        card = json.loads(card_path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{setting}={card_path}: not a readable humanset filter card ({e}); expected the card.json "
                         f"written by `{how}`") from e
    if not isinstance(card, dict) or card.get("format") != CARD_FORMAT:
        found = card.get("format") if isinstance(card, dict) else type(card).__name__
        raise ValueError(f"{setting}={card_path}: not a humanset filter card (format {found!r}, expected "
                         f"{CARD_FORMAT!r}); make one with `{how}`")
    if card.get("filter") != expect_filter:
        raise ValueError(f"{setting}={card_path}: this is a card of the {card.get('filter')!r} filter; the "
                         f"{expect_filter} stage needs one made by `{how}`")
    missing = [k for k in REQUIRED if k not in card]
    if missing:
        raise ValueError(f"{setting}={card_path}: card lacks {missing}; rewrite it with `{how}`")
    weights = str(card["weights"])
    # a name from a file never becomes a path outside the card's folder
    if Path(weights).name != weights or weights in ("", ".", ".."):
        raise ValueError(f"{setting}={card_path}: weights {weights!r} must be a file name in the card's folder")
    if card["keep_class"] not in card["classes"]:
        raise ValueError(f"{setting}={card_path}: keep_class {card['keep_class']!r} is not among {card['classes']}")
    return card


class CardClassifier:
    """The card's ViT (timm) with its input size and normalisation; `probs` gives class probabilities."""

    def __init__(self, card_path: Path, expect_filter: str, setting: str):
        import timm.models.vision_transformer as vt
        import torch

        self.card_path = card_path
        self.card = card = read_card(card_path, expect_filter, setting)
        weights = card_path.parent / card["weights"]
        if not weights.is_file():
            raise FileNotFoundError(f"{setting}={card_path}: its weights file {weights} is missing")
        arch = card["architecture"]
        if arch.get("library") != "timm" or not str(arch.get("class", "")).endswith("VisionTransformer"):
            raise ValueError(f"{setting}={card_path}: architecture {arch.get('class')!r} is not a timm "
                             f"VisionTransformer; this humanset reads only those cards")
        try:
            model = vt.VisionTransformer(**arch["kwargs"])
            model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True), strict=True)
        except Exception as e:
            raise RuntimeError(f"{setting}={card_path}: weights {weights.name} do not load into the card's timm "
                               f"VisionTransformer({arch.get('kwargs')}): {e}") from e
        self.device = "cuda:0" if torch.cuda.is_available() else "cpu"  # threads: set per actor by the engine
        self.model = model.eval().to(self.device)
        self.classes = list(card["classes"])
        self.keep_index = self.classes.index(card["keep_class"])
        self.size = int(card["input"]["size"])
        self.mean = np.asarray(card["input"]["mean"], np.float32)
        self.std = np.asarray(card["input"]["std"], np.float32)
        log.info("%s: humanset %s card %s (%s, %dpx, classes %s) on %s", expect_filter, expect_filter, card_path,
                 card["weights"], self.size, self.classes, self.device)

    def to_input(self, image) -> "torch.Tensor":  # noqa: F821
        """PIL RGB image -> normalised (3, S, S) tensor: squashed, bilinear, as in training."""
        import torch

        x = np.asarray(squash(image, self.size), np.float32) / 255.0
        return torch.from_numpy(((x - self.mean) / self.std).transpose(2, 0, 1).copy())

    def log_probs(self, x) -> "torch.Tensor":  # noqa: F821
        import torch

        if x.shape[-1] != self.size or x.shape[-2] != self.size:
            x = torch.nn.functional.interpolate(x.float(), size=(self.size, self.size), mode="bilinear",
                                                align_corners=False, antialias=True)
        return torch.log_softmax(self.model(x.float()).float(), dim=1)


class WatermarkAdapter:
    """The card model in the LAION model's place: takes the stage's ImageNet-normalised square batch (resized
    to the card's input here) and returns two logits whose softmax is (P(reject), P(keep)), so index 0 is
    the watermark probability as in LAION's convention."""

    def __init__(self, clf: CardClassifier, stage_mean, stage_std):
        import torch

        self.clf = clf
        self.renorm = None
        if not (np.allclose(stage_mean, clf.mean) and np.allclose(stage_std, clf.std)):
            m0, s0 = (torch.tensor(np.asarray(v, np.float32)).view(1, 3, 1, 1) for v in (stage_mean, stage_std))
            m1, s1 = (torch.tensor(v).view(1, 3, 1, 1) for v in (clf.mean, clf.std))
            self.renorm = (m0, s0, m1, s1)

    def __call__(self, x):
        import torch

        if self.renorm is not None:
            m0, s0, m1, s1 = (t.to(x.device) for t in self.renorm)
            x = ((x * s0 + m0) - m1) / s1
        lp = self.clf.log_probs(x)
        keep = lp[:, self.clf.keep_index]
        reject = torch.log1p(-keep.exp().clamp(max=1 - 1e-7))
        return torch.stack([reject, keep], dim=1)

    def eval(self):
        return self

    def to(self, device):
        return self


class ArtAdapter:
    """The card model in OpenCLIP's place for the art stage's zero-shot path. encode_image returns each
    image's class log-probabilities as a vector of fixed norm R (a padding coordinate tops it up); with
    group embeddings [I | 0] and logit scale R, the stage's normalise-then-softmax returns exactly the
    card's class probabilities. So the stage has one measuring path for OpenCLIP and cards."""

    FLOOR = -30.0  # log-probabilities are clamped here (p < 1e-13 counts as 0)

    def __init__(self, clf: CardClassifier):
        k = len(clf.classes)
        self.clf = clf
        self.radius = abs(self.FLOOR) * math.sqrt(k) + 1.0
        self.group_emb = np.concatenate([np.eye(k, dtype=np.float32), np.zeros((k, 1), np.float32)], axis=1)

    def encode_image(self, x):
        import torch

        lp = self.clf.log_probs(x).clamp(min=self.FLOOR)
        pad = (self.radius ** 2 - (lp ** 2).sum(dim=1, keepdim=True)).clamp(min=0).sqrt()
        return torch.cat([lp, pad], dim=1) / self.radius

    def eval(self):
        return self

    def to(self, device):
        return self
