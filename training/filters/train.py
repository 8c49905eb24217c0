"""Training the watermark and art filters from the crawl itself (`humanset train-filter`).

    cfg = FilterConfig(filter="watermark", images="RUN", encoder="PT/encoder.pth", output="models/wm")
    train_filter(cfg)   # -> OUT/model.pt (timm state dict) + OUT/card.json

The classifier is the project's ViT encoder (from an MAE encoder export; random initialisation only with a loud
warning) with a linear head on the cls token. Its training data are made on the fly by training/filters/samples.py
from clean photos of a curation run (its kept samples) or any shards: synthetic watermarks against clean photos and
hard negatives; stylised non-photos against photos (and crops of HTML pages Chromium renders into OUT/html_pool/,
filters/browser.py). One generator family per class is held out: its validation figures measure an unseen style.

Loads without humanset: `timm.models.vision_transformer.VisionTransformer(**card["architecture"]["kwargs"])`
with `load_state_dict(torch.load(OUT/model.pt, weights_only=True))`; pipeline/stages/watermark/stage.py and art.py
read the card (watermark.weights / art.weights = OUT).

The model, data and loss are a recipe (`FilterRecipe`) that training/trainer.py runs: resumable checkpoints
(OUT/checkpoints/step-N.pt; `--resume` continues bit-identically, the data a pure function of (seed, step)),
the run log, and Ray Train with `--workers N`.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import catalog
from catalog import cards, run_kind
from catalog.config import setting

from training import checkpoint as ckpt, run_config, run_folder, trainer
from training.data import capped_workers
from training.trainer import Context
from training.run_config import RunConfig
from training.filters.samples import DEFAULT_HOLDOUT, FilterSamples, FilterSpec, split_photos
from training.filters.overlays import GeneratorSettings
from training.filters.browser import HtmlPool, html_pool
from training.filters.inputs import read_inputs, read_scene_text
from training.filters.thresholds import CHANCE_Z, card_threshold, figures, reject_scores
from training.lr import adamw, layer_decay_groups, warmup_linear
from training.tasks.sampler import collate
from training.vit import VisionTransformer, preset
from training.weights import encoder_preset, load_encoder

log = logging.getLogger(__name__)

CARD_FORMAT, CARD_NAME, WEIGHTS_NAME = cards.CARD_FORMAT, cards.CARD_NAME, cards.WEIGHTS_NAME  # catalog/cards.py


def normalize(images_uint8: torch.Tensor, device=None) -> torch.Tensor:
    """uint8 (B, 3, S, S) -> float32 scaled to [0, 1] and normalised as the card says (catalog/cards.py)."""
    x = images_uint8.to(device, non_blocking=True).float().div_(255.0)
    mean = torch.tensor(cards.MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(cards.STD, device=x.device).view(1, 3, 1, 1)
    return (x - mean) / std


# --- configuration --------------------------------------------------------------------------------
@dataclass
class FilterConfig(RunConfig):
    filter: str = setting("watermark", "watermark | art", choices=("watermark", "art"))
    images: str = setting("", "clean photos: a curation run (its kept samples), a shards folder, tars or image files")
    renders: str = setting("", "art: a `humanset render` run whose frames are the \"3d render\" class")
    encoder: str = setting("", "MAE encoder export (OUT/encoder.pth) or checkpoint; empty = random init (loud)")
    model: str = setting("tiny", "preset when the encoder file does not say its shape (or there is none)")
    input_px: int = setting(cards.DEFAULT_INPUT_PX, "square model input; the stage squashes every image to it", low=16)
    gen_px: int = setting(0, "generator canvas (longer side); 0 = 2 x input_px", low=0)
    holdout: list | None = setting(None, "families held out for validation; null = training/filters/samples.py "
                                         "DEFAULT_HOLDOUT", kinds=("list",), nullable=True, items="str")
    opacity: tuple = setting((0.1, 0.6), kinds=("list",), items="number")
    max_images: int = setting(1000, "clean photos read (spread over the shards), at most", low=1)
    html_pages: int = setting(32, "art: web pages headless Chromium renders once per run (cached); 0 = no html family",
                              low=0)
    val_samples: int = setting(256, "per validation set (seen families, held-out families)", low=1)
    target_precision: float = setting(0.95, low=0, high=1)
    batch_size: int = setting(32, "per worker", low=1)
    steps: int = setting(500)  # doc and check: RunConfig's
    warmup_steps: int | None = setting(None, "null: 5 % of steps", kinds=("int",), nullable=True, low=0)
    lr: float = setting(5e-4, low=0)
    layer_decay: float = setting(0.75, low=0, high=1)
    weight_decay: float = setting(0.05, low=0)
    betas: tuple = setting((0.9, 0.999), kinds=("list",), items="number")
    checkpoint_every: int = setting(100)
    keep_checkpoints: int = setting(2)
    loader: str = setting("torch", "the samples are generated in DataLoader workers (exact resume)", choices=("torch",))

    def __post_init__(self):
        super().__post_init__()
        self.betas = tuple(self.betas)
        if self.loader == "ray":
            raise ValueError("train-filter generates its samples in DataLoader workers: use loader=torch")
        if self.filter not in ("watermark", "art"):
            raise ValueError(f"filter {self.filter!r}: choose watermark or art")
        if self.input_px % 16:
            raise ValueError(f"input_px {self.input_px}: must be a multiple of 16 (the patch size)")
        if self.holdout is None:
            self.holdout = list(DEFAULT_HOLDOUT[self.filter])
        self.holdout = list(self.holdout)
        self.opacity = tuple(self.opacity)
        if self.html_pages < 0 or self.html_pages == 1:
            raise ValueError(f"html_pages {self.html_pages}: 0 (no HTML screenshots) or at least 2")
        if not 0 < self.target_precision <= 1:
            raise ValueError(f"target_precision {self.target_precision}: a fraction in (0, 1]")
        preset(self.model)

    @property
    def warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else max(1, self.steps // 20)

    @property
    def generator_px(self) -> int:
        return self.gen_px or 2 * self.input_px

    def settings(self) -> GeneratorSettings:
        return GeneratorSettings(opacity=self.opacity, gen_px=self.generator_px)


def config_from(values: dict) -> FilterConfig:
    return run_config.config_from(FilterConfig, values, "train-filter")


# --- the model ------------------------------------------------------------------------------------
class FilterModel(nn.Module):
    """ViT encoder + linear head on the (normed) cls token: timm's VisionTransformer with global_pool='token'."""

    def __init__(self, encoder: VisionTransformer, n_classes: int):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder.width, n_classes)
        nn.init.normal_(self.head.weight, std=0.01)  # near chance at the start, as MAE's fine-tuning heads
        nn.init.zeros_(self.head.bias)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(images)[:, 0])

    def timm_kwargs(self) -> dict:
        kw = self.encoder.timm_kwargs()
        return {**kw, "num_classes": self.head.out_features, "global_pool": "token"}

    def timm_state_dict(self) -> dict:
        sd = {k[len("encoder."):]: v for k, v in self.state_dict().items() if k.startswith("encoder.")}
        sd.update({"head.weight": self.head.weight, "head.bias": self.head.bias})
        return {k: v.detach().cpu().contiguous() for k, v in sd.items()}


def encoder_shape(cfg: FilterConfig) -> tuple[int, int, int, int]:
    """(width, depth, heads, mlp) of the encoder's own preset (its encoder.json, as finetune reads it), else --model."""
    p = preset((encoder_preset(cfg.encoder) if cfg.encoder else None) or cfg.model)
    return p.width, p.depth, p.heads, p.mlp


def build_model(cfg: FilterConfig, n_classes: int, load_weights: bool = True) -> FilterModel:
    width, depth, heads, mlp = encoder_shape(cfg)
    encoder = VisionTransformer(width, depth, heads, mlp, img_size=cfg.input_px, learn_pos_embed=True).init_weights()
    if cfg.encoder and load_weights:
        load_encoder(encoder, cfg.encoder)
    elif load_weights:
        log.warning("NO --encoder: the %s filter's ViT starts from RANDOM weights; its figures will be poor. "
                    "Pass an MAE encoder export (humanset pretrain ... -> OUT/encoder.pth)", cfg.filter)
    return FilterModel(encoder, n_classes)


# --- the recipe: model, data, loss ----------------------------------------------------------------
class FilterRecipe(trainer.Recipe):
    """Model, data and loss of a filter for training/trainer.py."""

    def __init__(self, cfg: FilterConfig, photos: list[np.ndarray] | None = None,
                 renders: list[np.ndarray] | None = None):
        super().__init__(cfg)
        self.name = f"train-filter {cfg.filter}"
        if photos is None:  # a Ray Train worker reads its own copy (bounded by max_images)
            photos, renders = read_inputs(cfg)
        self.train_photos, self.val_photos = split_photos(photos)
        self.html = self.html_screenshots(cfg)
        self.spec = FilterSpec(cfg.filter, tuple(cfg.holdout), renders=bool(renders), html=self.html.available)
        self.renders = renders or []
        self.scene_text = read_scene_text(cfg.images) if cfg.filter == "watermark" else []
        self.train_set = FilterSamples(self.spec, self.train_photos, cfg.input_px, cfg.seed, cfg.settings(),
                                       self.renders, "train", self.scene_text, self.html.train)
        self.t0 = time.perf_counter()
        self.start = 0

    def html_screenshots(self, cfg: FilterConfig) -> HtmlPool:
        """art: the pool of HTML screenshots, rendered once into OUT/html_pool/ (a resume or a Ray Train
        worker finds it there). Kept at most 4 x the generator canvas: crops stay sharp, memory bounded."""
        if cfg.filter != "art":
            return HtmlPool(info={"available": False, "reason": "the watermark filter has no html family"})
        return html_pool(Path(cfg.output) / "html_pool", cfg.html_pages, cfg.seed, self.train_photos,
                         self.val_photos, max_side=max(512, 4 * cfg.generator_px))

    def build_model(self, ctx: Context, resuming: bool) -> FilterModel:
        return build_model(self.cfg, len(self.spec.classes), load_weights=not resuming)

    def shard_units(self, model):
        return list(model.encoder.blocks)

    def optimizer(self, model, ctx: Context):
        cfg = self.cfg
        # names of the unwrapped model (DDP prefixes 'module.'); its parameters are the wrapper's
        groups = layer_decay_groups(trainer.unwrap(model), cfg.weight_decay, cfg.layer_decay)
        for g in groups:
            g["lr"] = cfg.lr * g["lr_scale"]
        opt = adamw([{k: v for k, v in g.items() if k != "names"} for g in groups], cfg.lr, cfg.betas,
                    fused=not trainer.sharded(cfg, ctx))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_linear(s, cfg.steps, cfg.warmup))
        return opt, sched

    def batches(self, ctx: Context, start_micro: int):
        """Micro-batch m of rank r holds samples (m * world + r) * B ... of the stream: a pure function of
        the step, so a resumed run sees exactly the samples it would have seen."""
        cfg = self.cfg
        self.start = start_micro // cfg.accum_steps
        self.t0 = time.perf_counter()
        b = cfg.batch_size
        sampler = [list(range((m * ctx.world + ctx.rank) * b, (m * ctx.world + ctx.rank + 1) * b))
                   for m in range(start_micro, cfg.steps * cfg.accum_steps)]
        # the samples are generated, endlessly: only the CPUs bound the workers
        workers = capped_workers(cfg.loader_workers, sys.maxsize, 0, cfg.output, ctx.world, ctx.main)
        return iter(torch.utils.data.DataLoader(self.train_set, batch_sampler=sampler, num_workers=workers,
                                                collate_fn=collate, pin_memory=ctx.device.type == "cuda"))

    def loss(self, model, batch: dict, ctx: Context, autocast) -> torch.Tensor:
        with autocast:
            logits = model(normalize(batch["image"], ctx.device))
        return F.cross_entropy(logits.float(), batch["label"].to(ctx.device))

    def describe(self, model, ctx: Context, start: int) -> str:
        cfg = self.cfg
        n = sum(p.numel() for p in model.parameters())
        return (f"train-filter {cfg.filter}: ViT {model.encoder.width}x{model.encoder.depth} ({n / 1e6:.1f}M "
                f"params) at {cfg.input_px}px on {ctx.world} x {ctx.device.type}, classes {self.spec.classes}, "
                f"{len(self.train_photos)} training + {len(self.val_photos)} validation photos"
                f"{f', {len(self.renders)} render frames' if self.renders else ''}{self._html_note()}, held out "
                f"{list(self.spec.holdout)}, batch {cfg.batch_size} x {ctx.world}, {cfg.steps} steps from {start}")

    def _html_note(self) -> str:
        i = self.html.info
        return f", {i['train_pages']} + {i['validation_pages']} HTML screenshots" if self.html.available else ""

    def checkpoint_extras(self, model) -> dict:
        return {"filter": self.cfg.filter, "classes": self.spec.classes, "timm_kwargs": model.timm_kwargs()}

    def summary(self, ctx: Context, final_loss: float) -> dict:
        return {"train_seconds": time.perf_counter() - self.t0, "steps_run": self.cfg.steps - self.start,
                "final_loss": final_loss}


def train_loop(config: dict) -> dict:
    """The body of every process (this one, or each Ray Train worker)."""
    return trainer.train(FilterRecipe(config_from(config)))


# --- validation and the card ----------------------------------------------------------------------
@torch.no_grad()
def predict_scores(model: FilterModel, images: np.ndarray, keep_index: int, batch: int = 64) -> np.ndarray:
    """Reject scores of uint8 (N, 3, S, S) model inputs."""
    model.eval()
    device = next(model.parameters()).device
    out = [reject_scores(model(normalize(torch.as_tensor(images[i:i + batch]), device)), keep_index)
           for i in range(0, len(images), batch)]
    return np.concatenate(out) if out else np.zeros(0)


def validation_set(recipe: FilterRecipe, split: str, n: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    data = FilterSamples(recipe.spec, recipe.val_photos, recipe.cfg.input_px, recipe.cfg.seed, recipe.cfg.settings(),
                         recipe.renders, split, recipe.scene_text, recipe.html.val)
    items = [data.sample(k) for k in range(n)]
    return np.stack([i[0] for i in items]), np.array([i[2] for i in items], bool), [i[3] for i in items]


def validate(model: FilterModel, recipe: FilterRecipe) -> dict:
    """Threshold chosen on the seen families (validation photos), figures on both sets."""
    cfg, keep = recipe.cfg, recipe.spec.classes.index(recipe.spec.keep_class)
    seen_x, seen_y, seen_f = validation_set(recipe, "val_seen", cfg.val_samples)
    held_x, held_y, held_f = validation_set(recipe, "val_heldout", cfg.val_samples)
    seen_s, held_s = predict_scores(model, seen_x, keep), predict_scores(model, held_x, keep)
    threshold = card_threshold(seen_s, seen_y, cfg.target_precision)  # a coin-flip filter deletes nothing
    return {"threshold": threshold,
            "seen": figures(seen_s, seen_y, seen_f, threshold["score"]),
            "heldout": figures(held_s, held_y, held_f, threshold["score"])}


def write_card(out: Path, model: FilterModel, recipe: FilterRecipe, validation: dict, training: dict) -> Path:
    cfg, spec = recipe.cfg, recipe.spec
    weights = out / WEIGHTS_NAME
    with catalog.atomic_path(weights) as tmp:
        torch.save(model.timm_state_dict(), tmp)
    card = {
        "format": CARD_FORMAT,
        "filter": cfg.filter,
        "weights": WEIGHTS_NAME,
        "architecture": {"library": "timm", "class": "timm.models.vision_transformer.VisionTransformer",
                         "kwargs": model.timm_kwargs()},
        "input": cards.input_spec(cfg.input_px),
        "classes": spec.classes,
        "keep_class": spec.keep_class,
        "score": f"1 - P({spec.keep_class}); higher = reject",
        "threshold": validation["threshold"],
        "generator": {"settings": cfg.settings().to_dict(), "seed": cfg.seed, "positive_families": list(spec.positive),
                      "negative_families": list(spec.negative), "holdout": list(spec.holdout),
                      "scene_text_strings": len(recipe.scene_text),
                      "html_pages": cfg.html_pages, "html_screenshots": recipe.html.info},
        "validation": validation,
        "training": training,
    }
    catalog.write_json(out / CARD_NAME, card)
    return out / CARD_NAME


# --- entry point ----------------------------------------------------------------------------------
def train_filter(cfg: FilterConfig) -> dict:
    """Train, validate on the held-out families, write OUT/model.pt and OUT/card.json. Returns the card."""
    if not cfg.output:
        raise ValueError("--output is required: the folder for the card, the weights and checkpoints")
    if not cfg.images:
        raise ValueError("--images is required: a curation run (its kept samples), its shards, tars or image files")
    cfg = run_folder.resolved(cfg)
    if cfg.encoder and not Path(cfg.encoder).is_file():
        raise FileNotFoundError(f"--encoder {cfg.encoder}: no such file (an MAE encoder export OUT/encoder.pth)")
    if cfg.renders and Path(cfg.renders).is_dir():
        run_kind.require(cfg.renders, ("render",), "--renders", "pass a render run (humanset render --output RUN)")
    run_folder.check(cfg, "filter")  # before the photos are read: a refused folder costs nothing
    t0 = time.perf_counter()
    photos, renders = read_inputs(cfg)  # before the folder is written: bad --images leave it untouched
    with run_folder.owned(cfg, "filter"):
        return _train_filter(cfg, photos, renders, t0)


def _train_filter(cfg: FilterConfig, photos: list, renders: list, t0: float) -> dict:
    if cfg.filter == "art" and not renders:
        log.info("art: no --renders given: the '3d render' family is left out")
    log.debug("train-filter %s: %d clean photos from %s%s", cfg.filter, len(photos), cfg.images,
             f", {len(renders)} render frames" if renders else "")
    recipe = FilterRecipe(cfg, photos, renders)
    if cfg.workers:
        trainer.launch_ray(train_loop, cfg, f"train-filter-{cfg.filter}")  # its paths resolved (run_folder)
        run = {"train_seconds": time.perf_counter() - t0, "steps_run": None, "final_loss": None}
    else:
        run = trainer.train(recipe)
    # the model as its last checkpoint holds it (the same in this process or after Ray Train)
    state = ckpt.load_checkpoint(ckpt.checkpoint_path(cfg.output, cfg.steps))
    model = build_model(cfg, len(recipe.spec.classes), load_weights=False)
    model.load_state_dict(state["model"])
    model.to("cuda" if torch.cuda.is_available() else "cpu")
    validation = validate(model, recipe)
    training = {**run, "total_seconds": time.perf_counter() - t0, "steps": cfg.steps, "batch_size": cfg.batch_size,
                "workers": cfg.workers, "lr": cfg.lr, "encoder": Path(cfg.encoder).name if cfg.encoder else None,
                "random_init": not cfg.encoder, "photos": {"train": len(recipe.train_photos),
                                                           "validation": len(recipe.val_photos)},
                "render_frames": len(renders), "device": str(next(model.parameters()).device),
                "torch_threads": torch.get_num_threads()}
    card_path = write_card(Path(cfg.output), model.cpu(), recipe, validation, training)
    h = validation["heldout"]
    log.debug("%s filter: held-out ROC AUC %s, precision %s recall %s at threshold %.3f -> %s", cfg.filter,
             _fmt(h["roc_auc"]), _fmt(h["at_threshold"]["precision"]), _fmt(h["at_threshold"]["recall"]),
             validation["threshold"]["score"], card_path)
    if validation["threshold"].get("rejects_nothing"):
        log.warning("%s filter: no better than chance on the validation photos (seen families ROC AUC %s, "
                    "z = %s, needs > %s); the card's threshold is 1.0, which rejects nothing. Train on more "
                    "photos (--images) or for more steps", cfg.filter, _fmt(validation["seen"]["roc_auc"]),
                    _fmt(validation["threshold"]["auc_z"]), CHANCE_Z)
    return json.loads(card_path.read_text())


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def demo_config(task: str, images, output, renders="", encoder: str = "", steps: int = 60) -> FilterConfig:
    """`make demo`: about a minute per filter on 2 cores: tiny preset at 64 px, a raised lr, 24 HTML pages
    (four Chromium windows) for the art filter."""
    return FilterConfig(filter=task, images=str(images), renders=str(renders or ""), output=str(output),
                        encoder=encoder, model="tiny", input_px=64, gen_px=128, batch_size=16, steps=steps,
                        warmup_steps=max(1, steps // 10), lr=1e-3, layer_decay=0.9, val_samples=96,
                        loader_workers=0, cpu_threads=2, checkpoint_every=steps, max_images=200,
                        log_every=max(1, steps // 3),  # at most 4 progress lines, however slow the machine
                        target_precision=0.9, html_pages=24, resume="auto")  # a rerun continues an interrupted demo


def summary_line(card: dict) -> str:
    v = card["validation"]
    h, s = v["heldout"], v["seen"]
    return (f"{card['filter']}: held-out {card['generator']['holdout']} ROC AUC {_fmt(h['roc_auc'])}, precision "
            f"{_fmt(h['at_threshold']['precision'])} / recall {_fmt(h['at_threshold']['recall'])} at "
            f"{v['threshold']['score']:.3f}; seen families ROC AUC {_fmt(s['roc_auc'])}; "
            f"{card['training']['train_seconds']:.0f} s training")

