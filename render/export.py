"""`humanset render export OUT --format sapiens|coco --to PATH`: a render run in the layout another trainer reads.

sapiens (DIR): the folders of Sapiens' own fine-tuning datasets (facebookresearch/sapiens,
seg/mmseg/datasets/depth_general.py, normal_general.py, pointmap_render_people.py; docs/rendering.md):
  images/{key}.png             RGB, as rendered
  masks/{key}.png              uint8, 255 = person, 0 = background (Sapiens reads channel 0 > 0)
  depths/{key}.npy             float32 H×W planar z in metres, 0 off the person
  normals/{key}.npy            float32 H×W×3 unit normals in `normal_frame`, 0 off the person
  parts/{key}.png              uint8 Sapiens-28 class ids, 0 = Background (only frames that have part labels)
  camera_intrinsics/{key}.txt  K, 3×3 pixels (np.loadtxt)
  camera_extrinsics/{key}.txt  world-to-camera, 4×4, OpenCV camera axes (np.loadtxt)
  manifest.json                written first with complete = false, rewritten last with the counts
Sapiens' datasets overwrite the background themselves from the mask (depth -1, normals -1000), so the
zeros we write there never reach its loss. A frame's image is written after its other files: a frame
with an image is whole, and a rerun skips it.

coco (FILE.json): see render/export_coco.py.

Every byte of the run is read through `RunReader.open` (render/run/reader.py), the one place a path of
OUT is opened (OUT may be a URI, s3://bucket/runs/synth: read through catalog.storage, each shard as one
buffered stream); shards are streamed member by member with catalog.iter_tar, one frame in memory at a
time.
"""
from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np

import catalog
from catalog import run_kind
from catalog.storage import is_uri

from render.run import output as outfmt
from render.run.reader import (FRAME_KEY, ExportError, RunReader, frame_arrays, frame_records, run_fingerprint)

log = logging.getLogger(__name__)

FORMATS = ("sapiens", "coco")
NORMAL_FRAMES = {
    "opencv": "x right, y down, z forward into the scene (humanset's normal.npy as rendered); "
              "a surface facing the camera has z < 0",
    "opengl": "x right, y up, z toward the viewer: exactly (1, -1, -1) times the OpenCV vector; "
              "a surface facing the camera has z > 0",
}
DEFAULT_NORMAL_FRAME = "opengl"  # what Sapiens' released normal checkpoints predict (evidence: docs/rendering.md)
OPENGL_FROM_OPENCV = np.array([1.0, -1.0, -1.0], np.float32)
MANIFEST = "manifest.json"


def npy_bytes(arr: np.ndarray) -> bytes:
    return outfmt.npy_bytes(np.ascontiguousarray(arr))


def txt_bytes(matrix: np.ndarray) -> bytes:
    buf = io.StringIO()
    np.savetxt(buf, np.asarray(matrix, np.float64), fmt="%.17g")
    return buf.getvalue().encode()


def world_to_camera(cam_to_world) -> np.ndarray:
    """The exact inverse of a rigid 4×4 camera-to-world matrix: [R^T, -R^T t]."""
    t = np.asarray(cam_to_world, np.float64)
    out = np.eye(4)
    out[:3, :3] = t[:3, :3].T
    out[:3, 3] = -t[:3, :3].T @ t[:3, 3]
    return out


# --- sapiens ---------------------------------------------------------------------------------------
def sapiens_files(rec: catalog.TarRecord, normal_frame: str) -> dict[str, bytes] | str:
    """The export's files of one frame (relative path -> bytes, the image last), or why it is skipped."""
    got = frame_arrays(rec, need=outfmt.REQUIRED + ("json",))
    if isinstance(got, str):
        return got
    meta, mask = got
    key, f = rec.key, rec.files
    depth, normal = outfmt.load_npy(f["depth.npy"]), outfmt.load_npy(f["normal.npy"])
    h, w = mask.shape
    if depth.shape != (h, w) or normal.shape != (h, w, 3) or not (np.issubdtype(depth.dtype, np.floating)
                                                                and np.issubdtype(normal.dtype, np.floating)):
        return f"bad arrays: depth {depth.dtype}{depth.shape}, normal {normal.dtype}{normal.shape}, mask {mask.shape}"
    normal = normal.astype(np.float32)
    if normal_frame == "opengl":
        normal = normal * OPENGL_FROM_OPENCV  # exactly: a sign flip of y and z
    files = {f"masks/{key}.png": f["mask.png"],
             f"depths/{key}.npy": npy_bytes(np.where(np.isfinite(depth), depth, 0).astype(np.float32)),
             f"normals/{key}.npy": npy_bytes(normal),
             f"camera_intrinsics/{key}.txt": txt_bytes(np.asarray(meta["K"]).reshape(3, 3)),
             f"camera_extrinsics/{key}.txt": txt_bytes(world_to_camera(np.asarray(meta["cam_to_world"]).reshape(4, 4)))}
    if "parts.png" in f:
        files[f"parts/{key}.png"] = f["parts.png"]
    files[f"images/{key}.png"] = f["rgb.png"]  # last: an image on disk means the frame is whole
    return files


def sapiens_settings(reader: RunReader, normal_frame: str) -> dict:
    run = reader.manifest()
    return {"format": "sapiens", "normal_frame": normal_frame, "normal_frame_axes": NORMAL_FRAMES[normal_frame],
            "source": reader.out, "source_run": run_fingerprint(run), "part_vocabulary": run.get("part_vocabulary")}


def check_resume(path: Path, settings: dict, keys=("format", "normal_frame", "source_run")) -> None:
    if not path.exists():
        return
    old = catalog.read_json(path)
    changed = [k for k in keys if old.get(k) != settings.get(k)]
    if changed:
        what = ", ".join(f"{k} {old.get(k)!r} (now {settings.get(k)!r})" for k in changed)
        raise ExportError(f"{path}: this folder holds an export with {what}; resuming would mix them. Use a new "
                          f"--to, or the original settings.")


def export_sapiens(out, to, normal_frame: str = DEFAULT_NORMAL_FRAME, progress: bool = True) -> dict:
    if normal_frame not in NORMAL_FRAMES:
        raise ExportError(f"--normal-frame {normal_frame!r}: choose one of {sorted(NORMAL_FRAMES)}")
    reader, to = RunReader(out), Path(to)
    settings = sapiens_settings(reader, normal_frame)
    identity = {k: settings[k] for k in ("format", "normal_frame", "source_run")}
    run_kind.check(to, "export", identity, flag="--to")  # before anything is written
    try:
        with catalog.run_lock(to):  # one export writes a folder at a time
            run_kind.claim(to, "export", identity, flag="--to")
            manifest = write_sapiens(reader, to, settings, progress)
    except catalog.RunLocked as e:
        raise ExportError(str(e)) from None
    return {k: v for k, v in manifest.items() if k != "folders"}


def write_sapiens(reader: RunReader, to: Path, settings: dict, progress: bool) -> dict:
    catalog.clean_tmp(to)
    check_resume(to / MANIFEST, settings)
    catalog.write_json(to / MANIFEST, {**settings, "complete": False})
    skipped: dict[str, str] = {}

    def done(key: str) -> bool:
        return (to / "images" / f"{key}.png").exists()
    for shard, rec in frame_records(reader, done, progress, "export sapiens"):
        files = sapiens_files(rec, settings["normal_frame"])
        if isinstance(files, str):
            skipped[rec.key] = files
            log.warning("%s/%s frame %s: skipped (%s)", reader.out, shard, rec.key, files)
            continue
        for rel, data in files.items():
            catalog.write_bytes(to / rel, data)
    keys = sorted({k for s in reader.shards() for k in reader.keys(s) if FRAME_KEY.match(k) and done(k)})
    manifest = {**settings, "complete": True, "frames": len(keys),
                "frames_with_parts": sum((to / "parts" / f"{k}.png").exists() for k in keys),
                "skipped": skipped, "folders": FOLDER_DOCS}
    catalog.write_json(to / MANIFEST, manifest)  # last: the export is complete
    return manifest


FOLDER_DOCS = {
    "images": "{key}.png RGB uint8, as rendered",
    "masks": "{key}.png uint8 L, 255 = person, 0 = background (Sapiens reads channel 0 > 0)",
    "depths": "{key}.npy float32 H×W planar z (along the optical axis) in metres; 0 off the person. Sapiens "
              "rescales the person's depth to 0..1 and sets the background to -1 itself, from masks/",
    "normals": "{key}.npy float32 H×W×3 unit normals in normal_frame, facing the camera; 0 off the person "
               "(Sapiens sets its own background, -1000, from masks/)",
    "parts": "{key}.png uint8 class ids of part_vocabulary (Sapiens-28, the Goliath classes), 0 = Background; "
             "only frames with part labels (generated anny bodies)",
    "camera_intrinsics": "{key}.txt K, 3×3 pixels, pixel centres at integer coordinates (np.loadtxt)",
    "camera_extrinsics": "{key}.txt world-to-camera 4×4, OpenCV camera axes (x right, y down, z forward), "
                         "world in metres, Z up (np.loadtxt)",
}


def check_source(out) -> None:
    """OUT must be a render run (or a folder of render shards); named with the fix otherwise."""
    text = str(out)
    if not is_uri(text) and not Path(text).is_dir():
        raise ExportError(f"OUT {text}: no such folder; pass a render run (humanset render --output OUT)")
    run_kind.require(text, ("render",), "OUT", "pass a render run (humanset render --output OUT)")


def export(out, fmt: str, to, normal_frame: str | None = None, progress: bool = True) -> dict:
    """`humanset render export`: dispatch on --format."""
    check_source(out)
    if fmt == "sapiens":
        return export_sapiens(out, to, normal_frame or DEFAULT_NORMAL_FRAME, progress)
    if fmt == "coco":
        if normal_frame is not None:
            raise ExportError("--normal-frame applies to --format sapiens only (COCO keypoints have no normals)")
        from render.export_coco import export_coco
        return export_coco(out, to, progress)
    raise ExportError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
