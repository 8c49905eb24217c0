"""Benchmark MAE pretraining steps: images/s, FLOPs per image and (on a GPU) MFU. Prints JSON.

    python bench/pretrain.py --model sapiens-0.3b --image-size 1024 --batch-size 32        # on a GPU
    python bench/pretrain.py --model tiny --image-size 64 --batch-size 16 --steps 10        # on a CPU

Synthetic inputs measure the model step alone (forward, backward, AdamW); add --data RUN/shards to
measure the shard stream's decode + augment throughput as well.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from training.flops import encoder_linear_macs, mae_forward_flops, mae_train_flops
from training.lr import param_groups
from training.mae import MaskedAutoencoder, count_params

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


def bench_model(args, device) -> dict:
    torch.manual_seed(0)
    model = MaskedAutoencoder.from_preset(args.model, args.image_size, args.mask_ratio,
                                          grad_checkpointing=args.grad_checkpointing).init_weights().to(device)
    opt = torch.optim.AdamW(param_groups(model, 0.05), lr=1e-4, betas=(0.9, 0.95),
                            fused=device.type == "cuda")
    bf16 = device.type == "cuda" and not args.fp32
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _, _ = model(x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    sync(device)
    seconds = (time.perf_counter() - t0) / args.steps
    ips = args.batch_size / seconds
    train_flops = mae_train_flops(args.model, args.image_size, args.mask_ratio, args.grad_checkpointing)
    out = {
        "model": args.model, "image_size": args.image_size, "batch_size": args.batch_size,
        "mask_ratio": args.mask_ratio, "params": count_params(model), "device": device_name(device),
        "precision": "bf16-autocast" if bf16 else "fp32", "grad_checkpointing": args.grad_checkpointing,
        "torch_threads": torch.get_num_threads() if device.type == "cpu" else None,
        "steps_timed": args.steps, "step_time_s": round(seconds, 4), "images_per_s": round(ips, 3),
        "train_flops_per_image": train_flops, "forward_flops_per_image": mae_forward_flops(
            args.model, args.image_size, args.mask_ratio),
        "encoder_linear_macs_full_image": encoder_linear_macs(args.model, args.image_size),
        "achieved_tflops": round(train_flops * ips / 1e12, 4), "final_loss": loss.item(),
    }
    peak = peak_flops(device)
    if device.type == "cuda":
        out["peak_bf16_tflops"] = peak / 1e12 if peak else None
        out["mfu"] = round(train_flops * ips / peak, 4) if peak else None
        out["max_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return out


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
    p.add_argument("--grad-checkpointing", action="store_true")
    p.add_argument("--data", help="also time the shard stream on this shards folder")
    p.add_argument("--loader-workers", type=int, default=2)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = bench_model(args, torch.device(args.device))
    if args.data:
        result.update(bench_data(args))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
