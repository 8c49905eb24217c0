"""The render config: sampling distributions, Cycles settings and output layout, with documented defaults.

`humanset render config` prints it as YAML; `--config FILE.yaml` and `--set camera.height=512` override.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field

import yaml

from .blender import RenderSettings
from .sampling import SamplingConfig


@dataclass
class OutputConfig:
    frames_per_shard: int = 64  # frames per WebDataset tar (and per resume/completion unit)
    contact_rows: int = 16  # frames shown on each shard's contact sheet
    contact_height: int = 192  # pixel height of one contact-sheet cell


@dataclass
class ScheduleConfig:
    # frames of one scan rendered back to back by one worker, scan kept loaded (render.plan); 1 = per-frame
    # order. Sapiens rendered ~830 frames per scan, so a scan is visited ~26 times at the default.
    frames_per_scan_visit: int = 32
    max_restarts: int = 4  # times a Ray render actor is restarted after its process died (Blender crash)
    max_frame_attempts: int = 2  # a frame whose scan crashed Blender this often is failed ("blender_crash")


@dataclass
class RenderConfig:
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    cycles: RenderSettings = field(default_factory=RenderSettings)
    output: OutputConfig = field(default_factory=OutputConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)

    def to_dict(self) -> dict:
        return {"sampling": self.sampling.to_dict(), "cycles": asdict(self.cycles), "output": asdict(self.output),
                "schedule": asdict(self.schedule)}

    @classmethod
    def from_dict(cls, d: dict | None) -> "RenderConfig":
        d = d or {}
        unknown = set(d) - {"sampling", "cycles", "output", "schedule"}
        if unknown:
            raise KeyError(f"unknown render config sections {sorted(unknown)}; use sampling, cycles, output, schedule")
        return cls(sampling=SamplingConfig.from_dict(d.get("sampling")),
                   cycles=_build(RenderSettings, d.get("cycles")), output=_build(OutputConfig, d.get("output")),
                   schedule=_build(ScheduleConfig, d.get("schedule")))


def _build(cls, d):
    d = dict(d or {})
    unknown = set(d) - set(cls.__dataclass_fields__)
    if unknown:
        raise KeyError(f"unknown {cls.__name__} keys {sorted(unknown)}; known: {sorted(cls.__dataclass_fields__)}")
    return cls(**d)


def apply_sets(d: dict, sets: list[str] | None) -> dict:
    """'sampling.camera.height=512' style overrides; values parsed as YAML. Unknown keys are errors."""
    d = copy.deepcopy(d)
    for item in sets or []:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected key=value, e.g. --set sampling.camera.height=512")
        key, value = item.split("=", 1)
        path = key.strip().split(".")
        node = d
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                raise KeyError(f"--set {item!r}: no config section {part!r} (have {sorted(node)})")
            node = node[part]
        if path[-1] not in node:
            raise KeyError(f"--set {item!r}: unknown key {path[-1]!r} (known here: {', '.join(sorted(node))})")
        node[path[-1]] = yaml.safe_load(value)
    return d


def load_config(path=None, sets: list[str] | None = None) -> RenderConfig:
    d = RenderConfig().to_dict()
    if path:
        from pathlib import Path
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"--config {p}: no such file")
        d = _merge(d, yaml.safe_load(p.read_text()) or {})
    return RenderConfig.from_dict(apply_sets(d, sets))


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
