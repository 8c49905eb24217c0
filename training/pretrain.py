"""MAE pretraining: the masked autoencoder, the shard stream and the loss, run by the training engine.

`pretrain(cfg)` runs in this process; `pretrain_ray(cfg)` runs `train_loop` on `cfg.workers` Ray Train
workers (DDP or FSDP2). Everything around the model (resume, AMP, clipping, NaN stop, checkpoints, the run
log) is `trainer.train`'s.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from catalog.config import setting

from training import checkpoint as ckpt
from training import run_config, run_folder, trainer
from training.data import (ShardStream, count_samples, loader_workers, normalize, ray_dataset,
                           shards_folder)
from training.trainer import Context
from training.run_config import RunConfig
from training.lr import adamw, param_groups, scaled_lr, warmup_cosine
from training.mae import MaskedAutoencoder, compile_blocks, count_params
from training.vit import preset

log = logging.getLogger(__name__)


@dataclass
class PretrainConfig(RunConfig):
    """Every knob of a pretraining run (the engine's in RunConfig); defaults follow the Sapiens paper."""
    data: str = setting("", "folder of curated shards (RUN/shards)")
    model: str = setting("sapiens-0.3b")
    image_size: int = setting(1024, low=16)
    batch_size: int = setting(32, "per worker; the lr scales with batch_size * workers", low=1)
    warmup_steps: int | None = setting(None, "null: 5 % of steps", kinds=("int",), nullable=True, low=0)
    base_lr: float = setting(1.5e-4, "lr = base_lr * global batch / 256", low=0)
    min_lr_ratio: float = setting(0.0, "cosine floor, as a fraction of the peak lr", low=0, high=1)
    weight_decay: float = setting(0.05, low=0)
    betas: tuple = setting((0.9, 0.95), kinds=("list",), items="number")
    mask_ratio: float = setting(0.75, low=0, high=0.99)
    norm_pix_loss: bool = setting(True)
    crop_scale: tuple = setting((0.2, 1.0), kinds=("list",), items="number")
    loader_workers: int = setting(4)  # doc and check: RunConfig's
    grad_checkpointing: bool = setting(False)
    compile: bool = setting(False, "torch.compile each transformer block (fuses norms, GELU, residuals)")

    def __post_init__(self):
        super().__post_init__()
        self.betas, self.crop_scale = tuple(self.betas), tuple(self.crop_scale)
        preset(self.model)  # fail early on a typo

    @property
    def warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else max(1, self.steps // 20)


def config_from(values: dict) -> PretrainConfig:
    return run_config.config_from(PretrainConfig, values, "pretraining")


def build_model(cfg: PretrainConfig) -> MaskedAutoencoder:
    return MaskedAutoencoder.from_preset(cfg.model, cfg.image_size, cfg.mask_ratio, cfg.norm_pix_loss,
                                         cfg.grad_checkpointing).init_weights()


# --- data ---------------------------------------------------------------------------------------
def torch_batches(cfg: PretrainConfig, ctx: Context, positions: dict, start_batch: int) -> Iterator[dict]:
    stream = ShardStream(cfg.data, cfg.image_size, cfg.batch_size, cfg.seed, ctx.rank, ctx.world,
                         positions=positions, start_batch=start_batch, crop_scale=cfg.crop_scale)
    workers = loader_workers(stream, cfg.loader_workers, cfg.batch_size, ctx.world, say=ctx.main)
    loader = torch.utils.data.DataLoader(
        stream, batch_size=None, num_workers=workers, pin_memory=ctx.device.type == "cuda",
        persistent_workers=False, prefetch_factor=2 if workers else None)
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


# --- the recipe the engine runs -------------------------------------------------------------------
class MAERecipe(trainer.Recipe):
    name = "pretrain"

    def __init__(self, cfg: PretrainConfig):
        super().__init__(cfg)
        self.positions: dict = {}  # data stream positions per loader consumer (DataLoader worker)
        self.n_params = 0

    def build_model(self, ctx: Context, resuming: bool) -> MaskedAutoencoder:
        self.generator = torch.Generator(ctx.device).manual_seed(self.cfg.seed * 1_000_003 + ctx.rank)
        model = build_model(self.cfg)
        self.n_params = count_params(model)
        if self.cfg.compile:
            compile_blocks(model)
        return model

    def shard_units(self, model):
        return list(model.encoder.blocks) + list(model.decoder_blocks)

    def optimizer(self, model, ctx: Context):
        cfg = self.cfg
        peak = scaled_lr(cfg.base_lr, cfg.batch_size * cfg.accum_steps * ctx.world)
        # fused AdamW; under FSDP the sharded (DTensor) parameters take the foreach kernels
        opt = adamw(param_groups(model, cfg.weight_decay), peak, cfg.betas, fused=not trainer.sharded(cfg, ctx))
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: warmup_cosine(step, cfg.steps, cfg.warmup, cfg.min_lr_ratio))
        return opt, sched

    def restore(self, ranks: list[dict], ctx: Context):
        self.positions = {k: v for r in ranks for k, v in r.get("positions", {}).items()}

    def batches(self, ctx: Context, start_micro: int) -> Iterator[dict]:
        self.kind = trainer.loader_kind(self.cfg, ctx)
        source = torch_batches(self.cfg, ctx, self.positions, start_micro) if self.kind == "torch" else \
            ray_batches(self.cfg, self.positions.get(-1, {}))
        return self._tracked(source)

    def _tracked(self, source: Iterator[dict]) -> Iterator[dict]:
        for batch in source:
            self.positions[batch["consumer"]] = batch["position"]
            yield batch

    def loss(self, model, batch: dict, ctx: Context, autocast) -> torch.Tensor:
        images = normalize(batch["images"], ctx.device)
        with autocast:
            loss, _, _ = model(images, generator=self.generator)
        return loss

    def describe(self, model, ctx: Context, start: int) -> str:
        cfg = self.cfg
        batch = cfg.batch_size * cfg.accum_steps * ctx.world
        return (f"pretraining {cfg.model} ({self.n_params / 1e6:.1f}M params) at {cfg.image_size} px on "
                f"{ctx.world} x {ctx.device.type}, global batch {batch}, peak lr "
                f"{scaled_lr(cfg.base_lr, batch):.3g}, {cfg.steps} steps from {start}, {self.kind} loader")

    def rank_state(self) -> dict:
        return {"positions": dict(self.positions)}

    def counters(self) -> dict:
        return {"skipped_reads": sum(p.get("bad", 0) for p in self.positions.values())}

    def log_fields(self) -> dict:
        return {"epoch": max((p.get("epoch", 0) for p in self.positions.values()), default=0)}

    def checkpoint_extras(self, model) -> dict:
        return {"timm_kwargs": model.encoder.timm_kwargs()}

    def summary(self, ctx: Context, final_loss: float) -> dict:
        out = Path(self.cfg.output)
        summary = {"steps": self.cfg.steps, "final_loss": final_loss, "output": str(out)}
        if ctx.main:
            summary["encoder"] = str(ckpt.export_encoder(ckpt.latest_checkpoint(out), out / "encoder.pth"))
        return summary


def train_loop(config: dict) -> dict:
    """The body of every process (this one, or each Ray Train worker). Returns a summary."""
    return trainer.train(MAERecipe(config_from(config)))


# --- entry points -------------------------------------------------------------------------------
def check_inputs(cfg: PretrainConfig) -> PretrainConfig:
    """cfg with its paths resolved and --data as the shards folder (a curation run names its shards/);
    refused, naming the fix, when there are no shards or too few samples for the loader."""
    if not cfg.output:
        raise ValueError("--output is required: the run folder for checkpoints and logs")
    cfg = run_folder.resolved(cfg)
    folder = shards_folder(cfg.data) if cfg.data else None
    if not folder:
        raise FileNotFoundError(f"--data {cfg.data!r}: no curated shards (NAME.tar + NAME.parquet) there or in its "
                                f"shards/ folder; pass a curation run (humanset curate --output RUN) or its shards")
    cfg = dataclasses.replace(cfg, data=folder)
    if cfg.workers and cfg.loader in ("auto", "ray"):  # Ray Data drops a partial batch: a smaller stream never yields
        rows = count_samples(cfg.data, cfg.batch_size * cfg.workers)
        if rows < cfg.batch_size * cfg.workers:
            raise ValueError(f"--data {cfg.data}: {rows} samples, fewer than one global batch ({cfg.batch_size} x "
                             f"{cfg.workers} workers) the Ray loader needs; lower --batch-size, or --set loader=torch")
    return cfg


def pretrain(cfg: PretrainConfig) -> dict:
    """Run in this process (CPU, or the first GPU), or on Ray Train when cfg.workers > 0."""
    if cfg.workers:
        return pretrain_ray(cfg)
    cfg = check_inputs(cfg)
    with run_folder.owned(cfg, "pretrain"):
        return train_loop(cfg.to_dict())


def pretrain_ray(cfg: PretrainConfig, ray_address: str | None = None) -> dict:
    """The same loop on `cfg.workers` Ray Train workers (DDP or FSDP2; NCCL on GPUs, gloo on CPUs).
    Paths are absolute (check_inputs): every worker opens them, on any node."""
    cfg = check_inputs(cfg)
    with run_folder.owned(cfg, "pretrain"):
        datasets = {"train": ray_dataset(cfg.data, cfg.image_size, cfg.crop_scale)} \
            if cfg.loader in ("auto", "ray") else None
        trainer.launch_ray(train_loop, cfg, "pretrain", datasets, ray_address)
    return {"steps": cfg.steps, "output": cfg.output, "checkpoint": str(ckpt.latest_checkpoint(cfg.output)),
            "encoder": str(Path(cfg.output) / "encoder.pth")}
