"""Frame encodings (the members of a frame in its shard) and the per-shard contact sheet.

Members of frame `{key}` (key = 8-digit frame index):
  {key}.rgb.png     uint8 RGB
  {key}.depth.npy   float32 H×W planar z in metres (distance along the optical axis); 0 = no person
  {key}.normal.npy  float32 H×W×3 unit normals, OpenCV camera frame (x right, y down, z forward),
                    pointing towards the camera; (0, 0, 0) = no person
  {key}.mask.png    uint8 L, 255 = person, 0 = background (pixel-centre hits)
  {key}.parts.png   uint8 L part classes (render/parts.json vocabulary, sapiens28), 0 = background, set
                    exactly where the mask is; only for scans with part labels (generated anny bodies)
  {key}.json        every sampled parameter and seed, K (3×3) and cam_to_world (4×4, OpenCV axes)
"""
from __future__ import annotations

import io

import numpy as np
from PIL import Image

MEMBERS = ("rgb.png", "depth.npy", "normal.npy", "mask.png", "parts.png")
REQUIRED = MEMBERS[:4]


def png_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG", compress_level=3)
    return buf.getvalue()


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def load_npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def load_png(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)))


def encode_frame(out: dict) -> dict:
    """Renderer output -> shard members (bytes), with background stored as zeros."""
    depth = np.where(np.isfinite(out["depth_m"]), out["depth_m"], 0.0).astype(np.float32)
    return {"rgb.png": png_bytes(out["rgb"]), "depth.npy": npy_bytes(depth),
            "normal.npy": npy_bytes(np.asarray(out["normal"], dtype=np.float32)),
            "mask.png": png_bytes(np.asarray(out["mask"], dtype=np.uint8)),
            **({"parts.png": png_bytes(np.asarray(out["parts"], dtype=np.uint8))} if "parts" in out else {})}


def depth_colormap(depth: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Turbo colour map of depth over the person, scaled to its own near..far range; black elsewhere."""
    from matplotlib import colormaps
    m = mask > 0
    rgb = np.zeros(depth.shape + (3,), np.uint8)
    if m.any():
        d = depth[m]
        lo, hi = float(d.min()), float(d.max())
        t = (depth - lo) / max(hi - lo, 1e-6)
        rgb[m] = (colormaps["turbo"](1.0 - np.clip(t[m], 0, 1))[:, :3] * 255).astype(np.uint8)  # near = red
    return rgb


def normal_colormap(normal: np.ndarray, mask: np.ndarray) -> np.ndarray:
    rgb = ((normal * 0.5 + 0.5) * 255).clip(0, 255).astype(np.uint8)
    rgb[mask == 0] = 0
    return rgb


def parts_colormap(parts: np.ndarray) -> np.ndarray:
    """A fixed distinct colour per part class (tab20 + tab10), black background."""
    from matplotlib import colormaps
    table = np.concatenate([colormaps["tab20"].colors, colormaps["tab10"].colors])[:255]
    lut = np.zeros((256, 3), np.uint8)
    lut[1:len(table) + 1] = (np.asarray(table)[:, :3] * 255).astype(np.uint8)
    return lut[parts]


def contact_row(members: dict, height: int) -> np.ndarray:
    """RGB | depth (colour map) | normals | mask or part labels, each scaled to `height` rows."""
    rgb = load_png(members["rgb.png"])[..., :3]
    depth, normal = load_npy(members["depth.npy"]), load_npy(members["normal.npy"])
    mask = load_png(members["mask.png"])
    last = parts_colormap(load_png(members["parts.png"])) if "parts.png" in members \
        else np.repeat(mask[..., None], 3, -1)
    cells = [rgb, depth_colormap(depth, mask), normal_colormap(normal, mask), last]
    h, w = rgb.shape[:2]
    width = max(1, round(w * height / h))
    # nearest for the label cell, so resizing never invents a class between two parts
    cells = [np.asarray(Image.fromarray(c).resize((width, height), Image.NEAREST if i == 3 else Image.BILINEAR))
             for i, c in enumerate(cells)]
    return np.concatenate(cells, axis=1)


def contact_sheet(rows: list[np.ndarray]) -> bytes:
    width = max(r.shape[1] for r in rows)
    rows = [np.pad(r, ((0, 2), (0, width - r.shape[1]), (0, 0))) for r in rows]  # 2 px separator
    return png_bytes(np.concatenate(rows, axis=0))
