"""Evaluate a fine-tuned checkpoint on held-out data (no augmentation).

    evaluate("runs/depth/checkpoints/step-00001000.pt", data="RENDER_RUN")
      -> {"task": "depth", "n": 120, "rmse": ..., "absrel": ..., "delta1": ...}

pose: OKS AP over ground-truth person boxes (top-down, as Sapiens reports) and PCK@0.05 / 0.1 / 0.2 of the
box's longer side; seg: mIoU / mAcc at the label resolution; depth: per-image RMSE / AbsRel / delta1 after
scale-and-shift alignment, averaged; normals: angular error statistics over all person pixels.
At small scale delta1 (~1.0 for a constant after the alignment) and AP (~0 for people of a few hundred
pixels) do not separate a model from a constant: read AbsRel / RMSE and PCK (docs/finetune.md).
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import catalog

from training.data import normalize
from training.tasks.finetune import build_dataset, check_data, load_task_model
from training.tasks.keypoints import apply_affine, heatmap_keypoints
from training.tasks.sampler import collate
from training.tasks.scoring import Scorer

log = logging.getLogger(__name__)


@torch.no_grad()
def evaluate(checkpoint, data: str | None = None, images: str | None = None, batch_size: int = 4,
             limit: int | None = None, device: str | None = None, baselines: bool = False) -> dict:
    """Metrics of a checkpoint on `data` (default: its own training data, which `scored_on` then says).
    With `baselines`, also the trivial baselines computed from the training data (training/tasks/baselines.py)."""
    model, cfg = load_task_model(checkpoint)
    train_data, train_images = cfg.data, cfg.images
    if data:
        cfg.data = str(data)
    if images:
        cfg.images = str(images)
    check_data(cfg.task, cfg.data, "--data" if data else "the checkpoint's training data")
    if baselines and not Path(train_data).exists():  # refused before the scoring, not after it
        raise FileNotFoundError(f"--baselines: the checkpoint's training data {train_data} is not there (checkpoints "
                                "of older humansets record it relative to where training ran: evaluate from there)")
    on_train = same_path(cfg.data, train_data)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(dev)
    dataset = build_dataset(cfg, train=False)
    n = len(dataset) if limit is None else min(limit, len(dataset))
    scorer = Scorer(cfg.task, dataset, model.head.out.out_channels if cfg.task == "seg" else None)
    from tqdm import tqdm
    for start in tqdm(range(0, n, batch_size), desc=f"evaluate {cfg.task}", unit="batch"):
        items = [dataset[i] for i in range(start, min(n, start + batch_size))]
        out = model(normalize(collate(items)["image"], dev)).float().cpu()
        for o, item in zip(out, items):
            pred, confidence = to_target_space(cfg.task, o, item)
            scorer.add(pred, item, confidence)
    result: dict = {"task": cfg.task, "checkpoint": str(checkpoint), "data": cfg.data,
                    "scored_on": "training data" if on_train else "other data", "n": n}
    result.update(scorer.result())
    if baselines:
        from training.tasks.baselines import trivial_baselines
        train_cfg = dataclasses.replace(cfg, data=train_data, images=train_images)
        result["baselines"] = trivial_baselines(cfg.task, build_dataset(train_cfg, train=False), dataset, limit)
    log.debug("%s", {k: v for k, v in result.items() if not isinstance(v, dict)})  # the command prints it all
    return result


def to_target_space(task: str, out: torch.Tensor, item: dict) -> tuple[np.ndarray, float]:
    """One model output (C, h, w) -> the prediction the Scorer takes (training/tasks/scoring.py), and a confidence."""
    if task == "pose":
        xy, peak = heatmap_keypoints(out.numpy())
        return apply_affine(xy, item["inv"]), float(peak.mean())
    key = {"seg": "labels", "depth": "depth", "normal": "normal"}[task]
    up = F.interpolate(out[None], size=item[key].shape[-2:], mode="bilinear", align_corners=False)[0]
    if task == "seg":
        return up.argmax(0).numpy(), 1.0
    return (up[0] if task == "depth" else up).numpy(), 1.0


def same_path(a, b) -> bool:
    return bool(a) and bool(b) and Path(a).resolve() == Path(b).resolve()


def write_result(result: dict, out) -> Path:
    catalog.write_json(out, result)
    return Path(out)
