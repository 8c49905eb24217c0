"""Evaluate a fine-tuned checkpoint on held-out data (no augmentation).

    evaluate("runs/depth/checkpoints/step-00001000.pt", data="RENDER_RUN")
      -> {"task": "depth", "n": 120, "rmse": ..., "absrel": ..., "delta1": ...}

pose: OKS AP over ground-truth person boxes (top-down, as Sapiens reports); seg: mIoU / mAcc at the
label resolution; depth: per-image RMSE / AbsRel / delta1 after scale-and-shift alignment, averaged;
normals: angular error statistics over all person pixels.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import catalog

from . import metrics
from .data import normalize
from .finetune import build_dataset, load_task_model
from .keypoints import apply_affine, heatmap_keypoints
from .sampler import collate
from .vocab import load as load_vocab

log = logging.getLogger(__name__)


@torch.no_grad()
def evaluate(checkpoint, data: str | None = None, images: str | None = None, batch_size: int = 4,
             limit: int | None = None, device: str | None = None) -> dict:
    model, cfg = load_task_model(checkpoint)
    if data:
        cfg.data = str(data)
    if images:
        cfg.images = str(images)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(dev)
    dataset = build_dataset(cfg, train=False)
    n = len(dataset) if limit is None else min(limit, len(dataset))
    conf = None
    depth_rows, normal_errors, pose_preds = [], [], {}
    from tqdm import tqdm
    for start in tqdm(range(0, n, batch_size), desc=f"evaluate {cfg.task}", unit="batch"):
        batch = collate([dataset[i] for i in range(start, min(n, start + batch_size))])
        out = model(normalize(batch["image"], dev)).float().cpu()
        if cfg.task == "seg":
            labels = batch["labels"]
            pred = F.interpolate(out, size=labels.shape[-2:], mode="bilinear", align_corners=False).argmax(1)
            c = metrics.confusion(pred.numpy(), labels.numpy(), out.shape[1])
            conf = c if conf is None else conf + c
        elif cfg.task == "depth":
            pred = F.interpolate(out, size=batch["depth"].shape[-2:], mode="bilinear", align_corners=False)
            for p, g, m in zip(pred[:, 0].numpy(), batch["depth"][:, 0].numpy(), batch["mask"][:, 0].numpy()):
                if (m & (g > 0)).sum() >= 2:
                    depth_rows.append(metrics.depth_scores(p, g, m))
        elif cfg.task == "normal":
            pred = F.interpolate(out, size=batch["normal"].shape[-2:], mode="bilinear", align_corners=False)
            for p, g, m in zip(pred.numpy(), batch["normal"].numpy(), batch["mask"][:, 0].numpy()):
                m = m & (np.linalg.norm(g, axis=0) > 0.5)
                normal_errors.append(metrics.angular_errors(p.transpose(1, 2, 0), g.transpose(1, 2, 0), m))
        else:
            for hm, inv, ann in zip(out.numpy(), batch["inv"].numpy(), batch["ann"].numpy()):
                xy, peak = heatmap_keypoints(hm)
                pose_preds[int(ann)] = (apply_affine(xy, inv), float(peak.mean()))
    result: dict = {"task": cfg.task, "checkpoint": str(checkpoint), "n": n}
    if cfg.task == "seg":
        scores = metrics.seg_scores(conf)
        names = load_vocab(cfg.vocab).names
        scores["IoU"] = {name: v for name, v in zip(names, scores["IoU"]) if v == v}
        scores["Acc"] = {name: v for name, v in zip(names, scores["Acc"]) if v == v}
        result.update(scores)
    elif cfg.task == "depth":
        if not depth_rows:
            raise ValueError(f"{cfg.data}: no frame with person depth to evaluate")
        result.update(metrics.mean_dicts(depth_rows))
    elif cfg.task == "normal":
        result.update(metrics.normal_scores(np.concatenate(normal_errors)))
    else:
        result.update(pose_ap_from(dataset, pose_preds))
    log.info("%s", {k: v for k, v in result.items() if not isinstance(v, dict)})
    return result


def pose_ap_from(dataset, preds: dict) -> dict:
    """Group per image: every annotation of an image is a ground truth, each evaluated crop a prediction."""
    by_image: dict = {}
    for i, a in enumerate(dataset.anns):
        entry = by_image.setdefault(a["image_id"], {"gt": [], "pred": []})
        area = a.get("area") or a["bbox"][2] * a["bbox"][3]
        entry["gt"].append((np.asarray(a["keypoints"], np.float64).reshape(-1, 3), float(area)))
        if i in preds:
            entry["pred"].append(preds[i])
    images = [v for v in by_image.values() if v["pred"]]
    return metrics.pose_ap(images, dataset.vocab.sigmas)


def write_result(result: dict, out) -> Path:
    catalog.write_json(out, result)
    return Path(out)
