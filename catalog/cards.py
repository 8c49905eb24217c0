"""The filter card contract: what `humanset train-filter` writes (training/filters/train.py) and the
watermark and art stages read (pipeline/stages/card.py), stated once.

A card is a folder holding CARD_NAME (JSON, "format" CARD_FORMAT) and its weights file (a plain state
dict of a timm VisionTransformer). Its "input" entry (`input_spec`) says how an image becomes the
model's input: the whole image squashed to a square of `size` pixels, bilinear, no crop (`squash`),
RGB scaled to [0, 1], then normalised with the ImageNet mean and std (`MEAN`, `STD`).
"""
from __future__ import annotations

CARD_FORMAT = "humanset-filter/1"
CARD_NAME = "card.json"
WEIGHTS_NAME = "model.pt"
REQUIRED = ("weights", "architecture", "input", "classes", "keep_class")  # keys every card has

DEFAULT_INPUT_PX = 224  # the square input side train-filter uses unless told otherwise
MEAN = (0.485, 0.456, 0.406)  # ImageNet statistics, as the MAE encoder the filters start from
STD = (0.229, 0.224, 0.225)
RESIZE = "squash, bilinear (whole image, no crop)"
CHANNELS = "RGB"


def input_spec(size: int) -> dict:
    """The card's "input" entry for a square input of `size` pixels."""
    return {"size": int(size), "resize": RESIZE, "mean": list(MEAN), "std": list(STD), "channels": CHANNELS}


def squash(image, size: int):
    """A PIL image as the model sees it before normalisation: RGB, the whole image squashed (its aspect
    ratio not kept) to size x size pixels with bilinear resampling."""
    from PIL import Image
    return image.convert("RGB").resize((int(size), int(size)), Image.BILINEAR)
