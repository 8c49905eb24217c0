"""The source's own fields as columns: size.use_original in the size and person-box rules, and the
'input' reason prefix first in the decision and the funnel."""
import pytest

from catalog import SAMPLES, conform
from catalog.config import ConfigError
from pipeline.config import load_config
from pipeline.decide import decide, funnel
from pipeline.stages import build_stages
from pipeline.stages.person import PersonStage
from pipeline.stages.size import SizeStage, judged


@pytest.mark.parametrize("stored,original,use,expect", [
    ((770, 512), (451, 300), True, (300, True, 300 / 512)),    # img2dataset keep_ratio upscale
    ((770, 512), (451, 300), False, (512, True, 1.0)),
    ((683, 512), (800, 600), True, (512, False, 1.0)),        # downscaled: judged as stored
    ((512, 770), (451, 300), True, (300, True, 300 / 512)),    # EXIF-rotated against the original
    ((640, 480), (None, None), True, (480, None, 1.0)),       # nothing recorded
])
def test_judged_resolution(stored, original, use, expect):
    short, aspect, upscaled, scale = judged(*stored, *original, use)
    assert (short, upscaled) == expect[:2] and scale == pytest.approx(expect[2])
    assert aspect == pytest.approx(max(stored) / min(stored))
    assert judged(None, 5, 1, 1) == (None, None, None, None)


def _table(**cols):
    n = len(next(iter(cols.values())))
    return conform([{k: v[i] for k, v in cols.items()} for i in range(n)], SAMPLES)


def test_size_rule_and_select_follow_use_original():
    t = _table(sample_id=["up", "down"], width=[768, 683], height=[512, 512], original_width=[300, 800],
               original_height=[200, 600], scored_stages=[["decode", "size"]] * 2)
    on = decide(t, build_stages(load_config(sets=["stages=[decode,size]"])))
    assert on.column("reject_reason").to_pylist() == ["size:short_side<300", None]
    assert on.column("upscaled").to_pylist() == [True, False] and on.column("short_side").to_pylist() == [200, 512]
    off = decide(t, build_stages(load_config(sets=["stages=[decode,size]", "size.use_original=false"])))
    assert off.column("reject_reason").to_pylist() == [None, None] and off.column("short_side").to_pylist() == [512, 512]
    with pytest.raises(ConfigError, match="size.use_original"):
        load_config(sets=["size.use_original=maybe"])


def test_person_box_rule_judges_the_original_resolution():
    box = [[0.0, 0.0, 200.0, 500.0]]  # 500 px tall in the stored (upscaled 2x) image, 250 in the original
    t = _table(sample_id=["a", "b"], person_boxes=[box, box], person_scores=[[0.95], [0.95]],
               person_box_max_px=[500.0, 500.0], resolution_scale=[0.5, 1.0])
    stage = PersonStage({"min_score": 0.9, "min_box_px": 300, "score": "raw"})
    assert stage.reject(t) == ["box<=300px", None]
    derived = stage.derive(t)
    assert derived["person_n_pass"] == [0, 1] and derived["person_box_max_px"] == [250.0, 500.0]


def test_download_failures_are_input_reasons_first_in_the_funnel():
    t = _table(sample_id=["ok", "gone", "junk"], width=[400, None, None], height=[400, None, None],
               decode_error=[None, "download failed: failed_to_download: HTTP Error 404", "not an image: x"],
               scored_stages=[["decode", "size"]] * 3)
    out = decide(t, build_stages(load_config(sets=["stages=[decode,size]"])))
    assert out.column("reject_reason").to_pylist() == [None, "input:download_failed", "decode:not_an_image"]
    f = funnel(out.column("reject_reason").to_pylist(), ["decode", "size"])
    assert [(r["stage"], r["in"], r["out"]) for r in f] == [("input", 3, 2), ("decode", 2, 1), ("size", 1, 1)]
    # the decode stage alone rejects it too (so no later stage sees a sample without bytes)
    assert build_stages(load_config(sets=["stages=[decode]"]))[0].reject(t) == [None, "download_failed", "not_an_image"]
    assert SizeStage({}).use_original is True
