"""An independent geometric oracle: ray-cast the same mesh and camera in numpy, no Blender.

For every pixel centre (u, v) (integers: OpenCV's convention) we cast the ray K⁻¹·(u, v, 1) from the camera and intersect
it with every triangle whose projected bounding box covers the pixel (Möller–Trumbore). The nearest
hit gives planar depth z (the ray has unit z in the camera frame, so its parameter *is* z), the mask,
the hit face (for part labels), and the smooth-shaded normal: vertex normals (angle-weighted face normals, as Blender computes them)
interpolated barycentrically, rotated into the OpenCV camera frame and flipped to face the camera.
Tests compare the renderer's ground truth against this.
"""
from __future__ import annotations

import numpy as np


def vertex_normals(vertices: np.ndarray, faces: np.ndarray) -> np.ndarray:
    """Angle-weighted vertex normals (unit)."""
    v = vertices[faces]  # (F, 3, 3)
    fn = np.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0])
    fn /= np.maximum(np.linalg.norm(fn, axis=1, keepdims=True), 1e-20)
    out = np.zeros_like(vertices)
    for i in range(3):
        a = v[:, (i + 1) % 3] - v[:, i]
        b = v[:, (i + 2) % 3] - v[:, i]
        cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-20)
        angle = np.arccos(np.clip(cos, -1.0, 1.0))
        np.add.at(out, faces[:, i], fn * angle[:, None])
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-20)


def raycast(vertices: np.ndarray, faces: np.ndarray, K: np.ndarray, cam_to_world: np.ndarray,
            height: int, width: int, chunk: int = 2_000_000) -> dict:
    """Depth (planar z, metres, inf = miss), mask (bool) and OpenCV camera-frame unit normals."""
    vertices = np.asarray(vertices, dtype=np.float64)
    faces = np.asarray(faces, dtype=np.int64)
    w2c = np.linalg.inv(np.asarray(cam_to_world, dtype=np.float64))
    vc = vertices @ w2c[:3, :3].T + w2c[:3, 3]  # camera-frame vertices
    nc = vertex_normals(vertices, faces) @ w2c[:3, :3].T
    tri = vc[faces]  # (F, 3, 3)
    # keep triangles fully in front of the camera (the person is; see sampling.in_frame)
    front = (tri[:, :, 2] > 1e-6).all(1)
    fidx = np.nonzero(front)[0]
    tri = tri[front]
    uv = tri[:, :, :2] / tri[:, :, 2:3] * [K[0, 0], K[1, 1]] + [K[0, 2], K[1, 2]]
    # pixel centres (integers) covered by each triangle's projected bounding box
    u0 = np.clip(np.ceil(uv[:, :, 0].min(1)), 0, width).astype(np.int64)
    u1 = np.clip(np.floor(uv[:, :, 0].max(1)), -1, width - 1).astype(np.int64)
    v0 = np.clip(np.ceil(uv[:, :, 1].min(1)), 0, height).astype(np.int64)
    v1 = np.clip(np.floor(uv[:, :, 1].max(1)), -1, height - 1).astype(np.int64)
    nu, nv = np.maximum(u1 - u0 + 1, 0), np.maximum(v1 - v0 + 1, 0)
    counts = nu * nv
    keep = counts > 0
    tri, fidx, u0, v0, nu, counts = tri[keep], fidx[keep], u0[keep], v0[keep], nu[keep], counts[keep]

    depth = np.full(height * width, np.inf)
    best_face = np.full(height * width, -1, dtype=np.int64)
    best_bary = np.zeros((height * width, 2))
    Kinv = np.linalg.inv(K)
    starts = np.concatenate([[0], np.cumsum(counts)])
    # process (triangle, pixel) candidate pairs in chunks to bound memory
    t_lo = 0
    while t_lo < len(tri):
        t_hi = int(np.searchsorted(starts, starts[t_lo] + chunk, side="right")) - 1
        t_hi = max(t_hi, t_lo + 1)
        sl = slice(t_lo, t_hi)
        c = counts[sl]
        pair_tri = np.repeat(np.arange(t_lo, t_hi), c)
        local = np.arange(c.sum()) - np.repeat(starts[sl] - starts[t_lo], c)
        pu = u0[pair_tri] + local % nu[pair_tri]
        pv = v0[pair_tri] + local // nu[pair_tri]
        d = np.stack([pu, pv, np.ones_like(pu)], 1).astype(np.float64) @ Kinv.T  # d.z == 1
        a, b, cc = tri[pair_tri, 0], tri[pair_tri, 1], tri[pair_tri, 2]
        e1, e2 = b - a, cc - a
        p = np.cross(d, e2)
        det = (e1 * p).sum(1)
        ok = np.abs(det) > 1e-14
        inv = np.where(ok, 1.0 / np.where(ok, det, 1.0), 0.0)
        s = -a  # ray origin is the camera centre (0, 0, 0)
        bu = (s * p).sum(1) * inv
        q = np.cross(s, e1)
        bv = (d * q).sum(1) * inv
        t = (e2 * q).sum(1) * inv
        hit = ok & (bu >= 0) & (bv >= 0) & (bu + bv <= 1) & (t > 0)
        pix = (pv * width + pu)[hit]
        t, pt = t[hit], pair_tri[hit]
        bu, bv = bu[hit], bv[hit]
        # nearest hit per pixel: sort by (pixel, t) and take the first of each pixel
        order = np.lexsort((t, pix))
        pix, t, pt, bu, bv = pix[order], t[order], pt[order], bu[order], bv[order]
        first = np.ones(len(pix), dtype=bool)
        first[1:] = pix[1:] != pix[:-1]
        pix, t, pt, bu, bv = pix[first], t[first], pt[first], bu[first], bv[first]
        closer = t < depth[pix]
        depth[pix[closer]] = t[closer]
        best_face[pix[closer]] = pt[closer]
        best_bary[pix[closer]] = np.stack([bu[closer], bv[closer]], 1)
        t_lo = t_hi

    mask = np.isfinite(depth)
    normal = np.zeros((height * width, 3))
    hp = np.nonzero(mask)[0]
    fi = fidx[best_face[hp]]
    bu, bv = best_bary[hp, 0], best_bary[hp, 1]
    n = (1 - bu - bv)[:, None] * nc[faces[fi, 0]] + bu[:, None] * nc[faces[fi, 1]] + bv[:, None] * nc[faces[fi, 2]]
    n /= np.maximum(np.linalg.norm(n, axis=1, keepdims=True), 1e-20)
    # face the camera, like a renderer's shading normal of a two-sided surface
    rays = np.stack([(hp % width), (hp // width), np.ones(len(hp))], 1).astype(np.float64) @ Kinv.T
    n *= np.where((n * rays).sum(1) > 0, -1.0, 1.0)[:, None]
    normal[hp] = n
    face = np.full(height * width, -1, dtype=np.int64)
    face[hp] = fi
    return {"depth_m": depth.reshape(height, width).astype(np.float32), "mask": mask.reshape(height, width),
            "normal": normal.reshape(height, width, 3).astype(np.float32), "face": face.reshape(height, width)}


def part_labels(oracle: dict, face_labels: np.ndarray) -> np.ndarray:
    """uint8 part map of a raycast: the hit face's class, 0 where the ray misses."""
    face = oracle["face"]
    return np.where(face >= 0, np.asarray(face_labels)[np.maximum(face, 0)], 0).astype(np.uint8)


def part_agreement(rendered_parts: np.ndarray, oracle_parts: np.ndarray, mask: np.ndarray) -> float:
    """Fraction of mask pixels whose rendered part class equals the oracle's."""
    m = np.asarray(mask) > 0
    return float((np.asarray(rendered_parts)[m] == np.asarray(oracle_parts)[m]).mean()) if m.any() else 1.0


def compare(rendered: dict, oracle: dict, erode_px: int = 1) -> dict:
    """Agreement of rendered ground truth with the oracle: depth error on interior pixels, mask IoU,
    normal angle error. Interior = mask pixels whose 3×3 (per erode step) neighbourhood is all person
    in both masks, so silhouette pixels, where one pixel mixes person and background, are left out."""
    m_r = np.asarray(rendered["mask"]) > 0
    m_o = np.asarray(oracle["mask"]).astype(bool)
    inter = (m_r & m_o).sum()
    union = (m_r | m_o).sum()
    interior = m_r & m_o
    for _ in range(erode_px):
        e = interior.copy()
        e[1:] &= interior[:-1]
        e[:-1] &= interior[1:]
        e[:, 1:] &= interior[:, :-1]
        e[:, :-1] &= interior[:, 1:]
        interior = e
    # depth discontinuities inside the silhouette (an arm in front of the torso) are edges too
    d_o = np.where(m_o, oracle["depth_m"], 0.0)
    jump = np.zeros_like(interior)
    for ax in (0, 1):
        g = np.abs(np.diff(d_o, axis=ax)) > 0.02
        if ax == 0:
            jump[1:] |= g
            jump[:-1] |= g
        else:
            jump[:, 1:] |= g
            jump[:, :-1] |= g
    interior &= ~jump
    dz = np.abs(np.asarray(rendered["depth_m"], np.float64)[interior] - oracle["depth_m"][interior])
    nr, no = np.asarray(rendered["normal"], np.float64)[interior], oracle["normal"][interior].astype(np.float64)
    cos = np.clip((nr * no).sum(1) / np.maximum(np.linalg.norm(nr, axis=1) * np.linalg.norm(no, axis=1), 1e-12),
                  -1, 1)
    ang = np.degrees(np.arccos(cos))
    return {
        "mask_iou": float(inter / union) if union else 1.0,
        "interior_px": int(interior.sum()),
        "depth_abs_err_max_m": float(dz.max()) if dz.size else 0.0,
        "depth_abs_err_median_m": float(np.median(dz)) if dz.size else 0.0,
        "depth_abs_err_p99_m": float(np.percentile(dz, 99)) if dz.size else 0.0,
        "normal_angle_median_deg": float(np.median(ang)) if ang.size else 0.0,
        "normal_angle_p90_deg": float(np.percentile(ang, 90)) if ang.size else 0.0,
    }
