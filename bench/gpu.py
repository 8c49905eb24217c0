"""The GPU check: one script for a lent GPU machine, under five minutes, printing one JSON object.

    python bench/gpu.py                  # on a CUDA machine: the full check
    python bench/gpu.py --out gpu.json   # also write the JSON there
    python bench/gpu.py --cpu            # the CPU fallback (tiny sizes, < 30 s): what `make test` runs

Checks (each in `checks`, timed with CUDA events on the GPU; a check that fails records its error and
the others still run):

  person_fp16   the person stage (pipeline/stages/person.py) on the GPU in half precision, square 640
                letterbox, batch 128: images/s of its measure() on JPEG bytes (CPU decode included, as
                the engine runs it) and of the model alone (forward + NMS on a ready batch).
  jpeg_decode   batched JPEG decode on the GPU (torchvision.io.decode_jpeg on CUDA; nvImageCodec too
                when installed) against the CPU (PIL, one image per core in parallel), at an ImageNet-like
                size (500x375) and at 1080p. Anchor: > 8,000 images/s on an A100.
  cascade       the filter cascade (decode, size, pHash, person on the GPU, text, watermark; defaults)
                through the engine's per-unit path (pipeline/engine/adapter.run_on_unit) in this
                process, per stage seconds and images; `images_per_s_per_gpu_est` = images / the
                larger of the GPU stage's time and the CPU stages' time spread over this machine's
                cores. With a GPU also `engine`: `humanset curate`'s engine on the same crawl with person
                on the GPU (num_gpus 1, batch 128), in a child process with a time limit. Anchor: NeMo
                Curator's nightly floor of 900 images/s per 8-GPU node for read -> CLIP -> aesthetic ->
                write (~112 per GPU).
  mae_vit_l_224, mae_vit_0.3b_1024
                MAE pretraining steps (training/mae.py, the fused AdamW and clip of the training loop),
                bf16 autocast: ViT-L/16 at 224 px (the sapiens-0.3b preset: width 1024, depth 24, 16
                heads, MLP 4096, i.e. ViT-L's shape; MAE decoder 512/8/16) and the same at 1024 px
                (Sapiens' 0.3B pretraining). Step time, images/s, MFU = training/flops.py's FLOPs per
                image x images/s / the GPU's dense bf16 peak (bench/pretrain.py's table). Anchor: MFU
                >= 40 % (no public MAE MFU figure exists).

Nothing is downloaded: the images are the shipped photos and generated ones (pipeline/demo/crawl.py),
the person weights the shipped yolo11n-pose.pt, the MAE weights random.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ANCHORS = {"jpeg_decode_a100_images_per_s": 8000, "nemo_curator_images_per_s_per_gpu": 112,
           "nemo_curator_images_per_s_per_node_8gpu": 900, "mae_mfu_target": 0.40}


class Sizes:
    """What each check runs: full on a GPU, tiny for the CPU fallback."""

    def __init__(self, gpu: bool):
        self.gpu = gpu
        self.person_images = 512 if gpu else 2
        self.person_batch = 128 if gpu else 2
        self.person_imgsz = 640 if gpu else 160
        self.decode_small = 512 if gpu else 8  # 500x375 JPEGs
        self.decode_large = 96 if gpu else 2  # 1920x1080 JPEGs
        self.decode_repeats = 3 if gpu else 1
        self.cascade_images = 256 if gpu else 4
        self.engine_images = 512 if gpu else 0
        self.engine_timeout_s = 150
        self.budget_s = 270  # checks not started by then are skipped (the engine run goes last)
        # (name, preset, image size, batch, warm-up steps, timed steps)
        self.mae = ([("mae_vit_l_224", "sapiens-0.3b", 224, 256, 3, 10),
                     ("mae_vit_0.3b_1024", "sapiens-0.3b", 1024, 32, 2, 6)] if gpu
                    else [("mae_micro_64", "micro", 64, 2, 1, 1)])


# ---------------------------------------------------------------------------------------------------
# timing

class Timer:
    """Seconds of a block of GPU work (CUDA events) or CPU work (perf_counter)."""

    def __init__(self, device):
        import torch
        self.torch, self.cuda = torch, device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.a = self.torch.cuda.Event(enable_timing=True)
            self.b = self.torch.cuda.Event(enable_timing=True)
            self.a.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.b.record()
            self.b.synchronize()
            self.seconds = self.a.elapsed_time(self.b) / 1e3
        else:
            self.seconds = time.perf_counter() - self.t0
        return False


def set_flags() -> None:
    import torch
    if torch.cuda.is_available():
        torch.backends.cudnn.benchmark = True  # fixed shapes: let cuDNN pick its fastest kernels
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")


# ---------------------------------------------------------------------------------------------------
# images (nothing downloaded)

def jpegs(n: int, size: tuple[int, int] | None = None, seed: int = 0) -> list[bytes]:
    """n distinct JPEGs: the shipped photos, re-cropped and flipped (at `size` when given), and
    photo-like generated ones."""
    import numpy as np
    from PIL import Image

    from pipeline.demo.crawl import encode, photo_like, shipped_photos
    rng = np.random.default_rng(seed)
    photos = [Image.open(io.BytesIO(b)).convert("RGB") for b in shipped_photos().values()]
    out = []
    for i in range(n):
        if i % 4 == 3:
            w, h = size or (int(rng.integers(500, 1300)), int(rng.integers(400, 900)))
            out.append(photo_like(w, h, seed=seed * 100_000 + i))
            continue
        im = photos[i % len(photos)]
        f = rng.uniform(0.75, 1.0)
        cw, ch = max(8, int(im.width * f)), max(8, int(im.height * f))
        x, y = int(rng.integers(0, im.width - cw + 1)), int(rng.integers(0, im.height - ch + 1))
        im = im.crop((x, y, x + cw, y + ch))
        if rng.random() < 0.5:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        if size:
            im = im.resize(size, Image.BILINEAR)
        elif min(im.size) < 480:
            s = 480 / min(im.size)
            im = im.resize((int(im.width * s), int(im.height * s)), Image.BILINEAR)
        out.append(encode(im, quality=90))
    return out


def _batch(images: list[bytes]) -> dict[str, list]:
    from pipeline.inputs.images import probe
    batch: dict[str, list] = {"sample_id": [], "image": [], "width": [], "height": [], "resolution_scale": []}
    for i, data in enumerate(images):
        info = probe(data, verify=False)
        batch["sample_id"].append(f"{i:06d}")
        batch["image"].append(data)
        batch["width"].append(info["width"])
        batch["height"].append(info["height"])
        batch["resolution_scale"].append(None)
    return batch


# ---------------------------------------------------------------------------------------------------
# checks

def check_person(sizes: Sizes, device) -> dict:
    import numpy as np
    import torch

    from pipeline.config import load_config
    from pipeline.stages.person import PersonStage
    cfg = dict(load_config()["person"], backend="torch", batch_size=sizes.person_batch, imgsz=sizes.person_imgsz,
               resources={"num_cpus": max(1, (os.cpu_count() or 1) // 2), "num_gpus": 1 if sizes.gpu else 0})
    stage = PersonStage(cfg)
    t0 = time.perf_counter()
    stage.setup()
    setup_s = time.perf_counter() - t0
    images = jpegs(sizes.person_images, seed=1)
    batch = _batch(images)
    bs = sizes.person_batch
    stage.measure({k: v[:bs] for k, v in batch.items()})  # warm-up: cuDNN's choice, allocations
    t0 = time.perf_counter()
    found = 0
    for i in range(0, len(images), bs):
        out = stage.measure({k: v[i:i + bs] for k, v in batch.items()})
        found += sum(1 for n in out["n_persons"] if n)
    if device.type == "cuda":
        torch.cuda.synchronize()
    stage_s = time.perf_counter() - t0
    # the model alone: one letterboxed batch, forward + NMS, CUDA events
    rgb = np.zeros((sizes.person_imgsz, sizes.person_imgsz, 3), np.uint8)
    x = np.ascontiguousarray(np.stack([rgb] * bs).transpose(0, 3, 1, 2), np.float32) / 255.0
    stage._forward(x)
    reps = 10 if sizes.gpu else 1
    with Timer(device) as t:
        for _ in range(reps):
            stage._forward(x)
    return {"backend": stage.backend, "device": stage.device, "half": bool(getattr(stage, "half", False)),
            "imgsz": sizes.person_imgsz, "batch_size": bs, "setup_s": round(setup_s, 2), "images": len(images),
            "images_with_persons": found, "stage_images_per_s": round(len(images) / stage_s, 1),
            "model_images_per_s": round(reps * bs / t.seconds, 1),
            "note": "stage: measure() on JPEG bytes, CPU draft decode + letterbox + model + NMS; "
                    "model: forward of a ready batch"}


def _decode_cpu(images: list[bytes]) -> float:
    """Images/s of PIL decode (RGB), one image per core in parallel (PIL releases the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    def one(data: bytes):
        im = Image.open(io.BytesIO(data))
        im.load()
        return im.size

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(one, images[: max(1, len(images) // 8)]))  # warm-up
        t0 = time.perf_counter()
        list(pool.map(one, images))
    return len(images) / (time.perf_counter() - t0)


def _decode_gpu(images: list[bytes], device, repeats: int, batch: int = 256) -> float:
    """Images/s of torchvision's batched decode_jpeg on `device` (the bytes already in host tensors):
    host wall time between synchronisations (nvJPEG's host and device work both count)."""
    import torch
    from torchvision.io import decode_jpeg
    data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in images]
    decode_jpeg(data[:min(batch, len(data))], device=device)  # warm-up: nvJPEG's handles and buffers
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        for i in range(0, len(data), batch):
            decode_jpeg(data[i:i + batch], device=device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return repeats * len(data) / (time.perf_counter() - t0)


def _decode_nvimgcodec(images: list[bytes]) -> dict:
    try:
        from nvidia import nvimgcodec  # noqa: F401  (optional: pip install nvidia-nvimgcodec-cu12)
    except ImportError:
        return {"available": False}
    import torch
    decoder = nvimgcodec.Decoder()
    decoder.decode(images[:64])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = decoder.decode(images)
    torch.cuda.synchronize()
    return {"available": True, "images_per_s": round(len(out) / (time.perf_counter() - t0), 1)}


def check_jpeg_decode(sizes: Sizes, device) -> dict:
    out = {}
    for name, n, size in (("500x375", sizes.decode_small, (500, 375)), ("1920x1080", sizes.decode_large, (1920, 1080))):
        images = jpegs(n, size=size, seed=2)
        row = {"images": n, "mean_kb": round(sum(map(len, images)) / n / 1024, 1),
               "cpu_pil_images_per_s_all_cores": round(_decode_cpu(images), 1), "cpu_cores": os.cpu_count()}
        row["cpu_pil_images_per_s_per_core"] = round(row["cpu_pil_images_per_s_all_cores"] / (os.cpu_count() or 1), 1)
        ips = _decode_gpu(images, device, sizes.decode_repeats)
        row["torchvision_decode_jpeg_images_per_s" + ("" if device.type == "cuda" else "_cpu")] = round(ips, 1)
        if device.type == "cuda":
            row["gpu_over_cpu_all_cores"] = round(ips / row["cpu_pil_images_per_s_all_cores"], 2)
            row["nvimgcodec"] = _decode_nvimgcodec(images)
        out[name] = row
    return out


def _crawl_tar(folder: Path, n: int, per_shard: int) -> list[Path]:
    from pipeline.demo.crawl import write_webdataset
    images = jpegs(n, seed=3)
    samples = [(f"{i:06d}", "jpg", data, "") for i, data in enumerate(images)]
    return write_webdataset(folder, samples, per_shard=per_shard)


def check_cascade(sizes: Sizes, device, work: Path) -> dict:
    """The default cascade through the engine's per-unit path, in this process."""
    import torch

    from pipeline.config import load_config
    from pipeline.engine.adapter import run_on_unit
    from pipeline.engine.columns import unit_meta
    from pipeline.engine.unit_io import read_for_measure
    from pipeline.inputs.units import Unit
    from pipeline.stages import build_stages
    import pyarrow.compute as pc
    cfg = load_config(sets=[f"person.batch_size={sizes.person_batch}", f"person.imgsz={sizes.person_imgsz}",
                            "person.backend=torch"])
    if sizes.gpu:
        cfg["person"]["resources"] = {"num_cpus": 2, "num_gpus": 1}
    stages = [s for s in build_stages(cfg) if s.enabled]
    for s in stages:
        s.setup()
    (tar,) = _crawl_tar(work / "cascade", sizes.cascade_images, sizes.cascade_images)
    table = read_for_measure(Unit("gpu-check", "tar", str(tar)), {})
    seen, t_all = {}, time.perf_counter()
    for s in stages:
        alive = int(pc.sum(pc.cast(pc.fill_null(table.column("_alive"), False), "int64")).as_py() or 0)
        seen[s.name] = table.num_rows if s.phase == "measure" else alive
        table = run_on_unit(s, table, score_all=False)
        if device.type == "cuda":
            torch.cuda.synchronize()
    wall = time.perf_counter() - t_all
    seconds = unit_meta(table)["seconds"]
    n = table.num_rows
    gpu_s = sum(v for k, v in seconds.items() if k == "person") if sizes.gpu else 0.0
    cpu_s = sum(v for k, v in seconds.items() if k != "person" or not sizes.gpu)
    cores = os.cpu_count() or 1
    est = n / max(gpu_s, cpu_s / cores, 1e-9)
    return {"images": n, "stages": [s.name for s in stages], "images_per_stage": seen,
            "seconds_per_stage": {k: round(v, 3) for k, v in seconds.items()},
            "kept": int(pc.sum(pc.cast(pc.fill_null(table.column("_alive"), False), "int64")).as_py() or 0),
            "one_process_images_per_s": round(n / wall, 2), "images_per_s_per_gpu_est": round(est, 1),
            "note": "est: images / max(GPU stage seconds, CPU stages' seconds / this machine's cores)"}


def check_engine(sizes: Sizes, work: Path) -> dict:
    """`humanset curate`'s engine on a crawl of sizes.engine_images, person on the GPU, in a child process."""
    crawl = work / "engine-crawl"
    _crawl_tar(crawl, sizes.engine_images, 16)  # units of 16 images, as bench/filters.py
    code = ("import json, sys, time; sys.path.insert(0, sys.argv[3]);"
            "from pipeline.config import load_config; from pipeline.engine.driver import curate;"
            "from pipeline.engine.ray_setup import init_ray;"
            "cfg = load_config(sets=['person.batch_size=128', 'person.resources={num_cpus: 2, num_gpus: 1}']);"
            "init_ray(cfg); t0 = time.perf_counter(); m = curate([sys.argv[1]], sys.argv[2], cfg, progress=False);"
            "s = time.perf_counter() - t0;"
            "print(json.dumps({'seconds': round(s, 2), 'images': m['counts']['inputs'], 'kept': m['counts']['kept'],"
            "'images_per_s': round(m['counts']['inputs'] / s, 1), 'phases_s': m.get('seconds'), 'funnel': m['funnel']}))")
    try:
        p = subprocess.run([sys.executable, "-c", code, str(crawl), str(work / "engine-run"), str(ROOT)],
                           capture_output=True, text=True, timeout=sizes.engine_timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish in {sizes.engine_timeout_s} s"}
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def check_mae(name: str, preset: str, image_size: int, batch: int, warmup: int, steps: int, device) -> dict:
    import torch

    from training.flops import mae_train_flops
    from training.lr import adamw, clip_and_step, param_groups
    from training.mae import MaskedAutoencoder, count_params
    torch.manual_seed(0)
    model = MaskedAutoencoder.from_preset(preset, image_size, 0.75).init_weights().to(device)
    opt = adamw(param_groups(model, 0.05), 1e-4, (0.9, 0.95))
    bf16 = device.type == "cuda"

    def step(x):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(x)[0]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        clip_and_step(model, opt, 1.0)
        return loss

    while True:  # the batch halves until it fits the GPU's memory
        try:
            x = torch.randn(batch, 3, image_size, image_size, device=device)
            for _ in range(warmup):
                step(x)
            break
        except torch.cuda.OutOfMemoryError:
            if batch == 1:
                raise
            batch //= 2
            opt.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
    times = []
    for _ in range(steps):
        with Timer(device) as t:
            loss = step(x)
        times.append(t.seconds)
    times.sort()
    step_s = times[len(times) // 2]
    flops = mae_train_flops(preset, image_size, 0.75, batch_size=batch)
    ips = batch / step_s
    out = {"preset": preset, "image_size": image_size, "batch_size": batch, "params": count_params(model),
           "precision": "bf16-autocast" if bf16 else "fp32", "steps_timed": steps, "step_time_s": round(step_s, 4),
           "images_per_s": round(ips, 2), "train_flops_per_image": flops,
           "achieved_tflops": round(flops * ips / 1e12, 2), "final_loss": round(float(loss.detach()), 4)}
    peak = _peak_flops(device)
    if device.type == "cuda":
        out["peak_bf16_tflops"] = peak / 1e12 if peak else None
        out["mfu"] = round(flops * ips / peak, 4) if peak else None
        out["max_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        torch.cuda.reset_peak_memory_stats(device)
    return out


def _peak_flops(device) -> float | None:
    """The GPU's dense bf16 peak, from bench/pretrain.py's table (None off a GPU or when unknown)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_pretrain", Path(__file__).with_name("pretrain.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.peak_flops(device)


# ---------------------------------------------------------------------------------------------------

def _run(checks: dict, name: str, fn, *args, deadline: float = float("inf")) -> None:
    t0 = time.perf_counter()
    if t0 > deadline:
        checks[name] = {"skipped": "the check's time budget was spent before it started"}
        return
    try:
        checks[name] = fn(*args)
    except Exception as e:  # one failing check must not lose the others' figures
        checks[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
    checks[name]["check_seconds"] = round(time.perf_counter() - t0, 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="the CPU fallback even where CUDA is available")
    ap.add_argument("--skip", action="append", default=[], metavar="CHECK",
                    help="leave a check out: person_fp16, jpeg_decode, cascade, engine, mae (repeatable)")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)
    import logging
    logging.basicConfig(level=logging.WARNING)
    import torch
    gpu = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda:0" if gpu else "cpu")
    sizes = Sizes(gpu)
    set_flags()
    t0 = time.perf_counter()
    result: dict = {"mode": "gpu" if gpu else "cpu-fallback", "device": torch.cuda.get_device_name(device) if gpu
                    else f"cpu ({os.cpu_count()} cores)", "torch": torch.__version__,
                    "cuda": torch.version.cuda, "cpu_cores": os.cpu_count(), "anchors": ANCHORS, "checks": {}}
    checks = result["checks"]
    work = Path(tempfile.mkdtemp(prefix="humanset-gpu-"))
    end = t0 + sizes.budget_s
    try:
        if "person_fp16" not in args.skip:
            _run(checks, "person_fp16", check_person, sizes, device, deadline=end)
        if "jpeg_decode" not in args.skip:
            _run(checks, "jpeg_decode", check_jpeg_decode, sizes, device, deadline=end)
        if "mae" not in args.skip:
            for name, *spec in sizes.mae:
                _run(checks, name, check_mae, name, *spec, device, deadline=end)
                if gpu:
                    torch.cuda.empty_cache()
        if "cascade" not in args.skip:
            _run(checks, "cascade", check_cascade, sizes, device, work, deadline=end)
        if sizes.engine_images and "engine" not in args.skip:
            sizes.engine_timeout_s = max(30, min(sizes.engine_timeout_s, int(end + 30 - time.perf_counter())))
            _run(checks, "engine", check_engine, sizes, work, deadline=end - 30)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
