"""What a frame shows, drawn from (run seed, frame index): pure Python and numpy, no Blender.

A frame is a scene (scan or generated body, HDRI, its rotation and strength) plus a camera (focal
length, distance, azimuth, elevation, roll, look-at jitter, resolution). Every draw comes from
`numpy.random.default_rng([seed, frame_index, stream])`, so a frame's parameters depend on nothing but
the seed, its index and the config: reruns, resumes and other workers reproduce them exactly.

World frame: metres, Z up; the person stands on z = bbox_min.z, roughly centred on the Z axis.
Camera frame: OpenCV (x right, y down, z forward). K is the 3×3 pinhole matrix with square pixels and
the principal point at the image centre; pixel centres sit at integer coordinates, as in OpenCV.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from catalog import config as loader

# independent random streams per frame, so resampling the camera never changes the scene
STREAM_SCENE, STREAM_BODY, STREAM_CAMERA, STREAM_TEXTURE = 0, 1, 2, 3


@dataclass
class CameraConfig:
    """Camera distributions. Defaults follow Sapiens' renders: portrait, random focal/rotation/translation."""
    height: int = 1024  # image rows (Sapiens fine-tunes at 1024×768, H×W)
    width: int = 768  # image columns
    focal_mm: tuple = (35.0, 85.0)  # uniform, 35 mm-equivalent: 36 mm sensor across the longer image side
    fill: tuple = (0.55, 0.9)  # uniform, person's projected height / image height; sets the distance
    azimuth_deg: tuple = (0.0, 360.0)  # uniform, around the person (0 = in front of the body's +y side)
    elevation_deg: tuple = (-10.0, 35.0)  # uniform, camera above (+) or below (-) the look-at point
    roll_deg_std: float = 5.0  # normal, clipped at ±3 std: a hand-held camera's tilt
    look_at_jitter: float = 0.08  # uniform ± this fraction of body height on each axis, around bbox centre
    margin_px: int = 2  # the person's projected bounding box must lie this far inside the image
    max_resamples: int = 20  # draws of the camera before the frame is given up


@dataclass
class LightConfig:
    rotation_deg: tuple = (0.0, 360.0)  # uniform HDRI rotation about world Z
    strength: tuple = (0.6, 1.8)  # log-uniform HDRI strength multiplier


@dataclass
class BodyConfig:
    """Phenotypes of generated `anny` bodies; each in anny's [0, 1] range, drawn uniformly."""
    gender: tuple = (0.0, 1.0)
    age: tuple = (0.35, 0.9)  # anny's age axis: 0.5 is ~25 years; below ~0.3 are children
    muscle: tuple = (0.1, 0.9)
    weight: tuple = (0.1, 0.9)
    height: tuple = (0.1, 0.9)
    proportions: tuple = (0.2, 0.8)
    pose_scale: float = 1.0  # 0 = rest pose; 1 = the full joint ranges of render.bodies.POSE_RANGES


@dataclass
class SamplingConfig:
    camera: CameraConfig = field(default_factory=CameraConfig)
    light: LightConfig = field(default_factory=LightConfig)
    body: BodyConfig = field(default_factory=BodyConfig)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "SamplingConfig":
        return loader.build(cls, d, "sampling")  # lists as tuples; an unknown key is an error


def frame_rng(seed: int, frame_index: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), int(frame_index), int(stream)])


def _uniform(rng, lo_hi) -> float:
    lo, hi = lo_hi
    return float(rng.uniform(lo, hi)) if hi > lo else float(lo)


# --- scene -------------------------------------------------------------------------------------------
def sample_scene(seed: int, frame_index: int, scan_ids: list[str], hdri_ids: list[str],
                 cfg: SamplingConfig) -> dict:
    """Scan (or generated body), HDRI, HDRI rotation and strength for one frame."""
    if not scan_ids:
        raise ValueError("no usable scans to sample from (check the scan catalog's reject_reason column)")
    if not hdri_ids:
        raise ValueError("no usable HDRIs to sample from (check the hdri catalog's reject_reason column)")
    rng = frame_rng(seed, frame_index, STREAM_SCENE)
    lo, hi = cfg.light.strength
    return {
        "scan_id": scan_ids[_draw_scan(rng, len(scan_ids))],
        "hdri_id": hdri_ids[int(rng.integers(len(hdri_ids)))],
        "hdri_rotation_deg": _uniform(rng, cfg.light.rotation_deg),
        "hdri_strength": float(math.exp(rng.uniform(math.log(lo), math.log(hi)))) if hi > lo else float(lo),
    }


def _draw_scan(rng, n_scans: int) -> int:
    return int(rng.integers(n_scans))  # the scene stream's first draw


def scan_draw(seed: int, frame_index: int, n_scans: int) -> int:
    """Index of the scan frame `frame_index` shows (the same draw sample_scene makes), for planning."""
    return _draw_scan(frame_rng(seed, frame_index, STREAM_SCENE), n_scans)


def sample_phenotype(seed: int, frame_index: int, cfg: BodyConfig) -> dict:
    rng = frame_rng(seed, frame_index, STREAM_BODY)
    return {k: _uniform(rng, getattr(cfg, k)) for k in ("gender", "age", "muscle", "weight", "height",
                                                        "proportions")}


# --- camera ------------------------------------------------------------------------------------------
def intrinsics(focal_mm: float, height: int, width: int, sensor_mm: float = 36.0) -> np.ndarray:
    """K for a `focal_mm` lens on a `sensor_mm` sensor fitted to the longer image side (Blender's AUTO fit)."""
    f = focal_mm / sensor_mm * max(height, width)
    # OpenCV convention: pixel (0, 0)'s centre is at (0, 0), so the image centre is ((W-1)/2, (H-1)/2)
    return np.array([[f, 0.0, (width - 1) / 2.0], [0.0, f, (height - 1) / 2.0], [0.0, 0.0, 1.0]])


def look_at(eye: np.ndarray, target: np.ndarray, roll_deg: float = 0.0, up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """4×4 camera-to-world, OpenCV axes: z towards target, y down (towards -up), rolled about z."""
    eye, target, up = (np.asarray(a, dtype=float) for a in (eye, target, up))
    z = target - eye
    z /= np.linalg.norm(z)
    x = np.cross(z, up)
    if np.linalg.norm(x) < 1e-9:  # looking straight up or down
        x = np.cross(z, [0.0, 1.0, 0.0])
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    r = math.radians(roll_deg)
    c, s = math.cos(r), math.sin(r)
    x, y = c * x + s * y, -s * x + c * y
    T = np.eye(4)
    T[:3, 0], T[:3, 1], T[:3, 2], T[:3, 3] = x, y, z, eye
    return T


def project(points: np.ndarray, K: np.ndarray, cam_to_world: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pixel coordinates (N, 2) and camera-frame depth z (N,) of world points (N, 3)."""
    w2c = np.linalg.inv(cam_to_world)
    pc = np.asarray(points, dtype=float) @ w2c[:3, :3].T + w2c[:3, 3]
    z = pc[:, 2]
    uv = (pc[:, :2] / np.where(np.abs(z) < 1e-12, 1e-12, z)[:, None]) * [K[0, 0], K[1, 1]] + [K[0, 2], K[1, 2]]
    return uv, z


def bbox_corners(bbox_min, bbox_max) -> np.ndarray:
    lo, hi = np.asarray(bbox_min, float), np.asarray(bbox_max, float)
    return np.array([[(lo, hi)[i][0], (lo, hi)[j][1], (lo, hi)[k][2]]
                     for i in (0, 1) for j in (0, 1) for k in (0, 1)])


def in_frame(points: np.ndarray, K, cam_to_world, height: int, width: int, margin_px: float = 0) -> bool:
    """True if every point is in front of the camera and projects inside the image (minus a margin)."""
    uv, z = project(points, K, cam_to_world)
    if np.any(z <= 0.05):
        return False
    lo = margin_px - 0.5  # pixel centres are integers, so the image spans [-0.5, W - 0.5]
    return bool(np.all(uv[:, 0] >= lo) and np.all(uv[:, 0] <= width - 1 - lo)
                and np.all(uv[:, 1] >= lo) and np.all(uv[:, 1] <= height - 1 - lo))


def keypoints_2d(points3d: np.ndarray, K, cam_to_world, depth_m: np.ndarray, tolerance_m: float = 0.12) -> list:
    """COCO-style (x, y, v) per 3D joint: v = 2 visible, 1 in the image but hidden, 0 outside the image.

    Joints lie inside the body, up to ~10 cm behind the skin, so a joint counts as visible when the
    rendered surface at its pixel is no more than `tolerance_m` in front of it (an approximation).
    """
    uv, z = project(np.asarray(points3d, float), K, cam_to_world)
    h, w = depth_m.shape
    out = []
    for (x, y), zz in zip(uv, z):
        col, row = int(round(x)), int(round(y))
        if zz <= 0 or not (0 <= col < w and 0 <= row < h):
            out.append([float(x), float(y), 0])
            continue
        d = float(depth_m[row, col])
        visible = np.isfinite(d) and d > 0 and d >= zz - tolerance_m
        out.append([float(x), float(y), 2 if visible else 1])
    return out


class PersonNotInFrame(Exception):
    """No camera draw kept the person's bounding box inside the image."""


def sample_camera(seed: int, frame_index: int, bbox_min, bbox_max, cfg: CameraConfig,
                  points: np.ndarray | None = None) -> dict:
    """Draw camera parameters until the person is in frame (at most cfg.max_resamples draws).

    `points` (default: the 8 bbox corners) are what must project inside the image. The check uses
    the corners of the bounding box, which contain the body, so a passing frame never cuts the person.
    """
    rng = frame_rng(seed, frame_index, STREAM_CAMERA)
    lo, hi = np.asarray(bbox_min, float), np.asarray(bbox_max, float)
    extent = hi - lo
    body_h = float(extent[2])
    center = (lo + hi) / 2.0
    pts = bbox_corners(lo, hi) if points is None else np.asarray(points, float)
    H, W = cfg.height, cfg.width
    for attempt in range(max(1, cfg.max_resamples)):
        focal_mm = _uniform(rng, cfg.focal_mm)
        K = intrinsics(focal_mm, H, W)
        fill = _uniform(rng, cfg.fill)
        azimuth = _uniform(rng, cfg.azimuth_deg)
        elevation = _uniform(rng, cfg.elevation_deg)
        roll = float(np.clip(rng.normal(0.0, cfg.roll_deg_std), -3 * cfg.roll_deg_std, 3 * cfg.roll_deg_std)) \
            if cfg.roll_deg_std > 0 else 0.0
        jitter = rng.uniform(-1.0, 1.0, size=3) * cfg.look_at_jitter * body_h
        target = center + jitter
        # distance at which the body's height spans `fill` of the image height (thin-lens approximation,
        # plus half the body's depth so the near side does not come closer than planned)
        distance = K[1, 1] * body_h / (fill * H) + 0.5 * float(max(extent[0], extent[1]))
        az, el = math.radians(azimuth), math.radians(elevation)
        direction = np.array([math.cos(el) * math.sin(az), -math.cos(el) * math.cos(az), math.sin(el)])
        # azimuth 0 looks at the body's front: anny bodies face -y, so the camera sits on -y
        eye = target + distance * direction
        T = look_at(eye, target, roll)
        if in_frame(pts, K, T, H, W, cfg.margin_px):
            return {
                "focal_mm": focal_mm, "fill": fill, "distance_m": distance, "azimuth_deg": azimuth,
                "elevation_deg": elevation, "roll_deg": roll, "look_at": target.tolist(),
                "look_at_jitter_m": jitter.tolist(), "height": H, "width": W, "camera_draws": attempt + 1,
                "K": K, "cam_to_world": T,
            }
    raise PersonNotInFrame(
        f"frame {frame_index}: the camera could not see the whole person after {cfg.max_resamples} draws "
        f"(body bbox {np.round(extent, 2).tolist()} m, fill {cfg.fill}, focal {cfg.focal_mm} mm, "
        f"{H}x{W}); lower camera.fill or widen camera.focal_mm")
