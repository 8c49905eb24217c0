"""Run a fine-tuned checkpoint on image files and draw the results.

    predict("pose", CKPT, ["photo.jpg"], "out/")  -> out/photo.pose.png (+ photo.pose.json keypoints)

Each figure is the input next to the task's picture: heatmaps and skeleton (pose), colour-coded parts
(seg), a turbo depth map (near = red), or the normal map (x, y, z -> R, G, B). The raw prediction at the
image's resolution is saved beside it as .npy (seg labels, relative depth, unit normals).
The whole image is the model's input (letterboxed to its aspect); for pose it is taken as one person box.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import cv2
import numpy as np
import torch
from PIL import Image, ImageDraw

from training.data import normalize
from training.image_decode import read_image_file
from training.tasks.keypoints import apply_affine, heatmap_keypoints
from training.tasks.finetune import load_task_model
from training.tasks.vocab import load as load_vocab

log = logging.getLogger(__name__)


def letterbox_affine(src_hw, out_hw) -> np.ndarray:
    """Source -> input affine fitting the whole image inside the input, centred."""
    (sh, sw), (oh, ow) = src_hw, out_hw
    s = min(ow / sw, oh / sh)
    return np.array([[s, 0, (ow - s * sw) / 2], [0, s, (oh - s * sh) / 2]])


def palette(n: int) -> np.ndarray:
    from matplotlib import colormaps
    cols = np.concatenate([colormaps["tab20"](np.linspace(0, 1, 20))[:, :3],
                           colormaps["Set3"](np.linspace(0, 1, 12))[:, :3]])
    out = (cols[np.arange(n) % len(cols)] * 255).astype(np.uint8)
    out[0] = 0  # background black
    return out


def depth_picture(depth: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Turbo colours over the person's near..far range (2nd..98th percentile), near = red; black outside."""
    from matplotlib import colormaps
    m = np.ones(depth.shape, bool) if mask is None else mask
    lo, hi = np.percentile(depth[m], [2, 98]) if m.any() else (0.0, 1.0)
    t = np.clip((depth - lo) / max(hi - lo, 1e-6), 0, 1)
    rgb = (colormaps["turbo"](1 - t)[..., :3] * 255).astype(np.uint8)
    rgb[~m] = 0
    return rgb


def normal_picture(normal: np.ndarray) -> np.ndarray:
    n = normal / np.maximum(np.linalg.norm(normal, axis=-1, keepdims=True), 1e-6)
    return ((n * 0.5 + 0.5) * 255).clip(0, 255).astype(np.uint8)


def pose_picture(img: np.ndarray, heat: np.ndarray, kpts: np.ndarray, scores: np.ndarray, vocab) -> np.ndarray:
    from matplotlib import colormaps
    hm = (colormaps["jet"](np.clip(heat, 0, 1))[..., :3] * 255).astype(np.uint8)
    out = Image.fromarray((0.5 * img + 0.5 * hm).astype(np.uint8))
    draw = ImageDraw.Draw(out)
    r = max(2, int(round(max(img.shape[:2]) / 150)))
    ok = scores > 0.2 * scores.max() if scores.size else scores
    for a, b in vocab.skeleton:
        if ok[a] and ok[b]:
            draw.line([tuple(kpts[a]), tuple(kpts[b])], fill=(255, 255, 255), width=max(1, r // 2))
    for (x, y), good in zip(kpts, ok):
        if good:
            draw.ellipse([x - r, y - r, x + r, y + r], fill=(255, 40, 40))
    return np.asarray(out)


def side_by_side(a: np.ndarray, b: np.ndarray) -> Image.Image:
    gap = np.full((a.shape[0], 6, 3), 255, np.uint8)
    return Image.fromarray(np.concatenate([a, gap, b], axis=1))


@torch.no_grad()
def predict(task: str, checkpoint, images, out_dir, masks=None) -> list[Path]:
    """masks: optional person-mask images (one per image, > 0 = person); depth and normal pictures are
    then drawn on the person only, as the model is trained there only."""
    missing = [str(p) for p in [*images, *(masks or [])] if not Path(p).is_file()]
    if missing:  # before the model is loaded
        raise FileNotFoundError(f"IMAGE {missing[0]}: no such file; pass a photo (JPEG, PNG, WebP, ...)")
    model, cfg = load_task_model(checkpoint)
    if task != cfg.task:
        raise ValueError(f"--task {task}, but checkpoint {checkpoint} was fine-tuned for {cfg.task}")
    out_dir = Path(out_dir)
    in_hw = tuple(cfg.image_size)
    written = []
    masks = list(masks) if masks else [None] * len(images)
    if len(masks) != len(images):
        raise ValueError(f"{len(masks)} masks for {len(images)} images: give one mask per image, or none")
    for path, mask_path in zip(images, masks):
        path = Path(path)
        img = np.asarray(read_image_file(path))
        out_dir.mkdir(parents=True, exist_ok=True)  # once an image was read: a mistake leaves no empty folder
        h, w = img.shape[:2]
        m = letterbox_affine((h, w), in_hw)
        x = cv2.warpAffine(img, m, (in_hw[1], in_hw[0]), flags=cv2.INTER_LINEAR)
        out = model(normalize(torch.from_numpy(x.transpose(2, 0, 1).copy()).unsqueeze(0)))[0].float()
        # back to the input resolution, then through the inverse letterbox to the image
        full = torch.nn.functional.interpolate(out[None], size=in_hw, mode="bilinear", align_corners=False)[0]
        full = full.numpy().transpose(1, 2, 0)
        inv = cv2.invertAffineTransform(m)
        back = cv2.warpAffine(full, inv, (w, h), flags=cv2.INTER_LINEAR)
        back = back.reshape(h, w, -1)
        person = None
        if mask_path is not None:
            person = np.asarray(read_image_file(mask_path, "--masks").convert("L")) > 0
            if person.shape != (h, w):
                raise ValueError(f"mask {mask_path} is {person.shape}, image {path} is {(h, w)}")
        stem = out_dir / f"{path.stem}.{task}"
        if task == "pose":
            vocab = load_vocab(cfg.vocab)
            xy, peak = heatmap_keypoints(out.numpy())
            kpts = apply_affine(xy, inv)
            picture = pose_picture(img, back.max(axis=2), kpts, peak, vocab)
            Path(f"{stem}.json").write_text(json.dumps({"names": list(vocab.names), "keypoints": kpts.tolist(),
                                                        "scores": peak.tolist()}))
        elif task == "seg":
            labels = back.argmax(axis=2).astype(np.uint8)
            picture = (0.4 * img + 0.6 * palette(back.shape[2])[labels]).astype(np.uint8)
            np.save(f"{stem}.npy", labels)
        elif task == "depth":
            picture = depth_picture(back[..., 0], person)
            np.save(f"{stem}.npy", back[..., 0].astype(np.float32))
        else:
            n = back / np.maximum(np.linalg.norm(back, axis=-1, keepdims=True), 1e-6)
            picture = normal_picture(n)
            if person is not None:
                picture[~person] = 0
            np.save(f"{stem}.npy", n.astype(np.float32))
        fig = Path(f"{stem}.png")
        side_by_side(img, picture).save(fig)
        written.append(fig)
        log.debug("%s -> %s", path, fig)  # the callers print the paths returned
    return written
