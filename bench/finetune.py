"""Benchmark fine-tuning steps of the four task models, and the data pipeline of a render run. Prints JSON.

    python bench/finetune.py --model sapiens-0.3b --image-size 1024x768 --batch-size 8      # on a GPU
    python bench/finetune.py --model tiny --image-size 128x96 --batch-size 4 --steps 5      # on a CPU
    python bench/finetune.py --render RENDER_RUN --image-size 1024x768                      # + data loading

The model step (forward, loss, backward, clip, AdamW with layer-wise lr decay) runs on synthetic inputs
with Sapiens' decoder layouts unless --head-width narrows them.
"""
from __future__ import annotations

import argparse
import json
import time

import torch


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synthetic_batch(task: str, b: int, hw, n_out: int, device) -> dict:
    h, w = hw
    batch = {"image": torch.randint(0, 255, (b, 3, h, w), dtype=torch.uint8, device=device)}
    mask = torch.zeros(b, 1, h, w, dtype=torch.bool, device=device)
    mask[:, :, h // 4: 3 * h // 4, w // 4: 3 * w // 4] = True
    batch["mask"] = mask
    if task == "pose":
        batch["heatmaps"] = torch.rand(b, n_out, h // 4, w // 4, device=device)
        batch["weights"] = torch.ones(b, n_out, device=device)
    elif task == "seg":
        batch["labels"] = torch.randint(0, n_out, (b, h, w), device=device)
    elif task == "depth":
        batch["depth"] = torch.rand(b, 1, h, w, device=device) + 1
    else:
        batch["normal"] = torch.nn.functional.normalize(torch.randn(b, 3, h, w, device=device), dim=1)
    return batch


def bench_task(task: str, args, device) -> dict:
    from training.data import normalize
    from training.tasks.finetune import FinetuneConfig, build_model, build_optimizer, task_loss
    from training.tasks.vocab import load

    cfg = FinetuneConfig(task=task, model=args.model, image_size=args.image_size, head_width=args.head_width,
                         batch_size=args.batch_size, steps=1000)
    torch.manual_seed(0)
    model = build_model(cfg).to(device)
    opt, _ = build_optimizer(model, cfg)
    weights = torch.as_tensor(load(cfg.vocab).weights, device=device) if task == "seg" else None
    n_out = {"pose": 17, "seg": 28}.get(task, 0)
    batch = synthetic_batch(task, args.batch_size, cfg.image_size, n_out, device)
    bf16 = device.type == "cuda"

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            out = model(normalize(batch["image"], device))
        loss = task_loss(task, out.float(), batch, cfg, weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(args.warmup):
        step()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync(device)
    dt = (time.perf_counter() - t0) / args.steps
    return {"task": task, "params_M": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
            "step_s": round(dt, 4), "images_per_s": round(args.batch_size / dt, 2)}


def bench_render_data(args) -> dict:
    from training.tasks.augment import Augment
    from training.tasks.data import RenderFrames

    ds = RenderFrames(args.render, args.image_size, Augment(train=True))
    n = min(len(ds), args.data_samples)
    t0 = time.perf_counter()
    for i in range(n):
        ds[(i, 0)]
    dt = time.perf_counter() - t0
    return {"render_samples": n, "samples_per_s_one_process": round(n / dt, 2)}


def main():
    from training.tasks.finetune import parse_hw

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--image-size", default="128x96", type=parse_hw)
    p.add_argument("--head-width", type=int, default=None, help="decoder width (default: Sapiens' layouts)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--tasks", default="pose,seg,depth,normal")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    p.add_argument("--render", help="render run: also time decoding + augmentation of its frames")
    p.add_argument("--data-samples", type=int, default=32)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "model": args.model, "image_size": list(args.image_size), "batch_size": args.batch_size,
              "head_width": args.head_width or "sapiens", "tasks": [bench_task(t, args, device)
                                                                     for t in args.tasks.split(",")]}
    if args.render:
        result["data"] = bench_render_data(args)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
