"""Test fixtures of the training room: small datasets written from scratch, for tests and smoke runs
without a curation run or real renders (tests only; not part of the package).

`write_curated_shards` writes curated-shard folders (the curation engine's output format) from image
bytes: same layout, index schema (catalog.CURATED_INDEX) and sidecars as `RUN/shards`.

`write_sphere_renders` writes render shards in exactly the renderer's format (catalog.FRAMES index,
{key}.rgb.png / .depth.npy / .normal.npy / .mask.png / .json) of analytic scenes: a "person" made of
two spheres in front of a textured background, with exact planar depth and normals, shaded so the
image carries the shape. `write_coco_person` writes a COCO keypoint + part-mask JSON over real photos
shipped in scikit-image (the astronaut, the cameraman), annotated by hand at a coarse level.
"""
from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

import catalog


def write_curated_shards(folder, samples: list[tuple[str, bytes]], prefix: str = "curated",
                         per_shard: int = 8) -> list[str]:
    """samples: (file name such as 'astronaut.jpg', original bytes). Returns the shard names written.

    Index columns width/height/format come from PIL when the bytes open; undecodable bytes are
    written anyway (that is what the tests of skip-and-count need) with those columns null.
    """
    with catalog.ShardWriter(folder, prefix, catalog.CURATED_INDEX, max_count=per_shard) as writer:
        for i, (name, data) in enumerate(samples):
            ext = name.rsplit(".", 1)[-1].lower()
            key = f"{i:06d}"
            sha = hashlib.sha256(data).hexdigest()
            row = {"sample_id": sha[:24], "source_uri": f"test://{name}", "sha256": sha}
            try:
                with Image.open(io.BytesIO(data)) as im:
                    row.update(format=im.format, width=im.width, height=im.height)
            except Exception:
                pass
            writer.add(key, {ext: data, "json": {"source_uri": row["source_uri"], "sample_id": row["sample_id"]}},
                       row)
    return writer.written


def logged_losses(out) -> dict[int, float]:
    """step -> loss of a training run, from its OUT/log.jsonl."""
    return {r["step"]: r["loss"] for r in map(json.loads, (Path(out) / "log.jsonl").read_text().splitlines())}


def encode(array, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, fmt, **kw)
    return buf.getvalue()


def skimage_samples() -> list[tuple[str, bytes]]:
    """Real photos shipped inside scikit-image, encoded the ways a crawl delivers them: JPEG and PNG
    RGB, greyscale, CMYK JPEG, palette GIF, RGBA PNG, 16-bit PNG; plus one undecodable file."""
    import numpy as np
    import skimage.data as sd

    photos = {"astronaut": sd.astronaut(), "coffee": sd.coffee(), "chelsea": sd.chelsea(), "rocket": sd.rocket()}
    out = []
    for name, arr in photos.items():
        out.append((f"{name}.jpg", encode(arr, "JPEG", quality=90)))
        out.append((f"{name}_half.png", encode(arr[::2, ::2], "PNG")))
    out.append(("camera_grey.png", encode(sd.camera(), "PNG")))
    out.append(("astronaut_cmyk.jpg", _save(Image.fromarray(photos["astronaut"]).convert("CMYK"), "JPEG")))
    out.append(("coffee_palette.gif", _save(Image.fromarray(photos["coffee"]).convert("P"), "GIF")))
    rgba = np.dstack([photos["chelsea"], np.full(photos["chelsea"].shape[:2], 200, np.uint8)])
    out.append(("chelsea_alpha.png", encode(rgba, "PNG")))
    out.append(("camera_16bit.png", _save(Image.fromarray(sd.camera().astype(np.uint16) * 257), "PNG")))
    out.append(("broken.jpg", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00 truncated: not an image"))
    return out


def _save(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()
def _png(arr) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def _npy(arr) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def sphere_frame(rng: np.random.Generator, hw=(96, 72), background_inf: bool = False) -> dict:
    """One analytic frame: depth (planar z), unit normals towards the camera, mask, shaded RGB, K."""
    h, w = hw
    f = 0.9 * w
    k = np.array([[f, 0, w / 2], [0, f, h / 2], [0, 0, 1]], np.float64)
    v, u = np.mgrid[0:h, 0:w].astype(np.float64)
    d = np.stack([(u + 0.5 - k[0, 2]) / f, (v + 0.5 - k[1, 2]) / f, np.ones_like(u)], axis=-1)  # z = 1 rays
    depth = np.full((h, w), np.inf)
    normal = np.zeros((h, w, 3))
    which = np.zeros((h, w), np.uint8)  # 0 background, 1 body, 2 head
    z0 = rng.uniform(1.6, 2.2)
    body = np.array([rng.uniform(-0.15, 0.15), rng.uniform(0.05, 0.25), z0]), rng.uniform(0.45, 0.6)
    head = body[0] + np.array([rng.uniform(-0.1, 0.1), -body[1] - 0.25, rng.uniform(-0.1, 0.1)]), 0.25
    for part, (c, r) in enumerate((body, head), start=1):
        dd = (d * d).sum(-1)
        dc = d @ c
        disc = dc ** 2 - dd * (c @ c - r * r)
        t = np.where(disc > 0, (dc - np.sqrt(np.maximum(disc, 0))) / dd, np.inf)
        closer = t < depth
        depth = np.where(closer, t, depth)
        which = np.where(closer, part, which)
        p = d * t[..., None]
        normal = np.where(closer[..., None], (p - c) / r, normal)
    mask = np.isfinite(depth)
    light = np.array([rng.uniform(-0.5, 0.5), rng.uniform(-0.8, -0.2), -1.0])
    light /= np.linalg.norm(light)
    shade = np.clip((normal * light).sum(-1), 0, 1)
    albedo = rng.uniform(0.4, 1.0, 3)
    back = rng.uniform(0, 255, (h // 8 + 1, w // 8 + 1, 3)).astype(np.uint8)
    back = np.asarray(Image.fromarray(back).resize((w, h), Image.BILINEAR), np.float64)
    rgb = np.where(mask[..., None], (0.15 + 0.85 * shade[..., None]) * albedo * 255, back)
    if not background_inf:
        depth = np.where(mask, depth, 0.0)
    return {"rgb": rgb.clip(0, 255).astype(np.uint8), "depth": depth.astype(np.float32),
            "normal": normal.astype(np.float32), "mask": (mask * 255).astype(np.uint8), "K": k,
            "which": which, "spheres": (body, head)}


# sapiens28 classes of the sphere person's parts (body sphere split at its centre row, head)
SPHERE_PARTS = {"upper": "Upper_Clothing", "lower": "Lower_Clothing", "head": "Face_Neck"}
# COCO-17 joints as offsets from a sphere's centre in units of its radius (camera frame: x right, y down,
# z away from the camera; the person faces the camera, so its left is at +x); all inside the silhouette
SPHERE_JOINTS = [("head", (0, 0.1, -1)), ("head", (0.35, -0.25, -0.9)), ("head", (-0.35, -0.25, -0.9)),
                 ("head", (0.95, 0, 0)), ("head", (-0.95, 0, 0)), ("body", (0.75, -0.6, -0.2)),
                 ("body", (-0.75, -0.6, -0.2)), ("body", (1.0, -0.1, -0.1)), ("body", (-1.0, -0.1, -0.1)),
                 ("body", (0.9, 0.45, -0.3)), ("body", (-0.9, 0.45, -0.3)), ("body", (0.3, 0.4, -0.8)),
                 ("body", (-0.3, 0.4, -0.8)), ("body", (0.35, 0.65, -0.6)), ("body", (-0.35, 0.65, -0.6)),
                 ("body", (0.4, 0.85, -0.3)), ("body", (-0.4, 0.85, -0.3))]


def sphere_parts(fr: dict) -> np.ndarray:
    """sapiens28 label map of a sphere frame: the head, the body's upper and lower halves."""
    from training.tasks.vocab import load
    names = load("sapiens28").names
    h = fr["which"].shape[0]
    (c, r), _ = fr["spheres"]
    centre_row = fr["K"][1, 1] * c[1] / c[2] + fr["K"][1, 2]
    rows = np.arange(h)[:, None]
    labels = np.zeros_like(fr["which"])
    labels[fr["which"] == 2] = names.index(SPHERE_PARTS["head"])
    labels[(fr["which"] == 1) & (rows < centre_row)] = names.index(SPHERE_PARTS["upper"])
    labels[(fr["which"] == 1) & (rows >= centre_row)] = names.index(SPHERE_PARTS["lower"])
    return labels


def sphere_keypoints(fr: dict) -> list:
    """COCO-17 [x, y, v] of the sphere person (v = 2 in the image, 0 outside), as renders store them."""
    body, head = fr["spheres"]
    h, w = fr["which"].shape
    out = []
    for sphere, offset in SPHERE_JOINTS:
        c, r = head if sphere == "head" else body
        p = c + r * np.asarray(offset, np.float64)
        x, y = (fr["K"] @ p)[:2] / p[2] - 0.5  # pixel centres at integers, as render.sampling.project
        out.append([float(x), float(y), 2 if (0 <= x < w and 0 <= y < h) else 0])
    return out


def write_sphere_renders(folder, n_frames: int = 8, hw=(96, 72), per_shard: int = 4, seed: int = 0,
                         prefix: str = "render", people: bool = False) -> Path:
    """A render run folder (RUN/shards/...) of analytic frames; odd frames store inf on the background.
    `people`: also part labels (parts.png, sapiens28, with RUN/render.json naming the vocabulary) and
    COCO-17 keypoints in each frame's json (`keypoints_coco17`), as renders of generated bodies have."""
    rng = np.random.default_rng(seed)
    shards = Path(folder) / "shards"
    if people:
        from training.tasks.vocab import load
        catalog.write_json(Path(folder) / "render.json", {"part_vocabulary": {"names": list(load("sapiens28").names)}})
    with catalog.ShardWriter(shards, prefix, catalog.FRAMES, max_count=per_shard) as writer:
        for i in range(n_frames):
            fr = sphere_frame(rng, hw, background_inf=bool(i % 2))
            key = f"{i:08d}"
            meta = {"frame_index": i, "K": fr["K"].tolist(), "cam_to_world": np.eye(4).tolist(), "synthetic": "spheres"}
            extra = {}
            if people:
                meta["keypoints_coco17"] = sphere_keypoints(fr)
                extra["parts.png"] = _png(sphere_parts(fr))
            writer.add(key, {"rgb.png": _png(fr["rgb"]), "depth.npy": _npy(fr["depth"]),
                             "normal.npy": _npy(fr["normal"]), "mask.png": _png(fr["mask"]), **extra, "json": meta},
                       {"frame_index": i, "scan_id": "spheres", "height": hw[0], "width": hw[1],
                        "K": fr["K"].ravel().tolist(), "cam_to_world": np.eye(4).ravel().tolist(),
                        "person_px": int((fr["mask"] > 0).sum()), "params": json.dumps({"seed": seed})})
    return Path(folder)


# --- COCO-style annotations on real photos ---------------------------------------------------------
# coarse hand annotations (x, y, v) in COCO-17 order; v = 0 where the joint is out of the picture
ASTRONAUT_KPTS = [(222, 118, 2), (205, 100, 2), (240, 98, 2), (185, 110, 2), (262, 108, 2), (140, 215, 2),
                  (320, 210, 2), (95, 330, 2), (360, 330, 2), (120, 440, 2), (330, 420, 2), (0, 0, 0), (0, 0, 0),
                  (0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0)]
CAMERAMAN_KPTS = [(265, 95, 2), (258, 85, 2), (275, 85, 2), (245, 92, 1), (290, 92, 2), (225, 165, 2),
                  (320, 160, 2), (190, 230, 2), (330, 250, 2), (240, 240, 2), (290, 240, 2), (240, 330, 2),
                  (300, 330, 2), (220, 420, 2), (320, 420, 2), (200, 500, 1), (330, 500, 1)]
# part polygons on the astronaut (Sapiens-28 names)
ASTRONAUT_PARTS = {
    "Hair": [[170, 60, 270, 50, 285, 90, 175, 95]],
    "Face_Neck": [[180, 95, 270, 90, 265, 170, 230, 190, 190, 160]],
    "Upper_Clothing": [[120, 200, 330, 195, 350, 511, 110, 511]],
    "Left_Upper_Arm": [[80, 230, 135, 210, 130, 330, 85, 335]],
    "Right_Upper_Arm": [[330, 205, 380, 220, 375, 330, 340, 330]],
    "Left_Hand": [[100, 420, 150, 420, 150, 470, 100, 470]],
    "Right_Hand": [[310, 400, 360, 400, 360, 450, 310, 450]],
}


def write_coco_person(folder) -> tuple[Path, Path]:
    """Write astronaut.png and cameraman.png plus keypoints.json (COCO-17) and parts.json (Sapiens-28
    part polygons on the astronaut, its flipped copy too). Returns (keypoints.json, parts.json)."""
    import skimage.data as sd

    from training.tasks.vocab import load

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    astro = sd.astronaut()
    camera = np.repeat(sd.camera()[..., None], 3, axis=2)
    Image.fromarray(astro).save(folder / "astronaut.png")
    Image.fromarray(camera).save(folder / "cameraman.png")
    coco17 = load("coco17")
    images = [{"id": 1, "file_name": "astronaut.png", "height": 512, "width": 512},
              {"id": 2, "file_name": "cameraman.png", "height": 512, "width": 512}]
    anns = []
    for img_id, kp in ((1, ASTRONAUT_KPTS), (2, CAMERAMAN_KPTS)):
        arr = np.asarray(kp, np.float64)
        vis = arr[arr[:, 2] > 0]
        x0, y0 = vis[:, :2].min(0) - 30
        x1, y1 = vis[:, :2].max(0) + 30
        x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, 511), min(y1, 511)
        anns.append({"id": img_id, "image_id": img_id, "category_id": 1, "iscrowd": 0,
                     "bbox": [x0, y0, x1 - x0, y1 - y0], "area": float((x1 - x0) * (y1 - y0)),
                     "num_keypoints": int((arr[:, 2] > 0).sum()), "keypoints": arr.ravel().tolist()})
    kp_json = folder / "keypoints.json"
    kp_json.write_text(json.dumps({"images": images, "annotations": anns, "categories": [
        {"id": 1, "name": "person", "keypoints": list(coco17.names), "skeleton": [list(e) for e in coco17.skeleton]}]}))
    names = list(load("sapiens28").names)
    cats = [{"id": i, "name": n} for i, n in enumerate(names) if n in ASTRONAUT_PARTS]
    cat_id = {c["name"]: c["id"] for c in cats}
    parts = []
    for name, polys in ASTRONAUT_PARTS.items():
        xs = np.asarray(polys[0][0::2])
        ys = np.asarray(polys[0][1::2])
        parts.append({"id": len(parts) + 1, "image_id": 1, "category_id": cat_id[name], "segmentation": polys,
                      "area": float((xs.max() - xs.min()) * (ys.max() - ys.min())), "iscrowd": 0})
    parts_json = folder / "parts.json"
    parts_json.write_text(json.dumps({"images": images[:1], "annotations": parts, "categories": cats}))
    return kp_json, parts_json
