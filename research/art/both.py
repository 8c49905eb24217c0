"""The art stage rejecting only when the probe and a second look by clip_probe both call an image art ("both").
Simulated on the quality bench's tune split. Not used by the product.

Stop 58's eval gate of clip_probe as the default (runs/eval-clip15) showed the two methods wrong on different
people: clip kept two film stills and a hidden face the probe rejects, and rejected three studio portraits the
probe keeps. So the idea came from eval, which can then only veto it; tune decides.

Rule (written 2026-12-07 04:02 UTC, before the refit's per-image scores were written or read; an identical refit at
01:46 had reported only counts and the tune photos it rejects): the shipped probe (its scores in the tune run, cut
art.max_score 0.84) and clip_probe refitted by its shipped recipe on the art pool and tune batches 1-15, each tune
image scored out of fold by image (bench/train_art_clip.py --scores, scores before the intercept shift), at its own
fitted cut (0.54). An image is rejected as art only when both scores are over their cuts; the run's person, text and
watermark verdicts stay. Wins and losses against the run as curated, by bench/quality.py's compare. Passes if wins
>= 5 with no loss, or wins > losses at sign-test p <= 0.1, with the tune cascade still meeting the issue's kept-set
targets. Reported, not gated: what the art stage alone rejects by category with the probe, clip and both.

    python bench/train_art_clip.py --pool POOL --bench-tune CACHE/images --scores CLIP.csv
    python research/art/both.py RUN CLIP.csv [--clip-cut 0.54]     # RUN: a bench/quality.py tune run
    python bench/train_art.py --pool POOL --bench-tune CACHE/images --c 0.01 --every-variant --scores PROBE.csv
    python research/art/both.py RUN CLIP.csv --probe-scores PROBE.csv --probe-cut 0.94   # the probe out of fold too

Result (2026-12-07 04:04 UTC, runs/tune-batch15; the refit reproduced clip15.json's out-of-fold counts and weights):
2 wins (filterizr's backpack seen from behind, flowbite's whiteboard) to 5 losses (painted people the probe rejects
and the refitted clip keeps: freecol's Bolivar, GCompris' Pere Tanguy, opencv's Julia sample, a Ren'Py concert,
Morisot's woman in mauve), of kept 0.947. Not taken. The second look would have run on 35 of the 123 images that
reach the art stage (28 %). The art stage alone rejects, of non_photo / painted_person / person_clear / no_person:
probe 84 / 74 / 5 / 11, clip 71 / 60 / 2 / 17, both 71 / 60 / 0 / 6 (the probe's tune figures are partly in sample).
After the fact, not part of the rule: all five losses are tune images of batches 1 and 9, which trained the shipped
probe (its scores there are in sample). With the probe refitted on batches 1-15 and read out of fold as well
(--probe-scores, cut 0.94), "both" wins the same 2 with no loss against that probe without the second look, and
with or without it the cascade keeps 9 of tune's 74 painted people (0.12, over the target's 0.10).
docs/benchmarks.md, "The art stage's second look by clip_probe".
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import quality, quality_data  # noqa: E402
from catalog.duck import connect  # noqa: E402
from catalog.rules import ART  # noqa: E402


def read_scores(path: Path) -> dict[str, float]:
    """bench/train_art*.py --scores: id -> out-of-fold score."""
    with open(path, newline="") as f:
        return {r["id"]: float(r["art_score_out_of_fold"]) for r in csv.DictReader(f)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a bench/quality.py run of the tune split")
    ap.add_argument("clip_scores", type=Path, help="bench/train_art_clip.py --scores: out-of-fold scores by image")
    ap.add_argument("--clip-cut", type=float, default=0.54, help="the clip refit's fitted cut (its report's fitted_cut)")
    ap.add_argument("--probe-scores", type=Path,
                    help="bench/train_art.py --scores: the probe's out-of-fold scores instead of the run's")
    ap.add_argument("--probe-cut", type=float, default=ART.default)
    a = ap.parse_args(argv)
    categories = quality_data.split_categories("tune")
    samples = quality.split_samples(a.run, categories, "tune")
    con = connect(a.run)
    probe = {quality.bench_id(u): s for u, s in con.execute("SELECT source_uri, art_score FROM samples").fetchall()}
    con.close()
    if a.probe_scores:
        probe = read_scores(a.probe_scores)  # text_or_mark is not in the fit: scored as art, as below
    clip = read_scores(a.clip_scores)
    base, both, reach, second = [], [], 0, 0
    alone = {k: dict.fromkeys(quality_data.CATEGORIES, 0) for k in ("probe", "clip", "both")}
    for s in samples:
        others = [r for r in s["reject_reasons"] if r.split(":")[0] != "art"]
        probe_art = probe.get(s["id"], 1.0) > a.probe_cut
        if not a.probe_scores:
            assert probe_art == (len(others) < len(s["reject_reasons"])), s["id"]  # the run's art verdict
        clip_art = clip.get(s["id"], 1.0) > a.clip_cut  # text_or_mark is not in the fit: never kept for it
        for k, v in (("probe", probe_art), ("clip", clip_art), ("both", probe_art and clip_art)):
            alone[k][categories[s["id"]]] += v
        reach += not others
        second += not others and probe_art
        base.append(dict(s, keep=not others and not probe_art))
        both.append(dict(s, keep=not others and not (probe_art and clip_art)))
    scored = quality.score(both, categories)
    out = {"run": a.run.name, "probe": a.probe_scores.name if a.probe_scores else "the run's", "probe_cut": a.probe_cut,
           "clip_cut": a.clip_cut, "reach_art": reach, "second_look": second, "art_stage_alone_rejects": alone,
           "compare": quality.compare(both, base, categories),
           **{k: v for k, v in scored.items() if k in ("categories", "kept", "targets")}}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
