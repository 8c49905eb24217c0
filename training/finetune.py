"""Fine-tuning a pretrained ViT with a light Sapiens decoder: pose, part segmentation, depth, normals.

    cfg = FinetuneConfig(task="depth", data="RENDER_RUN", output="runs/depth", encoder="PT/encoder.pth")
    finetune(cfg)            # this process (CPU or the first GPU); cfg.workers > 0 runs on Ray Train

The encoder comes from a humanset MAE checkpoint, an exported encoder.pth, or any timm-format ViT state
dict; its position table is resized bicubically from the pretraining grid to the fine-tuning grid
(1024 x 768 -> 64 x 48 patches by default). AdamW (lr 5e-4, betas 0.9 / 0.999, weight decay 0.1 except
norms, biases and position embeddings), layer-wise lr decay 0.85 (block i of L gets 0.85^(L - i), the
decoder the full lr), linear warmup then linear decay (pose: step decay), gradient clip 1.0.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import catalog

from . import checkpoint as ckpt
from . import losses
from .data import normalize
from .heads import TASKS, build_head, tokens_to_map
from .lr import no_weight_decay
from .pretrain import Context, local_context, over_ranks, ray_context
from .vit import VisionTransformer, init_linear_and_norm, preset
from .vocab import load as load_vocab

log = logging.getLogger(__name__)

DEFAULT_VOCAB = {"pose": "coco17", "seg": "sapiens28"}


# --- encoder on a rectangular grid ----------------------------------------------------------------
class GridViT(VisionTransformer):
    """The pretraining ViT on an H x W input (the pretraining class is square); same parameter names."""

    def __init__(self, width, depth, heads, mlp, img_hw=(1024, 768), patch_size=16, grad_checkpointing=False):
        h, w = img_hw
        if h % patch_size or w % patch_size:
            raise ValueError(f"image size {h}x{w} is not a multiple of the patch size {patch_size}")
        super().__init__(width, depth, heads, mlp, img_size=h, patch_size=patch_size,
                         grad_checkpointing=grad_checkpointing)
        self.img_hw = (h, w)
        self.grid_hw = (h // patch_size, w // patch_size)
        # fine-tuning learns the positions (initialised from the resized pretraining table)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.grid_hw[0] * self.grid_hw[1] + 1, width))

    @classmethod
    def from_preset(cls, name: str, img_hw=(1024, 768), **kw) -> "GridViT":
        p = preset(name)
        return cls(p.width, p.depth, p.heads, p.mlp, img_hw=img_hw, **kw)

    def init_weights(self):
        """As the pretraining ViT, with the MAE sin-cos table laid out on the H x W grid."""
        w = self.patch_embed.proj.weight
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.zeros_(self.patch_embed.proj.bias)
        nn.init.normal_(self.cls_token, std=0.02)
        self.apply(init_linear_and_norm)
        with torch.no_grad():
            self.pos_embed.copy_(sincos_grid(self.width, self.grid_hw).unsqueeze(0))
        return self

    def timm_kwargs(self) -> dict:
        return {**super().timm_kwargs(), "img_size": list(self.img_hw)}


def sincos_grid(dim: int, grid_hw) -> torch.Tensor:
    """MAE's fixed 2D sin-cos table (1 + gh*gw, dim) for a rectangular grid (width coordinate first)."""
    gh, gw = grid_hw
    omega = 1.0 / 10000 ** (np.arange(dim // 4, dtype=np.float64) / (dim / 4.0))
    ys, xs = np.meshgrid(np.arange(gh, dtype=np.float64), np.arange(gw, dtype=np.float64), indexing="ij")

    def encode(pos):
        out = np.outer(pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)
    table = np.concatenate([np.zeros((1, dim)), np.concatenate([encode(xs), encode(ys)], axis=1)], axis=0)
    return torch.from_numpy(table).float()


def resize_pos_embed(pos: torch.Tensor, grid_hw, src_hw=None) -> torch.Tensor:
    """(1, 1 + gh0*gw0, D) -> (1, 1 + gh*gw, D): the patch part resized bicubically, the cls row kept.
    The source grid is square unless `src_hw` says otherwise."""
    cls, patches = pos[:, :1], pos[:, 1:]
    n, d = patches.shape[1], patches.shape[2]
    if src_hw is None:
        side = int(round(math.sqrt(n)))
        if side * side != n:
            raise ValueError(f"position table of {n} patches is not square; pass its grid")
        src_hw = (side, side)
    if tuple(src_hw) == tuple(grid_hw):
        return pos.clone()
    grid = patches.reshape(1, src_hw[0], src_hw[1], d).permute(0, 3, 1, 2).float()
    grid = F.interpolate(grid, size=tuple(grid_hw), mode="bicubic", align_corners=False)
    return torch.cat([cls.float(), grid.permute(0, 2, 3, 1).reshape(1, -1, d)], dim=1).to(pos.dtype)


ENCODER_PREFIXES = ("encoder.", "backbone.", "module.", "model.")


def encoder_weights(path) -> tuple[dict, tuple | None]:
    """A state dict of encoder weights (timm names) from a humanset MAE or fine-tuning checkpoint, an
    exported encoder.pth, or a timm ViT state dict; plus the source grid if the file says it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--encoder {path}: no such file (an MAE checkpoint OUT/checkpoints/step-N.pt, "
                                f"OUT/encoder.pth, or a timm ViT state dict)")
    obj = torch.load(path, map_location="cpu", weights_only=False)
    src_hw = None
    if isinstance(obj, dict) and "model" in obj and isinstance(obj["model"], dict):
        src_hw = _grid_from_kwargs(obj.get("timm_kwargs"))
        obj = obj["model"]
    elif isinstance(obj, dict) and "state_dict" in obj:
        obj = obj["state_dict"]
    side = path.with_suffix(".json")
    if src_hw is None and side.is_file():
        src_hw = _grid_from_kwargs(json.loads(side.read_text()))
    state = {}
    for k, v in obj.items():
        if not torch.is_tensor(v):
            continue
        for p in ENCODER_PREFIXES:  # Sapiens' own checkpoints use 'backbone.'
            if k.startswith(p):
                k = k[len(p):]
                break
        else:
            if k.startswith(("decoder", "mask_token", "head.")):
                continue  # MAE decoder or a task head: not encoder weights
        state[k] = v
    if "pos_embed" not in state or "patch_embed.proj.weight" not in state:
        raise KeyError(f"{path}: no ViT encoder weights found (need pos_embed and patch_embed.proj.weight)")
    return state, src_hw


def _grid_from_kwargs(kw) -> tuple | None:
    if not kw:
        return None
    size, patch = kw.get("img_size"), kw.get("patch_size", 16)
    if size is None:
        return None
    h, w = (size, size) if isinstance(size, int) else size
    return h // patch, w // patch


def load_encoder(encoder: GridViT, path) -> dict:
    """Load pretrained weights into `encoder`, resizing the position table. Returns what was skipped."""
    state, src_hw = encoder_weights(path)
    pos = state["pos_embed"]
    if pos.shape[1] == encoder.grid_hw[0] * encoder.grid_hw[1]:  # a table without a cls row
        pos = torch.cat([torch.zeros_like(pos[:, :1]), pos], dim=1)
    state["pos_embed"] = resize_pos_embed(pos, encoder.grid_hw, src_hw)
    own = encoder.state_dict()
    bad = [k for k in state if k in own and own[k].shape != state[k].shape]
    if bad:
        raise ValueError(f"encoder weights {path}: shapes differ for {bad[:4]} "
                         f"(e.g. {tuple(state[bad[0]].shape)} vs {tuple(own[bad[0]].shape)}); "
                         f"is --model the preset it was trained with?")
    result = encoder.load_state_dict(state, strict=False)
    if result.missing_keys:
        raise KeyError(f"encoder weights {path}: missing {result.missing_keys[:6]}")
    log.info("encoder weights from %s (position grid %s -> %s)%s", path, src_hw or "square",
             encoder.grid_hw, f"; ignored {len(result.unexpected_keys)} extra tensors" if result.unexpected_keys else "")
    return {"unexpected": list(result.unexpected_keys), "src_grid": src_hw}


# --- the task model -------------------------------------------------------------------------------
def out_channels(task: str, vocab) -> int:
    return {"pose": len(vocab) if vocab else 0, "seg": len(vocab) if vocab else 0, "depth": 1, "normal": 3}[task]


class TaskModel(nn.Module):
    def __init__(self, encoder: GridViT, head: nn.Module, task: str):
        super().__init__()
        self.encoder, self.head, self.task = encoder, head, task

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(tokens_to_map(self.encoder(images), self.encoder.grid_hw))


def build_model(cfg: "FinetuneConfig") -> TaskModel:
    vocab = load_vocab(cfg.vocab) if cfg.task in ("pose", "seg") else None
    encoder = GridViT.from_preset(cfg.model, tuple(cfg.image_size), grad_checkpointing=cfg.grad_checkpointing)
    encoder.init_weights()
    head = build_head(cfg.task, encoder.width, out_channels(cfg.task, vocab), cfg.head_width, cfg.head_deconvs,
                      cfg.head_convs)
    return TaskModel(encoder, head, cfg.task)


# --- optimiser: layer-wise lr decay, no decay on norms / biases / positions -----------------------
def layer_id(name: str, depth: int) -> int:
    """0 for the embeddings, i + 1 for block i, depth + 1 for the final norm and the decoder."""
    if name.startswith("encoder."):
        rest = name[len("encoder."):]
        if rest.startswith(("cls_token", "pos_embed", "patch_embed")):
            return 0
        if rest.startswith("blocks."):
            return int(rest.split(".")[1]) + 1
    return depth + 1


def param_groups(model: TaskModel, weight_decay: float, layer_decay: float) -> list[dict]:
    """One AdamW group per (layer, decayed or not), with `lr_scale` = layer_decay^(depth + 1 - layer)."""
    depth = model.encoder.depth
    groups: dict = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        lid = layer_id(name, depth)
        nd = no_weight_decay(name, p)
        key = (lid, nd)
        if key not in groups:
            groups[key] = {"params": [], "names": [], "weight_decay": 0.0 if nd else weight_decay,
                           "lr_scale": layer_decay ** (depth + 1 - lid)}
        groups[key]["params"].append(p)
        groups[key]["names"].append(name)
    return [groups[k] for k in sorted(groups)]


def warmup_linear(step: int, total: int, warmup: int) -> float:
    """Multiplier of the peak lr at `step`: linear warmup to 1, then linear decay to 0 at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def warmup_step(step: int, total: int, warmup: int, milestones=(0.67, 0.89), gamma: float = 0.1) -> float:
    """Pose schedule: linear warmup, then x0.1 at 67 % and 89 % of the run (mmpose's 170 / 200 epochs)."""
    if step < warmup:
        return (step + 1) / warmup
    return gamma ** sum(step >= m * total for m in milestones)


# --- configuration --------------------------------------------------------------------------------
@dataclass
class FinetuneConfig:
    task: str = "depth"  # pose | seg | depth | normal
    data: str = ""  # depth / normal: render run or its shards folder; pose / seg: COCO JSON
    images: str = ""  # pose / seg: folder of the JSON's file_names (default: the JSON's folder)
    output: str = ""
    encoder: str = ""  # pretrained weights; empty = random initialisation (smoke tests only)
    model: str = "sapiens-0.3b"
    image_size: tuple = (1024, 768)  # H, W
    vocab: str = ""  # pose: coco17 | coco_wholebody133 | sapiens308 | a JSON; seg: sapiens28 | lip20
    head_width: int | None = None  # None = Sapiens' layout (768, depth 384)
    head_deconvs: int | None = None
    head_convs: int | None = None
    batch_size: int = 8  # per worker
    steps: int = 1000
    warmup_steps: int | None = None  # None: 5 % of steps
    lr: float = 5e-4
    layer_decay: float = 0.85
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.999)
    clip_grad: float = 1.0
    schedule: str = "auto"  # auto (pose: step, others: linear) | linear | step
    heatmap_sigma: float = 2.0
    ohkm_topk: int | None = None  # pose: online hard keypoint mining (Sapiens: 128 for 308 keypoints)
    backgrounds: str = ""  # curation run whose person-free photos become random backgrounds
    background_prob: float = 0.5
    augment: bool = True
    seed: int = 0
    loader_workers: int = 2
    cpu_threads: int = 0
    checkpoint_every: int = 1000
    keep_checkpoints: int = 3
    log_every: int = 10
    grad_checkpointing: bool = False
    precision: str = "auto"  # auto (bf16 on GPU) | bf16 | fp32
    workers: int = 0  # Ray Train workers (DDP); 0 = this process
    gpus_per_worker: float = 0.0
    resume: str | None = None
    progress: bool = True

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"task {self.task!r}: choose one of {', '.join(TASKS)}")
        self.image_size = parse_hw(self.image_size)
        self.betas = tuple(self.betas)
        if not self.vocab and self.task in DEFAULT_VOCAB:
            self.vocab = DEFAULT_VOCAB[self.task]
        if self.task == "pose" and self.vocab == "sapiens308" and self.ohkm_topk is None:
            self.ohkm_topk = 128  # Sapiens mines the 128 hardest of its 308 keypoints
        preset(self.model)
        if self.image_size[0] % 16 or self.image_size[1] % 16:
            raise ValueError(f"image_size {self.image_size}: height and width must be multiples of 16 (the patch)")
        if self.schedule not in ("auto", "linear", "step"):
            raise ValueError(f"schedule {self.schedule!r}: use auto, linear or step")

    @property
    def warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else max(1, self.steps // 20)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


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
    known = {f.name for f in dataclasses.fields(FinetuneConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise KeyError(f"unknown fine-tuning settings {unknown}; known: {', '.join(sorted(known))}")
    return FinetuneConfig(**values)


# --- data -----------------------------------------------------------------------------------------
def build_dataset(cfg: FinetuneConfig, train: bool = True):
    from .task_data import Augment, BackgroundPool, CocoKeypoints, CocoParts, RenderFrames, RenderParts

    aug = Augment(train=train and cfg.augment, background=cfg.background_prob)
    pool = BackgroundPool.from_run(cfg.backgrounds) if (train and cfg.backgrounds) else None
    if cfg.task in ("depth", "normal"):
        return RenderFrames(cfg.data, cfg.image_size, aug, cfg.seed, pool)
    vocab = load_vocab(cfg.vocab)
    if cfg.task == "pose":
        return CocoKeypoints(cfg.data, cfg.images or None, vocab, cfg.image_size, aug, cfg.seed, cfg.heatmap_sigma)
    if Path(cfg.data).is_dir():  # a render run: part labels from its parts.png members
        return RenderParts(cfg.data, vocab, cfg.image_size, aug, cfg.seed, pool)
    return CocoParts(cfg.data, cfg.images or None, vocab, cfg.image_size, aug, cfg.seed, pool)


class StepSampler(torch.utils.data.Sampler):
    """Batches of (index, epoch) for one rank, as a pure function of the step: sample p of the global
    stream is permutation_e[p mod n] with e = p div n, so resuming at step s replays exactly."""

    def __init__(self, n: int, batch_size: int, seed: int, rank: int = 0, world: int = 1, start_step: int = 0,
                 steps: int | None = None):
        self.n, self.batch, self.seed, self.rank, self.world = n, batch_size, seed, rank, world
        self.start, self.steps = start_step, steps
        self._perms: dict[int, np.ndarray] = {}

    def perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms = {epoch: np.random.default_rng([self.seed, epoch, 3]).permutation(self.n)}
        return self._perms[epoch]

    def batch_at(self, step: int) -> list[tuple[int, int]]:
        first = (step * self.world + self.rank) * self.batch
        out = []
        for p in range(first, first + self.batch):
            epoch = p // self.n
            out.append((int(self.perm(epoch)[p % self.n]), epoch))
        return out

    def __iter__(self):
        step = self.start
        while self.steps is None or step < self.steps:
            yield self.batch_at(step)
            step += 1

    def __len__(self):
        return (self.steps - self.start) if self.steps is not None else 2 ** 31


def collate(items: list[dict]) -> dict:
    return {k: torch.as_tensor(np.stack([it[k] for it in items])) for k in items[0]}


def task_loss(task: str, out: torch.Tensor, batch: dict, cfg: FinetuneConfig, class_weights=None) -> torch.Tensor:
    if task == "pose":
        return losses.pose_heatmap_loss(out, batch["heatmaps"], batch["weights"], cfg.ohkm_topk)
    if task == "seg":
        return losses.seg_loss(out, batch["labels"], class_weights)
    if task == "depth":
        return losses.depth_loss(out, batch["depth"], batch["mask"])
    return losses.normal_loss(out, batch["normal"], batch["mask"])


# --- the loop -------------------------------------------------------------------------------------
def use_bf16(cfg: FinetuneConfig, ctx: Context) -> bool:
    return cfg.precision == "bf16" or (cfg.precision == "auto" and ctx.device.type == "cuda")


def build_optimizer(model: TaskModel, cfg: FinetuneConfig):
    groups = param_groups(model, cfg.weight_decay, cfg.layer_decay)
    for g in groups:
        g["lr"] = cfg.lr * g["lr_scale"]
    opt = torch.optim.AdamW([{k: v for k, v in g.items() if k != "names"} for g in groups], lr=cfg.lr,
                            betas=cfg.betas)
    kind = cfg.schedule if cfg.schedule != "auto" else ("step" if cfg.task == "pose" else "linear")
    fn = warmup_step if kind == "step" else warmup_linear
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: fn(s, cfg.steps, cfg.warmup))
    return opt, sched


def unwrap(model):
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def train_loop(config: dict) -> dict:
    """Fine-tune for cfg.steps optimiser steps; the body of every process. Returns a summary."""
    cfg = config_from(config)
    ctx = ray_context() if cfg.workers else local_context()
    if cfg.cpu_threads:
        torch.set_num_threads(cfg.cpu_threads)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg)
    out = Path(cfg.output)
    resume_from = ckpt.resolve_resume(cfg.resume, out)
    if cfg.encoder and resume_from is None:
        load_encoder(model.encoder, cfg.encoder)
    elif resume_from is None and ctx.main:
        log.warning("no --encoder: the encoder starts from random weights (fine for smoke tests, not for results)")
    model.to(ctx.device)
    if ctx.world > 1:
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    opt, sched = build_optimizer(unwrap(model), cfg)
    start = 0
    if resume_from is not None:
        state = ckpt.load_checkpoint(resume_from)
        unwrap(model).load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        start = state["step"]
        if ctx.main:
            log.info("resumed from %s at step %d", resume_from, start)
    if start >= cfg.steps:
        raise ValueError(f"checkpoint is at step {start}, not before the last step {cfg.steps}; raise --steps")

    dataset = build_dataset(cfg, train=True)
    sampler = StepSampler(len(dataset), cfg.batch_size, cfg.seed, ctx.rank, ctx.world, start, cfg.steps)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate,
                                         num_workers=cfg.loader_workers, pin_memory=ctx.device.type == "cuda")
    class_weights = torch.as_tensor(load_vocab(cfg.vocab).weights, device=ctx.device) if cfg.task == "seg" else None
    if ctx.main:
        out.mkdir(parents=True, exist_ok=True)
        catalog.write_json(out / "config.json", cfg.to_dict())
        n_params = sum(p.numel() for p in unwrap(model).parameters())
        log.info("fine-tuning %s for %s: %s (%.1fM params) at %dx%d on %d x %s, %d samples, batch %d x %d, "
                 "lr %.3g, %d steps from %d", cfg.task, cfg.vocab or cfg.task, cfg.model, n_params / 1e6,
                 *cfg.image_size, ctx.world, ctx.device.type, len(dataset), cfg.batch_size, ctx.world, cfg.lr,
                 cfg.steps, start)
    logger = StepLog(out / "log.jsonl", cfg, start) if ctx.main else None
    autocast = torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=use_bf16(cfg, ctx))
    model.train()
    loss_value = float("nan")
    for step, batch in enumerate(loader, start=start):
        batch = {k: v.to(ctx.device, non_blocking=True) for k, v in batch.items()}
        with autocast:
            pred = model(normalize(batch["image"], ctx.device))
        loss = task_loss(cfg.task, pred.float(), batch, cfg, class_weights)
        loss_value = loss.item()
        if not math.isfinite(loss_value):
            raise FloatingPointError(f"step {step + 1}: loss is {loss_value} on rank {ctx.rank}; the run stops "
                                     f"here. Lower lr, raise warmup_steps, or resume from {ckpt.checkpoint_dir(out)}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
        opt.step()
        sched.step()
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps or done == start + 1:
            mean_loss, _ = over_ranks(loss.detach(), 0, ctx)
            if logger:
                logger.write(done, mean_loss, sched.get_last_lr()[-1], float(grad_norm), cfg.batch_size * ctx.world)
        if done % cfg.checkpoint_every == 0 or done == cfg.steps:
            if ctx.main:
                save(unwrap(model), opt, sched, cfg, done)
            if ctx.world > 1:
                torch.distributed.barrier()
    if logger:
        logger.close()
    return {"task": cfg.task, "steps": cfg.steps, "final_loss": loss_value, "output": str(out),
            "checkpoint": str(ckpt.checkpoint_path(out, cfg.steps))}


def save(model: TaskModel, opt, sched, cfg: FinetuneConfig, step: int):
    ckpt.save_checkpoint(cfg.output, step, {
        "model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
        "step": step, "config": cfg.to_dict(), "task": cfg.task, "vocab": cfg.vocab,
        "timm_kwargs": model.encoder.timm_kwargs(),
    }, keep=cfg.keep_checkpoints)


class StepLog:
    """Loss, lr, images/s and ETA to the log, OUT/log.jsonl and a tqdm bar (rank 0)."""

    def __init__(self, path: Path, cfg: FinetuneConfig, start: int):
        from tqdm import tqdm
        self.fh = open(path, "a")
        self.cfg, self.start = cfg, start
        self.t0 = self.t_last = time.perf_counter()
        self.step_last = start
        self.bar = tqdm(total=cfg.steps, initial=start, desc=f"finetune {cfg.task}", unit="step",
                        disable=not cfg.progress, dynamic_ncols=True)

    def write(self, step, loss, lr, grad_norm, global_batch):
        now = time.perf_counter()
        ips = (step - self.step_last) * global_batch / max(now - self.t_last, 1e-9)
        rate = (step - self.start) / max(now - self.t0, 1e-9)
        eta = (self.cfg.steps - step) / rate if rate > 0 else float("nan")
        rec = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "images_per_s": ips, "eta_s": eta,
               "time": time.time()}
        self.fh.write(json.dumps(rec) + "\n")
        self.fh.flush()
        self.bar.update(step - self.bar.n)
        self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}")
        log.info("%s step %d/%d loss %.4f lr %.3e grad %.2f %.1f img/s eta %s", self.cfg.task, step, self.cfg.steps,
                 loss, lr, grad_norm, ips, _fmt_eta(eta))
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


# --- entry points ---------------------------------------------------------------------------------
def check_inputs(cfg: FinetuneConfig):
    if not cfg.output:
        raise ValueError("--output is required: the run folder for checkpoints and logs")
    if not cfg.data or not Path(cfg.data).exists():
        what = {"depth": "a render run (or its shards folder)", "normal": "a render run (or its shards folder)",
                "seg": "a COCO JSON file or a render run with parts.png"}.get(cfg.task, "a COCO JSON file")
        raise FileNotFoundError(f"--data {cfg.data!r}: no such path; task {cfg.task} reads {what}")


def finetune(cfg: FinetuneConfig) -> dict:
    check_inputs(cfg)
    if cfg.workers:
        return finetune_ray(cfg)
    return train_loop(cfg.to_dict())


def finetune_ray(cfg: FinetuneConfig, ray_address: str | None = None) -> dict:
    """The same loop on `cfg.workers` Ray Train workers (DDP; NCCL on GPUs, gloo on CPUs)."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    check_inputs(cfg)
    paths = {k: str(Path(getattr(cfg, k)).resolve()) for k in ("data", "output", "images", "encoder", "backgrounds")
             if getattr(cfg, k)}
    cfg = dataclasses.replace(cfg, **paths)
    if not ray.is_initialized():
        ray.init(address=ray_address, include_dashboard=False)
    use_gpu = cfg.gpus_per_worker > 0
    scaling = ScalingConfig(num_workers=cfg.workers, use_gpu=use_gpu,
                            resources_per_worker={"GPU": cfg.gpus_per_worker} if use_gpu else {"CPU": 1})
    trainer = TorchTrainer(train_loop, train_loop_config=cfg.to_dict(), scaling_config=scaling,
                           torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
                           run_config=RunConfig(name=f"finetune-{cfg.task}", storage_path=str(Path(cfg.output) / "ray")))
    result = trainer.fit()
    if result.error:
        raise result.error
    return {"task": cfg.task, "steps": cfg.steps, "output": cfg.output,
            "checkpoint": str(ckpt.latest_checkpoint(cfg.output))}


def load_task_model(checkpoint) -> tuple[TaskModel, FinetuneConfig]:
    """A fine-tuned model (eval mode) and its config from a fine-tuning checkpoint."""
    state = ckpt.load_checkpoint(checkpoint) if not isinstance(checkpoint, dict) else checkpoint
    if "task" not in state:
        raise ValueError(f"{checkpoint}: not a fine-tuning checkpoint (no 'task'); MAE checkpoints go to --encoder")
    cfg = config_from({**state["config"], "resume": None, "encoder": ""})
    model = build_model(cfg)
    model.load_state_dict(state["model"])
    return model.eval(), cfg


def demo_config(task: str, data, output, steps: int = 30, encoder: str = "") -> FinetuneConfig:
    """A short CPU run: tiny preset at 128x96 with narrow heads; the lr is raised so a few dozen steps
    show the loss falling. Everything else is the real recipe."""
    return FinetuneConfig(task=task, data=str(data), output=str(output), encoder=encoder, model="tiny",
                          image_size=(128, 96), head_width=32, batch_size=4, steps=steps,
                          warmup_steps=max(1, steps // 10), lr=2e-3, loader_workers=0, cpu_threads=1,
                          checkpoint_every=steps, log_every=5)


def demo(render_dir, out_dir, steps: int = 30, encoder: str = "") -> dict:
    """`make demo`: fine-tune depth and normals briefly on a render run, then predict the first frame."""
    from .predict import predict
    from .task_data import RenderFrames

    out_dir = Path(out_dir)
    frames = RenderFrames(render_dir, (128, 96))
    out_dir.mkdir(parents=True, exist_ok=True)
    from PIL import Image
    first = frames.raw(0)
    image, mask = out_dir / "demo-input.png", out_dir / "demo-mask.png"
    Image.fromarray(first["rgb"]).save(image)
    Image.fromarray((first["mask"] * 255).astype(np.uint8)).save(mask)
    summary = {}
    for task in ("depth", "normal"):
        run = finetune(demo_config(task, render_dir, out_dir / task, steps, encoder))
        written = predict(task, run["checkpoint"], [image], out_dir / task / "predictions", masks=[mask])
        summary[task] = {**run, "predictions": [str(p) for p in written]}
    catalog.write_json(out_dir / "summary.json", summary)
    return summary
