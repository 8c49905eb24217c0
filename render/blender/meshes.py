"""Meshes into Blender: generated arrays as a Blender mesh, scan files through Blender's importers
(the same importer for rendering and for the scan index)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from render.scene import FileMeshInput, MeshInput
from render.blender.materials import PART_ATTRIBUTE


def blender_mesh(m: MeshInput):
    import bpy
    mesh = bpy.data.meshes.new(m.name)
    v = np.asarray(m.vertices, dtype=np.float32)
    f = np.asarray(m.faces, dtype=np.int32)
    mesh.vertices.add(len(v))
    mesh.vertices.foreach_set("co", v.ravel())
    mesh.loops.add(f.size)
    mesh.loops.foreach_set("vertex_index", f.ravel())
    mesh.polygons.add(len(f))
    mesh.polygons.foreach_set("loop_start", np.arange(0, f.size, 3, dtype=np.int32))
    mesh.polygons.foreach_set("loop_total", np.full(len(f), 3, dtype=np.int32))
    if m.uvs is not None:
        uv = mesh.uv_layers.new(name="UVMap")
        uv.data.foreach_set("uv", np.asarray(m.uvs, dtype=np.float32).ravel())
    if m.face_labels is not None:
        labels = np.asarray(m.face_labels)
        if labels.shape != (len(f),) or labels.min(initial=1) < 1:
            raise ValueError(f"{m.name}: face_labels must hold one class >= 1 per face ({len(f)} faces)")
        attr = mesh.attributes.new(PART_ATTRIBUTE, "FLOAT", "FACE")
        attr.data.foreach_set("value", labels.astype(np.float32))
    mesh.update(calc_edges=True)
    mesh.validate()
    # smooth shading: normals interpolated across faces, like a scan's
    mesh.polygons.foreach_set("use_smooth", np.ones(len(f), dtype=bool))
    return mesh


def import_file(bproc, m: FileMeshInput):
    import bpy
    path = str(m.path)
    ext = Path(path).suffix.lower()
    before = set(bpy.data.objects)
    if ext == ".obj":
        # Blender's OBJ importer: forward -Z, up Y -> Blender Z-up (rotation +90° about X)
        bpy.ops.wm.obj_import(filepath=path)
    elif ext == ".fbx":
        bpy.ops.import_scene.fbx(filepath=path)
    elif ext in (".glb", ".gltf"):
        bpy.ops.import_scene.gltf(filepath=path)
    elif ext == ".ply":
        # read as Y-up like the other formats, so one up-axis rule holds for every file
        bpy.ops.wm.ply_import(filepath=path, forward_axis="NEGATIVE_Z", up_axis="Y")
    else:
        raise ValueError(f"{path}: unsupported mesh format {ext!r} (obj, fbx, glb, gltf, ply)")
    from blenderproc.python.types.MeshObjectUtility import MeshObject
    new = [o for o in bpy.data.objects if o not in before]
    # FBX/glTF may bring armatures and empties: parent transforms are baked, then only meshes stay
    meshes = []
    for o in new:
        if o.type == "MESH":
            mw = o.matrix_world.copy()
            o.parent = None
            o.matrix_world = mw
            meshes.append(MeshObject(o))
    for o in new:
        if o.type != "MESH":
            bpy.data.objects.remove(o, do_unlink=True)
    for mo in meshes:
        for mod in list(mo.blender_obj.modifiers):
            if mod.type == "ARMATURE":
                mo.blender_obj.modifiers.remove(mod)
    return meshes


def has_loaded_image(obj) -> bool:
    """True if one of the object's materials samples an image whose pixels Blender could read."""
    for mat in obj.get_materials():
        if mat is None:
            continue
        for node in mat.nodes:
            # size is (0, 0) for an image file that is missing or unreadable
            if node.bl_idname == "ShaderNodeTexImage" and node.image is not None and node.image.size[0] > 0:
                return True
    return False
