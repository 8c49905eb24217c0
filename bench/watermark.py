"""Benchmark of the OCR watermark rule (watermark.method=ocr). Prints one JSON object.

The set is generated from the photos shipped in installed packages (ultralytics' bus and zidane,
scikit-image's photos; marks.PHOTOS splits them by family) with marks drawn by pipeline/stages/watermark/marks.py: kinds tiled, corner,
center; installed fonts (fc-list); sizes; opacities 0.1-0.8; colours; shadows; level and diagonal;
JPEG re-encoding at quality 60-95. Clean images are the photos and random crops/rescales of them.

  --family eval (default): photos, fonts, strings and seed the rule was not tuned on; docs/watermark.md's figures.
  --family tune:           the set the evidence weights and the cut are tuned on.
Both print `sweep`: recall at opacity >= 0.2 and clean rejection at other cuts.

Output: per kind precision / recall at watermark.max_score, ROC AUC (marked of that kind vs clean),
recall at opacity >= 0.2 and by opacity bin, and at opacity >= 0.2 by the mark's visible contrast
(mean grey-level change over the pixels it touches: grey ink on mid-grey is near invisible); FP rate on clean photos, and on clean photos with scene
text (bus, motorcycle_left/right: a shop ad, a brand name); `misses`: per kind, why each mark at opacity >= 0.2 was missed (not_detected: no detected box lies
on the mark's pixels; not_read: boxes on it, but no read string is a fragment of the mark; read: its
text was read and the score stayed at or below the cut); stage images/s for text alone, watermark
on the text stage's boxes (shared), watermark detecting itself, and the ratio (text + watermark
shared) / text alone, in wall seconds and (`speed.cpu_s`) in the process's CPU seconds, which a
shared machine's load moves far less.

usage: python bench/watermark.py [--family eval|tune] [--n-marked 180] [--n-clean 60]
                                 [--seed N] [--set KEY=VALUE ...] [--out FILE] [--rows FILE] [--det-model FILE.onnx]
                                 [--det-levels L[,L...]]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catalog.rules import WATERMARK  # noqa: E402
from pipeline.stages.watermark import marks  # noqa: E402
from pipeline.config import load_config  # noqa: E402

@contextlib.contextmanager
def det_model(path: str | None):
    """While inside, rapidocr builds its detector from the ONNX file `path` (None: its shipped one), so
    experiments (--det-model, research/watermark/detectors.py) can swap the detector of the OCR they load."""
    if path is None:
        yield
        return
    import rapidocr

    if not Path(path).is_file():
        raise SystemExit(f"--det-model {path}: no such file")
    shipped = rapidocr.RapidOCR

    def with_model(params=None, **kw):
        return shipped(params={**(params or {}), "Det.model_path": path}, **kw)

    rapidocr.RapidOCR = with_model  # pipeline.stages.ocr imports it when an OCR is built
    try:
        yield
    finally:
        rapidocr.RapidOCR = shipped


class LevelBoxes:
    """Experiments (--det-levels): DB's postprocess run on the same probability map at higher
    binarisation levels too (box score >= the level), adding each box that overlaps no box found so
    far by IoU 0.5 or more. At the default level 0.3 a strong line can merge with weak haze around it
    into one component whose box scores below 0.3, so the line is lost; a higher level splits them.
    The added boxes' scores are capped below TEXT_BOX_THRESH, so the text stage does not count them and
    only the watermark rule reads them. No second network pass."""

    def __init__(self, post, levels: list[float]):
        import copy

        self.post = post
        self.at_levels = [copy.copy(post) for _ in levels]  # rapidocr's DBPostProcess, one per level
        for p, level in zip(self.at_levels, levels):
            p.thresh = p.box_thresh = level

    def __call__(self, pred, shape):
        from pipeline.stages.ocr import TEXT_BOX_THRESH

        boxes, scores = self.post(pred, shape)
        boxes = [np.asarray(b, np.float32) for b in (boxes if boxes is not None else [])]
        scores = [float(x) for x in scores]
        for post in self.at_levels:
            extra, extra_scores = post(pred, shape)
            for b, x in zip(extra if extra is not None else [], extra_scores):
                b = np.asarray(b, np.float32)
                if all(iou(b, o) < 0.5 for o in boxes):
                    boxes.append(b)
                    scores.append(min(float(x), TEXT_BOX_THRESH - 1e-3))
        return np.asarray(boxes, np.float32).reshape(-1, 4, 2), scores


def iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two convex 4x2 float32 boxes."""
    import cv2

    inter = cv2.intersectConvexConvex(a, b)[0]
    union = abs(cv2.contourArea(a)) + abs(cv2.contourArea(b)) - inter
    return inter / union if union > 0 else 0.0


def with_levels(ocr, levels: list[float]) -> None:
    """Give a loaded pipeline.stages.ocr.OCR the --det-levels postprocess (LevelBoxes)."""
    from pipeline.stages import rapidocr_compat as rc

    det = rc.det_model(ocr.engine)
    det.postprocess_op = LevelBoxes(det.postprocess_op, levels)


def build_set(family: str, n_marked: int, n_clean: int, seed: int) -> list[dict]:
    """Rows of {image, label, kind, photo, opacity, spec}: marked images then clean ones."""
    rng = np.random.default_rng(seed)
    base = marks.family_photos(family)
    names = sorted(base)
    rows = []
    for j in range(n_marked):
        kind = marks.KINDS[j % len(marks.KINDS)]
        name = names[int(rng.integers(0, len(names)))]
        im = marks.clean_view(base[name], rng) if rng.random() < 0.5 else base[name]
        spec = marks.sample_spec(rng, kind, family)
        marked = marks.draw_mark(im, spec)
        rows.append({"image": marks.jpeg(marked, spec.jpeg_quality), "label": 1, "kind": kind,
                     "photo": name, "opacity": spec.opacity, "spec": spec.to_dict(),
                     "contrast": visible_contrast(im, marked, spec)})
    for j in range(n_clean):
        name = names[j % len(names)]
        im = base[name] if j < len(names) else marks.clean_view(base[name], rng)
        rows.append({"image": marks.jpeg(im, int(rng.integers(60, 96))), "label": 0, "kind": "clean",
                     "photo": name, "opacity": None, "spec": None, "contrast": None})
    return rows


def visible_contrast(clean: Image.Image, marked: Image.Image, spec) -> float:
    """How much the mark changes the photo: mean |grey level change| over the pixels it touches (0-255).
    Grey ink over mid-grey moves pixels little at any opacity; such a mark is near invisible."""
    mask = marks.mark_mask(clean.size, spec)
    a = np.asarray(clean.convert("L"), np.float32)
    b = np.asarray(marked.convert("L"), np.float32)
    return float(np.abs(a - b)[mask].mean()) if mask.any() else 0.0


CONTRAST_BINS = ((0, 8), (8, 16), (16, 32), (32, 256))


CPU_S: dict[int, float] = {}  # id(output of measure) -> CPU seconds of the process during that measure


def measure(stage, rows: list[dict], batch: int, extra: list[dict] | None = None) -> tuple[dict, float]:
    """Run the stage over rows in batches -> (its columns, wall seconds); the process's CPU seconds go to
    CPU_S[id(columns)] (the stages run onnxruntime on one thread, so CPU seconds hardly move with the load
    of a shared machine, unlike wall seconds)."""
    out: dict[str, list] = {}
    c0 = time.process_time()
    t0 = time.perf_counter()
    for s in range(0, len(rows), batch):
        b = {"image": [r["image"] for r in rows[s:s + batch]]}
        if extra is not None:
            for c in extra[0]:
                b[c] = [e[c] for e in extra[s:s + batch]]
        for c, v in stage.measure(b).items():
            out.setdefault(c, []).extend(v)
    wall = time.perf_counter() - t0
    CPU_S[id(out)] = time.process_time() - c0
    return out, wall


def auc(pos: list[float], neg: list[float]) -> float | None:
    """ROC AUC as the Mann-Whitney statistic (ties count half)."""
    if not pos or not neg:
        return None
    p, q = np.asarray(pos)[:, None], np.asarray(neg)[None, :]
    return float(((p > q).sum() + 0.5 * (p == q).sum()) / (p.size * q.size))


def sweep(rows: list[dict], scores: list[float]) -> list[dict]:
    """Recall (opacity >= 0.2) and clean rejection at candidate cuts: how the default cut was chosen."""
    lab = np.array([r["label"] for r in rows])
    op = np.array([r["opacity"] if r["opacity"] is not None else 0.0 for r in rows])
    sc = np.array([-1.0 if s is None else s for s in scores])
    out = []
    for cut in (0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9):
        f = sc > cut
        out.append({"cut": cut, "recall_opacity_ge_0.2": round(float(f[(lab == 1) & (op >= 0.2)].mean()), 3),
                    "clean_rejected": round(float(f[lab == 0].mean()), 3)})
    return out


def report(rows: list[dict], scores: list[float], cut: float, n_read: list) -> dict:
    n_read = np.array([v or 0 for v in n_read])
    lab = np.array([r["label"] for r in rows])
    sc = np.array([-1.0 if s is None else s for s in scores])
    flagged = sc > cut
    clean = lab == 0
    scene = np.array([r["photo"] in marks.SCENE_TEXT for r in rows]) & clean
    out = {"cut": cut, "n_marked": int(lab.sum()), "n_clean": int(clean.sum()),
           "clean_rejected": round(float(flagged[clean].mean()), 4),
           "scene_text_clean": {"n": int(scene.sum()), "rejected": int(flagged[scene].sum())},
           "kinds": {}}
    op = np.array([r["opacity"] if r["opacity"] is not None else np.nan for r in rows])
    for kind in (*marks.KINDS, "all"):
        m = (lab == 1) if kind == "all" else np.array([r["kind"] == kind for r in rows])
        tp, fp = int((flagged & m).sum()), int((flagged & clean).sum())
        hi = m & (op >= 0.2)
        bins = {}
        for lo_, hi_ in ((0.1, 0.2), (0.2, 0.35), (0.35, 0.5), (0.5, 0.8)):
            sel = m & (op >= lo_) & (op < hi_ + (1e-9 if hi_ == 0.8 else 0))
            bins[f"{lo_:.2f}-{hi_:.2f}"] = round(float(flagged[sel].mean()), 3) if sel.any() else None
        ct = np.array([r.get("contrast") if r.get("contrast") is not None else np.nan for r in rows])
        by_contrast = {}
        for lo_, hi_ in CONTRAST_BINS:
            sel = hi & (ct >= lo_) & (ct < hi_)
            by_contrast[f"{lo_}-{hi_}"] = {"n": int(sel.sum()),
                                           "recall": round(float(flagged[sel].mean()), 3) if sel.any() else None}
        out["kinds"][kind] = {
            "n": int(m.sum()), "nothing_read": int((m & (n_read == 0)).sum()), "recall": round(tp / max(1, int(m.sum())), 3),
            "precision": round(tp / max(1, tp + fp), 3),
            "recall_opacity_ge_0.2": round(float(flagged[hi].mean()), 3) if hi.any() else None,
            "recall_by_opacity": bins,
            "recall_by_contrast_opacity_ge_0.2": by_contrast,
            "roc_auc": auc(sc[m].tolist(), sc[clean].tolist())}
    return out


def of_mark(s: str, text: str) -> bool:
    """A read string is a fragment of the mark's text (OCR of a translucent mark loses letters)."""
    from difflib import SequenceMatcher

    from pipeline.stages.watermark.evidence import norm
    a, b = norm(s), norm(text)
    if len(a) < 3:
        return False
    return SequenceMatcher(None, a, b).find_longest_match(0, len(a), 0, len(b)).size >= min(4, len(a), len(b))


def on_mark(row: dict, polys) -> bool:
    """Some detected box (flat 8-float polygon, original pixels) has >= 25 % of its area on the mark."""
    import cv2

    size = Image.open(io.BytesIO(row["image"])).size
    spec = marks.MarkSpec(**{**row["spec"], "colour": tuple(row["spec"]["colour"])})
    mask = cv2.dilate(marks.mark_mask(size, spec).astype(np.uint8), np.ones((5, 5), np.uint8))
    for p in polys or []:
        box = np.zeros_like(mask)
        cv2.fillPoly(box, [np.round(np.asarray(p, np.float64)).astype(np.int32).reshape(-1, 2)], 1)
        if box.sum() and (box & mask).sum() / box.sum() >= 0.25:
            return True
    return False


def misses(rows: list[dict], scores: list, strings: list, boxes: list, cut: float) -> dict:
    """Per kind, marks at opacity >= 0.2: flagged, or missed as not_detected / not_read / read."""
    out = {k: {"n": 0, "flagged": 0, "not_detected": 0, "not_read": 0, "read": 0} for k in (*marks.KINDS, "all")}
    for r, s, st, b in zip(rows, scores, strings, boxes):
        if not r["label"] or r["opacity"] < 0.2:
            continue
        if s is not None and s > cut:
            why = "flagged"
        elif not on_mark(r, b):
            why = "not_detected"
        elif not any(of_mark(x, r["spec"]["text"]) for x in st or []):
            why = "not_read"
        else:
            why = "read"
        for k in (r["kind"], "all"):
            out[k]["n"] += 1
            out[k][why] += 1
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", choices=marks.FAMILIES, default="eval")
    ap.add_argument("--n-marked", type=int, default=180)
    ap.add_argument("--n-clean", type=int, default=60)
    ap.add_argument("--seed", type=int, default=None, help="default: 1 for tune, 2 for eval")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--no-own", action="store_true", help="skip the pass that detects in the watermark stage")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config override, as humanset curate's (e.g. watermark.min_det_score=0.5)")
    ap.add_argument("--det-model", default=None, metavar="FILE.onnx",
                    help="experiments: this ONNX DB detector instead of rapidocr's shipped one, in both stages "
                         "(research/watermark/detft.py --onnx writes one)")
    ap.add_argument("--det-levels", default=None, metavar="L[,L...]",
                    help="experiments: also binarise the detector's map at these levels (e.g. 0.7) and add the boxes "
                         "found there (LevelBoxes), in both stages")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rows", default=None, help="also write each image's label, kind, opacity and evidence columns "
                    "(JSON lines): re-scoring them needs no OCR")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from pipeline.stages.text import TextStage
    from pipeline.stages.watermark.stage import WatermarkStage
    from pipeline.stages.watermark.ocr_rule import SHARED

    seed = marks.SEEDS[a.family] if a.seed is None else a.seed
    rows = build_set(a.family, a.n_marked, a.n_clean, seed)
    cfg = load_config(sets=a.set)
    text, wm, wm_own = TextStage(cfg["text"]), WatermarkStage(cfg["watermark"]), WatermarkStage(cfg["watermark"])
    with det_model(a.det_model):  # the stages load their OCR models in setup()
        for stage in (text, wm, wm_own):
            stage.setup()
    if a.det_levels:
        for ocr in (text.ocr, wm.ocr.ocr, wm_own.ocr.ocr):
            with_levels(ocr, [float(x) for x in a.det_levels.split(",")])
    measure(text, rows[:4], a.batch)  # warm-up: the recogniser loads on first text
    measure(wm_own, rows[:4], a.batch)
    t_out, t_text = measure(text, rows, a.batch)
    shared = [{c: t_out[c][i] for c in SHARED} for i in range(len(rows))]
    w_out, t_wm = measure(wm, rows, a.batch, shared)
    own_before = wm_own.ocr.own_detections
    o_out, t_own = measure(wm_own, rows if not a.no_own else rows[:1], a.batch)
    clean_rows = [r for r in rows if r["label"] == 0]
    c_out, t_text_clean = measure(text, clean_rows, a.batch)
    wc_out, t_wm_clean = measure(wm, clean_rows, a.batch, [{c: c_out[c][i] for c in SHARED} for i in range(len(clean_rows))])
    cpu = {k: CPU_S[id(v)] for k, v in (("text", t_out), ("wm", w_out), ("text_clean", c_out), ("wm_clean", wc_out))}
    n = len(rows)
    evs = [{c: w_out[c][i] for c in w_out} for i in range(n)]
    result = {"family": a.family, "seed": seed, "set": a.set, "det_model": a.det_model, "det_levels": a.det_levels, "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
              "load_avg": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
              "fonts": len(marks.family_fonts(a.family))}
    scores = w_out["watermark_score"]
    cut = float(WATERMARK.threshold(cfg["watermark"]))
    result["sweep"] = sweep(rows, scores)
    result.update(report(rows, scores, cut, w_out["watermark_n_boxes"]))
    result["misses"] = misses(rows, scores, w_out["watermark_strings"], t_out["text_det_boxes"], cut)
    result["same_as_own_detection"] = sum(
        (a_ is None and b_ is None) or (a_ is not None and b_ is not None and abs(a_ - b_) < 1e-6)
        for a_, b_ in zip(w_out["watermark_score"], o_out["watermark_score"])) / len(o_out["watermark_score"])
    result["speed"] = {
        "images": n, "batch": a.batch,
        "text_images_per_s": round(n / t_text, 2),
        "watermark_shared_images_per_s": round(n / t_wm, 2),
        "watermark_own_detection_images_per_s": None if a.no_own else round(n / t_own, 2),
        "text_plus_watermark_over_text": round((t_text + t_wm) / t_text, 3),
        "cpu_s": {"text": round(cpu["text"], 2), "watermark_shared": round(cpu["wm"], 2),
                  "text_plus_watermark_over_text": round((cpu["text"] + cpu["wm"]) / cpu["text"], 3)},
        "clean_only": {"images": len(clean_rows), "text_images_per_s": round(len(clean_rows) / t_text_clean, 2),
                       "watermark_shared_images_per_s": round(len(clean_rows) / t_wm_clean, 2),
                       "text_plus_watermark_over_text": round((t_text_clean + t_wm_clean) / t_text_clean, 3),
                       "cpu_text_plus_watermark_over_text": round((cpu["text_clean"] + cpu["wm_clean"]) / cpu["text_clean"], 3)},
        "corner_reads": wm.ocr.corner_reads,
        "own_detections_shared": wm.ocr.own_detections, "own_detections_alone": wm_own.ocr.own_detections - own_before,
        "text_det_calls": text.ocr.det_calls}
    missed = [{"kind": r["kind"], "opacity": round(r["opacity"], 2), "text": r["spec"]["text"],
               "score": None if s is None else round(s, 3), "strings": e["watermark_strings"]}
              for r, s, e in zip(rows, scores, evs) if r["label"] == 1 and (s is None or s <= cut)]
    false_pos = [{"photo": r["photo"], "score": round(s, 3), "strings": e["watermark_strings"]}
                 for r, s, e in zip(rows, scores, evs) if r["label"] == 0 and s is not None and s > cut]
    result["examples"] = {"missed": missed[:12], "false_positives": false_pos[:12]}
    if a.rows:
        with open(a.rows, "w") as f:
            for r, e in zip(rows, evs):
                f.write(json.dumps({"label": r["label"], "kind": r["kind"], "photo": r["photo"], "opacity": r["opacity"],
                                    "contrast": r["contrast"],
                                    "text": (r["spec"] or {}).get("text"), **e}, default=str) + "\n")
    text_json = json.dumps(result, indent=1, default=str)
    print(text_json)
    if a.out:
        Path(a.out).write_text(text_json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
