"""The generated watermark sets: what the OCR rule is tuned on shares nothing with what it is measured on."""
from __future__ import annotations

import numpy as np

from pipeline.stages.watermark import marks
from pipeline.stages.watermark.evidence import norm


def test_tune_and_eval_families_are_disjoint():
    tune, ev = marks.TEXTS["tune"], marks.TEXTS["eval"]
    tune_strings = {norm(s) for kind in tune.values() for s in kind}
    eval_strings = {norm(s) for kind in ev.values() for s in kind}
    assert tune_strings and eval_strings and not tune_strings & eval_strings
    # nor one inside another ("SAMPLE" in "SAMPLES ONLY" would share the word the rule keys on)
    assert not [(a, b) for a in tune_strings for b in eval_strings if a in b or b in a]
    assert not set(marks.family_fonts("tune")) & set(marks.family_fonts("eval"))
    assert marks.family_fonts("eval") != [""]  # real fonts installed (deps/*.apt.txt), not Pillow's default
    assert not {p[2] for p in marks.PHOTOS["tune"]} & {p[2] for p in marks.PHOTOS["eval"]}
    assert marks.SEEDS["tune"] != marks.SEEDS["eval"]
    assert set(marks.SCENE_TEXT) <= set(marks.family_photos("eval"))
    assert not set(marks.SCENE_TEXT) & set(marks.family_photos("tune"))


def test_sampled_marks_stay_in_their_family():
    for fam in marks.FAMILIES:
        rng = np.random.default_rng(marks.SEEDS[fam])
        texts = {s for kind in marks.TEXTS[fam].values() for s in kind}
        fonts = set(marks.family_fonts(fam))
        for j in range(60):
            spec = marks.sample_spec(rng, marks.KINDS[j % 3], fam)
            assert spec.text in texts and spec.font in fonts and 0.1 <= spec.opacity <= 0.8


def test_mark_mask_covers_the_drawn_pixels():
    rng = np.random.default_rng(0)
    photo = marks.family_photos("tune")["chelsea"]
    for kind in marks.KINDS:
        spec = marks.sample_spec(rng, kind, "tune", opacity=0.6)
        drawn = np.abs(np.asarray(marks.draw_mark(photo, spec), np.int16) - np.asarray(photo, np.int16)).max(-1) > 8
        mask = marks.mark_mask(photo.size, spec)
        assert drawn.any() and mask[drawn].mean() > 0.99 and mask.mean() < 0.9
