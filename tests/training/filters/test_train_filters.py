"""train-filter: the synthetic data generators, a short training run per filter (validation above chance),
resume, the card, and the stages loading cards (and refusing wrong files with a clear message).

Photos are the ones shipped in installed packages (scikit-image, ultralytics); models are the `micro`
preset at 32-64 px so each training takes seconds on 2 cores."""
from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from pipeline.demo.crawl import shipped_photos
from pipeline.stages.art import ArtStage
from pipeline.stages.watermark.stage import WatermarkStage
from training.filters import samples as fd
from training.filters import browser as fh
from training.filters import lettering
from training.filters import pages as fpages
from training.filters.train import FilterConfig, FilterModel, build_model, train_filter
from training.filters.thresholds import at_threshold, beats_chance, choose_threshold, roc_auc


@pytest.fixture(scope="module")
def photos() -> list[np.ndarray]:
    out = []
    for data in shipped_photos().values():
        im = Image.open(io.BytesIO(data)).convert("RGB")
        im.thumbnail((256, 256))
        out.append(np.asarray(im))
    return out


@pytest.fixture(scope="module")
def photo_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("photos")
    for name, data in shipped_photos().items():
        (folder / f"{name}.{'png' if data[:4] == bytes([137, 80, 78, 71]) else 'jpg'}").write_bytes(data)
    (folder / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")  # skipped with a warning, not fatal
    return folder


# --- generators -----------------------------------------------------------------------------------
def test_fonts_are_found_and_draw_latin_text():
    fonts = lettering.find_fonts()
    assert fonts and all(Path(f).suffix.lower() in lettering.FONT_EXTS for f in fonts)
    assert not any("sym" in Path(f).name.lower() for f in fonts)


def test_no_fonts_is_a_clear_error(monkeypatch):
    from training.filters import lettering as ft

    monkeypatch.setattr(ft.shutil, "which", lambda name: None)
    monkeypatch.setattr(ft, "FONT_DIRS", ())
    monkeypatch.setattr(ft.importlib.util, "find_spec", lambda name: None)
    ft.find_fonts.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="no TrueType/OpenType fonts found.*fonts-dejavu-core"):
            ft.find_fonts()
    finally:
        ft.find_fonts.cache_clear()


@pytest.mark.parametrize("task", ["watermark", "art"])
def test_samples_are_a_pure_function_of_seed_and_index(task, photos):
    spec = fd.FilterSpec(task, fd.DEFAULT_HOLDOUT[task])
    a = fd.FilterSamples(spec, photos, 48, seed=3, settings=fd.GeneratorSettings(gen_px=96))
    b = fd.FilterSamples(spec, photos, 48, seed=3, settings=fd.GeneratorSettings(gen_px=96))
    other = fd.FilterSamples(spec, photos, 48, seed=4, settings=fd.GeneratorSettings(gen_px=96))
    for k in range(6):
        x, label, positive, family = a.sample(k)
        x2, label2, positive2, family2 = b.sample(k)
        assert x.shape == (3, 48, 48) and x.dtype == np.uint8
        assert np.array_equal(x, x2) and (label, positive, family) == (label2, positive2, family2)
        assert positive == (k % 2 == 1) and family not in spec.holdout
        assert label == spec.label(family) >= 0
    assert any(not np.array_equal(a.sample(k)[0], other.sample(k)[0]) for k in range(4))
    held = fd.FilterSamples(spec, photos, 48, seed=3, split="val_heldout")
    fams = {held.sample(k)[3] for k in range(16)}
    assert fams & set(spec.holdout), fams  # the held-out families are what validation sees


def _stats(rgb: np.ndarray) -> dict:
    grey = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    hsv = cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV)
    return {"colours": len(np.unique((rgb // 8).reshape(-1, 3), axis=0)) / (rgb.shape[0] * rgb.shape[1]),
            "saturation": float(hsv[..., 1].mean()), "white": float((grey > 235).mean()),
            "laplacian": float(cv2.Laplacian(grey, cv2.CV_32F).var())}


def _family_stats(task, family, photos, n=6) -> dict:
    s = fd.GeneratorSettings(gen_px=128)
    out = []
    for k in range(n):
        rng = np.random.default_rng([11, k])
        base = fd.random_view(photos[k % len(photos)], rng, 128)
        img = fd.generate(task, family, base, rng, s)
        assert img.dtype == np.uint8 and img.ndim == 3 and img.shape == base.shape
        diff = np.abs(img.astype(int) - base.astype(int))
        out.append((_stats(img), _stats(base), diff.mean(), diff.max()))
    keys = out[0][0]
    return {k: float(np.median([o[0][k] for o in out])) for k in keys} | \
        {"base_" + k: float(np.median([o[1][k] for o in out])) for k in keys} | \
        {"changed": float(np.median([o[2] for o in out])), "peak": float(np.min([o[3] for o in out]))}


def test_art_families_have_their_own_look(photos):
    # render and html need frames / a Chromium pool: their own tests
    st = {f: _family_stats("art", f, photos) for f in fd.ART_POSITIVE if f not in ("render", "html")}
    assert st["cartoon"]["colours"] < 0.5 * st["cartoon"]["base_colours"]  # few flat colours
    assert st["clipart"]["colours"] < 0.2 * st["clipart"]["base_colours"]
    assert st["pencil"]["saturation"] < 0.5 * st["pencil"]["base_saturation"] + 1  # grey or faint wash
    assert st["painterly"]["saturation"] > st["painterly"]["base_saturation"]  # stronger colour
    assert st["painterly"]["laplacian"] > st["painterly"]["base_laplacian"]  # canvas weave and stroke edges
    assert st["document"]["white"] > 0.3 or st["document"]["colours"] < 0.1  # mostly paper
    for f, v in st.items():
        assert v["changed"] > 10, (f, v)  # every family changes the photo visibly


def test_watermark_families_change_the_photo_where_they_draw(photos):
    for fam in fd.WATERMARK_POSITIVE + ("sign", "border", "frame"):
        st = _family_stats("watermark", fam, photos)
        assert st["peak"] >= 8, (fam, st)  # something visible was drawn on every sample
    tiled = _family_stats("watermark", "text_tiled", photos)["changed"]
    corner = _family_stats("watermark", "text_corner", photos)["changed"]
    assert tiled > corner  # a tiled mark covers more of the image than a corner credit
    assert _family_stats("watermark", "clean", photos)["changed"] == 0


def test_unknown_or_empty_holdout_is_a_clear_error():
    with pytest.raises(ValueError, match="held-out families.*not among"):
        fd.FilterSpec("art", ("oilpaint",))
    with pytest.raises(ValueError, match="leaves a class with no family"):
        fd.FilterSpec("art", ("clean",))


# --- metrics --------------------------------------------------------------------------------------
def test_roc_auc_and_threshold():
    assert roc_auc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert roc_auc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert roc_auc([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1]) == 0.5
    assert roc_auc([0.1, 0.2], [1, 1]) is None
    t = choose_threshold([0.1, 0.3, 0.6, 0.7, 0.9], [0, 0, 1, 0, 1], 1.0)
    assert t["reached"] and t["score"] == pytest.approx(0.7)  # only > 0.7 is all positives
    # target out of reach: best F1 among thresholds that beat chance (precision above the 40% positives)
    t = choose_threshold([0.1, 0.3, 0.6, 0.7, 0.9], [0, 0, 1, 0, 1], 1.01)
    assert not t["reached"] and t["score"] == pytest.approx(0.3) and "rejects_nothing" not in t
    # worse than chance: rejecting everything would have the best F1 (0.57), but the threshold rejects nothing
    scores, positive = [0.1, 0.2, 0.8, 0.9], [1, 1, 0, 0]
    t = choose_threshold(scores, positive, 0.9)
    assert t == {"score": 1.0, "target_precision": 0.9, "reached": False, "rejects_nothing": True}
    assert at_threshold(scores, positive, t["score"])["tp"] + at_threshold(scores, positive, t["score"])["fp"] == 0
    # the gate on the classifier itself: ROC AUC against chance in standard errors
    rng = np.random.default_rng(0)
    y = np.arange(200) % 2 == 0
    assert beats_chance(y + rng.normal(0, 0.5, 200), y)[0]  # informative
    ok, z = beats_chance(rng.random(200), y)
    assert not ok and abs(z) < 2.33  # noise
    ok, z = beats_chance(-(y + rng.normal(0, 0.5, 200)), y)
    assert not ok and z < -5  # inverted
    assert beats_chance([0.1, 0.2], [1, 1]) == (False, None)


# --- training, the card, the stages -----------------------------------------------------------------
def tiny(task, images, out, **kw) -> FilterConfig:
    # no HTML pool unless a test asks for one: the figures below were measured on the other art families, and
    # Chromium costs seconds per window; the html family has its own tests (end of file)
    values = dict(filter=task, images=str(images), output=str(out), model="micro", input_px=32, gen_px=64,
                  batch_size=16, steps=40, lr=2e-3, layer_decay=1.0, warmup_steps=3, val_samples=64,
                  loader_workers=0, checkpoint_every=1000, max_images=50, progress=False, html_pages=0)
    return FilterConfig(**(values | kw))


@pytest.fixture(scope="module")
def art_card(photo_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("art")
    # 256 validation samples: with 64 the AUC's own noise is about +-0.07. At this seed the figures hold when the
    # training path is perturbed (1 or 2 threads, other fonts, 36-44 steps): seen 0.89-0.95, held-out 0.65-0.68.
    # Over seeds (other photo splits) held-out painterly ranges 0.56-0.79: a micro ViT from random weights
    # generalises to an unseen style only weakly; the README's figures come from the demo's longer run.
    card = train_filter(tiny("art", photo_dir, out, val_samples=256))
    return out, card


@pytest.mark.train
def test_art_filter_trains_above_chance_on_a_held_out_style(art_card):
    out, card = art_card
    assert (out / "model.pt").is_file() and (out / "card.json").is_file() and (out / "checkpoints").is_dir()
    v = card["validation"]
    assert card["generator"]["holdout"] == ["painterly"]
    assert set(v["heldout"]["families"]) == {"painterly", "clean"}
    assert v["seen"]["roc_auc"] > 0.7, v["seen"]
    assert v["heldout"]["roc_auc"] > 0.58, v["heldout"]
    assert card["classes"][0] == "photo" and "painting" not in card["classes"]
    assert card["training"]["random_init"] is True
    for key in ("precision", "recall"):
        assert key in v["heldout"]["at_threshold"]


@pytest.mark.train
def test_watermark_filter_trains_above_chance(photo_dir, tmp_path):
    # a randomly initialised micro ViT learns faint overlays slowly: marks at opacity 0.5-0.6 on 64 px inputs,
    # the small corner marks and the scene-text / frame negatives held out. Measured over 11 seeds and two font
    # sets (DejaVu core only, as deps/ installs, and a machine with more): seen AUC 0.62-0.74, held-out 0.58-0.67
    # on 512 validation samples each (with 128 the AUC's own noise, about +-0.05, failed a CI run at 0.545).
    cfg = tiny("watermark", photo_dir, tmp_path, input_px=64, gen_px=96, steps=120, batch_size=32, lr=3e-3,
               opacity=(0.5, 0.6), holdout=["text_corner", "logo_corner", "frame", "sign"], warmup_steps=10,
               val_samples=512)
    card = train_filter(cfg)
    v = card["validation"]
    assert card["classes"] == ["clean", "watermark"] and card["keep_class"] == "clean"
    assert v["seen"]["roc_auc"] > 0.58, v["seen"]
    assert v["heldout"]["roc_auc"] > 0.54, v["heldout"]


@pytest.mark.train
def test_card_weights_load_into_timm_and_match_the_trained_model(art_card):
    import timm.models.vision_transformer as vt

    out, card = art_card
    timm_model = vt.VisionTransformer(**card["architecture"]["kwargs"]).eval()
    timm_model.load_state_dict(torch.load(out / "model.pt", weights_only=True), strict=True)
    cfg = FilterConfig(filter="art", model="micro", input_px=32)
    ours = build_model(cfg, len(card["classes"]), load_weights=False)
    state = torch.load(out / "checkpoints" / "step-00000040.pt", weights_only=True)["model"]
    ours.load_state_dict(state)
    x = torch.randn(2, 3, 32, 32)
    assert torch.allclose(ours.eval()(x), timm_model(x), atol=1e-5)
    assert isinstance(ours, FilterModel)


@pytest.mark.train
def test_resume_continues_to_the_same_weights(photo_dir, tmp_path):
    import shutil

    whole = train_filter(tiny("art", photo_dir, tmp_path / "whole", steps=6, checkpoint_every=3, val_samples=8))
    # a run stopped after its step-3 checkpoint, resumed
    (tmp_path / "cut" / "checkpoints").mkdir(parents=True)
    shutil.copy(tmp_path / "whole" / "checkpoints" / "step-00000003.pt", tmp_path / "cut" / "checkpoints")
    resumed = train_filter(tiny("art", photo_dir, tmp_path / "cut", steps=6, checkpoint_every=3, val_samples=8,
                                resume="auto"))
    a = torch.load(tmp_path / "whole" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "cut" / "model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["training"]["steps_run"] == 3 and whole["training"]["steps_run"] == 6


@pytest.mark.train
def test_art_stage_scores_with_a_card(art_card, photo_dir):
    out, card = art_card
    for weights in (out, out / "card.json"):
        stage = ArtStage({"weights": str(weights)})
        assert stage.enabled
        stage.setup()
        names = ["astronaut.png", "coffee.png"]
        images = [(photo_dir / n).read_bytes() for n in names] + [b"GIF89a broken"]
        res = stage.measure({"sample_id": names + ["bad"], "image": images})
        for s, label in zip(res["art_score"][:2], res["art_label"][:2]):
            assert 0.0 <= s <= 1.0 and label in card["classes"]
        assert res["art_score"][2] is None and "decode" in res["art_error"][2]
    # the stage's score is exactly 1 - P(photo) of the card's model on the same input
    from pipeline.inputs.images import load_rgb
    rgb, _ = load_rgb(images[0], max_side=2 * stage.input_px)
    x = stage.preprocess(Image.fromarray(rgb))[None]
    with torch.no_grad():
        p = torch.softmax(stage.model.clf.model(x), dim=1)[0]
    assert res["art_score"][0] == pytest.approx(float(1 - p[card["classes"].index("photo")]), abs=1e-4)


@pytest.fixture(scope="module")
def watermark_card(photo_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("wm")
    return out, train_filter(tiny("watermark", photo_dir, out, steps=2, val_samples=8))


@pytest.mark.train
def test_watermark_stage_scores_with_a_card(watermark_card, photo_dir):
    out, card = watermark_card
    stage = WatermarkStage({"weights": str(out)})
    stage.setup()
    data = [(photo_dir / "astronaut.png").read_bytes(), (photo_dir / "bus.jpg").read_bytes(), b""]
    res = stage.measure({"sample_id": ["a", "b", "c"], "image": data})
    assert all(0.0 <= s <= 1.0 for s in res["watermark_score"][:2])
    assert res["watermark_score"][2] is None and res["watermark_error"][2]
    reasons = WatermarkStage({"weights": str(out), "max_score": -1}).reject(
        __import__("catalog").conform([{k: v[i] for k, v in res.items()} for i in range(3)],
                                      __import__("catalog").SAMPLES))
    assert reasons == ["watermark>-1", "watermark>-1", "error"]  # higher = reject, as with LAION's model


@pytest.mark.train
def test_wrong_files_are_clear_errors(watermark_card, art_card, tmp_path):
    wm, _ = watermark_card
    art, _ = art_card
    with pytest.raises(ValueError, match="card of the 'watermark' filter; the art stage needs one made by"):
        ArtStage({"weights": str(wm)}).setup()
    with pytest.raises(ValueError, match="card of the 'art' filter; the watermark stage"):
        WatermarkStage({"weights": str(art / "card.json")}).setup()
    # an encoder export (a ViT state dict) is neither LAION's model nor a card
    torch.save(torch.load(wm / "model.pt", weights_only=True), tmp_path / "encoder.pth")
    with pytest.raises(RuntimeError, match=r"encoder.pth: not a LAION watermark checkpoint .* nor a humanset filter card"):
        WatermarkStage({"weights": str(tmp_path / "encoder.pth")}).setup()
    # a folder without a card
    with pytest.raises(FileNotFoundError, match="a folder without card.json"):
        WatermarkStage({"weights": str(tmp_path)}).setup()
    # a card whose architecture does not fit its weights names the weights file
    bad = tmp_path / "bad"
    bad.mkdir()
    card = json.loads((wm / "card.json").read_text())
    card["architecture"]["kwargs"]["depth"] += 1
    (bad / "card.json").write_text(json.dumps(card))
    (bad / "model.pt").write_bytes((wm / "model.pt").read_bytes())
    with pytest.raises(RuntimeError, match=r"weights model.pt do not load into the card's timm VisionTransformer"):
        WatermarkStage({"weights": str(bad)}).setup()
    # a weights name from the card never leaves the card's folder
    card = json.loads((wm / "card.json").read_text()) | {"weights": "../model.pt"}
    (bad / "card.json").write_text(json.dumps(card))
    with pytest.raises(ValueError, match="must be a file name in the card's folder"):
        WatermarkStage({"weights": str(bad)}).setup()
    # any other JSON
    (bad / "card.json").write_text(json.dumps({"img_size": 64}))
    with pytest.raises(ValueError, match="not a humanset filter card"):
        WatermarkStage({"weights": str(bad / "card.json")}).setup()


def test_missing_images_or_encoder_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="--images .*no such file or folder"):
        train_filter(tiny("art", tmp_path / "nothing", tmp_path / "out"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no decodable image"):
        train_filter(tiny("art", tmp_path / "empty", tmp_path / "out"))
    with pytest.raises(FileNotFoundError, match="--encoder .*no such file"):
        train_filter(tiny("art", tmp_path, tmp_path / "out", encoder=str(tmp_path / "enc.pth")))


def test_scene_text_negatives_come_from_the_text_stage(demo_run):
    from training.filters.inputs import WATERMARK_LIKE, read_scene_text

    run, _ = demo_run
    strings = read_scene_text(run)
    assert strings, "the demo crawl's bus sign and captions are read by the text stage"
    assert not any(WATERMARK_LIKE.search(s) for s in strings)  # the demo's '(c) stockphoto' overlays are left out
    rng = np.random.default_rng(0)
    photo = np.full((96, 128, 3), 128, np.uint8)
    assert fd.sign(photo, rng, strings).shape == photo.shape
    assert read_scene_text(run / "shards") == []  # a plain shards folder has no catalog


@pytest.mark.train
def test_demo_trains_both_filters_and_curates_with_all_seven_stages(demo_crawl, demo_run, tmp_path):
    """`make demo`'s last step, at a few training steps: the funnel of the new run has watermark and art."""
    from humanset.demo import filters_demo

    run, _ = demo_run
    filtered = filters_demo(tmp_path, demo_crawl[0], run, tmp_path / "no-render", tmp_path / "no-encoder.pth",
                            progress=False, steps=2)
    manifest = json.loads((filtered / "manifest.json").read_text())
    assert manifest["skipped_stages"] == {}
    assert manifest["stage_info"]["art"] == {"method": "card"}  # auto: the trained card replaces the probe
    stages = [f["stage"] for f in manifest["funnel"]]
    assert stages == ["decode", "size", "dedup", "person", "text", "watermark", "art"]
    wm = next(f for f in manifest["funnel"] if f["stage"] == "watermark")
    assert wm["in"] > 0  # the trained filter scored the samples that reached it
    for task in ("watermark", "art"):
        card = json.loads((tmp_path / "filters" / task / "card.json").read_text())
        assert manifest["config"][task]["weights"] == str(tmp_path / "filters" / task)
        assert manifest["config"][task]["max_score"] == pytest.approx(card["threshold"]["score"], abs=1e-4)
        assert "auc_z" in card["threshold"]
        stage = next(f for f in manifest["funnel"] if f["stage"] == task)
        if card["threshold"].get("rejects_nothing"):  # 2 steps: no better than chance, so it deletes nothing
            assert card["threshold"]["score"] == 1.0 and stage["in"] == stage["out"], (task, stage)


@pytest.mark.train
def test_train_filter_on_ray_train_workers(ray_local, photo_dir, tmp_path):
    card = train_filter(tiny("art", photo_dir, tmp_path / "ray", steps=2, batch_size=8, val_samples=8, workers=2,
                             checkpoint_every=2))
    assert card["training"]["workers"] == 2 and (tmp_path / "ray" / "model.pt").is_file()
    assert (tmp_path / "ray" / "checkpoints" / "step-00000002.pt").is_file()


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    from humanset.cli import main

    assert main(["train-filter", "art", "--images", str(tmp_path / "none"), "--output", str(tmp_path / "o")]) == 2
    assert "humanset train-filter: error: --images" in capsys.readouterr().err


def test_render_frames_are_read_from_render_shards(tmp_path, photos):
    """The art filter's '3d render' class: the rgb.png member of each frame (not depth / normal / mask)."""
    import catalog
    from training.filters.inputs import read_photos

    def png(a):
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, "PNG")
        return buf.getvalue()

    writer = catalog.ShardWriter(tmp_path / "render" / "shards", "frames", catalog.FRAMES)
    for i in range(3):
        writer.add(f"{i:06d}", {"rgb.png": png(photos[i][:64, :64]), "mask.png": png(np.zeros((64, 64), np.uint8)),
                               "depth.npy": b"\x93NUMPY"}, {"frame_index": i})
    writer.close()
    frames = read_photos(tmp_path / "render", 10, 64, prefer=".rgb.png", what="--renders")
    assert len(frames) == 3 and all(f.shape == (64, 64, 3) for f in frames)
    assert sorted(f.mean() for f in frames) == pytest.approx(sorted(photos[i][:64, :64].mean() for i in range(3)),
                                                             abs=1e-6)
    spec = fd.FilterSpec("art", ("painterly",), renders=True)
    assert "3d render" in spec.classes
    data = fd.FilterSamples(spec, photos, 32, renders=frames)
    assert any(data.sample(k)[3] == "render" for k in range(1, 40, 2))


# --- HTML screenshots (headless Chromium) ---------------------------------------------------------
def _chromium() -> str:
    path = fh.find_chromium()
    if not path:
        pytest.skip("no chromium on PATH: install Debian's `chromium` (deps/stats.apt.txt) to test the html family")
    return path


def test_html_pages_are_a_pure_function_of_seed_and_index(photos):
    page, window = fh.page_html(3, 1, photos)
    assert (page, window) == fh.page_html(3, 1, photos)
    assert page != fh.page_html(4, 1, photos)[0] and page != fh.page_html(3, 2, photos)[0]
    assert page != fh.page_html(3, 1, photos[::-1])[0]  # its images are cut from the photos it is given
    pages = [fh.page_html(0, i, photos) for i in range(16)]
    html_all = "".join(p for p, _ in pages)
    for part in ("<nav>", "<h1>", "<h2>", "<p>", "<button", "<table>", "<form>", "class='card'", "<aside>",
                 "<footer>", "data:image/jpeg;base64,", "font-family:"):
        assert part in html_all, part
    assert len({w for _, w in pages}) >= 3 and all(w in fpages.WINDOWS for _, w in pages)
    assert len({p for p, _ in pages}) == 16
    for p, _ in pages:  # nothing but data: URIs and in-page links: the page cannot reach the network
        assert fpages.CSP in p
        refs = re.findall(r"""(?:src|href)=["']([^"']*)""", p) + re.findall(r"url\(([^)]*)\)", p)
        assert refs and all(r.startswith("data:") or r == "#" for r in refs), [r[:40] for r in refs]


@pytest.fixture(scope="module")
def html_pool(photos, tmp_path_factory):
    _chromium()
    folder = tmp_path_factory.mktemp("html") / "html_pool"
    # 6 pages: one Chromium window; pages 0 and 5 are validation pages (validation photos)
    return folder, fh.render_pool(folder, 6, 0, photos[1:], photos[:1])


def test_html_pool_renders_real_screenshots(html_pool, photos, monkeypatch):
    folder, pool = html_pool
    assert pool.available and pool.info["failed_pages"] == [] and not pool.info["reused"]
    assert (len(pool.train), len(pool.val)) == (4, 2)
    windows = [fh.page_html(0, i, photos[:1] if i % 5 == 0 else photos[1:])[1] for i in (1, 2, 3, 4, 0, 5)]
    shots = pool.train + pool.val
    small = []
    for rgb, (w, h) in zip(shots, windows):
        assert rgb.shape == (h, w, 3) and rgb.dtype == np.uint8  # the page's own viewport
        q = (rgb // 8).astype(np.int32)
        colours = len(np.unique(q[..., 0] << 10 | q[..., 1] << 5 | q[..., 2]))
        assert rgb.std() > 20 and colours > 20, ("a blank or flat screenshot", rgb.std(), colours)
        small.append(cv2.resize(rgb, (64, 64), interpolation=cv2.INTER_AREA).astype(int))
    diffs = [np.abs(a - b).mean() for i, a in enumerate(small) for b in small[i + 1:]]
    assert min(diffs) > 5, diffs  # six different pages
    # a second run (a resume, a Ray Train worker) reuses the cache without starting Chromium
    monkeypatch.setattr(fh, "screenshot_window", lambda *a, **k: pytest.fail("Chromium ran again"))
    again = fh.render_pool(folder, 6, 0, photos[1:], photos[:1])
    assert again.info["reused"] and all(np.array_equal(a, b) for a, b in zip(again.train + again.val, shots))
    assert fh.pool_key([fh.page_html(1, i, photos) for i in range(6)]) != pool.info["cache"].split("/")[-1]


def test_html_family_samples_are_a_pure_function_of_seed_and_index(html_pool, photos):
    _, pool = html_pool
    spec = fd.FilterSpec("art", fd.DEFAULT_HOLDOUT["art"], html=True)
    assert "html" in spec.positive and "web screenshot" in spec.classes
    assert "html" not in fd.FilterSpec("art", fd.DEFAULT_HOLDOUT["art"]).positive
    make = lambda seed: fd.FilterSamples(spec, photos, 48, seed, fd.GeneratorSettings(gen_px=96),  # noqa: E731
                                         screenshots=pool.train)
    a, b, other = make(3), make(3), make(4)
    html_k = [k for k in range(1, 80, 2) if a.sample(k)[3] == "html"]
    assert len(html_k) >= 3
    for k in html_k:
        x, label, positive, family = a.sample(k)
        assert np.array_equal(x, b.sample(k)[0]) and x.shape == (3, 48, 48)
        assert positive and label == spec.classes.index("web screenshot")
    assert any(not np.array_equal(a.sample(k)[0], other.sample(k)[0]) for k in html_k)
    base = np.zeros((60, 96, 3), np.uint8)
    view = fd.generate("art", "html", base, np.random.default_rng(0), fd.GeneratorSettings(), screenshots=pool.val)
    assert view.shape == base.shape and view.std() > 5
    with pytest.raises(ValueError, match="needs the screenshots of an HTML pool"):
        fd.generate("art", "html", base, np.random.default_rng(0), fd.GeneratorSettings())


@pytest.mark.train
def test_art_training_uses_the_html_pool_and_a_resume_reuses_it(photo_dir, tmp_path, monkeypatch):
    _chromium()
    cfg = dict(steps=2, checkpoint_every=1, val_samples=24, html_pages=6)
    card = train_filter(tiny("art", photo_dir, tmp_path, **cfg))
    info = card["generator"]["html_screenshots"]
    assert info["available"] and info["pages"] == 6 and not info["reused"] and card["generator"]["html_pages"] == 6
    assert "html" in card["generator"]["positive_families"] and "web screenshot" in card["classes"]
    assert "html" in card["validation"]["seen"]["families"]
    monkeypatch.setattr(fh, "screenshot_window", lambda *a, **k: pytest.fail("Chromium ran again"))
    resumed = train_filter(tiny("art", photo_dir, tmp_path, **(cfg | {"steps": 3, "resume": "auto"})))
    assert resumed["generator"]["html_screenshots"]["reused"]
    assert resumed["generator"]["html_screenshots"]["cache"] == info["cache"]


@pytest.mark.train
def test_no_chromium_leaves_the_html_family_out_with_one_warning(photo_dir, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert fh.find_chromium() is None
    monkeypatch.undo()
    monkeypatch.setattr(fh, "find_chromium", lambda: None)
    with caplog.at_level(logging.WARNING):
        card = train_filter(tiny("art", photo_dir, tmp_path, steps=2, val_samples=8, html_pages=8))
    said = [r.getMessage() for r in caplog.records if "chromium" in r.getMessage().lower()]
    assert len(said) == 1 and "LEFT OUT" in said[0] and "apt-get install chromium" in said[0], said
    info = card["generator"]["html_screenshots"]
    assert info["available"] is False and "no chromium on PATH" in info["reason"]
    assert "html" not in card["generator"]["positive_families"] and "web screenshot" not in card["classes"]
    assert not (tmp_path / "html_pool").exists()
