"""Scan and HDRI libraries -> Parquet catalogs (schemas catalog.SCANS and catalog.HDRIS).

Each scan is imported with the renderer's own importer (render.blender.inspect_mesh_file), then judged
by pure rules (`judge_scan`): up axis from the tallest side, units from the person's height, texture
presence. A rejected scan keeps its row with a `reject_reason`; problems that still allow rendering
(missing texture, centimetres) go into `warnings`.

Importing runs in a child process (one for the whole library), so a scan whose import crashes Blender
(native code) only costs that scan: its row is rejected with reason "blender_crash: ..." and a new child
goes on with the next file.
"""
from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

MESH_EXTS = (".obj", ".fbx", ".glb", ".gltf", ".ply")
HDRI_EXTS = (".hdr", ".exr")

# plausible person heights per unit: (unit name, factor to metres, lo, hi in that unit)
UNITS = [("metres", 1.0, 0.3, 2.6), ("centimetres", 0.01, 30.0, 260.0), ("millimetres", 0.001, 300.0, 2600.0)]


def scan_id(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("").as_posix()
    return re.sub(r"[^A-Za-z0-9_/-]+", "_", rel)


def judge_scan(measure: dict) -> dict:
    """Decide up axis, unit scale and usability from the importer's measurements (pure)."""
    lo, hi = np.asarray(measure["bbox_min"], float), np.asarray(measure["bbox_max"], float)
    extent = hi - lo
    warnings: list[str] = []
    row = {"n_triangles": int(measure["n_triangles"]), "ok": True, "reject_reason": None}
    tallest = int(np.argmax(extent))
    if tallest == 2:
        up, fix = "Y", np.eye(3)  # importer already turned the Y-up file to Z-up
    elif tallest == 1:
        up, fix = "Z", np.array([[1, 0, 0], [0, 0, 1], [0, -1, 0]], float)  # Z-up file, turned once too many
    else:
        return {**row, "ok": False, "up_axis": None, "unit_scale": None,
                "reject_reason": f"the person lies along the x axis (extent {np.round(extent, 3).tolist()}); "
                                 "re-export it standing along Y (or Z)", "warnings": warnings}
    height = float(extent[tallest])
    unit = next((u for u in UNITS if u[2] <= height <= u[3]), None)
    if unit is None:
        return {**row, "ok": False, "up_axis": up, "unit_scale": None, "warnings": warnings,
                "reject_reason": f"height {height:.4g} file units fits neither metres (0.3-2.6), centimetres "
                                 "nor millimetres; rescale the scan"}
    name, scale = unit[0], unit[1]
    if scale != 1.0:
        warnings.append(f"mesh is in {name} (height {height:.4g}); scaled by {scale} to metres")
    corners = np.array([[x, y, z] for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])])
    c = corners @ fix.T * scale
    texture = None
    loaded = [t for t in measure.get("textures", []) if t not in measure.get("missing_textures", [])]
    for t in measure.get("missing_textures", []):
        warnings.append(f"texture {t} is missing or unreadable: renders with a plain material")
    if loaded:
        texture = loaded[0]
    elif not measure.get("missing_textures"):
        warnings.append("no albedo texture: renders with a plain material")
    return {**row, "up_axis": up, "unit_scale": scale, "bbox_min": c.min(0).tolist(), "bbox_max": c.max(0).tolist(),
            "texture": texture, "warnings": warnings}


def obj_texture_refs(path: Path) -> list[Path]:
    """Albedo images (map_Kd) the OBJ's material libraries name, resolved next to the files."""
    refs = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("mtllib "):
            mtl = path.parent / line.split(None, 1)[1].strip()
            if mtl.exists():
                for m in mtl.read_text(errors="replace").splitlines():
                    if m.strip().startswith("map_Kd "):
                        refs.append(mtl.parent / m.strip().split()[-1])
    return refs


def _inspect_worker(list_file: str, start: int, out_file: str) -> None:
    """Child process: import scans start.. of the list, one JSON line each ("begin" first, so a crash
    inside an import leaves a begin without its result)."""
    from render import blender
    paths = json.loads(Path(list_file).read_text())
    with open(out_file, "a") as out:
        for i in range(start, len(paths)):
            out.write(json.dumps({"i": i, "begin": True}) + "\n")
            out.flush()
            try:
                rec = {"i": i, "measure": blender.inspect_mesh_file(paths[i])}
            except Exception as e:  # noqa: BLE001  (a broken file must not stop the index)
                rec = {"i": i, "error": str(e)}
            out.write(json.dumps(rec) + "\n")
            out.flush()


def inspect_isolated(paths: list[Path]) -> list[dict]:
    """inspect_mesh_file of every path in child processes: {"measure"}, {"error"} or {"crash"} per path."""
    results: list[dict | None] = [None] * len(paths)
    with tempfile.TemporaryDirectory(prefix="humanset-scan-index-") as tmp:
        list_file, out_file = Path(tmp) / "paths.json", Path(tmp) / "results.jsonl"
        list_file.write_text(json.dumps([str(p) for p in paths]))
        start = 0
        while start < len(paths):
            code = (f"from render.scans import _inspect_worker; _inspect_worker({str(list_file)!r}, {start}, "
                    f"{str(out_file)!r})")
            proc = subprocess.run([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                      filter(None, [str(Path(__file__).resolve().parents[1]),
                                                    os.environ.get("PYTHONPATH")]))})
            begun = None
            for line in out_file.read_text().splitlines():
                rec = json.loads(line)
                if rec.get("begin"):
                    begun = rec["i"]
                else:
                    results[rec["i"]], begun = rec, None
            if proc.returncode == 0 and begun is None:
                break
            if begun is None:  # died before its first import: not a scan's fault
                raise RuntimeError(f"the scan-index process failed (rc {proc.returncode}): {proc.stderr[-2000:]}")
            log.warning("scan %s crashed the importer's process (rc %d); rejected", paths[begun], proc.returncode)
            results[begun] = {"i": begun, "crash": proc.returncode}
            start = begun + 1
    return [r or {"error": "not inspected"} for r in results]


def index_scans(scans_dir) -> list[dict]:
    """One SCANS row per mesh file under `scans_dir` (recursively), rejected ones included."""
    root = Path(scans_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"scan library {root}: {'a file' if root.is_file() else 'no such folder'}; pass a "
                                "folder of scans (OBJ+MTL, FBX, glTF/GLB, PLY)")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in MESH_EXTS and p.is_file())
    if not files:
        raise FileNotFoundError(f"scan library {root} holds no mesh files ({', '.join(MESH_EXTS)}); "
                                "pass a folder of OBJ+MTL / FBX / glTF scans, or --scans anny")
    rows = []
    for p, result in zip(files, inspect_isolated(files)):
        base = {"scan_id": scan_id(p, root), "path": str(p.resolve()), "format": p.suffix.lower().lstrip(".")}
        try:
            if "crash" in result:
                raise _Crash(f"blender_crash: Blender's process died importing it (exit {result['crash']}); "
                             "re-export the scan or remove it from the library")
            if "error" in result:
                raise ValueError(result["error"])
            measure = result["measure"]
            if p.suffix.lower() == ".obj":  # Blender's OBJ importer silently drops textures it cannot find
                missing = [str(t) for t in obj_texture_refs(p) if not t.is_file()]
                measure["missing_textures"] = sorted(set(measure["missing_textures"]) | set(missing))
            row = {**base, **judge_scan(measure)}
        except _Crash as e:
            row = {**base, "ok": False, "reject_reason": str(e), "warnings": []}
        except Exception as e:  # noqa: BLE001  (a broken file must not stop the index)
            row = {**base, "ok": False, "reject_reason": f"cannot load: {e}", "warnings": []}
        if row["ok"]:
            for w in row["warnings"]:
                log.warning("scan %s: %s", p, w)
        else:
            log.warning("scan %s rejected: %s", p, row["reject_reason"])
        rows.append(row)
    return rows


class _Crash(Exception):
    pass


def index_hdris(hdris) -> list[dict]:
    """HDRIS rows for a folder of .hdr/.exr files, or 'builtin' (the studio lights inside the bpy wheel)."""
    from render import blender
    if str(hdris) == "builtin":
        root, prefix = blender.builtin_hdri_dir(), "builtin/"
    else:
        root, prefix = Path(hdris), ""
    if not root.is_dir():
        raise FileNotFoundError(f"HDRI library {root}: no such directory (or pass --hdris builtin)")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in HDRI_EXTS and p.is_file())
    if not files:
        raise FileNotFoundError(f"HDRI library {root} holds no .hdr/.exr files")
    rows = []
    for p in files:
        row = {"hdri_id": prefix + scan_id(p, root), "path": str(p.resolve()), "ok": True}
        try:
            row["width"], row["height"] = blender.image_size(p)
        except Exception as e:  # noqa: BLE001
            row.update(ok=False, reject_reason=f"unreadable: {e}")
            log.warning("HDRI %s rejected: %s", p, row["reject_reason"])
        rows.append(row)
    return rows
