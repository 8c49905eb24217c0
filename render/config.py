"""The render config: sampling distributions, Cycles settings and output layout, with documented defaults.

`humanset render config` prints it as YAML; `--config FILE.yaml` and `--set camera.height=512` override.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from catalog import config as loader

from .scene import RenderSettings
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
    return loader.apply_sets(d, sets)


# settings whose default is not null but null is meaningful (checks of the others follow their defaults)
CHECKS = {"cycles.denoiser": loader.Check(("str",), nullable=True, choices=("INTEL", "OPTIX", None))}


def load_config(path=None, sets: list[str] | None = None) -> RenderConfig:
    """Defaults -> --config FILE -> --set -> validation (catalog.config, the loader of every room)."""
    return RenderConfig.from_dict(loader.load(RenderConfig().to_dict(), path, sets, CHECKS))
