"""The render config: sampling distributions, Cycles settings and output layout, with documented defaults.
The dataclasses are the defaults; their checks are field metadata (catalog.config.setting).

`humanset render config` prints it as YAML; `--config FILE.yaml` and `--set camera.height=512` override.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from catalog import config as loader
from catalog.config import setting
from catalog.storage.retry import StorageSettings

from render.scene import RenderSettings
from render.sampling import SamplingConfig


@dataclass
class OutputConfig:
    frames_per_shard: int = setting(64, "frames per WebDataset tar (and per resume/completion unit)", low=1)
    contact_rows: int = setting(16, "frames shown on each shard's contact sheet (0: no contact sheet)", low=0)
    contact_height: int = setting(192, "pixel height of one contact-sheet cell", low=8)


@dataclass
class ScheduleConfig:
    frames_per_scan_visit: int = setting(
        32, "frames of one scan rendered back to back by one worker, scan kept loaded (render.run.plan);\n"
            "1 = per-frame order. Sapiens rendered ~830 frames per scan, so a scan is visited ~26 times\n"
            "at the default", low=1)
    max_restarts: int = setting(4, "times a Ray render actor is restarted after its process died (Blender crash)",
                                low=0)
    max_frame_attempts: int = setting(2, 'a frame whose scan crashed Blender this often is failed ("blender_crash")',
                                      low=1)


@dataclass
class RenderConfig:
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    cycles: RenderSettings = field(default_factory=RenderSettings)
    output: OutputConfig = field(default_factory=OutputConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    storage: StorageSettings = field(default_factory=StorageSettings)  # retries of requests to s3:// (docs/storage.md)

    def to_dict(self) -> dict:
        return {"sampling": self.sampling.to_dict(), "cycles": asdict(self.cycles), "output": asdict(self.output),
                "schedule": asdict(self.schedule), "storage": asdict(self.storage)}

    @classmethod
    def from_dict(cls, d: dict | None) -> "RenderConfig":
        return loader.build(cls, d, "render config")  # nested sections too; an unknown key is an error


def apply_sets(d: dict, sets: list[str] | None) -> dict:
    """'sampling.camera.height=512' style overrides; values parsed as YAML. Unknown keys are errors."""
    return loader.apply_sets(d, sets)


# the fields' checks (e.g. cycles.denoiser: INTEL, OPTIX or null); the others follow their defaults' types
CHECKS = loader.checks_of(RenderConfig)


def load_config(path=None, sets: list[str] | None = None) -> RenderConfig:
    """Defaults -> --config FILE -> --set -> validation (catalog.config, the loader of every room)."""
    return RenderConfig.from_dict(loader.load(RenderConfig().to_dict(), path, sets, CHECKS))
