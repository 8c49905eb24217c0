"""text stage: the real PP-OCR models shipped in rapidocr on shipped photos and generated captions."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import catalog
from pipeline.config import default_config
from pipeline.stages.text import TextStage, confirmed, union_area_frac
from captioned_photos import SKIMAGE, meme

# located without importing ultralytics (its import-time network check must see YOLO_OFFLINE)
ASSETS = Path(list(importlib.util.find_spec("ultralytics").submodule_search_locations)[0]) / "assets"


def _cases() -> dict[str, bytes]:
    return {
        "bus": (ASSETS / "bus.jpg").read_bytes(),               # scene text: an ad on the bus
        "coffee": (SKIMAGE / "coffee.png").read_bytes(),         # no text; det boxes the whole cup
        "astronaut": (SKIMAGE / "astronaut.png").read_bytes(),
        "meme": meme(SKIMAGE / "chelsea.png", "WHEN THE CODE", "COMPILES FIRST TRY"),
        "page": (SKIMAGE / "page.png").read_bytes(),             # a scanned text page
        "garbage": b"\x89PNG\r\n\x1a\n broken",
    }


@pytest.fixture(scope="module")
def scored():
    """Exact measurements: every detected box recognised."""
    stage = TextStage(default_config()["text"] | {"recognize": "all"})
    stage.setup()
    cases = _cases()
    out = stage.measure({"sample_id": list(cases), "image": list(cases.values())})
    table = catalog.conform([{k: v[i] for k, v in out.items()} for i in range(len(cases))], catalog.SAMPLES)
    return stage, list(cases), out, table


def _get(scored, name, col):
    _, names, out, _ = scored
    return out[col][names.index(name)]


def test_captions_and_pages_are_rejected_scene_text_is_kept(scored):
    stage, names, _, table = scored
    reasons = dict(zip(names, stage.reject(table)))
    assert reasons["meme"] == "text_area>0.03"
    assert reasons["page"] == "text_area>0.03"
    assert reasons["bus"] is None and reasons["astronaut"] is None and reasons["coffee"] is None
    assert reasons["garbage"] == "error"


def test_recognition_confirms_boxes(scored):
    # the detector's box over the coffee cup reads as a single digit: not text
    assert _get(scored, "coffee", "text_area_frac") == 0.0
    assert _get(scored, "coffee", "text_n_boxes") == 0
    strings = " ".join(_get(scored, "meme", "text_strings")).replace(" ", "")
    assert "COMPILESFIRSTTRY" in strings
    assert 0.0 < _get(scored, "bus", "text_area_frac") < 0.03
    assert _get(scored, "page", "text_area_frac") > 0.3


def test_error_column_and_nulls(scored):
    assert "decode" in _get(scored, "garbage", "text_error")
    assert _get(scored, "garbage", "text_area_frac") is None
    assert _get(scored, "meme", "text_error") is None
    unmeasured = catalog.conform([{"sample_id": "x"}], catalog.SAMPLES)
    assert scored[0].reject(unmeasured) == [None]


def test_union_area_counts_overlaps_once():
    a = np.array([[0, 0], [50, 0], [50, 50], [0, 50]])
    b = a + 25
    assert union_area_frac([a], 100, 100) == pytest.approx(0.25, abs=0.02)
    assert union_area_frac([a, a], 100, 100) == pytest.approx(0.25, abs=0.02)
    assert union_area_frac([a, b], 100, 100) == pytest.approx((2 * 2500 - 625) / 10000, abs=0.03)
    assert union_area_frac([], 100, 100) == 0.0


def test_confirmed_needs_confidence_and_length():
    texts = ["8", "SALE", "ab", "Hello world", "...."]
    scores = [0.99, 0.95, 0.99, 0.5, 0.99]
    assert confirmed(texts, scores, 0.7, 3) == [1]
    assert confirmed(texts, scores, 0.4, 2) == [1, 2, 3]


def test_recognition_only_where_it_can_change_the_verdict(scored):
    """The default (recognize: needed) reads fewer boxes, in fewer calls, and reaches the verdicts
    of the full computation; each stored area lies on the same side of max_area_frac as the exact one."""
    full_stage, names, full, full_table = scored
    stage = TextStage(default_config()["text"])
    assert stage.recognize == "needed"
    stage.setup()
    cases = _cases()
    out = stage.measure({"sample_id": list(cases), "image": list(cases.values())})
    table = catalog.conform([{k: v[i] for k, v in out.items()} for i in range(len(cases))], catalog.SAMPLES)
    assert stage.reject(table) == full_stage.reject(full_table)
    limit = stage.cfg["max_area_frac"]
    for name, a, b in zip(names, out["text_area_frac"], full["text_area_frac"]):
        assert (a is None) == (b is None), name
        if a is not None:
            assert (a > limit) == (b > limit), (name, a, b)
    print(f"recognition: {stage.rec_crops} crops in {stage.rec_calls} call(s), "
          f"against {full_stage.rec_crops} crops in {full_stage.rec_calls} call(s) for every box")
    assert stage.rec_crops < full_stage.rec_crops / 2
    assert stage.rec_calls <= full_stage.rec_calls == 1  # batched across the images
    # the page: it stops as soon as a few lines already cover more than the limit
    page = names.index("page")
    assert limit < out["text_area_frac"][page] <= full["text_area_frac"][page]
    assert 0 < out["text_n_boxes"][page] < full["text_n_boxes"][page]


def test_no_recognition_when_all_detected_text_is_small():
    """bus.jpg's ad and astronaut: the detector's boxes together cover less than the limit, so
    recognition never runs; the stored area is the detected union, an upper bound under the limit."""
    stage = TextStage(default_config()["text"] | {"max_area_frac": 0.5})
    stage.setup()
    out = stage.measure({"sample_id": ["bus", "astronaut"], "image": [
        (ASSETS / "bus.jpg").read_bytes(), (SKIMAGE / "astronaut.png").read_bytes()]})
    assert stage.rec_calls == 0 and stage.rec_crops == 0
    assert out["text_error"] == [None, None]
    assert 0 < out["text_area_frac"][0] <= 0.5 and stage.reject(catalog.conform(
        [{k: v[i] for k, v in out.items()} for i in range(2)], catalog.SAMPLES)) == [None, None]


def test_bad_recognize_value_is_a_clear_error():
    with pytest.raises(ValueError, match="text.recognize"):
        TextStage({"recognize": "some"})
