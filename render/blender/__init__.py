"""Everything Blender: BlenderProc 2.8 running in-process on the pip `bpy` 4.2 wheel.

No other module of humanset imports bpy or blenderproc; the scene it renders is plain data
(render/scene.py). A `BlenderRenderer` is one warm Blender per process: `init` once, then
`render(scene)` per frame. A scan file stays loaded (mesh, materials, textures) while consecutive
frames show the same scan (scan-major plans, render.run.plan); only the camera and the world change.
HDRIs are loaded once and kept; the world's nodes are built once and re-pointed. Generated meshes
(anny bodies, a new body per frame) are replaced every frame.

  compat.py     importing BlenderProc inside our Python (the one place BlenderProc is patched)
  renderer.py   the warm renderer: Cycles settings, world, camera, the two passes, decoding them
  meshes.py     generated meshes and scan files into Blender (one importer for render and index)
  materials.py  albedo texture or plain colour, the part-label AOV
  probe.py      inspection for the scan and HDRI catalogs

Conventions of what `render` returns (the rest of humanset never sees Blender's conventions):
  rgb     uint8 H×W×3, sRGB ("Standard" view transform, so colours are the albedo under the HDRI light)
  depth_m float32 H×W, planar z along the optical axis in metres; +inf where no surface was hit
  normal  float32 H×W×3 unit vectors in the OpenCV camera frame (x right, y down, z forward);
          (0, 0, 0) where no surface was hit. BlenderProc writes camera-frame normals in OpenGL axes
          (x right, y up, z towards the viewer) encoded as 0.5·n + 0.5; we decode and flip y and z.
  mask    uint8 H×W, 255 where a pixel's centre ray hits the person (depth finite), else 0
  parts   uint8 H×W class ids (render.parts vocabulary), 0 = background, set exactly where mask is; only
          for meshes that carry per-face labels (MeshInput.face_labels), else absent
"""
from render.scene import FileMeshInput, MeshInput, RenderSettings, SceneInput
from render.blender.compat import import_blenderproc
from render.blender.probe import image_size, inspect_mesh_file
from render.blender.renderer import BACKGROUND_DEPTH, CV_TO_GL, BlenderRenderer, builtin_hdri_dir, get_renderer

__all__ = ["BACKGROUND_DEPTH", "CV_TO_GL", "BlenderRenderer", "FileMeshInput", "MeshInput", "RenderSettings",
           "SceneInput", "builtin_hdri_dir", "get_renderer", "image_size", "import_blenderproc",
           "inspect_mesh_file"]
