"""Experiment: a linear probe on PP-OCR's own detector features as watermark evidence (research/notes/watermark.md,
"A probe on the detector's features"). Prints one JSON object.

The text stage already runs PP-OCR's detector (rapidocr's PP-OCRv6 det, ONNX) on every image. Its DB
head reads a 96-channel neck map at 1/4 of the input and a 24-channel hidden layer; a 1 x 1 probe on
those 120 channels would cost next to nothing. Here the shipped ONNX graph is loaded (never changed on
disk), the two tensors are added as outputs in memory, and a logistic regression (scikit-learn,
standardised features) is fitted per map cell: positive where a tune-family mark covers >= 40 % of
the cell (marks.mark_mask), negative where it covers < 5 %.

Training images (seed --seed): backgrounds from research/watermark/tile2.py (shipped images in neither family's
photo list, the bpy wheel's eight world HDRIs; with --with-tune-photos also the tune photos), a
random view of each, on 40 % of them opaque perspective scene text (tile2.scene_text: a negative),
on 70 % a tune-family mark; JPEG at quality 60-95. Up to 1000 positive and 1000 negative cells each.

An image's probe score is an aggregate of its cell probabilities (max, top-k mean, share above 0.5;
all reported). It is combined with the OCR rule as an OR: flagged when the rule's stored score passes
the cut (0.8) or the probe score passes T. T is chosen on the tune family's bench rows (<= 5 % of
clean photos rejected), then applied once to eval; the eval-chosen T is printed too, marked as an
upper bound (it is fitted on the set it is measured on).

usage: python research/watermark/dbprobe.py --tune-rows T.jsonl --eval-rows E.jsonl [--n-train 1000] [--seed 12]
                                  [--with-tune-photos]
  (T, E: `python bench/watermark.py --family tune|eval --no-own --rows T|E.jsonl`)

Result (2026-12-02, research/notes/watermark.md): not taken. See there.
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
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT)]  # the other experiments here; the product

import tile as wt  # noqa: E402
import tile2 as wt2  # noqa: E402

from pipeline.stages.watermark import marks  # noqa: E402

TAPS = ("p2o.pd_op.relu.18.0", "p2o.pd_op.concat.1.0")  # DB head's hidden layer (24 ch), neck (96 ch)
CUT = 0.8
AGGS = ("max", "top10", "top50", "frac0.5")


class Features:
    """PP-OCR detection as the text stage runs it, with the two tapped maps as extra outputs."""

    def __init__(self):
        import onnx
        import onnxruntime as ort

        from pipeline.stages import rapidocr_compat as rc
        from pipeline.stages.ocr import OCR

        self.ocr = OCR(960, 1, "probe")
        path = rc.det_model_path(self.ocr.engine)
        m = onnx.load(str(path))
        for t in TAPS:
            m.graph.output.append(onnx.helper.make_empty_tensor_value_info(t))
        so = ort.SessionOptions()
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        self.sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        self.model = path.name
        self.inp = self.sess.get_inputs()[0].name

    def __call__(self, rgb: np.ndarray) -> np.ndarray:
        pre = self.ocr.det_input(np.ascontiguousarray(rgb[:, :, ::-1]))[3]
        outs = self.sess.run(None, {self.inp: pre})
        return np.concatenate([outs[1][0], outs[2][0]], 0)  # C x H/4 x W/4


def cover(mask: np.ndarray, shape) -> np.ndarray:
    return np.asarray(Image.fromarray(mask.astype(np.uint8) * 255).resize((shape[1], shape[0]), Image.BILINEAR),
                      np.float32) / 255


def training_cells(feat: Features, n: int, seed: int, with_tune: bool):
    rng = np.random.default_rng(seed)
    base = {**(marks.family_photos("tune") if with_tune else {}), **wt2.more_backgrounds(), **wt2.hdri_backgrounds()}
    names = sorted(base)
    X, Y = [], []
    for i in range(n):
        im = base[names[int(rng.integers(len(names)))]]
        im = marks.clean_view(im, rng) if rng.random() < 0.7 else im
        if rng.random() < 0.4:
            im = wt2.scene_text(im, rng)
        mask = np.zeros(im.size[::-1], bool)
        if rng.random() < 0.7:
            spec = marks.sample_spec(rng, marks.KINDS[i % 3], "tune")
            mask = marks.mark_mask(im.size, spec)
            im = marks.draw_mark(im, spec)
        rgb = np.asarray(Image.open(io.BytesIO(marks.jpeg(im, int(rng.integers(60, 96))))).convert("RGB"))
        f = feat(rgb)
        c = cover(mask, f.shape[1:]).ravel()
        pos, neg = np.flatnonzero(c > 0.4), np.flatnonzero(c < 0.05)
        pos = rng.choice(pos, min(len(pos), 1000), replace=False)
        neg = rng.choice(neg, min(len(neg), 1000), replace=False)
        idx = np.concatenate([pos, neg])
        X.append(f.reshape(len(f), -1)[:, idx].T.astype(np.float32))
        Y.append(np.r_[np.ones(len(pos)), np.zeros(len(neg))])
        if i % 100 == 0:
            print(f"drawn {i}/{n} {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)
    return np.concatenate(X), np.concatenate(Y)


def image_scores(feat: Features, probe, images: list[bytes]) -> dict[str, np.ndarray]:
    sc, clf = probe
    out = {k: [] for k in AGGS}
    for data in images:
        f = feat(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
        p = np.sort(clf.predict_proba(sc.transform(f.reshape(len(f), -1).T))[:, 1])[::-1]
        out["max"].append(p[0])
        out["top10"].append(p[:10].mean())
        out["top50"].append(p[:50].mean())
        out["frac0.5"].append((p > 0.5).mean())
    return {k: np.asarray(v) for k, v in out.items()}


def or_figures(rows, ocr, probe_score, t) -> dict:
    lab = np.array([r["label"] for r in rows])
    op = np.array([r["opacity"] if r["opacity"] is not None else 0.0 for r in rows])
    kind = np.array([r["kind"] for r in rows])
    scene = np.array([r["photo"] in marks.SCENE_TEXT for r in rows]) & (lab == 0)
    f = (ocr > CUT) | (probe_score > t)
    hi = (lab == 1) & (op >= 0.2)
    return {"t": float(t), "recall_opacity_ge_0.2": round(float(f[hi].mean()), 3),
            "by_kind": {k: round(float(f[hi & (kind == k)].mean()), 3) for k in marks.KINDS},
            "clean_rejected": int(f[lab == 0].sum()), "clean": int((lab == 0).sum()),
            "scene_rejected": int(f[scene].sum()), "scene": int(scene.sum())}


def choose_t(rows, ocr, s) -> float:
    """The lowest T with <= 5 % of the clean photos rejected by the OR."""
    lab = np.array([r["label"] for r in rows])
    for t in np.unique(s):
        f = (ocr > CUT) | (s > t)
        if f[lab == 0].mean() <= 0.05:
            return float(t)
    return float(s.max())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tune-rows", required=True)
    ap.add_argument("--eval-rows", required=True)
    ap.add_argument("--n-train", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--with-tune-photos", action="store_true")
    a = ap.parse_args(argv)
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    res = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "load_avg": [round(x, 2) for x in os.getloadavg()],
           "n_train": a.n_train, "seed": a.seed, "with_tune_photos": a.with_tune_photos}
    feat = Features()
    res["det_model"] = feat.model
    t0 = time.perf_counter()
    X, Y = training_cells(feat, a.n_train, a.seed, a.with_tune_photos)
    sc = StandardScaler().fit(X)
    clf = LogisticRegression(C=1.0, max_iter=300).fit(sc.transform(X), Y)
    res["train"] = {"cells": int(len(Y)), "positive": round(float(Y.mean()), 3), "s": round(time.perf_counter() - t0, 1)}
    for fam, path in (("tune", a.tune_rows), ("eval", a.eval_rows)):
        rows = wt.load_rows(path)
        t0 = time.perf_counter()
        S = image_scores(feat, (sc, clf), wt.family_images(fam))
        ocr = np.array([r["watermark_score"] or 0.0 for r in rows])
        lab = np.array([r["label"] for r in rows])
        d = {"probe_s_per_image": round((time.perf_counter() - t0) / len(rows), 3), "by_aggregate": {}}
        for k, s in S.items():
            e = {"auc": {kd: round(wt.auc(s[np.array([r["kind"] == kd for r in rows])], s[lab == 0]), 3)
                         for kd in marks.KINDS}}
            if fam == "tune":
                res.setdefault("chosen_t", {})[k] = choose_t(rows, ocr, s)
            e["at_tune_chosen_t"] = or_figures(rows, ocr, s, res["chosen_t"][k])
            if fam == "eval":
                e["upper_bound_eval_chosen_t"] = or_figures(rows, ocr, s, choose_t(rows, ocr, s))
            d["by_aggregate"][k] = e
        d["ocr_only"] = or_figures(rows, ocr, np.zeros(len(rows)), 1.0)
        res[fam] = d
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
