"""Top-down pose samples straight from render shards: `humanset finetune --task pose --data RENDER_RUN`.

Each rendered frame of a generated body carries its COCO-17 keypoints in its `{key}.json` member
(`keypoints_coco17`: [x, y, v] per joint in image pixels, v = 2 visible, 1 in the image but hidden,
0 outside it; render/run/job.py). One frame holds one person; its annotation, in COCO's terms:

    id, image_id   the frame index (the key's number)
    key, shard     the frame key and its shard tar (the image is the shard's {key}.rgb.png)
    bbox           [x, y, w, h] of the person mask's pixels: x = leftmost column, w = rightmost - leftmost
                   + 1 (pycocotools' box of a mask), likewise y / h
    area           person mask pixels (int)
    keypoints      the 17 x (x, y, v) as rendered (floats unrounded), flattened, with x = y = 0 where v = 0
                   (COCO's unlabelled point); num_keypoints = joints with v > 0
    iscrowd, category_id   0, 1
Frames left out: no keypoints in the json (scans from files), no person pixel, or num_keypoints = 0 (as
CocoKeypoints leaves such annotations out of a COCO file).

`render_annotations(RUN)` lists them (a COCO export of the same run should agree); `RenderKeypoints`
crops and augments them exactly as `CocoKeypoints` does a COCO file (task_data.pose_example).
"""
from __future__ import annotations

import json
import logging

import numpy as np

import catalog

from training.image_decode import decode_image
from training.tasks.augment import Augment, sample_rng
from training.tasks.data import RenderFrames, member_offsets, pose_example
from training.tasks.vocab import KeypointVocab

log = logging.getLogger(__name__)

KEYPOINT_FIELD = {"coco17": "keypoints_coco17"}  # vocabulary -> the frame json's field holding its keypoints


def mask_box(mask: np.ndarray) -> list[float] | None:
    """[x, y, w, h] of the True pixels (pycocotools' toBbox of the mask), None for an empty mask."""
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if not len(rows):
        return None
    return [float(cols[0]), float(rows[0]), float(cols[-1] - cols[0] + 1), float(rows[-1] - rows[0] + 1)]


class RenderKeypoints(RenderFrames):
    """Pose samples of a render run: items as CocoKeypoints (image, heatmaps, weights, inv, ann).

    Frames without keypoints (scans from files have no skeleton) or without person pixels are left out."""

    def __init__(self, folder, vocab: KeypointVocab, out_hw=(256, 192), aug: Augment | None = None, seed: int = 0,
                 sigma: float = 2.0):
        super().__init__(folder, out_hw, aug, seed)
        field = KEYPOINT_FIELD.get(vocab.name)
        if field is None:
            raise ValueError(f"{self.folder}: renders carry COCO-17 keypoints ({', '.join(KEYPOINT_FIELD)}); "
                             f"vocabulary {vocab.name} has no render field; pass --vocab coco17")
        self.vocab, self.sigma = vocab, sigma
        self.anns, rows = [], []
        for i in range(self.index.num_rows):
            ann = self.annotation(i, field)
            if ann is not None:
                self.anns.append(ann)
                rows.append(i)
        skipped = self.index.num_rows - len(rows)
        self.index = self.index.take(rows)  # item i is annotation i
        if not self.anns:
            raise ValueError(f"{self.folder}: no rendered frame carries {field} with a person in view; render "
                             f"generated bodies (--scans anny), whose skeletons give keypoints")
        if skipped:
            log.info("%s: %d frames without keypoints or person pixels left out", self.folder, skipped)

    def annotation(self, i: int, field: str) -> dict | None:
        r = self.row(i)
        mem = member_offsets(r["members"])
        if "json" not in mem:
            return None
        tar = self.folder / r["shard"]
        frame = json.loads(catalog.read_member(tar, *mem["json"]))
        kp = frame.get(field)
        if not kp:
            return None
        kp = np.asarray(kp, np.float64).reshape(-1, 3)
        names = frame.get("keypoint_names")
        if len(kp) != len(self.vocab) or (names is not None and tuple(names) != tuple(self.vocab.names)):
            raise ValueError(f"{tar} key {r['key']}: {len(kp)} keypoints in {field} named {(names or [])[:3]}..., "
                             f"not those of vocabulary {self.vocab.name}")
        kp[kp[:, 2] <= 0] = 0.0  # COCO writes an unlabelled point as 0, 0, 0
        mask = np.asarray(decode_image(catalog.read_member(tar, *mem["mask.png"])).convert("L")) > 0
        box = mask_box(mask)
        n = int((kp[:, 2] > 0).sum())
        if box is None or n == 0:
            return None
        fid = int(r["key"])
        flat = [float(v) if j % 3 < 2 else int(v) for j, v in enumerate(kp.ravel())]
        return {"id": fid, "image_id": fid, "key": r["key"], "shard": r["shard"], "bbox": box,
                "area": int(mask.sum()), "keypoints": flat, "num_keypoints": n, "iscrowd": 0, "category_id": 1}

    def __getitem__(self, item) -> dict:
        i, epoch = item if isinstance(item, tuple) else (item, 0)
        r = self.row(i)
        mem = member_offsets(r["members"])
        img = np.asarray(decode_image(catalog.read_member(self.folder / r["shard"], *mem["rgb.png"])))
        return pose_example(self, img, self.anns[i], sample_rng(self.seed, epoch, i), i)


def render_annotations(folder, vocab: KeypointVocab) -> list[dict]:
    """The COCO-style person annotations of a render run (see the module docstring)."""
    return RenderKeypoints(folder, vocab).anns
