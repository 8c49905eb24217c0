"""A render run's folder: nothing is written before its inputs are checked (a refused start cannot poison
it), it refuses a folder of another kind, records its inputs resolved and leaves no lock behind."""
import json
import struct

import pytest

from catalog import run_kind
from render.config import load_config
from render.run.job import prepare_run, release_run

TINY = ["sampling.camera.height=96", "sampling.camera.width=72", "cycles.samples=4", "cycles.device=cpu"]


def write_hdr(path, w: int = 4, h: int = 2) -> None:
    """A flat (uncompressed) Radiance RGBE image: what an HDRI library holds, in a few bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = struct.pack("4B", 128, 128, 128, 129) * (w * h)
    path.write_bytes(b"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n" + f"-Y {h} +X {w}\n".encode() + pixels)


def test_a_refused_start_writes_nothing_so_the_next_start_is_judged_on_its_own(tmp_path):
    out, cfg = tmp_path / "synth", load_config(sets=TINY)
    with pytest.raises(FileNotFoundError, match=r"--scans .*nonexistent: no such folder; pass a folder of scans"):
        prepare_run(out, str(tmp_path / "nonexistent"), "builtin", 1, 0, cfg)
    assert not out.exists()
    crawl = tmp_path / "crawl"
    crawl.mkdir()
    (crawl / "photo.jpg").write_bytes(b"\xff\xd8\xff")
    with pytest.raises(FileNotFoundError, match=r"crawl holds no .hdr/.exr files"):  # not the builtin lights
        prepare_run(out, "anny", str(crawl), 1, 0, cfg)
    assert not out.exists()


def test_a_folder_of_another_kind_is_refused_untouched(tmp_path):
    run_kind.claim(tmp_path / "r1", "curate")
    with pytest.raises(run_kind.RunKindError, match=r"r1: holds a curation run \(humanset curate\), not a render run"):
        prepare_run(tmp_path / "r1", "anny", "builtin", 1, 0, load_config(sets=TINY))
    assert [p.name for p in (tmp_path / "r1").iterdir()] == [run_kind.MARKER]


def test_a_run_records_its_inputs_resolved_resumes_and_leaves_no_lock(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_hdr(tmp_path / "lights" / "grey.hdr")
    cfg = load_config(sets=TINY)
    spec = prepare_run("synth", "anny", "lights", 1, 0, cfg)
    try:
        manifest = json.loads((tmp_path / "synth" / "render.json").read_text())
        assert manifest["hdris"] == str(tmp_path / "lights") and manifest["scans"] == "anny"
        assert (tmp_path / "synth" / ".lock").exists()  # held while the run is prepared and rendered
    finally:
        release_run(spec.out)
    assert not (tmp_path / "synth" / ".lock").exists()
    assert run_kind.kind_of(tmp_path / "synth") == "render"
    release_run(prepare_run(str(tmp_path / "synth"), "anny", "lights/", 1, 0, cfg).out)  # the same run: resumed
    with pytest.raises(run_kind.RunKindError, match=r"holds a render run \(humanset render\) with other settings "
                                                    r"\(seed 0, now 1\)"):
        prepare_run("synth", "anny", "lights", 1, 1, cfg)
