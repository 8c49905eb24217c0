"""`humanset render export OUT --format coco --to FILE.json`: COCO person keypoints from a render run.

Writes FILE.json (COCO keypoint annotations, one person per frame) and the frames' RGB images into
FILE_images/ beside it; `file_name` is relative to FILE.json's folder ("FILE_images/00000012.png"), the
image root `humanset finetune --task pose --data FILE.json` uses when --images is not given.

Per frame (generated anny bodies; scan frames carry no joints and are skipped):
  image       id = frame index, file_name, height, width, humanset_shard / humanset_key (the frame in OUT)
  annotation  id = image_id = frame index, category_id 1, iscrowd 0,
              bbox [x, y, w, h] of the mask's pixels, area = mask pixel count,
              segmentation = the mask as uncompressed RLE, num_keypoints = keypoints with v > 0,
              keypoints = the frame json's `keypoints_coco17` as [x, y, v] * 17 with v as rendered:
              2 visible, 1 inside the image but hidden behind the body (render.sampling.keypoints_2d),
              0 outside the image (x = y = 0 then, as COCO writes unlabelled points);
              x, y are the rendered floats unrounded
  category    1 "person" with COCO's 17 keypoint names and skeleton
Images are written atomically and skipped when already there, so a rerun only adds what is missing;
FILE.json is written last, whole, every run.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

import catalog
from catalog import run_kind

from render.bodies import COCO17  # the order render writes keypoints_coco17 in (COCO's own)
from render.run.reader import ExportError, RunReader, frame_arrays, frame_records, run_fingerprint

log = logging.getLogger(__name__)

# COCO's person skeleton, 1-based keypoint ids (the published person_keypoints category)
COCO17_SKELETON = [[16, 14], [14, 12], [17, 15], [15, 13], [12, 13], [6, 12], [7, 13], [6, 7], [6, 8], [7, 9],
                   [8, 10], [9, 11], [2, 3], [1, 2], [1, 3], [2, 4], [3, 5], [4, 6], [5, 7]]


def images_dir(to: Path) -> Path:
    return to.with_name(to.stem + "_images")


def mask_box(mask: np.ndarray) -> list[float]:
    """COCO [x, y, w, h] of the mask's pixels (a pixel spans [c, c + 1))."""
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    return [float(cols[0]), float(rows[0]), float(cols[-1] - cols[0] + 1), float(rows[-1] - rows[0] + 1)]


def mask_rle(mask: np.ndarray) -> dict:
    """Uncompressed COCO RLE: run lengths down the columns, starting with a run of zeros."""
    flat = np.asarray(mask, bool).T.ravel()
    change = np.flatnonzero(np.diff(flat.astype(np.int8))) + 1
    bounds = np.concatenate([[0], change, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat[0]:
        counts = [0] + counts
    return {"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": counts}


def coco_keypoints(points: list, names: list | None) -> tuple[list, int]:
    """The render's [[x, y, v], ...] as COCO's flat list (x = y = 0 where v = 0) and the labelled count."""
    if names is not None and list(names) != COCO17:
        raise ExportError(f"keypoint names {list(names)[:3]}... are not COCO-17's; this export writes COCO-17")
    if len(points) != len(COCO17):
        raise ExportError(f"{len(points)} keypoints, COCO-17 has {len(COCO17)}")
    flat = []
    for x, y, v in points:
        v = int(v)
        flat += [float(x), float(y), v] if v > 0 else [0, 0, 0]
    return flat, sum(int(p[2]) > 0 for p in points)


def frame_annotation(shard: str, rec: catalog.TarRecord, image_folder: str) -> tuple[dict, dict] | str:
    """(image, annotation) of one frame, or why it is skipped."""
    got = frame_arrays(rec)
    if isinstance(got, str):
        return got
    meta, mask = got
    if not meta.get("keypoints_coco17"):
        return "no keypoints_coco17 (scan frames carry no joints)"
    try:
        keypoints, n = coco_keypoints(meta["keypoints_coco17"], meta.get("keypoint_names"))
    except ExportError as e:
        return str(e)
    fid = int(meta.get("frame_index", int(rec.key)))
    person = mask > 0
    image = {"id": fid, "file_name": f"{image_folder}/{rec.key}.png", "height": int(mask.shape[0]),
             "width": int(mask.shape[1]), "humanset_shard": shard.rsplit("/", 1)[-1], "humanset_key": rec.key}
    ann = {"id": fid, "image_id": fid, "category_id": 1, "iscrowd": 0, "bbox": mask_box(person),
           "area": int(person.sum()), "segmentation": mask_rle(person), "keypoints": keypoints, "num_keypoints": n}
    return image, ann


def export_coco(out, to, progress: bool = True) -> dict:
    reader, to = RunReader(out), Path(to)
    if to.suffix != ".json":
        raise ExportError(f"--to {to}: a COCO export is one .json file (its images go to {to.stem}_images/)")
    run = reader.manifest()
    folder = images_dir(to)
    # the marker lives in FILE_images/ (the export's folder): its images must come from one run
    identity = {"format": "coco", "source_run": run_fingerprint(run), "file": to.name}
    run_kind.check(folder, "export", identity, flag="--to")
    try:
        with catalog.run_lock(folder):  # one export writes a folder at a time
            run_kind.claim(folder, "export", identity, flag="--to")
            return write_coco(reader, to, folder, run, progress)
    except catalog.RunLocked as e:
        raise ExportError(str(e)) from None


def write_coco(reader: RunReader, to: Path, folder: Path, run: dict, progress: bool) -> dict:
    catalog.clean_tmp(folder)
    images, annotations, skipped = [], [], {}
    # every frame is read (its box and keypoints go into the JSON); an image already written is kept
    for shard, rec in frame_records(reader, lambda key: False, progress, "export coco"):
        got = frame_annotation(shard, rec, folder.name)
        if isinstance(got, str):
            skipped[rec.key] = got
            log.warning("%s/%s frame %s: skipped (%s)", reader.out, shard, rec.key, got)
            continue
        image, ann = got
        path = folder / f"{rec.key}.png"
        if not path.exists():
            catalog.write_bytes(path, rec.files["rgb.png"])
        images.append(image)
        annotations.append(ann)
    if not images:
        raise ExportError(f"{reader.out}: no frame with a person and COCO-17 keypoints to export "
                          f"(skipped: {sorted(set(skipped.values()))}); render anny bodies (--scans anny)")
    info = {"description": "humanset render export --format coco", "source": reader.out,
            "source_run": run_fingerprint(run), "images_dir": folder.name, "frames": len(images),
            "skipped": skipped,
            "visibility": "2 visible, 1 inside the image but hidden behind the body, 0 outside the image "
                          "(x = y = 0)"}
    coco = {"info": info, "images": images, "annotations": annotations,
            "categories": [{"id": 1, "name": "person", "supercategory": "person", "keypoints": COCO17,
                            "skeleton": COCO17_SKELETON}]}
    catalog.write_bytes(to, json.dumps(coco, separators=(",", ":")).encode())  # last
    return {"format": "coco", "to": str(to), **info}
