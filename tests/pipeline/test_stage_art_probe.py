"""The art stage's default method: the shipped probe on the person model's backbone (the whole image and
its centre window at full decoded resolution), on real packaged images.

Photos: scikit-image's and ultralytics' (some of them are in the probe's training pool or the quality
bench's tune split, bench/art_pool.py: these check behaviour, not accuracy, which bench/art_quality.py and
bench/quality.py measure on the eval split the probe never saw). Non-photos:
matplotlib's clip-art present and scikit-image's logo and horse silhouette (none in the pool), and a
photo turned into a painting and a cartoon by the generators of training/filters/styles.py.
"""
from __future__ import annotations

import csv
import io
import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from catalog.rules import ART
from pipeline.config import default_config
from pipeline.inputs.images import load_rgb
from pipeline.stages import art_probe
from pipeline.stages.art import ArtStage
from pipeline.stages.art_probe import PROBE_FILE, PROBE_FORMAT, VIEWS, Probe, crop_input, pooled, to_input
from pipeline.stages.person import default_weights
from pipeline.stages.person_model import file_sha256

SKIMAGE = Path(str(resources.files("skimage") / "data"))
ULTRALYTICS = Path(str(resources.files("ultralytics") / "assets"))
MATPLOTLIB = Path(str(resources.files("matplotlib") / "mpl-data" / "sample_data"))
CUT = ART.default
ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "bench" / "quality" / "images.csv"

# scikit-image's coffee.png is not among them: a smooth studio close-up of a cup, no person, which the art
# stage (after the person stage) never sees; the two-view probe scores it 0.94 ("other"), a known
# weakness on photos without people (docs/quality.md, "The non-photo filter": no_person rejected 0.137)
PHOTOS = {"astronaut": SKIMAGE / "astronaut.png", "chelsea": SKIMAGE / "chelsea.png", "bus": ULTRALYTICS / "bus.jpg",
          "zidane": ULTRALYTICS / "zidane.jpg"}
NON_PHOTOS = {"clip art present": MATPLOTLIB / "Minduka_Present_Blue_Pack.png", "logo": SKIMAGE / "logo.png",
              "horse silhouette": SKIMAGE / "horse.png"}


def _png(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG")
    return buf.getvalue()


def _stylised(style: str) -> bytes:
    from training.filters import styles

    rgb = np.asarray(Image.open(PHOTOS["zidane"]).convert("RGB").resize((640, 360)))
    return _png(getattr(styles, style)(rgb, np.random.default_rng(1)))


@pytest.fixture(scope="module")
def stage():
    s = ArtStage(default_config()["art"])
    assert s.method == "probe" and s.enabled, s.skip_reason()
    s.setup()
    return s


def test_shipped_probe_matches_the_installed_person_model():
    p = Probe()
    assert PROBE_FILE.stat().st_size < 200_000  # package data stays small
    assert p.views == VIEWS and p.crop_px == 320
    assert p.classes[0] == "cartoon" and "photo" in p.classes and p.coef.shape == (len(p.classes), 1152 * len(VIEWS))
    assert p.weights_sha256 == file_sha256(default_weights())
    assert np.all(p.scale > 0)


def _provenance() -> tuple[dict, set[int]]:
    with np.load(PROBE_FILE, allow_pickle=False) as z:
        return json.loads(str(z["provenance"])), {int(v) for v in z["trained_sha256_64"]}


def test_the_shipped_probe_never_saw_the_bench_eval_split():
    """The probe's pool was checked against the bench's manifest; of the bench only tune images trained
    it (their sha256s are recorded in the probe), of the batches it says; no Battle for Wesnoth image
    anywhere; and the shipped threshold is the one fitted on the tune split's held-out scores."""
    prov, trained = _provenance()
    assert prov["pool_excludes"]["manifest"] == "bench/quality/images.csv"
    assert prov["pool_excludes"]["pool_images_in_manifest"] == 0
    with open(MANIFEST, newline="") as f:
        bench = list(csv.DictReader(f))
    in_probe = [r for r in bench if int(r["sha256"][:16], 16) in trained]
    assert not [r["id"] for r in in_probe if r["split"] != "tune"]
    assert len(in_probe) == prov["bench_tune_images"] > 0
    if prov.get("tune_batches") is not None:  # later batches' tune images only fitted the cut, held out
        assert max(int(r["batch"]) for r in in_probe) <= prov["tune_batches"]
        later = [r for r in bench if r["split"] == "tune" and int(r["batch"]) > prov["tune_batches"]]
        assert prov["bench_held_out_images"] <= len(later)
    assert not [p for p in prov["packages"] if "wesnoth" in p.lower()]
    assert len(trained) > 1000  # the pool's images are recorded too, not only the bench's
    assert prov["tune_out_of_fold"]["fitted_cut"] == CUT


def test_file_format_does_not_decide(stage):
    """The probe is trained on every image as a JPEG and as a PNG: photos saved as PNGs stay photos, and
    clip art and a logo saved as poor JPEGs stay non-photos (decoded as the stage decodes them: alpha on
    white)."""
    def jpeg(path: Path) -> bytes:
        buf = io.BytesIO()
        Image.fromarray(load_rgb(path.read_bytes())[0]).save(buf, "JPEG", quality=40)
        return buf.getvalue()

    photos = [_png(load_rgb(PHOTOS[n].read_bytes())[0]) for n in ("bus", "zidane")]
    out = stage.measure({"image": photos + [jpeg(NON_PHOTOS["clip art present"]), jpeg(NON_PHOTOS["logo"])]})
    assert max(out["art_score"][:2]) <= CUT < min(out["art_score"][2:]), out["art_score"]


def test_photos_kept_and_non_photos_rejected(stage):
    names = list(PHOTOS) + list(NON_PHOTOS) + ["painterly zidane", "cartoon zidane"]
    images = [f.read_bytes() for f in (*PHOTOS.values(), *NON_PHOTOS.values())]
    images += [_stylised("painterly"), _stylised("cartoon")]
    out = stage.measure({"image": images})
    scores = dict(zip(names, out["art_score"]))
    labels = dict(zip(names, out["art_label"]))
    assert all(e is None for e in out["art_error"]), out["art_error"]
    for n in PHOTOS:
        assert scores[n] <= CUT and labels[n] == "photo", (n, scores[n], labels[n])
    for n in [*NON_PHOTOS, "painterly zidane", "cartoon zidane"]:
        assert scores[n] > CUT and labels[n] != "photo", (n, scores[n], labels[n])
    assert labels["painterly zidane"] == "painting"


def test_black_and_white_and_dark_photos_stay_photos(stage):
    rgb = np.asarray(Image.open(PHOTOS["astronaut"]).convert("RGB"))
    grey = np.repeat(np.asarray(Image.fromarray(rgb).convert("L"))[..., None], 3, axis=2)
    dark = (rgb.astype(np.float32) * 0.3).astype(np.uint8)
    out = stage.measure({"image": [_png(grey), _png(dark), (SKIMAGE / "camera.png").read_bytes()]})
    assert all(s <= CUT for s in out["art_score"]), out["art_score"]


def test_video_frames_of_photos_stay_photos(stage):
    """Low-bit-rate video or webcam frames (styles.video_frame: shrunk, blocky, colour at half resolution)
    of the shipped photos stay under the cut, colour and black-and-white alike."""
    from training.filters import styles

    frames = []
    for n in ("astronaut", "bus", "zidane"):
        rgb = load_rgb(PHOTOS[n].read_bytes())[0]
        frames += [styles.video_frame(rgb, np.random.default_rng(s)) for s in (0, 3)]
    assert any(np.ptp(f.astype(int) - f[..., :1], axis=None) == 0 for f in frames)  # a black-and-white one
    out = stage.measure({"image": [_png(f) for f in frames]})
    assert all(s <= CUT for s in out["art_score"]), out["art_score"]


def test_video_frame_is_a_pure_function_of_the_generator():
    from training.filters import styles

    rgb = load_rgb(PHOTOS["chelsea"].read_bytes())[0]
    a, b = (styles.video_frame(rgb, np.random.default_rng(7)) for _ in range(2))
    np.testing.assert_array_equal(a, b)
    assert a.shape == rgb.shape and a.dtype == np.uint8
    assert np.abs(a.astype(int) - rgb).mean() > 2  # softened and re-coded, not a copy


def test_a_broken_image_costs_its_own_row(stage):
    out = stage.measure({"image": [b"not an image", PHOTOS["bus"].read_bytes()]})
    assert out["art_score"][0] is None and out["art_error"][0].startswith("decode")
    assert out["art_score"][1] is not None and out["art_error"][1] is None


def test_to_input_keeps_aspect_in_multiples_of_the_stride():
    x = to_input(np.zeros((480, 640, 3), np.uint8), 320)  # 240 rounds to 256 (7.5 strides, to even)
    assert x.shape == (3, 256, 320) and x.dtype == np.float32
    assert to_input(np.zeros((30, 900, 3), np.uint8), 320).shape == (3, 32, 320)


def test_crop_input_is_the_centre_window_at_decoded_resolution():
    rgb = np.arange(480 * 640 * 3, dtype=np.uint32).reshape(480, 640, 3) % 251
    rgb = rgb.astype(np.uint8)
    x = crop_input(rgb, 320)
    assert x.shape == (3, 320, 320) and x.dtype == np.float32
    np.testing.assert_array_equal((x * 255).round().astype(np.uint8).transpose(1, 2, 0), rgb[80:400, 160:480])
    assert crop_input(rgb[:200, :300], 320).shape == (3, 192, 288)  # smaller than the window: not resized
    assert crop_input(rgb[:20, :300], 320).shape == (3, 32, 288)  # under one stride: edge-padded


def test_pooled_is_mean_then_std_per_channel():
    rng = np.random.default_rng(0)
    maps = [rng.normal(size=(2, 3, 4, 5)), rng.normal(size=(2, 2, 2, 2))]
    f = pooled(maps)
    assert f.shape == (2, 2 * (3 + 2))
    np.testing.assert_allclose(f[1, :3], maps[0][1].mean(axis=(1, 2)), rtol=1e-5)
    np.testing.assert_allclose(f[1, 3:6], maps[0][1].std(axis=(1, 2)), rtol=1e-5)
    np.testing.assert_allclose(f[0, 8:], maps[1][0].std(axis=(1, 2)), rtol=1e-5)


def test_a_probe_of_other_weights_is_refused(monkeypatch, tmp_path):
    with np.load(PROBE_FILE) as z:
        data = {k: z[k] for k in z.files}
    data["weights_sha256"] = np.array("0" * 64)
    other = tmp_path / "probe.npz"
    np.savez(other, **data)
    monkeypatch.setattr(art_probe, "PROBE_FILE", other)
    monkeypatch.setattr(Probe.__init__, "__defaults__", (other,))
    with pytest.raises(RuntimeError, match="fitted on the features of another yolo11n-pose.pt"):
        ArtStage({}).setup()


def test_a_missing_or_foreign_probe_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="art probe .*missing"):
        Probe(tmp_path / "none.npz")
    bad = tmp_path / "bad.npz"
    np.savez(bad, format=np.array("something else"))
    with pytest.raises(ValueError, match=f"format 'something else', expected '{PROBE_FORMAT}'"):
        Probe(bad)
