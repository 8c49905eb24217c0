"""Benchmark MAE pretraining steps: images/s, FLOPs per image and (on a GPU) MFU. Prints JSON.

    python bench/pretrain.py --model sapiens-0.3b --image-size 1024 --batch-size 32        # on a GPU
    python bench/pretrain.py --model tiny --image-size 64 --batch-size 16 --steps 10        # on a CPU

Synthetic inputs measure the model step alone (forward, backward, clip, AdamW as the training loop builds
them); add --data RUN/shards to measure the shard stream's decode + augment throughput as well.

Side by side with facebookresearch/mae (a local copy of its models_mae.py, never downloaded; its
util/pos_embed.py is taken from beside it or from ../util/):

    python bench/pretrain.py --model base --image-size 224 --batch-size 8 --ref REF/models_mae.py \
        --rounds 7 --steps 3 --warmup 2 --threads 2

Both models get the same batch; rounds alternate which goes first. Each round times `--steps` steps of
each; the report gives per model the median over rounds of the round's median step time, split into
forward + backward and clip + optimiser, and `speedup` = reference time / humanset time (> 1: humanset is
faster). The reference steps with plain AdamW as its main_pretrain.py builds it, clipped by
`clip_grad_norm_`; humanset with the fused AdamW and `clip_and_step` its training loop uses
(`speedup_forward_backward` compares the models alone). On a CPU both run in fp32; --bf16 runs both under
bf16 autocast (a CPU with AVX512-BF16 or AMX), as on a GPU.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
import types
from functools import partial
from pathlib import Path

import torch

from training.flops import encoder_linear_macs, mae_forward_flops, mae_train_flops
from training.lr import adamw, clip_and_step, param_groups
from training.mae import MaskedAutoencoder, compile_blocks, count_params
from training.vit import preset

# dense bf16 tensor-core peaks (FLOP/s) of common training GPUs, from the vendors' datasheets
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "GH200": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12,
             "A10": 125e12, "B200": 2250e12}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key in sorted(PEAK_BF16, key=len, reverse=True):
        if key in name:
            return PEAK_BF16[key]
    return None


def humanset_model(args, device):
    torch.manual_seed(0)
    model = MaskedAutoencoder.from_preset(args.model, args.image_size, args.mask_ratio,
                                          grad_checkpointing=args.grad_checkpointing).init_weights().to(device)
    if args.compile:
        compile_blocks(model)
    return model, adamw(param_groups(model, 0.05), 1e-4, (0.9, 0.95))


def load_reference(path: Path):
    """Import facebookresearch/mae's models_mae.py unchanged. It was written for timm 0.3.2 and numpy < 1.24:
    Block took `qk_scale` (gone from timm since), so timm's Block is swapped for one that drops it while
    the file imports; `util.pos_embed` comes from the copy beside it, with `np.float` given back."""
    import timm.models.vision_transformer as tvt

    path = Path(path).resolve()
    if not path.is_file():
        raise SystemExit(f"--ref {path}: no such file (a local copy of facebookresearch/mae's models_mae.py)")
    for folder in (path.parent, path.parent.parent):
        for candidate in (folder / "util" / "pos_embed.py", folder / "pos_embed.py"):
            if candidate.is_file() and "util.pos_embed" not in sys.modules:
                spec = importlib.util.spec_from_file_location("util.pos_embed", candidate)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                module.np = numpy_compat()  # np.float, removed in numpy 1.24
                sys.modules.setdefault("util", types.ModuleType("util")).pos_embed = module
                sys.modules["util.pos_embed"] = module
    if "util.pos_embed" not in sys.modules:
        raise SystemExit(f"--ref {path}: util/pos_embed.py of the same repository is not beside it")

    class CompatBlock(tvt.Block):
        def __init__(self, *a, qk_scale=None, **kw):
            super().__init__(*a, **kw)

    original = tvt.Block
    tvt.Block = CompatBlock
    try:
        spec = importlib.util.spec_from_file_location("reference_models_mae", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        tvt.Block = original
    return module


def numpy_compat():
    import numpy as np

    compat = types.ModuleType("numpy")
    compat.__dict__.update(np.__dict__)
    compat.float = float
    return compat


def reference_model(args, device, ref_module):
    p = preset(args.model)
    torch.manual_seed(0)
    model = ref_module.MaskedAutoencoderViT(
        img_size=args.image_size, patch_size=16, embed_dim=p.width, depth=p.depth, num_heads=p.heads,
        decoder_embed_dim=p.decoder_width, decoder_depth=p.decoder_depth, decoder_num_heads=p.decoder_heads,
        mlp_ratio=p.mlp / p.width, norm_layer=partial(torch.nn.LayerNorm, eps=1e-6), norm_pix_loss=True).to(device)
    # main_pretrain.py: timm's add_weight_decay groups, plain torch AdamW
    return model, torch.optim.AdamW(param_groups(model, 0.05), lr=1e-4, betas=(0.9, 0.95))


def stepper(model, opt, x, device, bf16: bool, mask_ratio: float, reference: bool):
    def step() -> tuple[float, float, float]:
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _, _ = model(x, mask_ratio=mask_ratio) if reference else model(x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        sync(device)
        t1 = time.perf_counter()
        if reference:  # main_pretrain.py's way
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        else:  # the training engine's
            clip_and_step(model, opt, 1.0)
        sync(device)
        return t1 - t0, time.perf_counter() - t1, loss.item()
    return step


def use_bf16(args, device) -> bool:
    """bf16 autocast: by default on a GPU (--fp32 turns it off), on a CPU only with --bf16."""
    return (not args.fp32) if device.type == "cuda" else args.bf16


def bench_model(args, device) -> dict:
    model, opt = humanset_model(args, device)
    bf16 = use_bf16(args, device)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    step = stepper(model, opt, x, device, bf16, args.mask_ratio, False)
    for _ in range(args.warmup):
        step()
    times = [step() for _ in range(args.steps)]
    seconds = sum(a + b for a, b, _ in times) / args.steps
    ips = args.batch_size / seconds
    train_flops = mae_train_flops(args.model, args.image_size, args.mask_ratio, args.grad_checkpointing,
                                  batch_size=args.batch_size)
    out = {
        "model": args.model, "image_size": args.image_size, "batch_size": args.batch_size,
        "mask_ratio": args.mask_ratio, "params": count_params(model), "device": device_name(device),
        "precision": "bf16-autocast" if bf16 else "fp32", "grad_checkpointing": args.grad_checkpointing,
        "compile": args.compile, "attention": sdpa_backends(device),
        "torch_threads": torch.get_num_threads() if device.type == "cpu" else None,
        "steps_timed": args.steps, "step_time_s": round(seconds, 4), "images_per_s": round(ips, 3),
        "train_flops_per_image": train_flops, "forward_flops_per_image": mae_forward_flops(
            args.model, args.image_size, args.mask_ratio, batch_size=args.batch_size),
        "encoder_linear_macs_full_image": encoder_linear_macs(args.model, args.image_size),
        "achieved_tflops": round(train_flops * ips / 1e12, 4), "final_loss": times[-1][2],
    }
    peak = peak_flops(device)
    if device.type == "cuda":
        out["peak_bf16_tflops"] = peak / 1e12 if peak else None
        out["mfu"] = round(train_flops * ips / peak, 4) if peak else None
        out["max_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return out


def bench_against_reference(args, device) -> dict:
    """Interleaved rounds of humanset vs the reference on one batch; medians of round medians."""
    ref_module = load_reference(args.ref)
    bf16 = use_bf16(args, device)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    ours, ours_opt = humanset_model(args, device)
    ref, ref_opt = reference_model(args, device, ref_module)
    steps = {"humanset": stepper(ours, ours_opt, x, device, bf16, args.mask_ratio, False),
             "reference": stepper(ref, ref_opt, x, device, bf16, args.mask_ratio, True)}
    for name in steps:
        for _ in range(args.warmup):
            steps[name]()
    rounds: dict = {name: [] for name in steps}
    for r in range(args.rounds):
        order = list(steps) if r % 2 == 0 else list(steps)[::-1]
        for name in order:
            times = [steps[name]() for _ in range(args.steps)]
            rounds[name].append((statistics.median(a + b for a, b, _ in times),
                                 statistics.median(a for a, _, _ in times), statistics.median(b for _, b, _ in times)))
    result = {"rounds": args.rounds, "steps_per_round": args.steps}
    for name, rows in rounds.items():
        result[name] = {"params": count_params(ours if name == "humanset" else ref),
                        "step_s": round(statistics.median(r[0] for r in rows), 4),
                        "forward_backward_s": round(statistics.median(r[1] for r in rows), 4),
                        "clip_optimizer_s": round(statistics.median(r[2] for r in rows), 4),
                        "round_step_s": [round(r[0], 4) for r in rows]}
    result["speedup"] = round(result["reference"]["step_s"] / result["humanset"]["step_s"], 3)
    result["speedup_forward_backward"] = round(
        result["reference"]["forward_backward_s"] / result["humanset"]["forward_backward_s"], 3)
    return result


def sdpa_backends(device) -> dict | None:
    if device.type != "cuda":
        return None
    b = torch.backends.cuda
    return {"flash": b.flash_sdp_enabled(), "mem_efficient": b.mem_efficient_sdp_enabled(),
            "math": b.math_sdp_enabled()}


def bench_data(args) -> dict:
    from training.data import ShardStream

    stream = ShardStream(args.data, args.image_size, args.batch_size)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=args.loader_workers)
    n, t0 = 0, None
    for i, batch in enumerate(loader):
        if i == 1:  # skip worker start-up
            t0 = time.perf_counter()
        elif i > 1:
            n += batch["images"].shape[0]
        if i == args.steps + 1:
            break
    return {"loader_images_per_s": round(n / (time.perf_counter() - t0), 2), "loader_workers": args.loader_workers}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--mask-ratio", type=float, default=0.75)
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    p.add_argument("--fp32", action="store_true", help="no bf16 autocast on GPU")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast on CPU too (both models with --ref)")
    p.add_argument("--grad-checkpointing", action="store_true")
    p.add_argument("--compile", action="store_true", help="torch.compile each transformer block")
    p.add_argument("--ref", metavar="PATH/models_mae.py",
                   help="also time facebookresearch/mae's model from this local copy, in interleaved rounds")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds with --ref (default 5)")
    p.add_argument("--data", help="also time the shard stream on this shards folder")
    p.add_argument("--loader-workers", type=int, default=2)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    result = bench_model(args, device)
    if args.ref:
        result["versus_reference"] = bench_against_reference(args, device)
    if args.data:
        result.update(bench_data(args))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
