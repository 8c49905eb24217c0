"""Rule W1 for the watermark stage's false positives on lettered objects: does a domain/URL, or the agency rule (a
word read three or more times), count as a mark only where marks sit? Measured on the quality bench's tune split and
on bench/watermark.py's generated tune family. Not used by the product.

The shipped evidence (pipeline/stages/watermark/evidence.py) makes watermark_mark_text 1 for any string with ©, (c),
a domain or URL, or a word of marks, for the agency rule, and for a year in a corner band. The clean tune photos it
rejects are lettered objects: a board's silkscreen URL, a device's printed web address, a brand read three times.
W1 (written 2026-12-06, before it was run on any image): a string that looks like a mark only by its domain or URL
(no ©, (c) or word of marks) counts only if its box is in a corner band or the bottom-centre band
(evidence.placement) or its own opacity (evidence.box_opacity) is <= 0.45; the agency rule counts only if a read
box is in such a band or the read boxes' median opacity is <= 0.45. Everything else is unchanged.

The text stage runs once, and each variant runs the watermark stage on its boxes, as a curation run does, on each
tune image's file (clean photos: person_clear, person_small, no_person; and text_or_mark), and on the generated
family (180 marked, 60 clean, seed 1). Wins: clean tune photos the shipped rule rejects and W1 passes. Losses: tune
text_or_mark photos the shipped rule rejects and W1 passes. The generated family's recall at the cut (all marks, and
marks at opacity >= 0.2) must not fall by more than 0.01.

    python research/watermark/w1.py [--cache DIR] [--rows FILE.csv]

Result (tune batches 1-13, 2026-12-06, run once for the record: its rule asked for 5 clean tune photos read as
marks, tune holds 4): 1 win (the radio board's URL), no loss; the generated family's recall fell by 0.017 (0.019 at
opacity >= 0.2). Dropped. docs/benchmarks.md, "batch 13".
Rerun 2026-12-07 on tune batches 1-15, after its comparison moved into compare() for w2.py: the same figures.
"""
from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import watermark as bw  # noqa: E402

from pipeline.stages.watermark import evidence as ev_mod  # noqa: E402

OPAQUE_MAX = 0.45
URL_PARTS = re.compile(r"\b(?:www|https?)\b|\.(?:com|net|org|io|co|uk|de|fr|info|biz|me|photo|pics|ru|cn)\b")
CLEAN = ("person_clear", "person_small", "no_person")


def domain_only(s: str) -> bool:
    """The string looks like a mark only by a domain or URL: no ©, (c) or word of marks."""
    folded = ev_mod.fold(s)
    if not ev_mod.looks_like_mark(s) or "©" in folded or "(c)" in folded:
        return False
    # the domain's own name stays: "istockphoto.com" is a mark by its word "stock" wherever it sits
    plain = URL_PARTS.sub(" ", folded)
    return not ev_mod.looks_like_mark(plain)


def shipped_and_read(gray, boxes, strings, rec_scores, min_rec_score=0.5) -> tuple[dict, list]:
    """The shipped evidence, and the (box, string) pairs it reads (as evidence.evidence filters them)."""
    out = SHIPPED_EVIDENCE(gray, boxes, strings, rec_scores, min_rec_score)
    read = [(b, s) for b, s, r in zip(boxes, strings, rec_scores)
            if r is not None and r >= min_rec_score and len(ev_mod.norm(s)) >= 2]
    return out, read


def evidence_w1(gray, boxes, strings, rec_scores, min_rec_score=0.5):
    """The shipped evidence, with W1 applied to watermark_mark_text."""
    out, read = shipped_and_read(gray, boxes, strings, rec_scores, min_rec_score)
    h, w = gray.shape[:2]
    if not read:
        return out

    def where_marks_sit(b) -> bool:
        o = ev_mod.box_opacity(gray, b)
        return ev_mod.placement(b, h, w)[0] or (o is not None and o <= OPAQUE_MAX)

    marks = any(ev_mod.looks_like_mark(s) and (not domain_only(s) or where_marks_sit(b)) for b, s in read)
    rep = ev_mod.repeat_count([s for _, s in read])
    words = [ev_mod.norm(s) for _, s in read if len(ev_mod.norm(s)) >= 4 and " " not in s.strip()]
    op = out["watermark_opacity"]
    agency = rep >= 3 and len(words) >= 3 and (any(ev_mod.placement(b, h, w)[0] for b, _ in read)
                                                or (op is not None and op <= OPAQUE_MAX))
    dated = any(ev_mod.YEAR.search(s) and ev_mod.placement(b, h, w)[0] for b, s in read)
    out["watermark_mark_text"] = float(marks or agency or dated)
    return out


SHIPPED_EVIDENCE = ev_mod.evidence


def evidence_rule(variants: dict):
    """rule(name): a context in which the watermark stage reads variants[name] as its evidence (the shipped
    evidence for any other name)."""
    @contextlib.contextmanager
    def rule(name: str):
        ev_mod.evidence = variants.get(name, SHIPPED_EVIDENCE)
        try:
            yield
        finally:
            ev_mod.evidence = SHIPPED_EVIDENCE
    return rule


rule = evidence_rule({"w1": evidence_w1})


def text_boxes(text, images: list[bytes], batch: int) -> tuple[list[dict], list[dict]]:
    """Each image's row and the text stage's boxes for it (the same under every rule compared: a rule changes only
    the watermark evidence)."""
    from pipeline.stages.watermark.ocr_rule import SHARED

    rows = [{"image": b} for b in images]
    t_out, _ = bw.measure(text, rows, batch)
    return rows, [{c: t_out[c][i] for c in SHARED} for i in range(len(rows))]


def wm_scores(wm, rows: list[dict], shared: list[dict], batch: int) -> list[float]:
    """The watermark score of each image on the text stage's boxes, as a curation run computes it."""
    return bw.measure(wm, rows, batch, shared)[0]["watermark_score"]


def compare(rule, name: str, text, wm, cut: float, cache: Path, batch: int) -> dict:
    """The tune bench's clean photos and text_or_mark images, and the generated tune family, each scored by the
    watermark stage on the text stage's boxes under the shipped evidence and under rule `name` (`rule(name)` switches
    it). Returns the report's common figures, the files, their categories, the scores and the bench's boxes."""
    from research.bench_tune import bench_quality, tune_images

    labels, files = tune_images(cache)
    files = [f for f in files if labels[f.stem]["category"] in CLEAN + ("text_or_mark",)]
    images = [f.read_bytes() for f in files]
    family = bw.build_set("tune", 180, 60, bw.marks.SEEDS["tune"])
    bench_set = text_boxes(text, images, batch)
    family_set = text_boxes(text, [r["image"] for r in family], batch)
    scores, recall = {}, {}
    for variant in ("shipped", name):
        with rule(variant):
            scores[variant] = wm_scores(wm, *bench_set, batch)
            fam = wm_scores(wm, *family_set, batch)
        marked = [(r, s) for r, s in zip(family, fam) if r["label"] == 1]
        recall[variant] = {"all": round(float(np.mean([s is not None and s > cut for _, s in marked])), 4),
                           "opacity_ge_0.2": round(float(np.mean([s is not None and s > cut for r, s in marked
                                                                  if r["opacity"] >= 0.2])), 4),
                           "clean_rejected": sum(s is not None and s > cut for r, s in zip(family, fam)
                                                 if r["label"] == 0)}
    rej = {k: [v is not None and v > cut for v in s] for k, s in scores.items()}
    cat = [labels[f.stem]["category"] for f in files]
    wins = [f.stem for f, c, r0, r1 in zip(files, cat, rej["shipped"], rej[name]) if c in CLEAN and r0 and not r1]
    losses = [f.stem for f, c, r0, r1 in zip(files, cat, rej["shipped"], rej[name])
              if c == "text_or_mark" and r0 and not r1]
    out = {"clean_photos": sum(c in CLEAN for c in cat), "text_or_mark": cat.count("text_or_mark"),
           "clean_rejected": {k: [f.stem for f, c, r in zip(files, cat, v) if c in CLEAN and r]
                              for k, v in rej.items()},
           "text_or_mark_rejected": {k: sum(c == "text_or_mark" and r for c, r in zip(cat, v)) for k, v in rej.items()},
           "wins": wins, "losses": losses, "sign_test_p": round(bench_quality().sign_test(len(wins), len(losses)), 4),
           "family_tune": recall,
           "family_recall_fall": {k: round(recall["shipped"][k] - recall[name][k], 4) for k in ("all", "opacity_ge_0.2")}}
    rows = [{"id": f.stem, "category": c, "shipped": None if s0 is None else round(s0, 4),
             name: None if s1 is None else round(s1, 4)}
            for f, c, s0, s1 in zip(files, cat, scores["shipped"], scores[name])]
    return {"out": out, "rows": rows, "files": files, "scores": scores, "bench_set": bench_set}


def main() -> int:
    from catalog.rules import WATERMARK
    from pipeline.config import load_config
    from pipeline.stages.text import TextStage
    from pipeline.stages.watermark.stage import WatermarkStage
    from research.bench_tune import parser, report

    a = parser(__doc__).parse_args()
    cfg = load_config()
    text, wm = TextStage(cfg["text"]), WatermarkStage(cfg["watermark"])
    for s in (text, wm):
        s.setup()
    got = compare(rule, "w1", text, wm, float(WATERMARK.threshold(cfg["watermark"])), a.cache, a.batch)
    return report(got["out"], got["rows"], a.rows)


if __name__ == "__main__":
    sys.exit(main())
