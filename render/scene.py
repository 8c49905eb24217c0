"""A frame to render, as plain data: the mesh (generated arrays or a scan file), the HDRI light, the
camera, the image size, and the renderer's settings. No Blender here (as Kubric's core/scene.py):
render.sampling fills these from (seed, frame), render.blender turns them into Blender state.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from catalog.config import setting


@dataclass
class RenderSettings:
    """Cycles settings of one worker (fixed for the life of a warm Blender)."""
    samples: int = 64
    noise_threshold: float = 0.01  # adaptive sampling stops a pixel below this noise; 0 disables
    denoiser: str | None = setting("INTEL", '"INTEL" (OpenImageDenoise), "OPTIX" or null', kinds=("str",),
                                   nullable=True, choices=("INTEL", "OPTIX", None))
    max_bounces: int = 4
    device: str = "auto"  # "auto": OptiX/CUDA/HIP GPU when Blender finds one, else CPU; "cpu"; "gpu"
    threads: int = 0  # CPU threads, 0 = all


@dataclass
class MeshInput:
    """A mesh in metres, Z up, as arrays (generated bodies) ..."""
    vertices: np.ndarray  # (V, 3) float
    faces: np.ndarray  # (F, 3) int
    uvs: np.ndarray | None = None  # (F, 3, 2) per-corner texture coordinates
    texture: np.ndarray | None = None  # (H, W, 3) uint8 albedo
    name: str = "person"
    face_labels: np.ndarray | None = None  # (F,) uint8 part class per face (1..255); None = no part labels


@dataclass
class FileMeshInput:
    """... or a scan file, converted to metres and Z up on import."""
    path: str
    unit_scale: float = 1.0  # multiply by this to get metres
    up_axis: str = "Y"  # the file's up axis; OBJ/FBX/glTF are Y-up by convention
    texture: str | None = None  # albedo image to force when the file's material has none that loads
    name: str = "person"


@dataclass
class SceneInput:
    mesh: MeshInput | FileMeshInput
    hdri_path: str
    hdri_rotation_deg: float  # about world Z
    hdri_strength: float
    K: np.ndarray  # 3×3 OpenCV intrinsics
    cam_to_world: np.ndarray  # 4×4, OpenCV camera axes, world Z up, metres
    height: int
    width: int
    base_color: tuple = (0.6, 0.6, 0.6)  # plain material for meshes without a texture
    warnings: list = field(default_factory=list)


def scan_key(mesh) -> tuple | None:
    """Identity of a scan file load (None for generated meshes, which change every frame)."""
    if isinstance(mesh, FileMeshInput):
        return (str(mesh.path), float(mesh.unit_scale), mesh.up_axis.upper(), mesh.texture, mesh.name)
    return None
