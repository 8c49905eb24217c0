"""Stage registry: config name -> class, imported on first use."""
from __future__ import annotations

import importlib

from pipeline.stages.base import Resources, Stage

REGISTRY = {
    "decode": "pipeline.stages.decode:DecodeStage",
    "size": "pipeline.stages.size:SizeStage",
    "dedup": "pipeline.stages.dedup:DedupStage",
    "person": "pipeline.stages.person:PersonStage",
    "text": "pipeline.stages.text:TextStage",
    "watermark": "pipeline.stages.watermark.stage:WatermarkStage",
    "art": "pipeline.stages.art:ArtStage",
}


def stage_class(name: str) -> type[Stage]:
    if name not in REGISTRY:
        raise KeyError(f"unknown stage {name!r}; known stages: {', '.join(REGISTRY)}")
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)


def build_stages(cfg: dict) -> list[Stage]:
    """The configured stages, in cascade order, each with its config section."""
    stages = [stage_class(name)(cfg.get(name) or {}) for name in cfg["stages"]]
    if [s.name for s in stages[:3]] != ["decode", "size", "dedup"][:len(stages[:3])]:
        raise ValueError("config stages must start with decode, size, dedup (in that order)")
    return stages


__all__ = ["REGISTRY", "Resources", "Stage", "build_stages", "stage_class"]
