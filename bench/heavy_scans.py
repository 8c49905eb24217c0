"""RenderPeople-like heavy scans for benchmarks and tests, made offline from `anny` bodies.

A photogrammetry scan is hundreds of thousands of faces with a 4K-8K albedo; loading one into Blender
costs seconds, which is what scan-major rendering saves. `write_heavy_scan` writes OBJ + MTL + JPEG:
an anny body (its own phenotype and pose from (seed, index)) midpoint-subdivided twice (27,420 ->
438,720 triangles; the surface is unchanged, so the ray-casting oracle still applies) and a
4096x4096 procedural albedo in anny's UV layout (the body's synthetic colours, upsampled, with a fabric
weave and skin-pore noise so the texture carries real high-frequency detail). Nothing is downloaded.

    python bench/heavy_scans.py OUT_DIR --count 4          # writes OUT_DIR/heavy-00.obj ... and prints JSON
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def subdivide(points: np.ndarray, faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split every triangle into four at its edge midpoints (shared edges share their midpoint)."""
    faces = np.asarray(faces, np.int64)
    edges = np.sort(faces[:, [0, 1, 1, 2, 2, 0]].reshape(-1, 2), axis=1)
    uniq, inv = np.unique(edges, axis=0, return_inverse=True)
    mids = (points[uniq[:, 0]] + points[uniq[:, 1]]) / 2
    m = inv.reshape(-1, 3) + len(points)  # midpoints of edges 01, 12, 20
    a, b, c = faces.T
    m01, m12, m20 = m.T
    out = np.concatenate([np.stack(t, 1) for t in ([a, m01, m20], [m01, b, m12], [m20, m12, c], [m01, m12, m20])])
    return np.concatenate([points, mids]), out


def procedural_albedo(base: np.ndarray, size: int, seed: int) -> np.ndarray:
    """The body's albedo upsampled to size x size, with a woven-fabric pattern and per-pixel noise."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    img = np.asarray(Image.fromarray(base).resize((size, size), Image.BILINEAR), dtype=np.float32)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32)
    period = rng.uniform(6, 14)
    weave = 0.06 * np.sin(2 * np.pi * x / period) * np.sin(2 * np.pi * y / period)
    noise = 0.05 * rng.standard_normal((size, size)).astype(np.float32)
    return np.clip(img * (1 + weave + noise)[..., None], 0, 255).astype(np.uint8)


def write_heavy_scan(folder, name: str, seed: int = 0, index: int = 0, levels: int = 2,
                     texture_size: int = 4096) -> dict:
    """OBJ (Y-up, metres) + MTL + JPEG albedo of the anny body of (seed, index); returns what it wrote."""
    from PIL import Image

    from render import bodies
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = bodies.anny_model()
    body = bodies.make_body(seed, index)
    v, f = body.vertices.astype(np.float64), body.faces
    tc = model.texture_coordinates.cpu().numpy().astype(np.float64)
    ft = model.face_texture_coordinate_indices.cpu().numpy()
    for _ in range(levels):
        v, f = subdivide(v, f)
        tc, ft = subdivide(tc, ft)  # same face order and corner pattern as the positions
    Image.fromarray(procedural_albedo(body.texture, texture_size, seed * 1000 + index)).save(
        folder / f"{name}.jpg", quality=92)
    (folder / f"{name}.mtl").write_text(f"newmtl skin\nKd 1 1 1\nmap_Kd {name}.jpg\n")
    v_yup = np.stack([v[:, 0], v[:, 2], -v[:, 1]], axis=1)  # Z-up -> Y-up, as OBJ files are by convention
    with open(folder / f"{name}.obj", "w") as fh:
        fh.write(f"mtllib {name}.mtl\no {name}\n")
        np.savetxt(fh, v_yup, fmt="v %.6f %.6f %.6f")
        np.savetxt(fh, tc, fmt="vt %.6f %.6f")
        fh.write("usemtl skin\ns 1\n")
        idx = np.stack([f + 1, ft + 1], axis=2).reshape(len(f), 6)
        np.savetxt(fh, idx, fmt="f %d/%d %d/%d %d/%d")
    return {"obj": str(folder / f"{name}.obj"), "faces": int(len(f)), "vertices": int(len(v)),
            "texture": [texture_size, texture_size], "params": body.params}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--count", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--levels", type=int, default=2, help="midpoint subdivisions (2: 438,720 triangles)")
    p.add_argument("--texture", type=int, default=4096)
    args = p.parse_args()
    out = []
    for k in range(args.count):
        t = time.time()
        r = write_heavy_scan(args.out, f"heavy-{k:02d}", args.seed, k, args.levels, args.texture)
        out.append({k: r[k] for k in ("obj", "faces", "vertices", "texture")} | {"seconds": round(time.time() - t, 1)})
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
