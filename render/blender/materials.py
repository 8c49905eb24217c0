"""Materials of the person: an albedo texture (array or file) or a plain colour on a Principled BSDF,
and the part-label AOV that ground-truth renders read."""
from __future__ import annotations

import numpy as np

# Face attribute holding a mesh's part class, and the AOV (render pass) the ground-truth render writes it to
PART_ATTRIBUTE = "humanset_part"
PART_AOV = "part"


def _new_material(obj, name):
    mat = obj.new_material(name)  # BlenderProc material with a Principled BSDF
    obj.blender_obj.data.materials.clear()
    obj.blender_obj.data.materials.append(mat.blender_obj)
    return mat


def _principled_defaults(mat):
    bsdf = mat.get_the_one_node_with_type("BsdfPrincipled")
    bsdf.inputs["Roughness"].default_value = 0.6
    # skin scatters a little; a small subsurface weight reads as skin without slowing Cycles much
    return bsdf


def apply_texture_image(obj, image, name):
    mat = _new_material(obj, f"{name}-skin")
    bsdf = _principled_defaults(mat)
    tex = mat.new_node("ShaderNodeTexImage")
    tex.image = image
    mat.link(tex.outputs["Color"], bsdf.inputs["Base Color"])


def apply_texture_array(obj, texture: np.ndarray, name):
    import bpy
    h, w = texture.shape[:2]
    image = bpy.data.images.new(f"{name}-albedo", width=w, height=h, alpha=True)
    image.colorspace_settings.name = "sRGB"  # before the pixels: changing it re-generates a blank image
    rgba = np.concatenate([texture[..., :3].astype(np.float32) / 255.0,
                           np.ones((h, w, 1), np.float32)], axis=-1)
    image.pixels.foreach_set(rgba[::-1].ravel())  # Blender images start at the bottom row
    image.update()
    apply_texture_image(obj, image, name)


def apply_texture_file(obj, path, name):
    import bpy
    apply_texture_image(obj, bpy.data.images.load(str(path), check_existing=True), name)


def write_part_aov(obj):
    """Every material of obj also writes the face's part class (a face attribute) into the part AOV."""
    for mat in obj.get_materials():
        attr = mat.new_node("ShaderNodeAttribute")
        attr.attribute_type, attr.attribute_name = "GEOMETRY", PART_ATTRIBUTE
        aov = mat.new_node("ShaderNodeOutputAOV")
        aov.aov_name = PART_AOV
        mat.link(attr.outputs["Fac"], aov.inputs["Value"])


def apply_plain(obj, color):
    mat = _new_material(obj, "plain")
    bsdf = _principled_defaults(mat)
    bsdf.inputs["Base Color"].default_value = (*color, 1.0)

