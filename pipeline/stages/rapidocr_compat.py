"""Every place humanset reaches into rapidocr's private API, and nothing else.

The text and watermark stages run PP-OCR's detection and recognition steps one by one (one detection
pass feeds both stages and keeps the weak boxes; recognition batches crops of many images), which
rapidocr's public `RapidOCR.__call__` does not offer. Tested on rapidocr 3.10.0 (deps/filters.pip.txt
pins >=3.10,<4); tests/pipeline/stages/test_rapidocr_compat.py fails when an upgrade moves or renames what
is used here; update this module and the pin together.
"""
from __future__ import annotations

TESTED_RAPIDOCR = ("3.10",)  # minor versions this module was tested on


def det_model(engine):
    """The loaded PP-OCR detector of a `RapidOCR` (get_preprocess, session, postprocess_op, sorted_boxes)."""
    return engine._load_det_model()


def det_model_path(engine):
    """The ONNX file the detector of a `RapidOCR` was loaded from (onnxruntime keeps it on the session)."""
    from pathlib import Path

    return Path(det_model(engine).session.session._model_path)


def rec_model(engine):
    """The loaded PP-OCR recogniser of a `RapidOCR`: called with a `TextRecInput` of crops."""
    return engine._load_rec_model()


def rec_input(crops):
    """rapidocr's recogniser input for a list of BGR crops (no word boxes)."""
    from rapidocr.ch_ppocr_rec import TextRecInput

    return TextRecInput(img=crops, return_word_box=False)


def map_boxes_to_original(boxes, op, height: int, width: int):
    from rapidocr.utils.process_img import map_boxes_to_original as mapped

    return mapped(boxes, op, height, width)


def apply_vertical_padding(img, op, width_height_ratio, min_height):
    from rapidocr.utils.process_img import apply_vertical_padding as padded

    return padded(img, op, width_height_ratio, min_height)


def rotate_crop(bgr, box):
    """The perspective-rectified crop of a 4x2 float32 box, as rapidocr crops for recognition."""
    from rapidocr.utils.process_img import get_rotate_crop_image

    return get_rotate_crop_image(bgr, box)
