"""What a render run is: its spec (RunSpec, stored as OUT/render.json), the names of its shards and
frames, where a shard's frames are staged, and which shards are still to render. render/run/job.py (its
docstring has the layout of OUT) prepares, renders and packs runs of this spec.
"""
from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from catalog.storage import is_uri
from catalog.storage.paths import absolute

from render.run import plan
from render.config import RenderConfig
from render.run.files import HDRI_CATALOG, SCAN_CATALOG, read_table, run_store

PREFIX = "render"
MANIFEST = "render.json"
CONVENTIONS = {
    "world": "metres, Z up; the person stands on its bbox_min.z",
    "camera": "OpenCV: x right, y down, z forward; pixel centres at integer coordinates",
    "depth": "planar z along the optical axis, metres, float32; 0 = no person",
    "normal": "unit vectors in the OpenCV camera frame, towards the camera, float32; 0 = no person",
    "mask": "uint8, 255 where the pixel centre's ray hits the person",
    "parts": "uint8 class ids of the manifest's part vocabulary (sapiens28), 0 = background, set exactly "
             "where mask is; absent for scans without part labels",
}


def shard_name(shard: int) -> str:
    return f"{PREFIX}-{shard:05d}"


def frame_key(frame_index: int) -> str:
    return f"{frame_index:08d}"


@dataclass
class RunSpec:
    out: str
    seed: int
    frames: int
    scans: str  # "anny", or the scan library folder
    hdris: str  # "builtin" or the HDRI folder
    config: dict
    scan_ids: list | None = None  # the scans frames draw from, fixed when the run starts (None: anny)

    @property
    def cfg(self) -> RenderConfig:
        return RenderConfig.from_dict(self.config)

    @cached_property
    def _plan_args(self) -> tuple[int, int, int]:
        cfg = self.cfg
        return (len(self.scan_ids) if self.scan_ids else 1, cfg.schedule.frames_per_scan_visit,
                cfg.output.frames_per_shard)

    @property
    def n_shards(self) -> int:
        return plan.n_shards(self.frames, self._plan_args[2])

    def shard_frames(self, shard: int) -> list[int]:
        """Frame indices of `shard` in render order (scan-major: runs of one scan, see render.run.plan)."""
        return plan.shard_frames(self.seed, shard, self.frames, *self._plan_args)

    def to_dict(self) -> dict:
        return {"out": self.out, "seed": self.seed, "frames": self.frames, "scans": self.scans, "hdris": self.hdris,
                "config": self.config, "scan_ids": self.scan_ids}


def staging_dir(spec: RunSpec, shard: int) -> Path:
    """Where a shard's frames wait until it is packed: OUT/staging/NAME for a local OUT (a rerun renders
    only its missing frames); for an OUT on an object store a local scratch folder named by the run
    (so a restarted worker on the same machine still finds its finished frames), removed after upload."""
    if not is_uri(spec.out):
        return Path(spec.out) / "staging" / shard_name(shard)
    same = json.dumps({k: spec.to_dict()[k] for k in ("out", "seed", "scans", "hdris", "config", "scan_ids")},
                      sort_keys=True)
    run = hashlib.blake2b(same.encode(), digest_size=8).hexdigest()
    return Path(tempfile.gettempdir()) / f"humanset-render-{run}" / shard_name(shard)


def usable_hdris(spec: RunSpec) -> dict[str, str]:
    t = read_table(spec, HDRI_CATALOG).to_pylist()
    return {r["hdri_id"]: r["path"] for r in sorted(t, key=lambda r: r["hdri_id"]) if r["ok"]}


def usable_scans(spec: RunSpec) -> dict[str, dict]:
    t = read_table(spec, SCAN_CATALOG).to_pylist()
    return {r["scan_id"]: r for r in sorted(t, key=lambda r: r["scan_id"]) if r["ok"]}


def shard_done(spec: RunSpec, shard: int) -> bool:
    return run_store(spec).exists(f"shards/{shard_name(shard)}.stats.json")


def shards_todo(spec: RunSpec) -> list[int]:
    """Shards without their completion marker, from one listing of OUT/shards (paged on object stores)."""
    done = {e.path for e in run_store(spec).list("shards", suffix=".stats.json")}
    return [s for s in range(spec.n_shards) if f"shards/{shard_name(s)}.stats.json" not in done]


IDENTITY = ("seed", "scans", "hdris", "config")  # what a resume must not change (frames may grow)


def run_identity(manifest: dict) -> dict:
    """IDENTITY as a manifest records it, the config without `storage`: how the store is talked to is not
    part of what a run renders."""
    out = {k: manifest.get(k) for k in IDENTITY}
    out["config"] = {k: v for k, v in (out["config"] or {}).items() if k != "storage"}
    return out


def resume_manifest(store, out, spec: RunSpec) -> dict | None:
    """The manifest of the run OUT holds, checked against `spec` (whose frames it may raise); None if
    the run was never started (or its first start was refused before the manifest)."""
    if not store.exists(MANIFEST):
        return None
    old = store.read_json(MANIFEST)
    was = run_identity(old)
    for k in ("scans", "hdris"):  # older runs recorded the paths as given
        if was[k] not in (None, "anny", "builtin"):
            was[k] = absolute(was[k])
    now = run_identity(spec.to_dict())
    if was != now:
        changed = sorted(k for k in now if was[k] != now[k])
        raise ValueError(f"{out} was rendered with a different {', '.join(changed)}; resuming would mix "
                         "parameters. Use a new --output, or the original settings.")
    if old.get("frames", 0) > spec.frames:
        spec.frames = int(old["frames"])  # never shrink a run; extra frames were already promised
    if spec.frames > old.get("frames", 0):
        spec.scan_ids = old.get("scan_ids")
        window = plan.window_frames(*spec._plan_args)
        spec.__dict__.pop("_plan_args", None)  # cached: prepare_run sets scan_ids for good
        if old.get("frames", 0) % window:
            raise ValueError(f"{out}: a run of {old['frames']} frames cannot grow to {spec.frames}: its last plan "
                             f"window ({window} frames, render.run.plan) is partial and would be re-planned. Start "
                             f"runs that will grow with a multiple of {window} frames, or render the new frames "
                             f"into a new --output.")
    return old


def index_inputs(spec: RunSpec) -> tuple[list, list | None]:
    """The HDRI and scan catalogs' rows (in memory), refused unless each has a usable entry."""
    for flag, value, word, what in (("--scans", spec.scans, "anny", "scans (OBJ+MTL, FBX, glTF, PLY)"),
                                    ("--hdris", spec.hdris, "builtin", ".hdr/.exr environment maps")):
        if value != word and not Path(value).is_dir():  # before Blender is loaded to index the other one
            raise FileNotFoundError(f"{flag} {value}: no such folder; pass a folder of {what}, or {flag} {word}")
    from render import scans as scan_index  # imports Blender's helpers: only when a run starts
    hdri_rows = scan_index.index_hdris(spec.hdris)
    if not any(r["ok"] for r in hdri_rows):
        reasons = sorted({r.get("reject_reason") or "?" for r in hdri_rows})[:3]
        raise ValueError(f"--hdris {spec.hdris}: no readable HDRI ({'; '.join(reasons)}); pass a folder of "
                         ".hdr/.exr files, or --hdris builtin")
    scan_rows = None
    if spec.scans != "anny":
        scan_rows = scan_index.index_scans(spec.scans)
        if not any(r["ok"] for r in scan_rows):
            reasons = sorted({r.get("reject_reason") or "?" for r in scan_rows})[:3]
            raise ValueError(f"--scans {spec.scans}: no usable scan ({'; '.join(reasons)}); "
                             "`humanset render scan-index` lists why each is rejected")
    return hdri_rows, scan_rows
