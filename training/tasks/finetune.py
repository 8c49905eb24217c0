"""Fine-tuning a pretrained ViT with a light Sapiens decoder: pose, part segmentation, depth, normals.

    cfg = FinetuneConfig(task="depth", data="RENDER_RUN", output="runs/depth", encoder="PT/encoder.pth")
    finetune(cfg)            # this process (CPU or the first GPU); cfg.workers > 0 runs on Ray Train

This module supplies the model (encoder + head), the data and the loss; `trainer.train` runs them (resume,
AMP, clipping, NaN stop, checkpoints, DDP or FSDP2 with `strategy="fsdp"`, the run log). The encoder
comes from a humanset MAE checkpoint, an exported encoder.pth, or any timm-format ViT state dict
(`weights.load_encoder`); its position table is resized bicubically from the pretraining grid to the
fine-tuning grid (1024 x 768 -> 64 x 48 patches by default). AdamW (lr 5e-4, betas 0.9 / 0.999, weight
decay 0.1 except norms, biases and position embeddings), layer-wise lr decay 0.85 (block i of L gets
0.85^(L - i), the decoder the full lr), linear warmup then linear decay (pose: step decay), gradient clip 1.0.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch import nn

from catalog import run_kind
from catalog.config import setting

from training import checkpoint as ckpt
from training.tasks import losses
from training import run_config, run_folder, trainer
from training.data import capped_workers, normalize
from training.trainer import Context
from training.run_config import RunConfig
from training.tasks.heads import TASKS, build_head, tokens_to_map
from training.lr import adamw, layer_decay_groups, warmup_linear, warmup_step
from training.tasks.sampler import StepSampler, collate
from training.vit import VisionTransformer, preset
from training.tasks.vocab import load as load_vocab
from training.weights import encoder_preset, load_encoder

log = logging.getLogger(__name__)

DEFAULT_VOCAB = {"pose": "coco17", "seg": "sapiens28"}
DEFAULT_MODEL = "sapiens-0.3b"  # without --model and without an encoder that says its own


# --- the task model -------------------------------------------------------------------------------
def out_channels(task: str, vocab) -> int:
    return {"pose": len(vocab) if vocab else 0, "seg": len(vocab) if vocab else 0, "depth": 1, "normal": 3}[task]


class TaskModel(nn.Module):
    def __init__(self, encoder: VisionTransformer, head: nn.Module, task: str):
        super().__init__()
        self.encoder, self.head, self.task = encoder, head, task

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = tokens_to_map(self.encoder(images), self.encoder.grid_hw)
        return self.head(features, images) if self.head.skip is not None else self.head(features)


def build_model(cfg: "FinetuneConfig") -> TaskModel:
    vocab = load_vocab(cfg.vocab) if cfg.task in ("pose", "seg") else None
    encoder = VisionTransformer.from_preset(cfg.model or DEFAULT_MODEL, tuple(cfg.image_size), learn_pos_embed=True,
                                            grad_checkpointing=cfg.grad_checkpointing).init_weights()
    head = build_head(cfg.task, encoder.width, out_channels(cfg.task, vocab), cfg.head_width, cfg.head_deconvs,
                      cfg.head_convs, cfg.head_image_skip)
    return TaskModel(encoder, head, cfg.task)


# --- configuration --------------------------------------------------------------------------------
@dataclass
class FinetuneConfig(RunConfig):
    task: str = setting("depth", "pose | seg | depth | normal", choices=("pose", "seg", "depth", "normal"))
    data: str = setting("", "depth / normal: render run or its shards folder; pose / seg: COCO JSON or a render run")
    images: str = setting("", "pose / seg: folder of the JSON's file_names (default: the JSON's folder)")
    encoder: str = setting("", "pretrained weights; empty = random initialisation (smoke tests only)")
    model: str = setting("", "encoder preset; empty = the --encoder's own (its encoder.json or checkpoint), else "
                             "sapiens-0.3b")
    image_size: tuple = setting((1024, 768), "H, W", kinds=("int", "list", "str"))  # 1024, [1024, 768], "1024x768"
    vocab: str = setting("", "pose: coco17 | coco_wholebody133 | sapiens308 | a JSON; seg: sapiens28 | lip20")
    head_width: int | None = setting(None, "null = Sapiens' layout (768, depth 384)", kinds=("int",), nullable=True,
                                     low=1)
    head_deconvs: int | None = setting(None, kinds=("int",), nullable=True, low=0)
    head_convs: int | None = setting(None, kinds=("int",), nullable=True, low=0)
    head_image_skip: bool = setting(False, "the image, 3x3-convolved, joins the upsampled tokens (small frames; heads.py)")
    batch_size: int = setting(8, "per worker", low=1)
    warmup_steps: int | None = setting(None, "null: 5 % of steps", kinds=("int",), nullable=True, low=0)
    lr: float = setting(5e-4, low=0)
    layer_decay: float = setting(0.85, low=0, high=1)
    weight_decay: float = setting(0.1, low=0)
    betas: tuple = setting((0.9, 0.999), kinds=("list",), items="number")
    schedule: str = setting("auto", "auto (pose: step, others: linear) | linear | step",
                            choices=("auto", "linear", "step"))
    heatmap_sigma: float = setting(2.0, low=0)
    ohkm_topk: int | None = setting(None, "pose: online hard keypoint mining (Sapiens: 128 for 308 keypoints)",
                                    kinds=("int",), nullable=True, low=1)
    background_weight: float | None = setting(None, "seg: cross-entropy weight of class 0 (null: the vocabulary's)")
    backgrounds: str = setting("", "curation run whose person-free photos become random backgrounds")
    background_prob: float = setting(0.5, low=0, high=1)
    augment: bool = setting(True)
    loader: str = setting("torch", "torch (exact resume) | ray (Ray Data streams the samples; needs --workers)")
    grad_checkpointing: bool = setting(False)

    def __post_init__(self):
        super().__post_init__()
        if self.task not in TASKS:
            raise ValueError(f"task {self.task!r}: choose one of {', '.join(TASKS)}")
        self.image_size = parse_hw(self.image_size)
        self.betas = tuple(self.betas)
        if not self.vocab and self.task in DEFAULT_VOCAB:
            self.vocab = DEFAULT_VOCAB[self.task]
        if self.task == "pose" and self.vocab == "sapiens308" and self.ohkm_topk is None:
            self.ohkm_topk = 128  # Sapiens mines the 128 hardest of its 308 keypoints
        if self.model:
            preset(self.model)
        if self.image_size[0] % 16 or self.image_size[1] % 16:
            raise ValueError(f"image_size {self.image_size}: height and width must be multiples of 16 (the patch)")
        if self.schedule not in ("auto", "linear", "step"):
            raise ValueError(f"schedule {self.schedule!r}: use auto, linear or step")

    @property
    def warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else max(1, self.steps // 20)


def parse_hw(value) -> tuple[int, int]:
    """'1024x768', 1024 (square), [1024, 768] -> (H, W)."""
    if isinstance(value, str):
        parts = value.lower().replace(",", "x").split("x")
        value = [int(p) for p in parts]
    if isinstance(value, int):
        value = (value, value)
    h, w = (tuple(value) * 2)[:2] if len(value) == 1 else tuple(value)
    return int(h), int(w)


def config_from(values: dict) -> FinetuneConfig:
    return run_config.config_from(FinetuneConfig, values, "fine-tuning")


# --- data, loss, optimiser ---------------------------------------------------------------------
def build_dataset(cfg: FinetuneConfig, train: bool = True):
    from training.tasks.augment import Augment, BackgroundPool
    from training.tasks.data import CocoKeypoints, CocoParts, RenderFrames, RenderParts

    aug = Augment(train=train and cfg.augment, background=cfg.background_prob)
    pool = BackgroundPool.from_run(cfg.backgrounds) if (train and cfg.backgrounds) else None
    if cfg.task in ("depth", "normal"):
        return RenderFrames(cfg.data, cfg.image_size, aug, cfg.seed, pool)
    vocab = load_vocab(cfg.vocab)
    if cfg.task == "pose" and Path(cfg.data).is_dir():  # a render run: keypoints from its frames' json
        from training.tasks.render_pose import RenderKeypoints
        return RenderKeypoints(cfg.data, vocab, cfg.image_size, aug, cfg.seed, cfg.heatmap_sigma)
    if cfg.task == "pose":
        return CocoKeypoints(cfg.data, cfg.images or None, vocab, cfg.image_size, aug, cfg.seed, cfg.heatmap_sigma)
    if Path(cfg.data).is_dir():  # a render run: part labels from its parts.png members
        return RenderParts(cfg.data, vocab, cfg.image_size, aug, cfg.seed, pool)
    return CocoParts(cfg.data, cfg.images or None, vocab, cfg.image_size, aug, cfg.seed, pool)


def task_loss(task: str, out: torch.Tensor, batch: dict, cfg: FinetuneConfig, class_weights=None) -> torch.Tensor:
    if task == "pose":
        return losses.pose_heatmap_loss(out, batch["heatmaps"], batch["weights"], cfg.ohkm_topk)
    if task == "seg":
        return losses.seg_loss(out, batch["labels"], class_weights)
    if task == "depth":
        return losses.depth_loss(out, batch["depth"], batch["mask"])
    return losses.normal_loss(out, batch["normal"], batch["mask"])


def seg_class_weights(cfg: FinetuneConfig, device=None) -> torch.Tensor:
    """The vocabulary's cross-entropy weights, class 0 (background) replaced by cfg.background_weight if set
    (sapiens28 gives it 0.1: on renders of unclothed bodies that paints parts over the background)."""
    w = torch.as_tensor(np.asarray(load_vocab(cfg.vocab).weights, np.float32).copy(), device=device)
    if cfg.background_weight is not None:
        w[0] = float(cfg.background_weight)
    return w


def build_optimizer(model: TaskModel, cfg: FinetuneConfig, fused: bool = True):
    groups = layer_decay_groups(model, cfg.weight_decay, cfg.layer_decay)
    for g in groups:
        g["lr"] = cfg.lr * g["lr_scale"]
    opt = adamw([{k: v for k, v in g.items() if k != "names"} for g in groups], cfg.lr, cfg.betas, fused)
    kind = cfg.schedule if cfg.schedule != "auto" else ("step" if cfg.task == "pose" else "linear")
    fn = warmup_step if kind == "step" else warmup_linear
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: fn(s, cfg.steps, cfg.warmup))
    return opt, sched


# --- the recipe the engine runs ---------------------------------------------------------------------
class TaskRecipe(trainer.Recipe):
    def __init__(self, cfg: FinetuneConfig):
        super().__init__(cfg)
        self.name = f"finetune {cfg.task}"
        self.class_weights = None
        self.n_samples = 0

    def build_model(self, ctx: Context, resuming: bool) -> TaskModel:
        model = build_model(self.cfg)
        if self.cfg.encoder and not resuming:
            load_encoder(model.encoder, self.cfg.encoder)
        elif not resuming and ctx.main:
            log.warning("no --encoder: the encoder starts from random weights (fine for smoke tests, not for results)")
        if self.cfg.task == "seg":
            self.class_weights = seg_class_weights(self.cfg, ctx.device)
        return model

    def shard_units(self, model):
        return list(model.encoder.blocks) + [model.head]

    def optimizer(self, model, ctx: Context):
        return build_optimizer(model, self.cfg, fused=not trainer.sharded(self.cfg, ctx))

    def batches(self, ctx: Context, start_micro: int) -> Iterator[dict]:
        cfg = self.cfg
        if trainer.loader_kind(cfg, ctx) == "ray":
            return ray_batches(cfg, ctx)
        dataset = build_dataset(cfg, train=True)
        self.n_samples = len(dataset)
        sampler = StepSampler(len(dataset), cfg.batch_size, cfg.seed, ctx.rank, ctx.world, start_micro,
                              cfg.steps * cfg.accum_steps)
        workers = capped_workers(cfg.loader_workers, len(dataset), cfg.batch_size, cfg.data, ctx.world, ctx.main)
        return iter(torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate,
                                                num_workers=workers,
                                                pin_memory=ctx.device.type == "cuda"))

    def loss(self, model, batch: dict, ctx: Context, autocast) -> torch.Tensor:
        batch = {k: v.to(ctx.device, non_blocking=True) for k, v in batch.items()}
        with autocast:
            pred = model(normalize(batch["image"], ctx.device))
        return task_loss(self.cfg.task, pred.float(), batch, self.cfg, self.class_weights)

    def describe(self, model, ctx: Context, start: int) -> str:
        cfg = self.cfg
        n_params = sum(p.numel() for p in model.parameters())
        vocab = f" ({cfg.vocab})" if cfg.vocab else ""
        return (f"fine-tuning {cfg.task}{vocab}: {cfg.model} ({n_params / 1e6:.1f}M params) "
                f"at {cfg.image_size[0]}x{cfg.image_size[1]} on {ctx.world} x {ctx.device.type} "
                f"({cfg.strategy}), {self.n_samples or 'streamed'} samples, batch {cfg.batch_size} x "
                f"{cfg.accum_steps} x {ctx.world}, lr {cfg.lr:.3g}, {cfg.steps} steps from {start}")

    def checkpoint_extras(self, model) -> dict:
        return {"task": self.cfg.task, "vocab": self.cfg.vocab, "timm_kwargs": model.encoder.timm_kwargs()}

    def summary(self, ctx: Context, final_loss: float) -> dict:
        out = Path(self.cfg.output)
        return {"task": self.cfg.task, "steps": self.cfg.steps, "final_loss": final_loss, "output": str(out),
                "checkpoint": str(ckpt.checkpoint_path(out, self.cfg.steps))}


def train_loop(config: dict) -> dict:
    """The body of every process (this one, or each Ray Train worker). Returns a summary."""
    return trainer.train(TaskRecipe(config_from(config)))


# --- Ray Data: samples decoded and augmented in Ray tasks, streamed to the Ray Train workers -----------
@functools.lru_cache(maxsize=4)
def _dataset(config_json: str):
    return build_dataset(config_from(json.loads(config_json)), train=True)


def sample_items(batch: dict, config_json: str) -> dict:
    """Ray Data map_batches: stream positions p -> the augmented samples (perm_e[p mod n], e = p div n)."""
    cfg = config_from(json.loads(config_json))
    dataset = _dataset(config_json)
    order = StepSampler(len(dataset), 1, cfg.seed)
    items = []
    for p in batch["id"].tolist():
        epoch = p // len(dataset)
        items.append(dataset[(int(order.perm(epoch)[p % len(dataset)]), epoch)])
    return {k: np.stack([it[k] for it in items]) for k in items[0]}


def ray_dataset(cfg: FinetuneConfig, start_step: int = 0):
    """The samples of steps start_step.. cfg.steps as a Ray Data stream (split across the workers by Ray
    Train). The order is the torch loader's, but Ray Data interleaves tasks: resumes are not exact."""
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    per_step = cfg.batch_size * cfg.accum_steps * max(1, cfg.workers)
    first, last = start_step * per_step, (cfg.steps + 1) * per_step  # one spare step for uneven splits
    config_json = json.dumps(cfg.to_dict())
    return ray.data.range(last - first).map_batches(
        lambda b: sample_items({"id": b["id"] + first}, config_json), batch_size=cfg.batch_size,
        batch_format="numpy")


def ray_batches(cfg: FinetuneConfig, ctx: Context) -> Iterator[dict]:
    import ray.train

    shard = ray.train.get_dataset_shard("train")
    for batch in shard.iter_torch_batches(batch_size=cfg.batch_size, drop_last=True):
        yield {k: v for k, v in batch.items()}
    raise RuntimeError("the Ray Data stream ended before the last step")


# --- entry points ---------------------------------------------------------------------------------
def check_inputs(cfg: FinetuneConfig) -> FinetuneConfig:
    """cfg with its paths resolved and its model the encoder's own preset; refused, naming the fix,
    when --data is missing or of the wrong kind, or --model contradicts the encoder."""
    if not cfg.output:
        raise ValueError("--output is required: the run folder for checkpoints and logs")
    cfg = run_folder.resolved(cfg)
    check_data(cfg.task, cfg.data)
    if cfg.encoder and not Path(cfg.encoder).is_file():
        raise FileNotFoundError(f"--encoder {cfg.encoder}: no such file (an MAE checkpoint OUT/checkpoints/step-N.pt, "
                                f"OUT/encoder.pth, or a timm ViT state dict)")
    own = encoder_preset(cfg.encoder) if cfg.encoder else None
    if cfg.model and own and cfg.model != own:
        raise ValueError(f"--model {cfg.model}: the encoder {cfg.encoder} is a {own} ViT (its "
                         f"{'encoder.json' if Path(cfg.encoder).with_suffix('.json').is_file() else 'checkpoint'} "
                         f"says so); drop --model or pass --model {own}")
    return dataclasses.replace(cfg, model=cfg.model or own or DEFAULT_MODEL)


def check_data(task: str, data: str, flag: str = "--data") -> None:
    """`data` exists and is what `task` reads (a curation run is not a render run), else one line."""
    if not data or not Path(data).exists():
        raise FileNotFoundError(f"{flag} {data}: no such path; pass {DATA_FORMS[task]} (what task {task} reads)")
    if Path(data).is_dir():
        run_kind.require(data, ("render",), flag, f"pass {DATA_FORMS[task]} (what task {task} reads)")
        outer = run_kind.kind_of(Path(data).parent) if Path(data).name == "shards" else None
        if outer not in (None, "render"):
            raise run_kind.RunKindError(f"{flag} {data}: the shards of {run_kind.describe(outer)}; pass "
                                        f"{DATA_FORMS[task]} (what task {task} reads)")
    elif task in ("depth", "normal"):
        raise ValueError(f"{flag} {data}: a file; pass {DATA_FORMS[task]} (what task {task} reads)")


DATA_FORMS = {"depth": "a render run (humanset render --output RUN) or its shards folder",
              "normal": "a render run (humanset render --output RUN) or its shards folder",
              "seg": "a COCO JSON file, or a render run with parts.png (humanset render --scans anny)",
              "pose": "a COCO keypoint JSON file, or a render run of anny bodies (keypoints_coco17)"}


def finetune(cfg: FinetuneConfig) -> dict:
    """Run in this process (CPU, or the first GPU), or on Ray Train when cfg.workers > 0."""
    if cfg.workers:
        return finetune_ray(cfg)
    cfg = check_inputs(cfg)
    with run_folder.owned(cfg, "finetune"):
        return train_loop(cfg.to_dict())


def finetune_ray(cfg: FinetuneConfig, ray_address: str | None = None) -> dict:
    """The same loop on `cfg.workers` Ray Train workers (DDP or FSDP2; NCCL on GPUs, gloo on CPUs). Paths
    are absolute (check_inputs): every worker opens them, on any node."""
    cfg = check_inputs(cfg)
    with run_folder.owned(cfg, "finetune"):
        datasets = None
        if cfg.loader == "ray":
            resume = ckpt.resolve_resume(cfg.resume, cfg.output)
            datasets = {"train": ray_dataset(cfg, ckpt.step_of(resume) if resume else 0)}
        trainer.launch_ray(train_loop, cfg, f"finetune-{cfg.task}", datasets, ray_address)
    return {"task": cfg.task, "steps": cfg.steps, "output": cfg.output,
            "checkpoint": str(ckpt.latest_checkpoint(cfg.output))}


def load_task_model(checkpoint) -> tuple[TaskModel, FinetuneConfig]:
    """A fine-tuned model (eval mode) and its config from a fine-tuning checkpoint."""
    state = ckpt.load_checkpoint(checkpoint) if not isinstance(checkpoint, dict) else checkpoint
    if "task" not in state:
        raise ValueError(f"--checkpoint {checkpoint}: a {ckpt.kind_of(state)} checkpoint, not a fine-tuning one; pass "
                         "humanset finetune's OUT/checkpoints/step-N.pt or OUT (an MAE's goes to finetune --encoder)")
    cfg = config_from({**state["config"], "resume": None, "encoder": ""})
    model = build_model(cfg)
    model.load_state_dict(state["model"])
    return model.eval(), cfg
