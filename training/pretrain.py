"""MAE pretraining loop: one process, or every worker of a Ray Train TorchTrainer (DDP or FSDP).

`pretrain(cfg)` runs in this process; `pretrain_ray(cfg)` runs `train_loop` on `cfg.workers` Ray Train
workers. The loop is the same: build the MAE, AdamW with the Sapiens rules, stream shards, step, log,
checkpoint. A non-finite loss stops the run at once with the step number.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist

import catalog

from . import checkpoint as ckpt
from .data import ShardStream, normalize, ray_dataset
from .lr import param_groups, scaled_lr, warmup_cosine
from .mae import MaskedAutoencoder, count_params
from .vit import preset

log = logging.getLogger(__name__)


@dataclass
class PretrainConfig:
    """Every knob of a pretraining run; defaults follow the Sapiens paper where it gives one."""
    data: str = ""  # folder of curated shards (RUN/shards)
    output: str = ""  # run folder: checkpoints/, log.jsonl, encoder.pth
    model: str = "sapiens-0.3b"
    image_size: int = 1024
    batch_size: int = 32  # per worker; the lr scales with batch_size * workers
    steps: int = 1000  # optimiser steps
    warmup_steps: int | None = None  # None: 5 % of steps
    base_lr: float = 1.5e-4  # lr = base_lr * global batch / 256
    min_lr_ratio: float = 0.0  # cosine floor, as a fraction of the peak lr
    weight_decay: float = 0.05
    betas: tuple = (0.9, 0.95)
    clip_grad: float = 1.0
    mask_ratio: float = 0.75
    norm_pix_loss: bool = True
    crop_scale: tuple = (0.2, 1.0)
    seed: int = 0
    loader_workers: int = 4  # DataLoader processes per training process (torch loader)
    cpu_threads: int = 0  # torch intra-op threads on CPU; 0 = torch's default (all cores)
    loader: str = "auto"  # torch | ray | auto (ray under Ray Train, torch otherwise)
    checkpoint_every: int = 1000
    keep_checkpoints: int = 3
    log_every: int = 10
    grad_checkpointing: bool = False
    precision: str = "auto"  # auto (bf16 autocast on GPU, fp32 on CPU) | bf16 | fp32
    workers: int = 0  # Ray Train workers; 0 runs in this process
    gpus_per_worker: float = 0.0
    strategy: str = "ddp"  # ddp | fsdp (shards parameters and optimiser state: for sapiens-1b / 2b)
    resume: str | None = None  # 'auto' = newest checkpoint in output, or a checkpoint path
    progress: bool = True

    def __post_init__(self):
        self.betas, self.crop_scale = tuple(self.betas), tuple(self.crop_scale)
        preset(self.model)  # fail early on a typo
        if self.strategy not in ("ddp", "fsdp"):
            raise ValueError(f"strategy {self.strategy!r}: use 'ddp' or 'fsdp'")
        if self.loader not in ("auto", "torch", "ray"):
            raise ValueError(f"loader {self.loader!r}: use 'torch', 'ray' or 'auto'")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision {self.precision!r}: use 'auto', 'bf16' or 'fp32'")

    @property
    def warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else max(1, self.steps // 20)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def config_from(values: dict) -> PretrainConfig:
    known = {f.name for f in dataclasses.fields(PretrainConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise KeyError(f"unknown pretraining settings {unknown}; known: {', '.join(sorted(known))}")
    return PretrainConfig(**values)


# --- distributed context -----------------------------------------------------------------------
@dataclass
class Context:
    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    in_ray: bool = False

    @property
    def main(self) -> bool:
        return self.rank == 0


def ray_context() -> Context:
    import ray.train
    import ray.train.torch

    tc = ray.train.get_context()
    return Context(tc.get_world_rank(), tc.get_world_size(), ray.train.torch.get_device(), True)


def local_context() -> Context:
    return Context(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))


# --- model and optimiser -------------------------------------------------------------------------
def build_model(cfg: PretrainConfig) -> MaskedAutoencoder:
    return MaskedAutoencoder.from_preset(cfg.model, cfg.image_size, cfg.mask_ratio, cfg.norm_pix_loss,
                                         cfg.grad_checkpointing).init_weights()


def wrap_model(model: MaskedAutoencoder, cfg: PretrainConfig, ctx: Context):
    """DDP or FSDP2 (fully_shard per block, then the root) when distributed; the model itself otherwise."""
    model.to(ctx.device)
    if ctx.world == 1:
        return model
    if cfg.strategy == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if use_bf16(cfg, ctx) else MixedPrecisionPolicy()
        for block in list(model.encoder.blocks) + list(model.decoder_blocks):
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        return model
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)


def unwrap(model):
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def use_bf16(cfg: PretrainConfig, ctx: Context) -> bool:
    return cfg.precision == "bf16" or (cfg.precision == "auto" and ctx.device.type == "cuda")


def build_optimizer(model, cfg: PretrainConfig, ctx: Context):
    peak = scaled_lr(cfg.base_lr, cfg.batch_size * ctx.world)
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=peak, betas=cfg.betas)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: warmup_cosine(step, cfg.steps, cfg.warmup, cfg.min_lr_ratio))
    return opt, sched


def full_states(model, opt, cfg: PretrainConfig, ctx: Context) -> tuple[dict, dict]:
    """Model and optimiser state dicts gathered in full (collective under FSDP: every rank calls it)."""
    if ctx.world > 1 and cfg.strategy == "fsdp":
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=opts), get_optimizer_state_dict(model, opt, options=opts)
    return unwrap(model).state_dict(), opt.state_dict()


def load_states(model, opt, state: dict, cfg: PretrainConfig, ctx: Context):
    if ctx.world > 1 and cfg.strategy == "fsdp":
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)
        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
        set_model_state_dict(model, state["model"], options=opts)
        set_optimizer_state_dict(model, opt, state["optimizer"], options=opts)
        return
    unwrap(model).load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])


# --- data ---------------------------------------------------------------------------------------
def torch_batches(cfg: PretrainConfig, ctx: Context, positions: dict, start_step: int) -> Iterator[dict]:
    stream = ShardStream(cfg.data, cfg.image_size, cfg.batch_size, cfg.seed, ctx.rank, ctx.world,
                         positions=positions, start_batch=start_step, crop_scale=cfg.crop_scale)
    loader = torch.utils.data.DataLoader(
        stream, batch_size=None, num_workers=cfg.loader_workers, pin_memory=ctx.device.type == "cuda",
        persistent_workers=False, prefetch_factor=2 if cfg.loader_workers else None)
    yield from loader


def ray_batches(cfg: PretrainConfig, position: dict) -> Iterator[dict]:
    """Ray Data passes, endlessly. Ray Data streams in a new order each pass, so a resumed run restarts
    the saved pass; only the torch loader replays the exact sample sequence."""
    import ray.train

    shard = ray.train.get_dataset_shard("train")
    epoch, samples, bad = position.get("epoch", 0), position.get("samples", 0), position.get("bad", 0)
    while True:
        for batch in shard.iter_torch_batches(batch_size=cfg.batch_size, drop_last=True,
                                              dtypes={"image": torch.uint8, "ok": torch.bool}):
            ok = batch["ok"]
            bad += int((~ok).sum())
            samples += int(ok.sum())
            if ok.any():
                yield {"images": batch["image"][ok], "consumer": -1,
                       "position": {"epoch": epoch, "samples": samples, "bad": bad}}
        epoch += 1


def loader_kind(cfg: PretrainConfig, ctx: Context) -> str:
    if cfg.loader == "auto":
        return "ray" if ctx.in_ray else "torch"
    if cfg.loader == "ray" and not ctx.in_ray:
        raise ValueError("loader 'ray' needs Ray Train: pass --workers N (or use --set loader=torch)")
    return cfg.loader


# --- the loop -----------------------------------------------------------------------------------
def train_loop(config: dict) -> dict:
    """Train for cfg.steps optimiser steps; the body of every process. Returns a summary on rank 0."""
    cfg = config_from(config)
    ctx = ray_context() if cfg.workers else local_context()
    if cfg.cpu_threads:  # on a shared or small CPU, fewer threads than cores avoids spin-wait thrash
        torch.set_num_threads(cfg.cpu_threads)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    model = build_model(cfg)
    n_params = count_params(model)
    model = wrap_model(model, cfg, ctx)
    opt, sched = build_optimizer(model, cfg, ctx)
    mask_gen = torch.Generator(ctx.device).manual_seed(cfg.seed * 1_000_003 + ctx.rank)

    out = Path(cfg.output)
    start, positions = 0, {}
    resume_from = ckpt.resolve_resume(cfg.resume, out)
    if resume_from is not None:
        state = ckpt.load_checkpoint(resume_from)
        load_states(model, opt, state, cfg, ctx)
        sched.load_state_dict(state["scheduler"])
        start = state["step"]
        ranks = state["ranks"]
        if len(ranks) == ctx.world:
            ckpt.set_rng_state(ranks[ctx.rank]["rng"], mask_gen)
        elif ctx.main:
            log.warning("checkpoint has %d ranks, this run %d: masking RNG starts fresh", len(ranks), ctx.world)
        positions = {k: v for r in ranks for k, v in r["positions"].items()}
        if ctx.main:
            log.info("resumed from %s at step %d", resume_from, start)
    elif ctx.main and cfg.resume not in (None, False, ""):
        log.info("resume: no checkpoint in %s yet; starting from step 0", ckpt.checkpoint_dir(out))
    if start >= cfg.steps:
        raise ValueError(f"checkpoint is at step {start}, not before the last step {cfg.steps}; raise --steps")

    kind = loader_kind(cfg, ctx)
    batches = torch_batches(cfg, ctx, positions, start) if kind == "torch" else \
        ray_batches(cfg, positions.get(-1, {}))
    global_batch = cfg.batch_size * ctx.world
    if ctx.main:
        out.mkdir(parents=True, exist_ok=True)
        catalog.write_json(out / "config.json", cfg.to_dict())
        log.info("pretraining %s (%.1fM params) at %d px on %d x %s, global batch %d, peak lr %.3g, "
                 "%d steps from %d, %s loader", cfg.model, n_params / 1e6, cfg.image_size, ctx.world,
                 ctx.device.type, global_batch, scaled_lr(cfg.base_lr, global_batch), cfg.steps, start, kind)
    logger = RunLog(out / "log.jsonl", cfg, start) if ctx.main else None
    autocast = torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=use_bf16(cfg, ctx))

    model.train()
    loss_value = float("nan")
    for step in range(start, cfg.steps):
        batch = next(batches)
        positions[batch["consumer"]] = batch["position"]
        images = normalize(batch["images"], ctx.device)
        with autocast:
            loss, _, _ = model(images, generator=mask_gen)
        loss_value = loss.item()
        if not math.isfinite(loss_value):
            raise FloatingPointError(
                f"step {step + 1}: loss is {loss_value} on rank {ctx.rank}; the run stops here. Lower "
                f"base_lr, raise warmup_steps, or resume from the last checkpoint in {ckpt.checkpoint_dir(out)}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
        opt.step()
        sched.step()
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps or done == start + 1:
            bad_here = sum(p.get("bad", 0) for p in positions.values())
            mean_loss, bad = over_ranks(loss.detach(), bad_here, ctx)
            if logger:
                logger.write(done, mean_loss, sched.get_last_lr()[0], float(grad_norm), global_batch, bad,
                             max(p.get("epoch", 0) for p in positions.values()))
        if done % cfg.checkpoint_every == 0 or done == cfg.steps:
            save(model, opt, sched, cfg, ctx, done, positions, mask_gen)
    if logger:
        logger.close()
    summary = {"steps": cfg.steps, "final_loss": loss_value, "output": str(out)}
    if ctx.main:
        summary["encoder"] = str(ckpt.export_encoder(ckpt.latest_checkpoint(out), out / "encoder.pth"))
    return summary


def over_ranks(loss: torch.Tensor, bad: int, ctx: Context) -> tuple[float, int]:
    """Mean loss and total skipped samples over all ranks (one small all-reduce, on log steps only)."""
    if ctx.world == 1:
        return float(loss), bad
    both = torch.stack([loss.float(), torch.tensor(float(bad), device=loss.device)])
    dist.all_reduce(both)
    return float(both[0]) / ctx.world, int(both[1])


def save(model, opt, sched, cfg: PretrainConfig, ctx: Context, step: int, positions: dict, mask_gen):
    model_state, opt_state = full_states(model, opt, cfg, ctx)
    mine = {"rng": ckpt.rng_state(mask_gen), "positions": dict(positions)}
    if ctx.world > 1:  # small per-rank states travel to rank 0, so only one file is written
        ranks = [None] * ctx.world
        dist.all_gather_object(ranks, mine)
    else:
        ranks = [mine]
    if ctx.main:
        enc = unwrap(model).encoder
        ckpt.save_checkpoint(cfg.output, step, {
            "model": model_state, "optimizer": opt_state, "scheduler": sched.state_dict(), "step": step,
            "config": cfg.to_dict(), "ranks": ranks, "timm_kwargs": enc.timm_kwargs(),
        }, keep=cfg.keep_checkpoints)
    if ctx.world > 1:
        dist.barrier()


class RunLog:
    """Loss, lr, images/s and ETA to the log, a JSONL file and a tqdm bar (rank 0 only)."""

    def __init__(self, path: Path, cfg: PretrainConfig, start: int):
        from tqdm import tqdm

        self.write_line = tqdm.write
        self.fh = open(path, "a")
        self.cfg, self.start = cfg, start
        self.t0 = self.t_last = time.perf_counter()
        self.step_last = start
        self.bar = tqdm(total=cfg.steps, initial=start, desc="pretrain", unit="step",
                        disable=not cfg.progress, dynamic_ncols=True)

    def write(self, step: int, loss: float, lr: float, grad_norm: float, global_batch: int, bad: int, epoch: int):
        now = time.perf_counter()
        ips = (step - self.step_last) * global_batch / max(now - self.t_last, 1e-9)
        rate = (step - self.start) / max(now - self.t0, 1e-9)
        eta = (self.cfg.steps - step) / rate if rate > 0 else float("nan")
        record = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "images_per_s": ips,
                  "eta_s": eta, "skipped_reads": bad, "epoch": epoch, "time": time.time()}
        self.fh.write(json.dumps(record) + "\n")
        self.fh.flush()
        self.bar.update(step - self.bar.n)
        self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", ips=f"{ips:.1f}")
        # stdout, above the bar (tqdm.write keeps the bar intact); the bar itself goes to stderr
        self.write_line(f"step {step}/{self.cfg.steps} loss {loss:.4f} lr {lr:.3e} grad {grad_norm:.2f} "
                        f"{ips:.1f} img/s eta {_fmt_eta(eta)} skipped {bad}", file=sys.stdout)
        self.t_last, self.step_last = now, step

    def close(self):
        self.bar.close()
        self.fh.close()


def _fmt_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


# --- entry points -------------------------------------------------------------------------------
def check_inputs(cfg: PretrainConfig):
    if not cfg.data or not catalog.list_shards(cfg.data):
        raise FileNotFoundError(f"--data {cfg.data!r}: no curated shards (NAME.tar + NAME.parquet) there; "
                                f"pass a curation run's shards folder, e.g. RUN/shards")
    if not cfg.output:
        raise ValueError("--output is required: the run folder for checkpoints and logs")


def pretrain(cfg: PretrainConfig) -> dict:
    """Run in this process (CPU, or the first GPU)."""
    check_inputs(cfg)
    if cfg.workers:
        return pretrain_ray(cfg)
    return train_loop(cfg.to_dict())


def pretrain_ray(cfg: PretrainConfig, ray_address: str | None = None) -> dict:
    """The same loop on `cfg.workers` Ray Train workers (DDP over NCCL on GPUs, gloo on CPUs)."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    check_inputs(cfg)
    cfg = dataclasses.replace(cfg, data=str(Path(cfg.data).resolve()), output=str(Path(cfg.output).resolve()))
    if not ray.is_initialized():
        ray.init(address=ray_address, include_dashboard=False)
    use_gpu = cfg.gpus_per_worker > 0
    scaling = ScalingConfig(num_workers=cfg.workers, use_gpu=use_gpu,
                            resources_per_worker={"GPU": cfg.gpus_per_worker} if use_gpu else {"CPU": 1})
    datasets = {}
    if cfg.loader in ("auto", "ray"):
        datasets["train"] = ray_dataset(cfg.data, cfg.image_size, cfg.crop_scale)
    trainer = TorchTrainer(
        train_loop, train_loop_config=cfg.to_dict(), scaling_config=scaling,
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"), datasets=datasets or None,
        run_config=RunConfig(name="pretrain", storage_path=str(Path(cfg.output) / "ray")),
    )
    result = trainer.fit()
    if result.error:
        raise result.error
    latest = ckpt.latest_checkpoint(cfg.output)
    return {"steps": cfg.steps, "output": cfg.output, "checkpoint": str(latest),
            "encoder": str(Path(cfg.output) / "encoder.pth")}


def demo_config(data, output, steps: int = 40) -> PretrainConfig:
    """A short CPU run for `make demo`: tiny preset at 64 px, under 2 minutes on 2 cores.

    The lr is far above the Sapiens rule (a few dozen steps must show the loss falling); everything
    else is the real recipe.
    """
    return PretrainConfig(data=str(data), output=str(output), model="tiny", image_size=64, batch_size=16,
                          steps=steps, warmup_steps=max(1, steps // 10), base_lr=0.02, loader_workers=1,
                          cpu_threads=1, checkpoint_every=max(1, steps // 2), log_every=5)


def demo(data, output, steps: int = 40) -> dict:
    """Pretrain briefly on a shards folder, then draw the reconstruction figure of the first image."""
    import pyarrow.parquet as pq

    from .decode import read_image_member
    from .vis import pretrain_vis

    cfg = demo_config(data, output, steps)
    summary = pretrain(cfg)
    first = catalog.list_shards(data)[0]
    row = pq.read_table(first.with_suffix(".parquet"), columns=["members"]).column("members")[0].as_py()
    image = Path(output) / "vis-input.img"
    with open(first, "rb") as fh:
        image.write_bytes(read_image_member(fh, row))
    summary["vis"] = str(pretrain_vis(ckpt.latest_checkpoint(output), image, Path(output) / "vis.png"))
    return summary
