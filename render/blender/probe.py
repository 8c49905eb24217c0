"""Inspection for the scan and HDRI catalogs, with the renderer's own importers."""
from __future__ import annotations

import sys

import numpy as np

from render.scene import FileMeshInput
from render.blender import meshes
from render.blender.compat import import_blenderproc
from render.blender.renderer import quiet


def image_size(path) -> tuple[int, int]:
    """(width, height) of an image as Blender reads it; raises ValueError if Blender cannot read it."""
    import bpy
    path = str(path)
    try:
        img = bpy.data.images.load(path, check_existing=False)
    except RuntimeError as e:
        raise ValueError(f"Blender cannot read it ({str(e).strip()})") from e
    try:
        w, h = int(img.size[0]), int(img.size[1])
        if w == 0 or h == 0 or not img.has_data and not _pixels_load(img):
            raise ValueError("Blender read no pixels (corrupt or unsupported file)")
        return w, h
    finally:
        bpy.data.images.remove(img)


def _pixels_load(img) -> bool:
    try:
        return len(img.pixels) > 0
    except Exception:  # noqa: BLE001  (Blender raises assorted errors on broken files)
        return False


def inspect_mesh_file(path) -> dict:
    """Import a scan with the renderer's importer and measure it, then remove it again.

    Returns the importer's view: triangle count, bounding box in Blender world coordinates (after the
    importer's Y-up -> Z-up turn), the albedo image files its materials reference and which of those
    could not be loaded. Raises ValueError when the file does not import or holds no mesh.
    """
    import bpy
    import_blenderproc()
    path = str(path)
    before_objs, before_meshes = set(bpy.data.objects), set(bpy.data.meshes)
    before_mats, before_imgs = set(bpy.data.materials), set(bpy.data.images)
    try:
        with quiet():
            try:
                objs = meshes.import_file(sys.modules["blenderproc"], FileMeshInput(path))
            except RuntimeError as e:  # bpy.ops report import errors as RuntimeError
                raise ValueError(f"the importer failed: {str(e).strip().splitlines()[-1]}") from e
        if not objs:
            raise ValueError("the file holds no mesh")
        n_tri, lo, hi = 0, np.full(3, np.inf), np.full(3, -np.inf)
        textures, missing = [], []
        for o in objs:
            bo = o.blender_obj
            me = bo.data
            if len(me.vertices) == 0:
                continue
            co = np.empty(len(me.vertices) * 3, dtype=np.float64)
            me.vertices.foreach_get("co", co)
            co = co.reshape(-1, 3)
            mw = np.array(bo.matrix_world)
            co = co @ mw[:3, :3].T + mw[:3, 3]
            lo, hi = np.minimum(lo, co.min(0)), np.maximum(hi, co.max(0))
            totals = np.empty(len(me.polygons), dtype=np.int64)
            me.polygons.foreach_get("loop_total", totals)
            n_tri += int(np.maximum(totals - 2, 0).sum())
            for mat in bo.data.materials:
                if mat is None or not mat.use_nodes:
                    continue
                for node in mat.node_tree.nodes:
                    if node.bl_idname == "ShaderNodeTexImage" and node.image is not None:
                        f = bpy.path.abspath(node.image.filepath)
                        textures.append(f)
                        if not node.image.has_data and not _pixels_load(node.image):
                            missing.append(f)
        if n_tri == 0:
            raise ValueError("the file's meshes have no faces")
        return {"n_triangles": n_tri, "bbox_min": lo.tolist(), "bbox_max": hi.tolist(),
                "textures": sorted(set(textures)), "missing_textures": sorted(set(missing))}
    finally:
        for o in set(bpy.data.objects) - before_objs:
            bpy.data.objects.remove(o, do_unlink=True)
        for m in set(bpy.data.meshes) - before_meshes:
            bpy.data.meshes.remove(m)
        for m in set(bpy.data.materials) - before_mats:
            bpy.data.materials.remove(m)
        for i in set(bpy.data.images) - before_imgs:
            bpy.data.images.remove(i)

