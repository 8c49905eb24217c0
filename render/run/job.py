"""A render run: plan, resume, render shards in a warm worker, write shards and catalogs.

Layout of a run directory OUT:
  render.json                      the run's manifest: seed, frames, config, scan and HDRI sources
  catalog/scans/*.parquet          SCANS rows (the indexed library, or one row per generated anny body)
  catalog/hdris/hdris.parquet      HDRIS rows
  catalog/frames/render-NNNNN.parquet  FRAMES rows of shard NNNNN, failed frames included (error set)
  shards/render-NNNNN.tar|.parquet the WebDataset shard and its index (schema FRAMES)
  shards/render-NNNNN.stats.json   completion marker: a shard with stats is never rendered again
  contact/render-NNNNN.png         contact sheet: RGB | depth | normals | part labels (or mask)
  staging/render-NNNNN/            frames of an unfinished shard; `{key}.json` is written last, so a
                                   frame with its json is done. Rerunning renders only missing frames.
                                   `{key}.attempt.json` is written before a frame renders and removed
                                   after: one left behind means the worker died inside that frame.
  crashes/{hash}.json              a scan that crashed Blender: rejected for the rest of the run

OUT may be a URI (s3://bucket/runs/synth): every file above is then an object written through
catalog.storage (whole or not at all), the run lock is the store's `.lock` object, and resume is one
listing of OUT/shards. Frames are staged in a local scratch folder instead (see `staging_dir`), removed
once their shard is uploaded; the attempt markers and crash records, which must outlive a dead worker,
stay on OUT (`staging/render-NNNNN/{key}.attempt.json`, `crashes/`).

Frame i's parameters come from (seed, i) alone; render.run.plan decides which shard holds it (scan-major
runs of `schedule.frames_per_scan_visit` frames of one scan). A worker process that dies inside a frame
(a Blender crash) is restarted (Ray: `schedule.max_restarts`); the frame is tried again up to
`schedule.max_frame_attempts` times, then failed with error "blender_crash". Its scan is rejected after
the first crash: later frames of that scan fail with "blender_crash" without loading it, and the run's
scan catalog marks it (ok = false, reject_reason "blender_crash: ...") when the run ends.

The run's spec, shard names and staging folders live in render/run/spec.py, its files in render/run/files.py.
"""
from __future__ import annotations

import atexit
import json
import logging
import shutil
import sys
import time
from pathlib import Path

import numpy as np

import catalog
from catalog import FRAMES, HDRIS, SCANS, ShardWriter, conform
from catalog import run_kind
from catalog.storage import is_uri, retry, run_root, storage_for
from catalog.storage.lock import LEASE_S
from catalog.storage.paths import absolute

from render.run import output as outfmt
from render.config import RenderConfig
from render.run.files import (HDRI_CATALOG, SCAN_CATALOG, crash_file, crashed_scans, read_table, reject_crashed_scans,
                              run_store)
from render.run.spec import (CONVENTIONS, MANIFEST, PREFIX, RunSpec, frame_key, index_inputs,
                             resume_manifest, run_identity, shard_done, shard_name, shards_todo, staging_dir, usable_hdris,
                             usable_scans)

log = logging.getLogger(__name__)


# --- planning --------------------------------------------------------------------------------------
_HELD_LOCKS: dict = {}  # OUT -> its catalog.run_lock, held until this process ends
_HELD: dict = {}  # OUT on an object store -> its lock's Held


def prepare_run(out, scans: str, hdris: str, frames: int, seed: int, cfg: RenderConfig,
                force_unlock: bool = False, lock_lease: float = LEASE_S) -> RunSpec:
    """Check OUT and the inputs, then (holding OUT's lock) write the run's marker, its catalogs of scans
    and HDRIs (at the first start) and its manifest. Nothing is written before every check passed:
    a refused start leaves OUT as it was."""
    remote = is_uri(str(out))
    out = run_root(out) if remote else Path(out)
    key = out if remote else str(out.resolve())
    store = storage_for(key)
    scans = scans if scans == "anny" else absolute(scans)  # recorded resolved: the run works from anywhere
    hdris = hdris if hdris == "builtin" else absolute(hdris)
    config = json.loads(json.dumps(cfg.to_dict()))  # as the manifest stores it (tuples become lists)
    spec = RunSpec(key, int(seed), int(frames), str(scans), str(hdris), config)
    identity = run_identity(spec.to_dict())
    run_kind.check(key, "render", identity)
    old = resume_manifest(store, out, spec)
    fresh = None if old else index_inputs(spec)  # a resume reuses the catalogs its first start wrote
    if key not in _HELD_LOCKS:  # OUT stays locked for the life of this process
        lock = catalog.run_lock(out) if not remote else store.run_lock(force=force_unlock, lease_s=lock_lease)
        try:
            held = lock.__enter__()
        except catalog.RunLocked as e:
            raise ValueError(str(e)) from None
        _HELD_LOCKS[key] = lock
        if remote:
            _HELD[key] = held  # .check() raises LockLost once another run took the lock over
        # released at exit: a local .lock is removed, an object-store lock does not wait out its lease
        atexit.register(release_run, key)
    run_kind.claim(store, "render", identity)  # the first write
    if not remote:
        catalog.clean_tmp(out)
    if fresh is not None:
        hdri_rows, scan_rows = fresh
        store.write_parquet(HDRI_CATALOG, conform(hdri_rows, HDRIS))
        if scan_rows is not None:
            store.write_parquet(SCAN_CATALOG, conform(scan_rows, SCANS))
        else:
            store.delete(SCAN_CATALOG)  # left by an older humanset's refused start
    from render import parts
    if scans != "anny":
        # fixed at the first start: crash rejections later in the run never change what frames draw
        spec.scan_ids = old["scan_ids"] if old and old.get("scan_ids") else list(usable_scans(spec))
        spec.__dict__.pop("_plan_args", None)
    store.write_json(MANIFEST, {**spec.to_dict(), "part_vocabulary": parts.vocabulary()})
    return spec


def check_lock(spec: RunSpec) -> None:
    """Raise LockLost if another process took this run's object-store lock over (--force-unlock):
    called before each shard is handed out, so no shard is written into a run taken over."""
    held = _HELD.get(spec.out)
    if held is not None:
        held.check()


def release_run(out: str) -> None:
    """Give up this process's lock on OUT (RunSpec.out); at exit for an OUT on an object store."""
    lock, _ = _HELD_LOCKS.pop(out, None), _HELD.pop(out, None)
    if lock is not None:
        lock.__exit__(None, None, None)



# --- the worker ------------------------------------------------------------------------------------
class ShardRenderer:
    """Renders whole shards. Keeps one warm Blender (and the anny model) for its whole life."""

    def __init__(self, spec: RunSpec | dict, threads: int | None = None):
        self.spec = spec if isinstance(spec, RunSpec) else RunSpec(**spec)
        self.cfg = self.spec.cfg
        retry.configure(self.spec.config)  # its storage.retry_* in this worker
        if threads is not None and self.cfg.cycles.threads == 0:
            self.cfg.cycles.threads = threads  # a Ray actor renders with the CPUs it reserved, not the node's
        self.hdris = usable_hdris(self.spec)
        self.scans = None
        if self.spec.scans != "anny":
            rows = read_table(self.spec, SCAN_CATALOG).to_pylist()
            by_id = {r["scan_id"]: r for r in rows}
            self.scans = {s: by_id[s] for s in self.spec.scan_ids}
        self._renderer = None

    @property
    def renderer(self):
        if self._renderer is None:
            from render.blender import get_renderer
            self._renderer = get_renderer(self.cfg.cycles)
        return self._renderer

    def render_shard(self, shard: int) -> dict:
        spec, store = self.spec, run_store(self.spec)
        name = shard_name(shard)
        if shard_done(spec, shard):
            return store.read_json(f"shards/{name}.stats.json")
        staging = staging_dir(spec, shard)
        staging.mkdir(parents=True, exist_ok=True)
        t0, rendered_now = time.time(), 0
        for i in spec.shard_frames(shard):
            if not (staging / f"{frame_key(i)}.json").exists():
                self.render_frame_to(staging, i)
                rendered_now += 1
        stats = pack_shard(spec, shard)
        stats["rendered_this_run"] = rendered_now
        stats["seconds_this_run"] = round(time.time() - t0, 2)
        store.write_json(f"shards/{name}.stats.json", stats)  # completion marker, last
        shutil.rmtree(staging, ignore_errors=True)
        if is_uri(spec.out) and not any(staging.parent.iterdir()):
            shutil.rmtree(staging.parent, ignore_errors=True)
        return stats

    def scan_of(self, i: int) -> str | None:
        """The library scan frame i shows (None for generated anny bodies: one body per frame)."""
        if self.scans is None:
            return None
        from render.sampling import scan_draw
        return self.spec.scan_ids[scan_draw(self.spec.seed, i, len(self.spec.scan_ids))]

    def render_frame_to(self, staging: Path, i: int) -> dict:
        """Render frame i into the staging folder: members first, the json sidecar last.

        An attempt marker brackets the render; finding one means this frame killed the previous worker
        process (Blender crashed), which counts against the frame and rejects its scan for the run. The
        marker is OUT/staging/NAME/{key}.attempt.json (a local OUT's staging folder; on an object store
        an object there, so a worker restarted on another node finds it too)."""
        t = time.time()
        key = frame_key(i)
        store, marker = run_store(self.spec), f"staging/{staging.name}/{key}.attempt.json"
        crashes = store.read_json(marker)["attempts"] if store.exists(marker) else 0
        scan_id = self.scan_of(i)
        if crashes and scan_id is not None:
            log.warning("frame %d: the render process died in it (%d time(s)); rejecting scan %s for this run",
                        i, crashes, scan_id)
            path = crash_file(scan_id)
            if not store.exists(path):
                store.write_json(path, {"scan_id": scan_id, "frame_index": i, "attempts": crashes})
        crashed = crashed_scans(self.spec).get(scan_id) if scan_id is not None else None
        frame, members, scan_row = None, {}, None
        if crashes >= self.cfg.schedule.max_frame_attempts or (crashed is not None and not crashes):
            detail = (f"Blender's process died {crashes} time(s) rendering this frame" if crashes else
                      f"scan {scan_id} crashed Blender on frame {crashed['frame_index']}; rejected for this run")
            log.warning("frame %d failed: blender_crash (%s)", i, detail)
            frame = {"frame_index": i, "seed": self.spec.seed, "scan_id": scan_id, "error": "blender_crash",
                     "params": {"error_detail": detail}}
        else:
            store.write_json(marker, {"attempts": crashes + 1, "scan_id": scan_id})
            try:
                frame, members, scan_row = self.render_frame(i)
            except Exception as e:  # noqa: BLE001  (one bad frame must not stop the job)
                log.warning("frame %d failed: %s", i, e)
                frame = {"frame_index": i, "seed": self.spec.seed, "error": f"{type(e).__name__}: {e}"}
            except BaseException:  # an interrupt is not a crash of this frame
                store.delete(marker)
                raise
        frame["render_seconds"] = round(time.time() - t, 3)
        t_write = time.time()
        for ext, data in members.items():
            catalog.write_bytes(staging / f"{key}.{ext}", data)
        if scan_row is not None:
            catalog.write_json(staging / f"{key}.scan.jsonrow", scan_row)
        if frame.get("timings") is not None:
            frame["timings"]["write_s"] = round(time.time() - t_write, 4)
        catalog.write_json(staging / f"{key}.json", frame)
        store.delete(marker)
        return frame

    def render_frame(self, i: int) -> tuple[dict, dict, dict | None]:
        from render import sampling
        from render.scene import FileMeshInput, MeshInput, SceneInput
        t_start = time.time()
        spec, cfg = self.spec, self.cfg
        scan_ids = list(spec.scan_ids) if self.scans is not None else ["anny"]
        scene = sampling.sample_scene(spec.seed, i, scan_ids, list(self.hdris), cfg.sampling)
        warnings, body_params, scan_row, joints = [], None, None, None
        if self.scans is None:
            from render import bodies
            body = bodies.make_body(spec.seed, i, cfg.sampling.body)
            scene["scan_id"] = bodies.body_id(body.params)
            body_params = body.params
            joints = body.keypoints3d
            mesh = MeshInput(body.vertices, body.faces, body.uvs, body.texture, name="person", face_labels=body.parts)
            bbox = body.bbox
            scan_row = {"scan_id": scene["scan_id"], "path": None, "format": "anny", "ok": True, "warnings": [],
                        "texture": None, "unit_scale": 1.0, "up_axis": "Z", "n_triangles": len(body.faces),
                        "bbox_min": bbox[0].tolist(), "bbox_max": bbox[1].tolist(),
                        "params": json.dumps(body.params, sort_keys=True)}
        else:
            row = self.scans[scene["scan_id"]]
            warnings = list(row.get("warnings") or [])
            mesh = FileMeshInput(row["path"], unit_scale=row["unit_scale"], up_axis=row["up_axis"],
                                 texture=row.get("texture"))
            bbox = (np.asarray(row["bbox_min"]), np.asarray(row["bbox_max"]))
        cam = sampling.sample_camera(spec.seed, i, *bbox, cfg.sampling.camera)
        K, T = cam.pop("K"), cam.pop("cam_to_world")
        t_setup = time.time()
        result = self.renderer.render(SceneInput(
            mesh=mesh, hdri_path=self.hdris[scene["hdri_id"]], hdri_rotation_deg=scene["hdri_rotation_deg"],
            hdri_strength=scene["hdri_strength"], K=K, cam_to_world=T, height=cam["height"], width=cam["width"]))
        parts_gt = ({"vocabulary": "sapiens28"} if "parts" in result
                    else {"missing": "the scan has no part labels: no parts.png"})
        params = {"scene": scene, "camera": cam, "body": body_params, "parts": parts_gt,
                  "cycles": {k: v for k, v in vars(cfg.cycles).items()}, "device": self.renderer.device}
        frame = {"frame_index": i, "key": frame_key(i), "seed": spec.seed, "scan_id": scene["scan_id"],
                 "hdri_id": scene["hdri_id"], "height": cam["height"], "width": cam["width"],
                 "K": K.tolist(), "cam_to_world": T.tolist(), "params": params, "warnings": warnings,
                 "person_px": int((result["mask"] > 0).sum()), "conventions": CONVENTIONS, "error": None,
                 "timings": {**result.get("timings", {}), "sample_s": round(t_setup - t_start, 4)}}
        if joints is not None:
            from render.bodies import COCO17
            frame["keypoints_coco17"] = sampling.keypoints_2d(joints, K, T, result["depth_m"])
            frame["keypoint_names"] = COCO17
            frame["keypoints3d_world"] = np.round(joints, 5).tolist()
        return frame, outfmt.encode_frame(result), scan_row


# --- packing a finished shard ----------------------------------------------------------------------
def pack_shard(spec: RunSpec, shard: int) -> dict:
    """Staged frames -> shard tar + index, frame catalog, scan rows (anny), contact sheet."""
    store, name = run_store(spec), shard_name(shard)
    staging = staging_dir(spec, shard)
    cfg = spec.cfg
    writer = ShardWriter(store.child("shards"), PREFIX, FRAMES, max_count=1 << 30, max_bytes=1 << 62)
    writer.index = shard
    rows, scan_rows, contact = [], [], []
    for i in spec.shard_frames(shard):
        key = frame_key(i)
        frame = catalog.read_json(staging / f"{key}.json")
        row = {"key": key, "frame_index": i, "scan_id": frame.get("scan_id"), "hdri_id": frame.get("hdri_id"),
               "height": frame.get("height"), "width": frame.get("width"),
               "params": json.dumps(frame.get("params"), sort_keys=True) if frame.get("params") else None,
               "K": np.ravel(frame["K"]).tolist() if frame.get("K") else None,
               "cam_to_world": np.ravel(frame["cam_to_world"]).tolist() if frame.get("cam_to_world") else None,
               "person_px": frame.get("person_px"), "render_seconds": frame.get("render_seconds"),
               "error": frame.get("error")}
        if frame.get("error"):
            rows.append(row)
            continue
        members = {ext: (staging / f"{key}.{ext}").read_bytes() for ext in outfmt.MEMBERS
                   if ext in outfmt.REQUIRED or (staging / f"{key}.{ext}").exists()}
        files = {**members, "json": frame}
        row["shard"] = writer.add(key, files, row)
        row["members"] = writer._rows[-1]["members"]  # offsets in the tar, so the catalog alone finds bytes
        rows.append(row)
        scan_file = staging / f"{key}.scan.jsonrow"
        if scan_file.exists():
            scan_rows.append(catalog.read_json(scan_file))
        if len(contact) < cfg.output.contact_rows:
            contact.append(outfmt.contact_row(members, cfg.output.contact_height))
    writer.close()
    store.write_parquet(f"catalog/frames/{name}.parquet", conform(rows, FRAMES))
    if scan_rows:
        store.write_parquet(f"catalog/scans/anny-{name}.parquet", conform(scan_rows, SCANS))
    if contact:
        store.write_bytes(f"contact/{name}.png", outfmt.contact_sheet(contact))
    errors = [r for r in rows if r["error"]]
    return {"shard": name, "frames": len(rows), "rendered": len(rows) - len(errors), "failed": len(errors),
            "errors": {r["key"]: r["error"] for r in errors},
            "render_seconds": round(sum(r["render_seconds"] or 0 for r in rows), 2)}


# --- running ---------------------------------------------------------------------------------------
def run_local(spec: RunSpec, progress: bool = True) -> list[dict]:
    """Render every missing shard in this process with one warm Blender. A bar on a terminal; otherwise
    the one log line per shard is the progress."""
    from tqdm import tqdm
    todo = shards_todo(spec)
    log.info("%s: %d frames in %d shards, %d to render", spec.out, spec.frames, spec.n_shards, len(todo))
    worker = ShardRenderer(spec)
    stats, bar = [], progress and sys.stderr.isatty()
    try:
        for s in tqdm(todo, desc="render shards", unit="shard", disable=not bar):
            check_lock(spec)  # stop before writing a shard into a run another process took over
            stats.append(worker.render_shard(s))
            log.info("%s: %d rendered, %d failed", stats[-1]["shard"], stats[-1]["rendered"], stats[-1]["failed"])
    finally:
        reject_crashed_scans(spec)
    return stats


def summary(spec: RunSpec) -> dict:
    files = sorted(e.path for e in run_store(spec).list("catalog/frames", suffix=".parquet")
                   if not e.path.rsplit("/", 1)[-1].startswith("."))
    if not files:
        return {"frames": 0, "rendered": 0, "failed": 0}
    errors = []
    for f in files:
        errors += read_table(spec, f, columns=["error"]).column("error").to_pylist()
    done = sum(e is None for e in errors)
    return {"frames": len(errors), "rendered": done, "failed": len(errors) - done,
            "shards_done": spec.n_shards - len(shards_todo(spec)), "shards": spec.n_shards}
