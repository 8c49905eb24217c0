"""pipeline/stages/rapidocr_compat.py: the private rapidocr steps the text and watermark stages call still exist
with the shapes used. These fail when a rapidocr upgrade moves or renames them (update the module and
the pin in deps/filters.pip.txt together)."""
import importlib.metadata
import inspect

import numpy as np
import pytest

from pipeline.stages import rapidocr_compat as rc

rapidocr = pytest.importorskip("rapidocr", reason="rapidocr is not installed (deps/filters.pip.txt)")


def test_rapidocr_is_a_tested_minor_version():
    version = importlib.metadata.version("rapidocr")
    assert ".".join(version.split(".")[:2]) in rc.TESTED_RAPIDOCR, (
        f"rapidocr {version} is not among the versions pipeline/stages/rapidocr_compat.py was tested on "
        f"{rc.TESTED_RAPIDOCR}")


def test_the_helpers_rapidocr_keeps_have_the_arguments_we_pass():
    from rapidocr.utils import process_img

    assert list(inspect.signature(process_img.map_boxes_to_original).parameters) == [
        "dt_boxes", "op_record", "ori_h", "ori_w"]
    assert list(inspect.signature(process_img.apply_vertical_padding).parameters) == [
        "img", "op_record", "width_height_ratio", "min_height"]
    assert list(inspect.signature(process_img.get_rotate_crop_image).parameters) == ["img", "points"]


def test_detector_and_recogniser_run_through_the_compat_calls():
    engine = rapidocr.RapidOCR(params={"Global.use_cls": False, "Global.log_level": "error",
                                       "EngineConfig.onnxruntime.intra_op_num_threads": 1})
    det = rc.det_model(engine)
    for name in ("get_preprocess", "session", "postprocess_op", "sorted_boxes"):
        assert callable(getattr(det, name)), f"rapidocr's detector lost {name}"
    path = rc.det_model_path(engine)
    assert path.suffix == ".onnx" and path.is_file(), f"the detector's model file is not where it says: {path}"
    # a black image with a white bar of text-like strokes: the steps run and return their shapes
    img = np.zeros((96, 320, 3), np.uint8)
    for x in range(20, 300, 14):
        img[36:60, x:x + 8] = 255
    pre = det.get_preprocess()(img)
    boxes, scores = det.postprocess_op(det.session(pre), img.shape[:2])
    assert len(boxes) == len(scores)
    crop = rc.rotate_crop(img, np.array([[20, 30], [300, 30], [300, 66], [20, 66]], np.float32))
    assert crop.shape[:2] == (36, 280)
    res = rc.rec_model(engine)(rc.rec_input([crop]))
    assert len(res.txts) == len(res.scores) == 1
