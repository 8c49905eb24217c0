"""The training engine that MAE pretraining and fine-tuning share.

A kind of training is a `Recipe`: it builds the model, the optimiser, the batches and the loss. The
engine does the rest, the same way for both: the run context (this process, or one rank of a Ray Train
run), DDP or FSDP2 wrapping, resume, the step loop (gradient accumulation, AMP, NaN stop, clipping),
checkpoint cadence, one run log with progress, and the Ray Train launcher.

    summary = train(MyRecipe(cfg))                 # in this process, or inside a Ray Train worker
    launch_ray(train_loop, cfg, "name", datasets)  # cfg.workers Ray Train workers running train_loop
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

import catalog
from catalog.storage import retry

from training import checkpoint as ckpt
from training.lr import clip_and_step
from training.run_config import RunConfig

log = logging.getLogger(__name__)


# --- where this process runs ---------------------------------------------------------------------
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


def use_bf16(cfg: RunConfig, ctx: Context) -> bool:
    return cfg.precision == "bf16" or (cfg.precision == "auto" and ctx.device.type == "cuda")


def loader_kind(cfg: RunConfig, ctx: Context) -> str:
    if cfg.loader == "auto":
        return "ray" if ctx.in_ray else "torch"
    if cfg.loader == "ray" and not ctx.in_ray:
        raise ValueError("loader 'ray' needs Ray Train: pass --workers N (or use --set loader=torch)")
    return cfg.loader


# --- model wrapping and full state dicts ------------------------------------------------------------
def wrap_model(model: nn.Module, units: list[nn.Module], cfg: RunConfig, ctx: Context):
    """DDP, or FSDP2 (fully_shard per unit, e.g. each block, then the root) when distributed."""
    model.to(ctx.device)
    if ctx.world == 1:
        return model
    if cfg.strategy == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if use_bf16(cfg, ctx) else MixedPrecisionPolicy()
        for unit in units:
            fully_shard(unit, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        return model
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)


def unwrap(model):
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def sharded(cfg: RunConfig, ctx: Context) -> bool:
    return ctx.world > 1 and cfg.strategy == "fsdp"


def full_states(model, opt, cfg: RunConfig, ctx: Context) -> tuple[dict, dict]:
    """Model and optimiser state dicts gathered in full (collective under FSDP: every rank calls it)."""
    if sharded(cfg, ctx):
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=opts), get_optimizer_state_dict(model, opt, options=opts)
    return unwrap(model).state_dict(), opt.state_dict()


def load_states(model, opt, state: dict, cfg: RunConfig, ctx: Context):
    if sharded(cfg, ctx):
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)
        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
        set_model_state_dict(model, state["model"], options=opts)
        set_optimizer_state_dict(model, opt, state["optimizer"], options=opts)
        return
    unwrap(model).load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])


def grad_sync(model, ctx: Context, sync: bool):
    """No gradient all-reduce on the micro-batches before the last one of a step."""
    if ctx.world == 1 or sync:
        return contextlib.nullcontext()
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model.no_sync()
    model.set_requires_gradient_sync(False)  # FSDP2; switched back on for the last micro-batch
    return contextlib.nullcontext()


def over_ranks(loss: torch.Tensor, counts: dict, ctx: Context) -> tuple[float, dict]:
    """Mean loss and summed counters over all ranks (one small all-reduce, on log steps only)."""
    if ctx.world == 1:
        return float(loss), dict(counts)
    both = torch.tensor([float(loss)] + [float(v) for v in counts.values()], device=loss.device)
    dist.all_reduce(both)
    return float(both[0]) / ctx.world, {k: int(v) for k, v in zip(counts, both[1:].tolist())}


# --- what a kind of training supplies --------------------------------------------------------------
class Recipe:
    """Model, data and loss of one kind of training. `cfg` is a RunConfig subclass."""
    name = "train"
    generator: torch.Generator | None = None  # a recipe's own RNG, saved and restored per rank

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg

    def build_model(self, ctx: Context, resuming: bool) -> nn.Module:
        raise NotImplementedError

    def shard_units(self, model) -> list[nn.Module]:
        """Modules that FSDP shards one by one before the root (the transformer blocks)."""
        return []

    def optimizer(self, model, ctx: Context):
        raise NotImplementedError

    def batches(self, ctx: Context, start_micro: int) -> Iterator[dict]:
        raise NotImplementedError

    def loss(self, model, batch: dict, ctx: Context, autocast) -> torch.Tensor:
        raise NotImplementedError

    def describe(self, model, ctx: Context, start: int) -> str:
        return f"{self.name}: {self.cfg.steps} steps from {start} on {ctx.world} x {ctx.device.type}"

    def rank_state(self) -> dict:
        return {}

    def restore(self, ranks: list[dict], ctx: Context):
        """Per-rank states of the checkpoint (RNGs are already restored when the world size matches)."""

    def counters(self) -> dict:
        """Counters summed over ranks into the log, e.g. {'skipped_reads': 3}."""
        return {}

    def log_fields(self) -> dict:
        return {}

    def checkpoint_extras(self, model) -> dict:
        return {}

    def summary(self, ctx: Context, final_loss: float) -> dict:
        return {"steps": self.cfg.steps, "final_loss": final_loss, "output": str(self.cfg.output)}


# --- the loop --------------------------------------------------------------------------------------
def train(recipe: Recipe) -> dict:
    """Train for cfg.steps optimiser steps; the body of every process. Returns the recipe's summary."""
    cfg = recipe.cfg
    retry.configure(cfg.storage)  # storage.retry_* in every process of the run (and its loader workers)
    ctx = ray_context() if cfg.workers else local_context()
    if cfg.cpu_threads:  # on a shared or small CPU, fewer threads than cores avoids spin-wait thrash
        torch.set_num_threads(cfg.cpu_threads)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    out = Path(cfg.output)
    resume_from = ckpt.resolve_resume(cfg.resume, out)
    model = recipe.build_model(ctx, resuming=resume_from is not None)
    model = wrap_model(model, recipe.shard_units(model), cfg, ctx)
    opt, sched = recipe.optimizer(unwrap(model), ctx)  # parameter names without DDP's "module."
    start = 0
    if resume_from is not None:
        state = ckpt.load_checkpoint(resume_from)
        load_states(model, opt, state, cfg, ctx)
        sched.load_state_dict(state["scheduler"])
        start = state["step"]
        ranks = state.get("ranks") or []
        if len(ranks) == ctx.world and "rng" in ranks[ctx.rank]:
            ckpt.set_rng_state(ranks[ctx.rank]["rng"], recipe.generator)
        elif ctx.main and ranks:
            log.warning("checkpoint has %d ranks, this run %d: RNGs start fresh", len(ranks), ctx.world)
        recipe.restore(ranks, ctx)
        if ctx.main:
            log.info("resumed from %s at step %d", resume_from, start)
    elif ctx.main and cfg.resume not in (None, False, ""):
        log.info("resume: no checkpoint in %s yet; starting from step 0", ckpt.checkpoint_dir(out))
    if start >= cfg.steps:
        raise ValueError(f"checkpoint is at step {start}, not before the last step {cfg.steps}; raise --steps")

    batches = recipe.batches(ctx, start * cfg.accum_steps)
    global_batch = getattr(cfg, "batch_size", 1) * cfg.accum_steps * ctx.world
    if ctx.main:
        out.mkdir(parents=True, exist_ok=True)
        catalog.write_json(out / "config.json", cfg.to_dict())
        log.info("%s", recipe.describe(unwrap(model), ctx, start))
    logger = RunLog(out / "log.jsonl", recipe.name, cfg.steps, start, global_batch, cfg.progress,
                    cfg.progress_every_s) if ctx.main else None
    autocast = torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=use_bf16(cfg, ctx))
    model.train()
    loss_value = float("nan")
    for step in range(start, cfg.steps):
        opt.zero_grad(set_to_none=True)
        step_loss = 0.0
        for micro in range(cfg.accum_steps):
            last = micro == cfg.accum_steps - 1
            with grad_sync(model, ctx, last):
                if last and sharded(cfg, ctx) and cfg.accum_steps > 1:
                    model.set_requires_gradient_sync(True)
                loss = recipe.loss(model, next(batches), ctx, autocast)
                value = loss.item()
                if not math.isfinite(value):
                    raise FloatingPointError(
                        f"step {step + 1}: loss is {value} on rank {ctx.rank}; the run stops here. Lower "
                        f"the lr, raise warmup_steps, or resume from the last checkpoint in "
                        f"{ckpt.checkpoint_dir(out)}")
                (loss / cfg.accum_steps if cfg.accum_steps > 1 else loss).backward()
            step_loss += value / cfg.accum_steps
        grad_norm = clip_and_step(model, opt, cfg.clip_grad)
        sched.step()
        loss_value = step_loss
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps or done == start + 1:
            mean_loss, counts = over_ranks(torch.tensor(step_loss, device=ctx.device), recipe.counters(), ctx)
            if logger:
                logger.write(done, mean_loss, sched.get_last_lr()[-1], float(grad_norm),
                             {**counts, **recipe.log_fields()})
        if done % cfg.checkpoint_every == 0 or done == cfg.steps:
            save(model, opt, sched, recipe, ctx, done)
    if logger:
        logger.close()
    return recipe.summary(ctx, loss_value)


def save(model, opt, sched, recipe: Recipe, ctx: Context, step: int):
    cfg = recipe.cfg
    model_state, opt_state = full_states(model, opt, cfg, ctx)
    mine = {"rng": ckpt.rng_state(recipe.generator), **recipe.rank_state()}
    if ctx.world > 1:  # small per-rank states travel to rank 0, so only one file is written
        ranks = [None] * ctx.world
        dist.all_gather_object(ranks, mine)
    else:
        ranks = [mine]
    if ctx.main:
        ckpt.save_checkpoint(cfg.output, step, {
            "model": model_state, "optimizer": opt_state, "scheduler": sched.state_dict(), "step": step,
            "config": cfg.to_dict(), "ranks": ranks, **recipe.checkpoint_extras(unwrap(model)),
        }, keep=cfg.keep_checkpoints)
    if ctx.world > 1:
        dist.barrier()


# --- the run log -----------------------------------------------------------------------------------
class RunLog:
    """Every logged step to OUT/log.jsonl; a tqdm bar on a terminal, else lines: the first step, one per
    `interval` seconds at most (0: every logged step), the last; timed by `clock` (tests pass their own)."""

    def __init__(self, path: Path, name: str, total: int, start: int, global_batch: int, progress: bool = True,
                 interval: float = 0.0, clock: Callable[[], float] = time.perf_counter):
        self.fh = open(path, "a")
        self.name, self.total, self.start, self.global_batch, self.clock = name, total, start, global_batch, clock
        self.t0 = self.t_last = clock()
        self.step_last, self.interval, self.t_printed = start, interval, None
        self.bar = None
        if progress and sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=start, desc=name, unit="step", dynamic_ncols=True)

    def write(self, step: int, loss: float, lr: float, grad_norm: float, extra: dict | None = None):
        now = self.clock()
        ips = (step - self.step_last) * self.global_batch / max(now - self.t_last, 1e-9)
        rate = (step - self.start) / max(now - self.t0, 1e-9)
        eta = (self.total - step) / rate if rate > 0 else float("nan")
        record = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "images_per_s": ips,
                  "eta_s": eta, **(extra or {}), "time": time.time()}
        self.fh.write(json.dumps(record) + "\n")
        self.fh.flush()
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", ips=f"{ips:.1f}")
        elif self.t_printed is None or step >= self.total or now - self.t_printed >= self.interval:
            # stdout: it reaches the driver from Ray workers too
            self.t_printed = now
            more = "".join(f" {k.replace('_', ' ')} {v}" for k, v in (extra or {}).items())
            print(f"{self.name} step {step}/{self.total} loss {loss:.4f} lr {lr:.3e} grad {grad_norm:.2f} "
                  f"{ips:.1f} img/s eta {fmt_eta(eta)}{more}", flush=True)
        self.t_last, self.step_last = now, step

    def close(self):
        if self.bar is not None:
            self.bar.close()
        self.fh.close()


def fmt_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


# --- Ray Train ---------------------------------------------------------------------------------------
def launch_ray(loop: Callable[[dict], dict], cfg: RunConfig, name: str, datasets: dict | None = None,
               ray_address: str | None = None):
    """Run `loop(cfg.to_dict())` on cfg.workers Ray Train workers (NCCL on GPUs, gloo on CPUs).
    Paths in cfg must be absolute (every worker, on any node, opens them)."""
    import ray
    from ray.train import RunConfig as RayRunConfig
    from ray.train import ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    if not ray.is_initialized():
        ray.init(address=ray_address, include_dashboard=False)
    use_gpu = cfg.gpus_per_worker > 0
    scaling = ScalingConfig(num_workers=cfg.workers, use_gpu=use_gpu,
                            resources_per_worker={"GPU": cfg.gpus_per_worker} if use_gpu else {"CPU": 1})
    trainer = TorchTrainer(
        loop, train_loop_config=cfg.to_dict(), scaling_config=scaling,
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"), datasets=datasets or None,
        run_config=RayRunConfig(name=name, storage_path=str(Path(cfg.output) / "ray")))
    result = trainer.fit()
    if result.error:
        raise result.error
    return result
