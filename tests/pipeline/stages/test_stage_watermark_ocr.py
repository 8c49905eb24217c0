"""watermark.method=ocr: the real PP-OCR models (rapidocr) on shipped photos and generated marks."""
from __future__ import annotations

import importlib.util
import io
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import catalog
from pipeline.stages.watermark import marks
from catalog.config import ConfigError
from pipeline.config import default_config, load_config
from pipeline.demo.crawl import with_watermark
from pipeline.stages.watermark import evidence as wm_evidence
from pipeline.stages.text import TextStage
from pipeline.stages.watermark.stage import WatermarkStage
from pipeline.stages.watermark.ocr_rule import SHARED

ASSETS = Path(list(importlib.util.find_spec("ultralytics").submodule_search_locations)[0]) / "assets"
SKIMAGE = Path(str(resources.files("skimage") / "data"))
# shipped photos with scene text: an ad on the bus, the brand on the motorcycle's tank
SCENE_TEXT = {"bus": ASSETS / "bus.jpg", "motorcycle_left": SKIMAGE / "motorcycle_left.png",
              "motorcycle_right": SKIMAGE / "motorcycle_right.png"}
CLEAN = {"astronaut": SKIMAGE / "astronaut.png", "coffee": SKIMAGE / "coffee.png",
         "chelsea": SKIMAGE / "chelsea.png", "zidane": ASSETS / "zidane.jpg"}


def _table(out, n):
    return catalog.conform([{k: v[i] for k, v in out.items()} for i in range(n)], catalog.SAMPLES)


def _marked() -> dict[str, bytes]:
    """One mark of each kind at opacity 0.5 (tune family, fixed seed) and the demo's tiled mark."""
    rng = np.random.default_rng(7)
    out = {}
    for kind, photo in (("tiled", "chelsea"), ("corner", "zidane"), ("center", "coffee")):
        spec = marks.sample_spec(rng, kind, "tune", opacity=0.5)
        spec = type(spec)(**{**spec.to_dict(), "colour": (255, 255, 255), "angle": 0.0 if kind != "tiled" else 30.0})
        out[kind] = marks.jpeg(marks.draw_mark(Image.open(CLEAN[photo]), spec), 90)
    out["demo"] = marks.jpeg(with_watermark(Image.open(CLEAN["astronaut"])), 90)
    return out


@pytest.fixture(scope="module")
def stages():
    cfg = default_config()
    text, wm, alone = TextStage(cfg["text"]), WatermarkStage(cfg["watermark"]), WatermarkStage(cfg["watermark"])
    for s in (text, wm, alone):
        s.setup()
    return text, wm, alone


@pytest.fixture(scope="module")
def scored(stages):
    """Text stage, then the watermark stage on its boxes (shared) and on its own (alone)."""
    text, wm, alone = stages
    images = {**{k: p.read_bytes() for k, p in {**SCENE_TEXT, **CLEAN}.items()}, **_marked()}
    names = list(images)
    batch = {"image": list(images.values())}
    det_before = text.ocr.det_calls
    t = text.measure(batch)
    assert text.ocr.det_calls - det_before == len(names)
    w_det, w_rec = wm.ocr.ocr.det_calls, wm.ocr.ocr.rec_crops
    shared = wm.measure({**batch, **{c: t[c] for c in SHARED}})
    shared_dets, shared_reads = wm.ocr.ocr.det_calls - w_det, wm.ocr.ocr.rec_crops - w_rec
    a_det, a_rec = alone.ocr.ocr.det_calls, alone.ocr.ocr.rec_crops
    own = alone.measure(batch)
    own_dets, own_reads = alone.ocr.ocr.det_calls - a_det, alone.ocr.ocr.rec_crops - a_rec
    return names, t, shared, own, (shared_dets, shared_reads), (own_dets, own_reads)


def test_one_detection_pass_serves_both_stages(scored, stages):
    names, t, shared, own, (shared_dets, shared_reads), (own_dets, own_reads) = scored
    assert shared_dets == 0  # every box came from the text stage's column
    assert own_dets == len(names)  # without the text stage's boxes it detects itself, once per image
    assert all(b is not None for b in t["text_det_boxes"])
    # the boxes the text stage recognised are not read again
    assert sum(r is not None for rs in t["text_det_rec_scores"] for r in rs) > 0
    assert shared_reads < own_reads
    # the same boxes, so the same evidence and verdicts either way (recognition scores may move a little
    # with the other crops of a recognition batch: rapidocr pads a batch to one width)
    assert shared["watermark_score"] == pytest.approx(own["watermark_score"], abs=0.05)
    stage = stages[1]
    assert stage.reject(_table(shared, len(names))) == stage.reject(_table(own, len(names)))


def test_reading_in_rounds_stops_past_the_cut_with_the_same_verdicts(scored, stages):
    """recognize: needed reads fewer boxes than recognize: all, rejects the same rows (a superset in
    general), and a row it keeps has exactly all's evidence (it read every box of it)."""
    names, t, shared, _, _, _ = scored
    wm = stages[1]
    full = WatermarkStage({**default_config()["watermark"], "recognize": "all"})
    full.setup()
    images = {**{k: p.read_bytes() for k, p in {**SCENE_TEXT, **CLEAN}.items()}, **_marked()}
    batch = {"image": [images[n] for n in names], **{c: t[c] for c in SHARED}}
    r0, f0 = wm.ocr.ocr.rec_crops, full.ocr.ocr.rec_crops
    needed, every = wm.measure(batch), full.measure(batch)
    assert wm.ocr.ocr.rec_crops - r0 < full.ocr.ocr.rec_crops - f0
    rej_needed, rej_all = wm.reject(_table(needed, len(names))), full.reject(_table(every, len(names)))
    assert rej_needed == rej_all
    for k, n in enumerate(names):
        if rej_all[k] is None:
            assert needed["watermark_score"][k] == every["watermark_score"][k], n
            assert needed["watermark_strings"][k] == every["watermark_strings"][k], n
        else:
            assert needed["watermark_n_boxes"][k] <= every["watermark_n_boxes"][k], n
    assert every["watermark_repeat"][names.index("tiled")] >= 3  # all the tiles read
    with pytest.raises(ConfigError, match="watermark.recognize"):
        load_config(sets=["watermark.recognize=some"])


def test_watermark_reads_do_not_depend_on_the_other_crops(stages):
    """The watermark stage recognises each crop at its own width (no padding to a batch's widest or to
    320 px): a crop reads the same alone as among others, so the reading rounds change no read."""
    rng = np.random.default_rng(5)
    crops = [np.ascontiguousarray(rng.integers(0, 255, (32, w, 3), dtype=np.uint8)) for w in (40, 300, 90)]
    spec = marks.sample_spec(rng, "center", "tune", opacity=0.6)
    word = np.asarray(marks.draw_mark(Image.new("RGB", (400, 200), (90, 90, 90)), spec))[..., ::-1]
    crops.append(np.ascontiguousarray(word[60:140]))
    ocr = stages[1].ocr.ocr
    together = ocr.recognize(crops)
    alone = [ocr.recognize([c]) for c in crops]
    assert list(together[0]) == [a[0][0] for a in alone]
    assert list(together[1]) == pytest.approx([a[1][0] for a in alone], abs=1e-6)


def _rotated_centre_words() -> dict[str, bytes]:
    """Tune-family centre words at 25 degrees: 'WATERMARK' over brick, whose box's bounding rectangle covers
    more than half the image, and 'Dreamstock' over camera, read only in part ('Dreams') by a box off centre."""
    fonts = {Path(f).name: f for f in marks.family_fonts("tune")}
    need = ("DejaVuSansMono-BoldOblique.ttf", "DejaVuSans-BoldOblique.ttf")
    if not all(n in fonts for n in need):
        return {}
    base = {"brick": SKIMAGE / "brick.png", "camera": SKIMAGE / "camera.png"}
    out = {}
    for name, photo, text, font, size, opacity, colour, shadow, q in (
            ("wide", "brick", "WATERMARK", need[0], 0.17, 0.58, (0, 0, 0), True, 85),
            ("part", "camera", "Dreamstock", need[1], 0.165, 0.35, (33, 187, 29), True, 76)):
        spec = marks.MarkSpec(kind="center", text=text, font=fonts[font], size_rel=size, opacity=opacity,
                              colour=colour, shadow=shadow, angle=25.0, corner="bl", jpeg_quality=q)
        out[name] = marks.jpeg(marks.draw_mark(Image.open(base[photo]).convert("RGB"), spec), q)
    return out


def test_rotated_centre_words_are_read_and_rejected(stages):
    """A box is a candidate by its polygon's area (not its bounding rectangle's), and a box across the
    image's centre counts as centred: both rotated tune-family words are rejected."""
    text, wm, _ = stages
    words = _rotated_centre_words()
    if not words:
        pytest.skip("the DejaVu Sans (Mono) Bold Oblique fonts (fonts-dejavu) are not installed")
    batch = {"image": list(words.values())}
    t = text.measure(batch)
    got = wm.measure({**batch, **{c: t[c] for c in SHARED}})
    reasons = wm.reject(_table(got, len(words)))
    for k, name in enumerate(words):
        assert reasons[k] == "watermark>0.8", (name, got["watermark_score"][k], got["watermark_strings"][k])
        assert got["watermark_center_word"][k] == 1.0, name
    # the large rotated box: its bounding rectangle holds more than half the image, its polygon less
    h, w = np.asarray(Image.open(io.BytesIO(words["wide"]))).shape[:2]
    big = [np.asarray(b, np.float32).reshape(4, 2) for b in t["text_det_boxes"][0]]
    assert any(np.ptp(b[:, 0]) * np.ptp(b[:, 1]) > 0.5 * h * w for b in big)
    box = np.array([[0, 60], [200, 0], [220, 40], [20, 100]], np.float32)  # crosses the centre (110, 50)
    assert wm_evidence.placement(box, 100, 220)[1] and not wm_evidence.placement(box * 0.3, 100, 220)[1]


def test_a_sample_the_text_stage_did_not_see_is_detected_again(stages):
    _, wm, _ = stages
    before = wm.ocr.ocr.det_calls
    data = [SKIMAGE.joinpath("astronaut.png").read_bytes()] * 2
    wm.measure({"image": data, "text_det_boxes": [[], None], "text_det_scores": [[], None],
                "text_det_strings": [[], None], "text_det_rec_scores": [[], None]})
    assert wm.ocr.ocr.det_calls - before == 1  # the null row only: an empty list is "no text", not "not seen"


def test_marks_are_rejected_scene_text_and_clean_photos_are_not(scored, stages):
    names, _, shared, _, _, _ = scored
    reasons = dict(zip(names, stages[1].reject(_table(shared, len(names)))))
    score = dict(zip(names, shared["watermark_score"]))
    for n in (*SCENE_TEXT, *CLEAN):
        assert reasons[n] is None, (n, score[n], shared["watermark_strings"][names.index(n)])
    for n in ("tiled", "corner", "center", "demo"):
        assert reasons[n] == "watermark>0.8", (n, score[n], shared["watermark_strings"][names.index(n)])
    assert min(score[n] for n in ("tiled", "corner", "center", "demo")) > max(score[n] for n in (*SCENE_TEXT, *CLEAN))
    # the evidence columns say why: the tiled mark repeats (reading stops once past the cut, so with
    # recognize: needed its count is of the boxes read so far), the demo's "(c) stockphoto" reads as a mark
    assert shared["watermark_repeat"][names.index("tiled")] >= 2
    assert shared["watermark_mark_text"][names.index("demo")] == 1.0
    assert shared["watermark_opacity"][names.index("bus")] > shared["watermark_opacity"][names.index("tiled")]


def test_evidence_functions():
    assert wm_evidence.looks_like_mark("© 2023 John Smith") and wm_evidence.looks_like_mark("www.example.com")
    assert wm_evidence.looks_like_mark("Copýrighit Kim Lee")  # OCR misreads, accents folded
    assert wm_evidence.looks_like_mark("istockimage") and wm_evidence.looks_like_mark("PREVIEW")
    assert not any(wm_evidence.looks_like_mark(s) for s in ("MADRID", "emisiones", "YAMAHA", "compiles"))
    assert wm_evidence.repeat_count(["shutterpix", "shutterp", "hutterpix", "MADRID"]) == 3
    assert wm_evidence.repeat_count(["cero", "emisiones"]) == 1 and wm_evidence.repeat_count([]) == 0
    # opacity of white text drawn at alpha a over a textured grey background: estimated within 0.12
    rng = np.random.default_rng(0)
    for a in (0.2, 0.5, 0.9):
        bg = np.clip(rng.normal(110, 12, (60, 300)), 0, 255)
        ink = np.zeros((60, 300), bool)
        for x0 in range(20, 280, 40):
            ink[15:45, x0:x0 + 8] = True
            ink[15:21, x0:x0 + 25] = True
        img = np.where(ink, bg + a * (255 - bg), bg).astype(np.uint8)
        box = np.array([[10, 8], [290, 8], [290, 52], [10, 52]], np.float32)
        assert wm_evidence.box_opacity(img, box) == pytest.approx(a, abs=0.12)
    assert wm_evidence.score({"watermark_n_boxes": 0}) == 0.0


def test_method_resolution_and_config_checks(tmp_path):
    cfg = default_config()["watermark"]
    s = WatermarkStage(cfg)
    assert s.method == "ocr" and s.enabled and s.info() == {"method": "ocr"}
    assert "watermark_repeat" in s.writes
    laion = WatermarkStage(cfg | {"weights": str(tmp_path / "w.pt")})
    assert laion.method == "laion" and laion.writes == ("watermark_score", "watermark_error")
    (tmp_path / "card").mkdir()
    (tmp_path / "card" / "card.json").write_text("{}")
    assert WatermarkStage(cfg | {"weights": str(tmp_path / "card")}).method == "card"
    assert WatermarkStage(cfg | {"method": "laion"}).skip_reason() == "watermark.weights not set: stage skipped, columns null"
    with pytest.raises(ValueError, match="watermark.method=ocr takes no weights"):
        WatermarkStage(cfg | {"method": "ocr", "weights": "x.pt"})
    with pytest.raises(ConfigError, match="watermark.method must be one of auto, ocr, laion, card"):
        load_config(sets=["watermark.method=trained"])
    with pytest.raises(ConfigError, match="watermark.max_boxes"):
        load_config(sets=["watermark.max_boxes=0"])


def test_weak_boxes_are_kept_and_the_strong_ones_are_rapidocrs_own(stages):
    """The detector keeps boxes down to WEAK_BOX_THRESH for the watermark rule; those from TEXT_BOX_THRESH
    are exactly what rapidocr's default box threshold gives (the text stage counts only those)."""
    from pipeline.stages.ocr import OCR, TEXT_BOX_THRESH, WEAK_BOX_THRESH

    text = stages[0]
    default = OCR(text.max_side, 1, "test")
    default.engine._load_det_model().postprocess_op.box_thresh = TEXT_BOX_THRESH  # rapidocr's default
    rng = np.random.default_rng(3)  # a tiled mark at 25 % on chelsea: 12 boxes, 4 of them weak
    spec = marks.sample_spec(rng, "tiled", "tune", opacity=0.25)
    img = np.asarray(Image.open(io.BytesIO(marks.jpeg(
        marks.draw_mark(Image.open(CLEAN["chelsea"]).convert("RGB"), spec), 85))).convert("RGB"))[..., ::-1].copy()
    weak, weak_scores, _ = text.ocr.detect(img)
    strong, strong_scores, _ = default.detect(img)
    assert min(weak_scores) >= WEAK_BOX_THRESH - 1e-6 and min(strong_scores) >= TEXT_BOX_THRESH - 1e-6
    assert any(s < TEXT_BOX_THRESH for s in weak_scores)  # the weak ones exist on a translucent mark
    kept = sorted(b.round(1).tobytes() for b, s in zip(weak, weak_scores) if s >= TEXT_BOX_THRESH)
    assert kept == sorted(b.round(1).tobytes() for b in strong)


def _missed_corner_lines() -> dict[str, bytes]:
    """Tune-family corner lines the detector puts no box on: white 'fotobase.com' at opacity 0.25 in the
    top-left and bottom-right bands of chelsea (DejaVu Serif Condensed Bold, 3.1 % of the height)."""
    fonts = [f for f in marks.family_fonts("tune") if f.endswith("DejaVuSerifCondensed-Bold.ttf")]
    out = {}
    for corner in ("tl", "br") if fonts else ():
        spec = marks.MarkSpec(kind="corner", text="fotobase.com", font=fonts[0], size_rel=0.031, opacity=0.25,
                              colour=(255, 255, 255), shadow=False, angle=0.0, corner=corner, jpeg_quality=93)
        out[f"line_{corner}"] = marks.jpeg(marks.draw_mark(Image.open(CLEAN["chelsea"]).convert("RGB"), spec), 93)
    return out


def test_corner_read_finds_lines_without_a_box_and_keeps_scene_text(stages):
    """watermark.corner_read: the five corner crops read without boxes; corner lines the detector missed
    are rejected, the clean and scene-text photos are still kept, and rows already above the cut are not
    read again (watermark_corner_text null)."""
    text, wm, _ = stages
    lines = _missed_corner_lines()
    if not lines:
        pytest.skip("the DejaVu Serif Condensed Bold font (fonts-dejavu) is not installed")
    on = WatermarkStage({**default_config()["watermark"], "corner_read": True})
    on.setup()
    images = {**{k: p.read_bytes() for k, p in {**SCENE_TEXT, **CLEAN}.items()}, **lines, "tiled": _marked()["tiled"]}
    names = list(images)
    batch = {"image": list(images.values())}
    t = text.measure(batch)
    shared = {c: t[c] for c in SHARED}
    off, got = wm.measure({**batch, **shared}), on.measure({**batch, **shared})
    reasons = dict(zip(names, on.reject(_table(got, len(names)))))
    for n in lines:
        k = names.index(n)
        assert off["watermark_score"][k] <= 0.8 and off["watermark_corner_text"][k] is None, n
        assert got["watermark_corner_text"][k] == 1.0 and reasons[n] == "watermark>0.8", (n, got["watermark_strings"][k])
    assert reasons["tiled"] == "watermark>0.8"
    for n in (*SCENE_TEXT, *CLEAN):
        assert reasons[n] is None, (n, got["watermark_score"][names.index(n)], got["watermark_strings"][names.index(n)])
        assert got["watermark_corner_text"][names.index(n)] == 0.0
    assert got["watermark_corner_text"][names.index("tiled")] is None  # already above the cut: not read
    assert on.ocr.corner_reads == len(names) - 1
    with pytest.raises(ConfigError, match="watermark.corner_read"):
        load_config(sets=["watermark.corner_read=3"])
