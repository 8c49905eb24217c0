"""Fine-tuning data: render shards (depth, normals, person mask) and COCO-style JSON (pose, part masks).

Every sample is a pure function of (dataset index, epoch, seed): `dataset[(index, epoch)]`, so a resumed
run sees the same crops, flips and backgrounds as an uninterrupted one (see finetune.StepSampler).

    RenderFrames     render shards (catalog.FRAMES index; {key}.rgb.png, .depth.npy, .normal.npy, .mask.png)
    RenderParts      render shards' {key}.parts.png (part classes of the run's vocabulary) -> label maps
    CocoKeypoints    top-down person crops from a COCO keypoint JSON + image folder -> Gaussian heatmaps
    CocoParts        whole images from a COCO JSON whose categories are part classes -> label maps
    BackgroundPool   non-human photos from a curation run (samples with no detected person)

Augmentation (train=True), as Sapiens: random scale and crop, horizontal flip (left/right keypoints and
part classes swap, normals negate x), photometric distortion, and for seg / depth / normals pasting
the person onto a random non-human background.
"""
from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import cv2
import numpy as np
import pyarrow.compute as pc

import catalog

from training.image_decode import decode_image
from training.tasks.vocab import ClassVocab, KeypointVocab
from training.tasks.augment import (NEAREST, Augment, BackgroundPool, box_affine, chw, crop_affine,
                                    paste_background, photometric, sample_rng, warp)

log = logging.getLogger(__name__)


# --- geometry -------------------------------------------------------------------------------------


# --- backgrounds ----------------------------------------------------------------------------------


# --- render shards: depth, normals, mask ----------------------------------------------------------
def member_offsets(row_members) -> dict:
    return {catalog.split_member(m["name"])[1]: (m["offset"], m["size"]) for m in row_members}


class RenderFrames:
    """Frames of render shards. Items: image uint8 (3,H,W), depth (1,H,W) metres (0 = none),
    normal (3,H,W) unit OpenCV camera frame, mask bool (1,H,W)."""

    def __init__(self, folder, out_hw=(1024, 768), aug: Augment | None = None, seed: int = 0,
                 backgrounds: BackgroundPool | None = None):
        folder = Path(folder)
        if (folder / "shards").is_dir():
            folder = folder / "shards"  # a render run directory
        self.folder = folder
        index = catalog.read_index(folder).select(["key", "shard", "members", "error"])
        # rows stay in Arrow (a 500K-frame run is cheap there, not as Python dicts); failed frames are dropped
        ok = pc.and_(pc.is_null(index.column("error")), pc.is_valid(index.column("shard")))
        self.index = index.filter(ok)
        if self.index.num_rows == 0:
            raise ValueError(f"{folder}: the render shards hold no rendered frame (all failed or empty)")
        self.check(self.row(0))
        self.out_hw, self.aug, self.seed = tuple(out_hw), aug or Augment(train=False), seed
        self.backgrounds = backgrounds

    def __len__(self):
        return self.index.num_rows

    def row(self, i: int) -> dict:
        return self.index.slice(i, 1).to_pylist()[0]

    def check(self, r: dict) -> dict:
        mem = member_offsets(r["members"] or [])
        missing = {"rgb.png", "depth.npy", "normal.npy", "mask.png"} - set(mem)
        if missing:
            raise ValueError(f"{self.folder}/{r['shard']} key {r['key']}: missing members {sorted(missing)}; "
                             f"is this a render shard folder?")
        return mem

    def raw(self, i: int) -> dict:
        r = self.row(i)
        mem = self.check(r)
        tar = self.folder / r["shard"]

        def get(ext):
            return catalog.read_member(tar, *mem[ext])
        rgb = np.asarray(decode_image(get("rgb.png")))
        depth = np.load(io.BytesIO(get("depth.npy")), allow_pickle=False).astype(np.float32)
        normal = np.load(io.BytesIO(get("normal.npy")), allow_pickle=False).astype(np.float32)
        mask = np.asarray(decode_image(get("mask.png")).convert("L")) > 0
        depth = np.where(np.isfinite(depth), depth, 0.0).astype(np.float32)  # inf background -> 0
        return {"rgb": rgb, "depth": depth, "normal": normal, "mask": mask, "key": r["key"]}

    def __getitem__(self, item) -> dict:
        i, epoch = item if isinstance(item, tuple) else (item, 0)
        rng = sample_rng(self.seed, epoch, i)
        f = self.raw(i)
        m, flip = crop_affine(f["rgb"].shape[:2], self.out_hw, rng, self.aug)
        img = warp(f["rgb"], m, self.out_hw)
        mask = warp(f["mask"].astype(np.uint8), m, self.out_hw, NEAREST) > 0
        depth = warp(f["depth"], m, self.out_hw, NEAREST)
        normal = warp(f["normal"], m, self.out_hw, NEAREST)
        if flip:
            normal[..., 0] *= -1  # a mirrored image mirrors the surface: x of the normal changes sign
        img = augment_pixels(self, img, mask, rng)
        return {"image": chw(img), "depth": depth[None].astype(np.float32), "normal": chw(normal).astype(np.float32),
                "mask": mask[None], "index": i}


class RenderParts(RenderFrames):
    """Part segmentation from render shards: frames with a {key}.parts.png member (scans without part
    labels have none and are skipped). The run's manifest (render.json `part_vocabulary`) must name the
    same classes as `vocab`. Items as CocoParts: image uint8 (3,H,W), labels int64 (H,W) with 255 on
    padding, mask bool (1,H,W)."""

    def __init__(self, folder, vocab: ClassVocab, out_hw=(1024, 768), aug: Augment | None = None, seed: int = 0,
                 backgrounds: BackgroundPool | None = None):
        super().__init__(folder, out_hw, aug, seed, backgrounds)
        manifest = self.folder.parent / "render.json"
        names = (json.loads(manifest.read_text()).get("part_vocabulary") or {}).get("names") \
            if manifest.is_file() else None
        if names is None:
            raise ValueError(f"{self.folder}: no part vocabulary in {manifest}; render the run with a humanset "
                             f"that writes parts.png")
        if tuple(names) != tuple(vocab.names):
            raise ValueError(f"{manifest}: part classes {names[:4]}... differ from vocabulary {vocab.name}; pass "
                             f"the run's vocabulary with --vocab")
        members = self.index.column("members").combine_chunks()
        has = pc.ends_with(pc.struct_field(pc.list_flatten(members), "name"), ".parts.png")
        keep = np.zeros(self.index.num_rows, bool)
        keep[pc.list_parent_indices(members).filter(has).to_numpy()] = True
        self.index = self.index.filter(keep)
        if self.index.num_rows == 0:
            raise ValueError(f"{self.folder}: no frame has a parts.png member (scans without part labels); "
                             f"render generated anny bodies (--scans anny) for part ground truth")
        self.vocab = vocab

    def __getitem__(self, item) -> dict:
        i, epoch = item if isinstance(item, tuple) else (item, 0)
        rng = sample_rng(self.seed, epoch, i)
        r = self.row(i)
        mem = member_offsets(r["members"])
        tar = self.folder / r["shard"]
        img = np.asarray(decode_image(catalog.read_member(tar, *mem["rgb.png"])))
        labels = np.asarray(decode_image(catalog.read_member(tar, *mem["parts.png"])).convert("L"))
        return seg_example(self, img, labels, rng, i)


# --- COCO JSON ------------------------------------------------------------------------------------
def load_coco(json_path, images_root=None) -> tuple[dict, Path]:
    path = Path(json_path)
    if not path.is_file():
        raise FileNotFoundError(f"COCO annotations {path}: no such file")
    coco = json.loads(path.read_text())
    for key in ("images", "annotations", "categories"):
        if key not in coco:
            raise ValueError(f"{path}: not a COCO annotation file (no {key!r} list)")
    root = Path(images_root) if images_root else path.parent
    return coco, root


def read_rgb(path: Path) -> np.ndarray:
    if not path.is_file():
        raise FileNotFoundError(f"image {path}: no such file (pass --images FOLDER holding the COCO file_names)")
    return np.asarray(decode_image(path.read_bytes()))


def gaussian_heatmaps(kpts: np.ndarray, valid: np.ndarray, hm_hw, sigma: float) -> np.ndarray:
    """(K, h, w) unnormalised Gaussians exp(-r^2 / 2 sigma^2) centred on keypoints in heatmap pixels."""
    h, w = hm_hw
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    out = np.zeros((len(kpts), h, w), np.float32)
    for k, ((x, y), ok) in enumerate(zip(kpts, valid)):
        if ok:
            out[k] = np.exp(-((xs - x) ** 2 + (ys - y) ** 2) / (2 * sigma ** 2))
    return out


class CocoKeypoints:
    """Top-down pose samples: one per annotated person (num_keypoints > 0, not crowd).

    Items: image uint8 (3,H,W), heatmaps (K, H/4, W/4), weights (K,), and for evaluation the affine
    `inv` mapping output pixels back to the original image, `ann` (annotation index)."""

    def __init__(self, json_path, images_root, vocab: KeypointVocab, out_hw=(256, 192),
                 aug: Augment | None = None, seed: int = 0, sigma: float = 2.0):
        self.coco, self.root = load_coco(json_path, images_root)
        self.vocab, self.out_hw, self.aug, self.seed, self.sigma = vocab, tuple(out_hw), aug or Augment(False), seed, sigma
        self.images = {im["id"]: im for im in self.coco["images"]}
        self.anns = [a for a in self.coco["annotations"]
                     if not a.get("iscrowd") and a.get("num_keypoints", 1) > 0 and "keypoints" in a]
        k = len(vocab)
        for a in self.anns:
            if len(a["keypoints"]) != 3 * k:
                raise ValueError(f"{json_path}: annotation {a.get('id')} has {len(a['keypoints']) // 3} keypoints, "
                                 f"vocabulary {vocab.name} has {k}; pass the matching --vocab")
        if not self.anns:
            raise ValueError(f"{json_path}: no annotation with keypoints")

    def __len__(self):
        return len(self.anns)

    def __getitem__(self, item) -> dict:
        i, epoch = item if isinstance(item, tuple) else (item, 0)
        a = self.anns[i]
        img = read_rgb(self.root / self.images[a["image_id"]]["file_name"])
        return pose_example(self, img, a, sample_rng(self.seed, epoch, i), i)


def pose_example(ds, img: np.ndarray, a: dict, rng, i: int) -> dict:
    """A top-down pose example from an image and its COCO annotation `a` (bbox, keypoints): the box crop
    (random scale, rotation, flip with left/right swapped when training), photometric jitter, Gaussian
    heatmaps at 1/4 and the inverse affine. `ds` gives out_hw, aug, vocab and sigma."""
    m, flip = box_affine(a["bbox"], ds.out_hw, rng, ds.aug)
    crop = warp(img, m, ds.out_hw)
    kp = np.asarray(a["keypoints"], np.float64).reshape(-1, 3)
    xy = np.c_[kp[:, :2], np.ones(len(kp))] @ m.T
    vis = kp[:, 2] > 0
    if flip:  # the mirrored left wrist is now a right wrist
        perm = ds.vocab.flip_index
        xy, vis = xy[perm], vis[perm]
    if ds.aug.train and ds.aug.photometric:
        crop = photometric(crop, rng)
    hm_hw = (ds.out_hw[0] // 4, ds.out_hw[1] // 4)
    hm_xy = (xy + 0.5) / 4 - 0.5  # pixel centres of the 1/4 grid
    inside = (hm_xy[:, 0] >= 0) & (hm_xy[:, 0] <= hm_hw[1] - 1) & (hm_xy[:, 1] >= 0) & (hm_xy[:, 1] <= hm_hw[0] - 1)
    valid = vis & inside
    inv = cv2.invertAffineTransform(m)
    return {"image": chw(crop), "heatmaps": gaussian_heatmaps(hm_xy, valid, hm_hw, ds.sigma),
            "weights": valid.astype(np.float32), "inv": inv.astype(np.float32), "ann": i}


def decode_segmentation(seg, h: int, w: int) -> np.ndarray:
    """COCO polygons or uncompressed RLE -> bool (h, w). Compressed RLE needs pycocotools."""
    from PIL import Image, ImageDraw

    if isinstance(seg, list):
        canvas = Image.new("L", (w, h), 0)
        draw = ImageDraw.Draw(canvas)
        for poly in seg:
            if len(poly) >= 6:
                draw.polygon([(poly[j], poly[j + 1]) for j in range(0, len(poly), 2)], fill=1)
        return np.asarray(canvas, bool)
    counts = seg["counts"]
    if isinstance(counts, str):
        try:
            from pycocotools import mask as mask_utils
        except ImportError as e:
            raise ImportError("compressed RLE masks need pycocotools (pip install pycocotools)") from e
        return mask_utils.decode(seg).astype(bool)
    flat = np.zeros(h * w, bool)
    pos, val = 0, False
    for c in counts:
        flat[pos:pos + c] = val
        pos, val = pos + c, not val
    return flat.reshape(w, h).T  # COCO RLE runs down the columns


class CocoParts:
    """Whole-image part segmentation: each annotation paints its category (named like a vocabulary
    class) over a background of class 0; larger regions first, so small parts stay on top.
    Items: image uint8 (3,H,W), labels int64 (H,W) with 255 on padding, mask bool (1,H,W) = labels > 0."""

    def __init__(self, json_path, images_root, vocab: ClassVocab, out_hw=(1024, 768),
                 aug: Augment | None = None, seed: int = 0, backgrounds: BackgroundPool | None = None):
        self.coco, self.root = load_coco(json_path, images_root)
        self.vocab, self.out_hw, self.aug, self.seed = vocab, tuple(out_hw), aug or Augment(False), seed
        self.backgrounds = backgrounds
        lookup = {n.lower().replace("-", "_"): i for i, n in enumerate(vocab.names)}
        self.cat_to_class = {}
        for c in self.coco["categories"]:
            key = c["name"].lower().replace("-", "_").replace(" ", "_")
            if key not in lookup:
                raise ValueError(f"{json_path}: category {c['name']!r} is not a class of vocabulary {vocab.name} "
                                 f"({', '.join(vocab.names)})")
            self.cat_to_class[c["id"]] = lookup[key]
        self.image_list = list(self.coco["images"])
        self.by_image: dict = {}
        for a in self.coco["annotations"]:
            self.by_image.setdefault(a["image_id"], []).append(a)

    def __len__(self):
        return len(self.image_list)

    def label_map(self, im: dict) -> np.ndarray:
        h, w = im["height"], im["width"]
        labels = np.zeros((h, w), np.uint8)
        anns = sorted(self.by_image.get(im["id"], []), key=lambda a: -a.get("area", 0))
        for a in anns:
            labels[decode_segmentation(a["segmentation"], h, w)] = self.cat_to_class[a["category_id"]]
        return labels

    def __getitem__(self, item) -> dict:
        i, epoch = item if isinstance(item, tuple) else (item, 0)
        rng = sample_rng(self.seed, epoch, i)
        im = self.image_list[i]
        img = read_rgb(self.root / im["file_name"])
        labels = self.label_map(im)
        if labels.shape != img.shape[:2]:
            raise ValueError(f"image {im['file_name']}: JSON says {labels.shape}, file is {img.shape[:2]}")
        return seg_example(self, img, labels, rng, i)


def seg_example(ds, img: np.ndarray, labels: np.ndarray, rng, i: int) -> dict:
    """A part-segmentation example from an image and its label map: crop/flip (labels follow the
    vocabulary's left/right swap), background paste and photometric jitter when training.
    `ds` gives out_hw, aug, vocab and backgrounds (the COCO and render part datasets)."""
    m, flip = crop_affine(img.shape[:2], ds.out_hw, rng, ds.aug)
    img = warp(img, m, ds.out_hw)
    labels = warp(labels, m, ds.out_hw, NEAREST, border=255)
    if flip:
        perm = np.r_[ds.vocab.flip_index, np.arange(len(ds.vocab), 256)].astype(np.uint8)
        labels = perm[labels]
    person = (labels > 0) & (labels != 255)
    img = augment_pixels(ds, img, person, rng)
    return {"image": chw(img), "labels": labels.astype(np.int64), "mask": person[None], "index": i}


def augment_pixels(ds, img: np.ndarray, person: np.ndarray, rng) -> np.ndarray:
    """Training-time pixel augmentation shared by the dense datasets: a non-human background pasted
    behind the person (`ds.aug.background` of the time) and photometric jitter."""
    if ds.aug.train:
        if ds.backgrounds is not None and len(ds.backgrounds) and rng.random() < ds.aug.background:
            bg = ds.backgrounds.image(int(rng.integers(len(ds.backgrounds))))
            img = paste_background(img, person, bg, rng)
        if ds.aug.photometric:
            img = photometric(img, rng)
    return img
