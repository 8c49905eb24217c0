"""catalog/cards.py: the filter card contract, stated once and used by the trainer and the stages."""
from pathlib import Path

import numpy as np
from PIL import Image

from catalog import cards

ROOT = Path(__file__).resolve().parents[2]


def test_input_spec_states_size_preprocessing_and_normalisation():
    spec = cards.input_spec(96)
    assert spec == {"size": 96, "resize": "squash, bilinear (whole image, no crop)", "mean": [0.485, 0.456, 0.406],
                    "std": [0.229, 0.224, 0.225], "channels": "RGB"}


def test_squash_keeps_the_whole_image_and_drops_its_aspect():
    rgb = np.zeros((40, 100, 3), np.uint8)
    rgb[:, :50] = 255  # left half white: squashed, still the left half
    grey = Image.fromarray(rgb).convert("L")
    out = cards.squash(grey, 20)
    assert out.mode == "RGB" and out.size == (20, 20)
    a = np.asarray(out)
    assert a[:, :9].min() == 255 and a[:, 11:].max() == 0
    assert np.array_equal(a, np.asarray(grey.convert("RGB").resize((20, 20), Image.BILINEAR)))


def test_trainer_and_stages_read_the_contract_from_catalog():
    from pipeline.stages import card
    from training.filters import train
    assert (train.CARD_FORMAT, train.CARD_NAME, train.WEIGHTS_NAME) == (cards.CARD_FORMAT, cards.CARD_NAME,
                                                                        cards.WEIGHTS_NAME)
    assert card.CARD_FORMAT is cards.CARD_FORMAT and card.squash is cards.squash
    assert train.FilterConfig().input_px == cards.DEFAULT_INPUT_PX
    stated = [str(p.relative_to(ROOT)) for room in ("pipeline", "training", "humanset", "render")
              for p in (ROOT / room).rglob("*.py") if f'"{cards.CARD_FORMAT}"' in p.read_text()]
    assert stated == [], f"the card format is stated outside catalog/cards.py: {stated}"
