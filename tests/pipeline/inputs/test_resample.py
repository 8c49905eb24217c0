"""The thumbnail's LANCZOS resize is Pillow's to the bit: every size, both pass orders, real photos."""
import importlib.util
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from pipeline.inputs import resample
from pipeline.inputs.images import THUMB, probe, to_rgb
from pipeline.inputs.resample import lanczos_grey


def _pillow(a: np.ndarray, w: int, h: int) -> np.ndarray:
    return np.asarray(Image.fromarray(a).resize((w, h), Image.LANCZOS))


def _images(rng: np.random.Generator, h: int, w: int) -> list[np.ndarray]:
    """Noise, and black/white noise (the sums' extremes: clipping below 0 and above 255)."""
    return [(rng.random((h, w)) * 256).astype(np.uint8),
            np.where(rng.random((h, w)) < 0.5, 0, 255).astype(np.uint8)]


def test_every_width_and_height_up_to_1100_equals_pillow():
    rng = np.random.default_rng(0)
    wrong = []
    for side in range(1, 1101):
        other = int(rng.integers(1, 1101))
        # square, tall or wide in turn: Pillow's pass order turns on the ratio of the two sides
        h, w = ((side, side), (side, other), (other, side))[side % 3]
        a = _images(rng, h, w)[side % 2]
        if not np.array_equal(lanczos_grey(a, THUMB, THUMB), _pillow(a, THUMB, THUMB)):
            wrong.append((h, w))
    assert not wrong, f"differs from Pillow at (h, w) = {wrong[:10]} ({len(wrong)} sizes)"


@pytest.mark.parametrize("h, w, oh, ow", [(300, 20, 32, 32), (20, 300, 32, 32), (32, 500, 32, 32),
                                          (500, 32, 32, 32), (700, 400, 17, 45), (5, 9, 32, 32)])
def test_one_axis_upscales_and_other_output_sizes_equal_pillow(h, w, oh, ow):
    for a in _images(np.random.default_rng(h * w), h, w):
        assert np.array_equal(lanczos_grey(a, ow, oh), _pillow(a, ow, oh))


def test_an_input_over_max_side_is_resized_by_pillow(monkeypatch):
    monkeypatch.setattr(resample, "MAX_SIDE", 64)
    a = _images(np.random.default_rng(1), 100, 70)[0]
    assert np.array_equal(lanczos_grey(a, THUMB, THUMB), _pillow(a, THUMB, THUMB))


def _photos() -> list[bytes]:
    out = []
    for pkg, sub in (("skimage", "data"), ("ultralytics", "assets")):
        spec = importlib.util.find_spec(pkg)  # located, not imported (ultralytics patches PIL's opener)
        if spec and spec.submodule_search_locations:
            root = Path(list(spec.submodule_search_locations)[0]) / sub
            out += [p.read_bytes() for p in sorted(root.glob("*")) if p.suffix in (".jpg", ".png")]
    return out


def test_probe_thumbnails_of_real_photos_equal_pillows_resize():
    """probe()'s thumbnail on shipped photos, as stored and re-encoded as JPEG (draft decode), against
    Pillow's resize of the same decoded grey pixels."""
    photos = _photos()
    if len(photos) < 10:
        pytest.skip(f"only {len(photos)} shipped photos found (skimage and ultralytics must be installed)")
    n = 0
    for data in photos:
        im = Image.open(io.BytesIO(data)).convert("RGB")
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=85)
        for raw in (data, buf.getvalue()):
            grey = Image.open(io.BytesIO(raw))
            if grey.format == "JPEG":
                grey.draft("L" if grey.mode in ("RGB", "L") else None, (8 * THUMB, 8 * THUMB))
            grey = ImageOps.exif_transpose(grey)
            grey = grey if grey.mode == "L" else to_rgb(grey).convert("L")
            want = grey.resize((THUMB, THUMB), Image.LANCZOS).tobytes()
            assert probe(raw)["thumb"] == want
            n += 1
    assert n >= 20
