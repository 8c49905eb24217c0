"""Benchmark of the human filters. Prints one JSON object.

  per_stage:  images/s of each stage's measure() on batches (in this process, CPU unless a GPU
              is visible, with as many threads as the machine has cores), over the whole mixed
              crawl. watermark and art run randomly initialised checkpoints of their real
              architectures: same compute, meaningless scores.
  per_stage.person_vs_onnxruntime: CPU seconds per image of the person stage (1 thread) against those of
              its ONNX Runtime session alone on the same batches, in the same run (target <= 1.2x).
  plain_ultralytics: what a user would write for the person rule alone: an ultralytics predict
              loop over the same files with the same weights, batches of person.batch_size paths.
  plain_cascade: the loop a user would write for the same cascade, in one process: that predict
              loop over all inputs, then rapidocr (same detection size and thresholds) on the
              images passing the person rule, batches of text.batch_size; its verdicts.
  cascade:    `pipeline.engine.driver.curate` on the mixed crawl (default config: decode -> size -> dedup
              -> person -> text -> watermark (its ocr method) -> art (the shipped probe)). Ray start-up is timed
              apart; `breakdown` splits the run with its own stats (RUN/stats/*.json): work seconds
              per stage summed over rows (decode = read + decode), the writer, and what the wall
              time on all cores leaves (Ray scheduling, queueing, dedup, driver); `phases_s` the
              run's measure, dedup and score+write phases, and `model_setup` when each model stage's
              actors started and were ready (engine.start_actors_early loads them during measure).
              `scored_twice_fraction`: images a fallback round scored (dedup.max_fallbacks: a model
              stage rejected the members before them in their cluster) / images; `fallback` its rounds.
  ratio_*:    cascade images/s / each plain loop's images/s (all over all inputs).
  text_area:  text_area_frac of shipped photos and generated captions, exact (text.recognize=all):
              the measurements behind text.max_area_frac in pipeline/default.yaml; and whether
              the default text.recognize=needed reaches the same verdicts on them.

The crawl is generated (nothing is downloaded): shipped photos of people, re-cropped, flipped and
rescaled into distinct images, some with captions; at least half are non-human (shipped photos
without people, photo-like textures, flat graphics).

usage: python bench/filters.py [--n 96] [--skip-art] [--files-per-unit 16] [--out bench.json]
                               [--set KEY=VALUE ...]
       (--set engine.start_actors_early=true/false: model actors start with the run / after dedup;
       the default, auto, starts them early from engine.early_min_units units to measure)
"""
from __future__ import annotations

import argparse
import io
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.config import load_config  # noqa: E402
from pipeline.demo.crawl import encode, flat_graphic, photo_like, shipped_photos, with_caption  # noqa: E402
from pipeline.inputs.images import probe  # noqa: E402

CASCADE = ("decode", "size", "dedup", "person", "text", "watermark", "art")
HUMAN = ("bus", "zidane", "astronaut", "camera")
NON_HUMAN = ("coffee", "chelsea", "rocket", "motorcycle_left", "hubble_deep_field")


def _variant(im: Image.Image, rng: np.random.Generator) -> Image.Image:
    """A distinct photo from a base: random crop (70-100%), flip, rescale, brightness."""
    w, h = im.size
    f = rng.uniform(0.7, 1.0)
    cw, ch = int(w * f), int(h * f)
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    out = im.crop((x, y, x + cw, y + ch))
    if rng.random() < 0.5:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    s = rng.uniform(0.9, 2.0) * max(1.0, 480 / min(out.size))  # short side stays >= size.min_short_side
    out = out.resize((int(out.width * s), int(out.height * s)), Image.BILINEAR)
    a = np.asarray(out.convert("RGB"), np.float32) * rng.uniform(0.8, 1.2)
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))


def make_crawl(folder: Path, n: int, seed: int = 0) -> dict[str, str]:
    """n JPEG files in folder; returns {file name: kind}. Half or more are non-human."""
    rng = np.random.default_rng(seed)
    photos = {k: Image.open(io.BytesIO(v)).convert("RGB") for k, v in shipped_photos().items()}
    humans = [photos[k] for k in HUMAN if k in photos]
    others = [photos[k] for k in NON_HUMAN if k in photos]
    folder.mkdir(parents=True, exist_ok=True)
    kinds = {}
    n_human = n // 2 - n // 8
    n_caption = n // 8
    for i in range(n):
        if i < n_human:
            im, kind = _variant(humans[i % len(humans)], rng), "human"
        elif i < n_human + n_caption:
            im, kind = with_caption(_variant(humans[i % len(humans)], rng), "SUMMER SALE 50% OFF"), "human+caption"
        else:
            j = i - n_human - n_caption
            if j % 3 == 0 and others:
                im, kind = _variant(others[j % len(others)], rng), "non-human photo"
            elif j % 3 == 1:
                im = Image.open(io.BytesIO(photo_like(int(rng.integers(500, 1200)), int(rng.integers(500, 900)),
                                                      seed=1000 + i)))
                kind = "texture"
            else:
                im, kind = flat_graphic(int(rng.integers(600, 1200)), int(rng.integers(500, 900)), seed=i), "graphic"
        name = f"{i:05d}.jpg"
        (folder / name).write_bytes(encode(im.convert("RGB"), quality=90))
        kinds[name] = kind
    return kinds


def _batch(files: list[Path]) -> dict[str, list]:
    batch = {"sample_id": [], "image": [], "width": [], "height": [], "exif_orientation": [], "format": [],
             "read_error": []}
    for f in files:
        data = f.read_bytes()
        info = probe(data)
        batch["sample_id"].append(f.name)
        batch["image"].append(data)
        batch["read_error"].append(None)
        for k in ("width", "height", "exif_orientation", "format"):
            batch[k].append(info[k])
    return batch


def bench_stage(stage, files: list[Path]) -> dict:
    t0 = time.perf_counter()
    stage.setup()
    setup_s = time.perf_counter() - t0
    bs = stage.batch_size
    batches = [_batch(files[i:i + bs]) for i in range(0, len(files), bs)]
    stage.measure({k: v[:1] for k, v in batches[0].items()})  # warm-up (first-call allocations)
    t0 = time.perf_counter()
    for b in batches:
        stage.measure(b)
    dt = time.perf_counter() - t0
    return {"images_per_s": round(len(files) / dt, 2), "images": len(files), "batch_size": bs,
            "seconds": round(dt, 2), "setup_s": round(setup_s, 2)}


def bench_person_vs_onnxruntime(cfg: dict, files: list[Path]) -> dict:
    """The person stage's measure() against ONNX Runtime alone on the same batches, per core: CPU seconds
    (every thread of this process) of the whole stage (decode, letterbox, the model, NMS, boxes) and of
    its session.run calls inside it, in the same run. Target: the stage within 1.2x of the model alone."""
    from pipeline.stages.person import PersonStage
    stage = PersonStage(dict(cfg, backend="onnx"))
    stage.setup()
    bs = stage.batch_size
    batches = [_batch(files[i:i + bs]) for i in range(0, len(files), bs)]
    stage.measure({k: v[:1] for k, v in batches[0].items()})  # warm-up
    forward, model_s = stage._forward, [0.0]

    def timed(x):
        c0 = time.process_time()
        try:
            return forward(x)
        finally:
            model_s[0] += time.process_time() - c0

    stage._forward = timed
    c0 = time.process_time()
    for b in batches:
        stage.measure(b)
    total = time.process_time() - c0
    return {"images": len(files), "threads": stage.threads, "stage_cpu_ms_per_image": round(1e3 * total / len(files), 2),
            "onnxruntime_cpu_ms_per_image": round(1e3 * model_s[0] / len(files), 2),
            "stage_over_onnxruntime": round(total / model_s[0], 3)}


def random_checkpoints(folder: Path, with_art: bool) -> dict:
    import torch

    from pipeline.stages.watermark.stage import build_model
    out = {}
    torch.manual_seed(0)
    out["watermark"] = folder / "watermark_random.pt"
    torch.save(build_model().state_dict(), out["watermark"])
    if with_art:
        import open_clip
        out["art"] = folder / "vit_b32_random.pt"
        torch.save(open_clip.create_model("ViT-B-32", pretrained=None).state_dict(), out["art"])
    return out


def text_area_cases(cfg: dict | None = None) -> dict:
    """text_area_frac on shipped photos and generated captions (the default's measurements)."""
    from pipeline.stages.text import TextStage
    photos = shipped_photos()

    def cap(name, text, rel, bar=False):
        im = Image.open(io.BytesIO(photos[name])).convert("RGB")
        d = ImageDraw.Draw(im)
        size = max(10, int(im.height * rel))
        y = im.height - size * 1.5
        if bar:
            d.rectangle([0, y - size * 0.2, im.width, y + size * 1.3], fill=(0, 0, 0))
        d.text((im.width * 0.05, y), text, font=ImageFont.load_default(size=size), fill="white",
               stroke_width=max(1, size // 15), stroke_fill="black")
        return encode(im, "PNG")

    cases = {k: photos[k] for k in ("bus", "zidane", "astronaut", "camera", "coffee", "chelsea", "page") if k in photos}
    cases.update({
        "zidane + 1-line caption 4% high": cap("zidane", "Champions league final tonight", 0.04),
        "zidane + 1-line caption 6% high": cap("zidane", "Champions league final tonight", 0.06),
        "astronaut + caption 8% high on a bar": cap("astronaut", "First woman in space", 0.08, bar=True),
        "bus + caption 5% high": cap("bus", "Summer sale 50% off", 0.05),
        "astronaut + meme bands (demo)": encode(with_caption(Image.open(io.BytesIO(photos["astronaut"]))), "PNG"),
    })
    batch = {"sample_id": list(cases), "image": list(cases.values())}
    cfg = (cfg or load_config())["text"]
    exact = TextStage(cfg | {"recognize": "all"}).measure(batch)["text_area_frac"]
    needed = TextStage(cfg).measure(batch)["text_area_frac"]
    limit = float(cfg["max_area_frac"])
    out = {k: round(v, 4) if v is not None else None for k, v in zip(cases, exact)}
    out["_verdicts_equal_with_recognize_needed"] = all(
        (a is None and b is None) or (a is not None and b is not None and (a > limit) == (b > limit))
        for a, b in zip(exact, needed))
    return out


def _ultralytics_loop(weights: str, files: list[Path], batch_size: int, imgsz: int, min_score: float,
                      min_box: float) -> tuple[list[Path], float]:
    """The user's predict loop: file paths in batches; returns the files passing the person rule."""
    from pipeline.stages.person_model import import_ultralytics_offline
    YOLO = import_ultralytics_offline()
    model = YOLO(weights)
    model.predict([str(files[0])], imgsz=imgsz, verbose=False)  # warm-up
    t0 = time.perf_counter()
    kept = []
    for i in range(0, len(files), batch_size):
        part = files[i:i + batch_size]
        for f, r in zip(part, model.predict([str(f) for f in part], imgsz=imgsz, classes=[0], verbose=False)):
            xywh, conf = r.boxes.xywh.cpu().numpy(), r.boxes.conf.cpu().numpy()
            if ((conf > min_score) & (np.maximum(xywh[:, 2], xywh[:, 3]) > min_box)).any():
                kept.append(f)
    return kept, time.perf_counter() - t0


def bench_plain(weights: str, files: list[Path], batch_size: int, imgsz: int, min_score: float = 0.9,
                min_box: float = 300) -> dict:
    kept, dt = _ultralytics_loop(weights, files, batch_size, imgsz, min_score, min_box)
    return {"images_per_s": round(len(files) / dt, 2), "seconds": round(dt, 2), "kept_by_person_rule": len(kept),
            "batch_size": batch_size, "imgsz": imgsz}


def bench_plain_cascade(weights: str, files: list[Path], cfg: dict) -> dict:
    """One process: the ultralytics loop over every input, then rapidocr on the images that pass
    the person rule, with the stages' thresholds and batch sizes."""
    from rapidocr import RapidOCR

    from pipeline.stages.text import confirmed, union_area_frac
    p, t = cfg["person"], cfg["text"]
    side = int(t["max_side"])
    ocr = RapidOCR(params={"Global.use_cls": False, "Global.log_level": "error", "Global.max_side_len": side,
                           "Det.limit_type": "max", "Det.limit_side_len": side})
    ocr(np.zeros((64, 64, 3), np.uint8))  # model load, as the predict loop's warm-up
    c0 = _own_cpu()
    people, dt_person = _ultralytics_loop(weights, files, int(p["batch_size"]), int(p["imgsz"]),
                                          float(p["min_score"]), float(p["min_box_px"]))
    t0 = time.perf_counter()
    kept = 0
    bs = int(t["batch_size"])
    for i in range(0, len(people), bs):
        for f in people[i:i + bs]:
            res = ocr(str(f))
            h, w = Image.open(f).size[::-1]
            s = side / max(h, w) if max(h, w) > side else 1.0
            if res.boxes is None or res.txts is None or len(res.txts) == 0:
                kept += 1
                continue
            keep = confirmed(res.txts, res.scores, float(t["min_rec_score"]), int(t["min_chars"]))
            frac = union_area_frac([res.boxes[k] * s for k in keep], round(h * s), round(w * s))
            kept += frac <= float(t["max_area_frac"])
    dt_text = time.perf_counter() - t0
    dt = dt_person + dt_text
    return {"images_per_s": round(len(files) / dt, 2), "seconds": round(dt, 2), "cpu_s": round(_own_cpu() - c0, 2),
            "person_seconds": round(dt_person, 2), "text_seconds": round(dt_text, 2),
            "passed_person": len(people), "kept": int(kept)}


def _own_cpu() -> float:
    """User + system seconds of this process, every thread."""
    import resource
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _tree_cpu():
    """bench/profile.py's sampler of the CPU time of this process' descendants (a TreeCPU)."""
    import importlib.util
    if "bench_profile" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_profile", Path(__file__).with_name("profile.py"))
        sys.modules["bench_profile"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["bench_profile"])
    return sys.modules["bench_profile"].TreeCPU()


def bench_cascade(crawl: Path, out: Path, cfg: dict) -> dict:
    import ray

    from pipeline.engine import driver as engine, local
    n = len(list(crawl.glob("*.jpg")))
    startup, cpus = 0.0, float(local.cores())
    if not local.use_local(cfg, n):  # engine.executor: a Ray run's cluster start-up is timed apart from the
        t0 = time.perf_counter()     # throughput (a local run's worker processes start inside its clock)
        engine.init_ray(cfg)
        startup = time.perf_counter() - t0
        cpus = float(ray.cluster_resources().get("CPU", 0))
    tree = _tree_cpu()  # Ray's processes are this process' children
    tree.start()
    c0, k0 = _own_cpu(), tree.total()
    t0 = time.perf_counter()
    manifest = engine.curate([str(crawl)], str(out), cfg, progress=False)
    dt = time.perf_counter() - t0
    cpu_s = _own_cpu() - c0 + tree.total() - k0
    tree.stop()
    work: dict[str, float] = {}
    spans: dict[str, set] = {}  # stage -> (started, ready) of each of its actors
    for f in sorted((out / "stats").glob("*.json")):
        stats = json.loads(f.read_text())
        for k, v in stats.get("seconds", {}).items():
            work[k] = work.get(k, 0.0) + float(v)
        for k, span in (stats.get("actor_setup") or {}).items():
            spans.setdefault(k, set()).add(tuple(span))
    busy = sum(work.values())
    return {"images_per_s": round(n / dt, 2), "seconds": round(dt, 2), "cpu_s": round(cpu_s, 2),
            "funnel": manifest.get("funnel"),
            **fallback_work(out, manifest, n),
            "kept": manifest.get("counts", {}).get("kept"), "skipped_stages": manifest.get("skipped_stages"),
            "executor": manifest.get("executor"),
            "breakdown": {
                "ray_startup_s": round(startup, 2), "cluster_cpus": cpus, "wall_s": round(dt, 2),
                "work_s": {("read+decode" if k == "decode" else k): round(v, 2) for k, v in work.items()},
                "work_total_s": round(busy, 2),
                "queueing_and_overhead_s": round(max(0.0, dt * cpus - busy), 2),
                **timeline(manifest.get("timeline") or {}, spans),
                "note": "work_s: seconds inside each stage summed over rows (per unit, from RUN/stats); "
                        "queueing_and_overhead_s: wall time x cluster CPUs minus that work; phases_s: the "
                        "run's phases on the driver's clock; model_setup: each model stage's actors (the pool's "
                        "first and any it scaled up to), seconds from the run's start to the first set-up "
                        "starting and the first model ready, the longest set-up, and ready_after_dedup_s: "
                        "how long after dedup (when phase 3 may start) the stage's first actor was ready "
                        "(<= 0: its set-up was off the critical path)"}}


def fallback_work(run: Path, manifest: dict, n: int) -> dict:
    """The extra model work of dedup.max_fallbacks: images scored in a fallback round (because a model
    stage rejected every member before them in their cluster), as a fraction of the crawl's images
    (`scored_twice_fraction`: each is a cluster the model stages scored a second or third time) and
    of the images the first round scored."""
    import catalog
    rounds = (manifest.get("fallbacks") or {}).get("rounds") or {}
    extra = sum(int(v) for v in rounds.values())
    clusters, scored = catalog.connect(run).execute(
        "SELECT count(DISTINCT coalesce(dup_of, sample_id)) FILTER (WHERE dup_cluster_size > 1), "
        "count(*) FILTER (WHERE dup_scored) FROM samples").fetchone()
    return {"fallback": {"max_fallbacks": (manifest["config"].get("dedup") or {}).get("max_fallbacks"),
                         "rounds": rounds, "kept_fallbacks": (manifest.get("fallbacks") or {}).get("kept_fallbacks", 0),
                         "duplicate_clusters": clusters, "scored_first_round": scored - extra,
                         "extra_over_first_round": round(extra / max(1, scored - extra), 4)},
            "scored_twice_fraction": round(extra / max(1, n), 4)}


def timeline(tl: dict, spans: dict[str, set]) -> dict:
    """The run's phases and its model actors' set-up, from the manifest and RUN/stats."""
    if not tl.get("scored"):
        return {}
    start, deduped = tl["start"], tl["deduped"]
    phases = {"measure": tl["measured"] - start, "dedup": deduped - tl["measured"], "score+write": tl["scored"] - deduped}
    setup = {name: {"actors": len(sp), "started_s": round(min(a for a, _ in sp) - start, 2),
                    "first_ready_s": round(min(b for _, b in sp) - start, 2),
                    "setup_s": round(max(b - a for a, b in sp), 2),
                    "ready_after_dedup_s": round(min(b for _, b in sp) - deduped, 2)} for name, sp in spans.items()}
    return {"phases_s": {k: round(v, 2) for k, v in phases.items()}, "model_setup": setup}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=96, help="images in the mixed crawl (default 96)")
    p.add_argument("--skip-art", action="store_true", help="leave out the OpenCLIP stage timing")
    p.add_argument("--skip-cascade", action="store_true", help="leave out the Ray cascade")
    p.add_argument("--skip-per-stage", action="store_true",
                   help="leave out the per-stage timings (the cascade against its peers only)")
    p.add_argument("--files-per-unit", type=int, default=16,
                   help="the engine cuts the crawl into units of this many files (default 16): one unit is one "
                        "block through the cascade, and a crawl in one unit would leave no pipelining between "
                        "stages (the default config's 1000 is sized for web-scale crawls)")
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every part of the bench, e.g. --set text.max_side=640")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import torch
    from pipeline.stages import stage_class
    from pipeline.stages.person import PersonStage

    cfg = load_config(sets=args.sets)
    cfg["stages"] = list(CASCADE)  # the whole cascade, whatever default.yaml enables today
    # the default stages as they are (watermark: its ocr method without weights; art skipped without
    # them), though the plain cascade does no watermark check: --set watermark.method=laion leaves it
    # out, as the figures before 2026-12-02 did
    cfg["input"]["files_per_unit"] = args.files_per_unit
    result: dict = {"machine": {"cpus": os.cpu_count(), "load_avg": [round(x, 2) for x in os.getloadavg()],
                                "torch_threads": torch.get_num_threads(),
                                "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
                    "sets": args.sets, "files_per_unit": args.files_per_unit}
    with tempfile.TemporaryDirectory(prefix="humanset-bench-") as tmp:
        tmp = Path(tmp)
        kinds = make_crawl(tmp / "crawl", args.n)
        files = sorted((tmp / "crawl").glob("*.jpg"))
        counts: dict[str, int] = {}
        for k in kinds.values():
            counts[k] = counts.get(k, 0) + 1
        result["crawl"] = {"images": len(files), "kinds": counts,
                           "non_human_fraction": round(sum(v for k, v in counts.items() if not k.startswith("human"))
                                                       / len(files), 3)}
        ckpts = random_checkpoints(tmp, with_art=not args.skip_art)
        per_stage: dict = {}
        if not args.skip_per_stage:
            for name in ("decode", "person", "text", "watermark", "art"):
                if name == "art" and args.skip_art:
                    continue
                scfg = dict(cfg.get(name) or {})
                scfg["resources"] = dict(scfg.get("resources") or {}, num_cpus=os.cpu_count())  # all cores
                if name in ckpts:
                    scfg["weights"] = str(ckpts[name])
                per_stage[name] = bench_stage(stage_class(name)(scfg), files)
                if name in ckpts:
                    per_stage[name]["weights"] = "random init of the real architecture (timing only)"
            # the text stage as it was: every detected box recognised (same detection)
            tcfg = dict(cfg["text"], recognize="all", resources={"num_cpus": os.cpu_count()})
            per_stage["text_recognize_all"] = bench_stage(stage_class("text")(tcfg), files)
            per_stage["text_speedup_over_recognize_all"] = round(
                per_stage["text"]["images_per_s"] / per_stage["text_recognize_all"]["images_per_s"], 3)
        per_stage["person_vs_onnxruntime"] = bench_person_vs_onnxruntime(cfg["person"], files)
        result["per_stage"] = per_stage
        person = PersonStage(cfg["person"])
        weights = str(person.weights_path())
        result["plain_ultralytics"] = bench_plain(weights, files, person.batch_size, person.imgsz,
                                                  float(cfg["person"]["min_score"]), float(cfg["person"]["min_box_px"]))
        result["plain_ultralytics"]["weights"] = person.weights_path().name
        result["plain_cascade"] = bench_plain_cascade(weights, files, cfg)
        if not args.skip_cascade:
            result["cascade"] = bench_cascade(tmp / "crawl", tmp / "run", cfg)
            for peer in ("plain_ultralytics", "plain_cascade"):
                result[f"ratio_cascade_over_{peer}"] = round(
                    result["cascade"]["images_per_s"] / result[peer]["images_per_s"], 3)
            result["cpu_ratio_plain_cascade_over_cascade"] = round(
                result["plain_cascade"]["cpu_s"] / result["cascade"]["cpu_s"], 3)
        result["text_area"] = text_area_cases(cfg)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
