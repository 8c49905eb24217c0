"""watermark and art stages: bring-your-own weights. The tests build randomly initialised
checkpoints of the real architectures, save them, and run the real loading and inference paths.
Random weights give meaningless scores, so only the plumbing is asserted, never a decision."""
from __future__ import annotations

import io
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFont

import catalog
from pipeline.config import default_config
from pipeline.stages.art import PROMPT_GROUPS, ArtStage, group_probs
from pipeline.stages.watermark.stage import WatermarkStage, build_model

SKIMAGE = Path(str(resources.files("skimage") / "data"))


def _png(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def watermarked(path: Path, text: str = "(c) stockphotos.example") -> bytes:
    """A semi-transparent tiled watermark, the kind LAION's classifier was trained on."""
    im = Image.open(path).convert("RGBA")
    layer = Image.new("RGBA", im.size, (0, 0, 0, 0))
    d = ImageDraw.Draw(layer)
    font = ImageFont.load_default(size=max(12, im.height // 14))
    for y in range(0, im.height, im.height // 4):
        d.text((10 + (y // 3) % 60, y), text, font=font, fill=(255, 255, 255, 110))
    return _png(Image.alpha_composite(im, layer).convert("RGB"))


def flat_graphic() -> bytes:
    """Synthetic graphics: flat colour shapes, like clip art."""
    im = Image.new("RGB", (400, 300), (240, 200, 40))
    d = ImageDraw.Draw(im)
    d.ellipse([50, 50, 200, 200], fill=(30, 90, 200))
    d.rectangle([220, 80, 380, 260], fill=(200, 30, 60))
    return _png(im)


IMAGES = {
    "astronaut": (SKIMAGE / "astronaut.png").read_bytes(),
    "watermarked": watermarked(SKIMAGE / "coffee.png"),
    "graphic": flat_graphic(),
    "garbage": b"GIF89a truncated",
}


def _table(out, n):
    return catalog.conform([{k: v[i] for k, v in out.items()} for i in range(n)], catalog.SAMPLES)


# --- watermark -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def watermark_ckpt(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("wm") / "watermark_model_v1.pt"
    torch.save(build_model().state_dict(), path)
    return path


def test_watermark_without_weights_is_skipped_with_a_reason():
    # method laion named without weights (with no method set, the ocr method runs: test_stage_watermark_ocr.py)
    s = WatermarkStage(default_config()["watermark"] | {"method": "laion"})
    assert not s.enabled
    assert s.skip_reason() == "watermark.weights not set: stage skipped, columns null"


def test_watermark_loads_checkpoint_and_scores_batch(watermark_ckpt):
    s = WatermarkStage(default_config()["watermark"] | {"weights": str(watermark_ckpt)})
    assert s.enabled
    s.setup()
    names = list(IMAGES)
    out = s.measure({"sample_id": names, "image": list(IMAGES.values())})
    assert set(out) == {"watermark_score", "watermark_error"}
    scores = dict(zip(names, out["watermark_score"]))
    for n in ("astronaut", "watermarked", "graphic"):
        assert 0.0 <= scores[n] <= 1.0
    assert scores["garbage"] is None and "decode" in out["watermark_error"][3]
    # a sample's score does not depend on its batch (eval mode: no dropout, BN running stats)
    alone = s.measure({"sample_id": ["a"], "image": [IMAGES["graphic"]]})["watermark_score"][0]
    assert alone == pytest.approx(scores["graphic"], abs=1e-4)
    # reject reads only stored scores and the threshold
    table = _table(out, len(names))
    cut = sorted(v for v in scores.values() if v is not None)[1]  # between the lowest and highest
    reasons = WatermarkStage({"weights": "x", "max_score": cut}).reject(table)
    assert reasons[3] == "error"
    assert [r is not None for r in reasons[:3]] == [scores[n] > cut for n in names[:3]]
    assert reasons[[scores[n] for n in names[:3]].index(max(scores[n] for n in names[:3]))] == f"watermark>{cut:g}"


def test_watermark_unwraps_training_checkpoints(tmp_path, watermark_ckpt):
    sd = torch.load(watermark_ckpt, weights_only=True)
    wrapped = tmp_path / "wrapped.pt"
    torch.save({"state_dict": {"module." + k: v for k, v in sd.items()}, "epoch": 3}, wrapped)
    a = WatermarkStage({"weights": str(watermark_ckpt)})
    b = WatermarkStage({"weights": str(wrapped)})
    batch = {"sample_id": ["g"], "image": [IMAGES["graphic"]]}
    assert a.measure(batch)["watermark_score"][0] == pytest.approx(b.measure(batch)["watermark_score"][0], abs=1e-5)


def test_watermark_wrong_or_missing_checkpoint_is_a_clear_error(tmp_path):
    import timm

    other = tmp_path / "b3_imagenet_head.pt"
    torch.save(timm.create_model("efficientnet_b3", pretrained=False, num_classes=2).state_dict(), other)
    with pytest.raises(RuntimeError, match="not a LAION watermark checkpoint"):
        WatermarkStage({"weights": str(other)}).setup()
    with pytest.raises(FileNotFoundError, match="watermark.weights=.*no such file"):
        WatermarkStage({"weights": str(tmp_path / "missing.pt")}).setup()


# --- art -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def art_ckpt(tmp_path_factory):
    import open_clip

    torch.manual_seed(0)
    model = open_clip.create_model("ViT-B-32", pretrained=None)  # random init, no download
    path = tmp_path_factory.mktemp("art") / "vit_b32_random.pt"
    torch.save(model.state_dict(), path)
    return path


def test_art_method_follows_the_weights(art_ckpt, tmp_path):
    """auto: the shipped probe without weights, OpenCLIP for a checkpoint file, card for a card folder."""
    assert ArtStage(default_config()["art"]).method == "probe" and ArtStage({}).enabled
    assert ArtStage({"weights": str(art_ckpt)}).method == "clip"
    card = tmp_path / "card"
    card.mkdir()
    (card / "card.json").write_text("{}")
    assert ArtStage({"weights": str(card)}).method == "card"
    assert ArtStage({"method": "clip"}).skip_reason() == "art.method=clip needs art.weights: stage skipped, columns null"
    with pytest.raises(ValueError, match="art.method=probe takes no weights"):
        ArtStage({"method": "probe", "weights": str(art_ckpt)})
    with pytest.raises(ValueError, match="art.method='openclip': expected one of auto, probe, clip_probe, clip, card"):
        ArtStage({"method": "openclip"})
    with pytest.raises(RuntimeError, match="art.method=card: .* is not a humanset filter card"):
        ArtStage({"method": "card", "weights": str(art_ckpt)}).setup()


def test_art_loads_openclip_checkpoint_and_scores(art_ckpt):
    s = ArtStage(default_config()["art"] | {"weights": str(art_ckpt)})
    s.setup()
    assert s.group_emb.shape == (len(PROMPT_GROUPS), 512)
    names = list(IMAGES)
    out = s.measure({"sample_id": names, "image": list(IMAGES.values())})
    for i in range(3):
        assert 0.0 <= out["art_score"][i] <= 1.0
        assert out["art_label"][i] in PROMPT_GROUPS
        assert out["art_error"][i] is None
    assert out["art_score"][3] is None and "decode" in out["art_error"][3]
    table = _table(out, len(names))
    assert ArtStage({"max_score": -1.0}).reject(table) == ["art>-1", "art>-1", "art>-1", "error"]
    assert ArtStage({"max_score": 1.0}).reject(table) == [None, None, None, "error"]


def test_art_checkpoint_of_another_architecture_is_a_clear_error(art_ckpt, tmp_path):
    with pytest.raises(RuntimeError, match="does not load into OpenCLIP RN50"):
        ArtStage({"weights": str(art_ckpt), "model": "RN50"}).setup()
    with pytest.raises(FileNotFoundError, match="art.weights=.*no such file"):
        ArtStage({"weights": str(tmp_path / "nope.bin")}).setup()


def test_group_probs_picks_the_matching_group():
    rng = np.random.default_rng(0)
    groups = rng.normal(size=(6, 16))
    groups /= np.linalg.norm(groups, axis=1, keepdims=True)
    p = group_probs(groups[[2, 5]], groups, logit_scale=100.0)
    assert p.shape == (2, 6) and np.allclose(p.sum(axis=1), 1.0)
    assert p[0].argmax() == 2 and p[1].argmax() == 5 and p[0, 2] > 0.9


# --- one sample that breaks the model costs only its own row ------------------------------------------
def _solid(colour=(90, 140, 60)) -> bytes:
    return _png(Image.new("RGB", (320, 240), colour))


def _poison(stage, monkeypatch):
    """Make the stage's model fail on any batch holding a solid-colour image (a constant input per
    channel), like a sample that trips a kernel; count the calls."""
    real, calls = stage._infer, []

    def infer(x):
        calls.append(len(x))
        flat = x.reshape(x.shape[0], x.shape[1], -1)
        if (flat.std(axis=2) < 1e-3).all(axis=1).any():
            raise RuntimeError("injected failure")
        return real(x)

    monkeypatch.setattr(stage, "_infer", infer)
    return calls


@pytest.mark.parametrize("which", ["watermark", "art"])
def test_a_failing_sample_is_retried_alone_and_only_it_is_rejected(which, watermark_ckpt, art_ckpt, monkeypatch):
    cls, ckpt = (WatermarkStage, watermark_ckpt) if which == "watermark" else (ArtStage, art_ckpt)
    s = cls(default_config()[which] | {"weights": str(ckpt)})
    s.setup()
    names = ["astronaut", "solid", "graphic", "garbage"]
    images = [IMAGES["astronaut"], _solid(), IMAGES["graphic"], IMAGES["garbage"]]
    clean = s.measure({"sample_id": names, "image": images})
    calls = _poison(s, monkeypatch)
    out = s.measure({"sample_id": names, "image": images})
    assert calls == [3, 1, 1, 1]  # the batch of 3 decodable samples, then each alone
    score, error = f"{which}_score", f"{which}_error"
    assert out[error][1] == "inference: injected failure" and out[score][1] is None
    assert out[error][0] is None and out[error][2] is None
    assert out[score][0] == pytest.approx(clean[score][0], abs=1e-4)
    assert out[score][2] == pytest.approx(clean[score][2], abs=1e-4)
    assert "decode" in out[error][3]
    reasons = s.reject(_table(out, 4))
    assert reasons[1] == "error" and reasons[3] == "error"
    assert reasons[0] == s.reject(_table(clean, 4))[0] and reasons[2] == s.reject(_table(clean, 4))[2]
