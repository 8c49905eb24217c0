"""Reconstruction figure of a pretraining checkpoint: original | masked | reconstruction (MAE paper, fig. 2).

The reconstruction shows predicted pixels in the masked patches and the input in the visible ones.
With the per-patch normalised loss the model predicts normalised patches, so each is mapped back with
the true patch's mean and variance, as the MAE authors do for their figures.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from training.checkpoint import kind_of, load_checkpoint
from training.data import normalize
from training.image_decode import IMAGENET_MEAN, IMAGENET_STD, center_resize, read_image_file
from training.mae import MaskedAutoencoder

log = logging.getLogger(__name__)


def model_from_checkpoint(checkpoint) -> MaskedAutoencoder:
    state = load_checkpoint(checkpoint) if not isinstance(checkpoint, dict) else checkpoint
    kind = kind_of(state)
    if kind != "pretrain":
        raise ValueError(f"--checkpoint {checkpoint}: a {kind} checkpoint; vis draws an MAE's reconstructions: pass "
                         "a checkpoint of humanset pretrain (OUT/checkpoints/step-N.pt, or its run folder OUT)")
    cfg = state["config"]
    model = MaskedAutoencoder.from_preset(cfg["model"], cfg["image_size"], cfg["mask_ratio"], cfg["norm_pix_loss"])
    model.load_state_dict(state["model"])
    return model.eval()


@torch.no_grad()
def reconstruct(model: MaskedAutoencoder, image: Image.Image, mask_ratio: float | None = None, seed: int = 0):
    """-> (original, masked, reconstruction) as uint8 (S, S, 3) arrays; mask_ratio None: the model's own
    (the pretrain config's mask_ratio it was trained with)."""
    mask_ratio = model.mask_ratio if mask_ratio is None else mask_ratio
    size = model.encoder.img_size
    x = normalize(torch.from_numpy(center_resize(image, size)).unsqueeze(0))
    gen = torch.Generator().manual_seed(seed)
    _, pred, mask = model(x, mask_ratio=mask_ratio, generator=gen)
    if model.norm_pix_loss:
        target = model.patchify(x)
        mean, var = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
        pred = pred * (var + 1.0e-6) ** 0.5 + mean
    recon = model.unpatchify(pred)
    pixel_mask = model.unpatchify(mask.unsqueeze(-1).expand(-1, -1, pred.shape[-1]))  # 1 = removed
    masked = x * (1 - pixel_mask)
    pasted = x * (1 - pixel_mask) + recon * pixel_mask
    return to_uint8(x), to_uint8(masked, fill=pixel_mask), to_uint8(pasted)


def to_uint8(x: torch.Tensor, fill: torch.Tensor | None = None) -> np.ndarray:
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    img = (x * std + mean).clamp(0, 1)
    if fill is not None:  # removed patches shown grey, as in the paper
        img = img * (1 - fill) + 0.5 * fill
    return (img[0].permute(1, 2, 0).numpy() * 255 + 0.5).astype(np.uint8)


def figure(panels: list[np.ndarray], titles: list[str], gap: int = 6) -> Image.Image:
    """The panels side by side under their titles; small panels are enlarged (whole pixels, nearest) until
    each title fits over its panel."""
    draw = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    widest = max(draw.textlength(t) for t in titles) + 4
    h, w = panels[0].shape[:2]
    scale = max(1, math.ceil(widest / w))
    h, w = h * scale, w * scale
    title_h = 14
    out = Image.new("RGB", (len(panels) * w + (len(panels) - 1) * gap, h + title_h), "white")
    draw = ImageDraw.Draw(out)
    for i, (panel, title) in enumerate(zip(panels, titles)):
        out.paste(Image.fromarray(panel).resize((w, h), Image.NEAREST), (i * (w + gap), title_h))
        draw.text((i * (w + gap) + 2, 1), title, fill="black")
    return out


def pretrain_vis(checkpoint, image_path, out_path, mask_ratio: float | None = None, seed: int = 0) -> Path:
    image = read_image_file(image_path)  # before the model is built: a wrong file costs nothing
    model = model_from_checkpoint(checkpoint)
    mask_ratio = model.mask_ratio if mask_ratio is None else mask_ratio
    panels = reconstruct(model, image, mask_ratio, seed)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    figure(list(panels), ["original", f"masked {mask_ratio:.0%}", "reconstruction"]).save(out_path)
    log.debug("reconstruction figure -> %s", out_path)  # the callers print the path returned
    return out_path
