"""Everything Blender: BlenderProc 2.8 running in-process on the pip `bpy` 4.2 wheel.

No other module of humanset imports bpy or blenderproc. A `BlenderRenderer` is one warm Blender per
process: `init` once, then `render(scene)` per frame. A scan file stays loaded (mesh, materials,
textures) while consecutive frames show the same scan (scan-major plans, render.plan); only the camera
and the world change. HDRIs are loaded once and kept; the world's nodes are built once and re-pointed.
Generated meshes (anny bodies, a new body per frame) are replaced every frame.

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
from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.util
import io
import logging
import os
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

# Depth pass value Cycles writes for rays that hit nothing (the world); anything above is background.
BACKGROUND_DEPTH = 1e5

# Face attribute holding a mesh's part class, and the AOV (render pass) the ground-truth render writes it to
PART_ATTRIBUTE = "humanset_part"
PART_AOV = "part"

# OpenCV camera axes (x right, y down, z forward) -> OpenGL/Blender camera axes (x right, y up, z back)
CV_TO_GL = np.diag([1.0, -1.0, -1.0, 1.0])


def builtin_hdri_dir() -> Path:
    """The CC0 studio-light HDRIs that ship inside the bpy wheel (Blender's 'World' lookdev lights)."""
    import bpy
    return Path(bpy.utils.system_resource("DATAFILES", path="studiolights/world"))


def _clear_typing_caches():
    # bpy's module teardown segfaults (rc 139) while typing's lru caches still hold Blender types.
    import typing
    for clear in getattr(typing, "_cleanups", []):
        with contextlib.suppress(Exception):
            clear()


def import_blenderproc():
    """Import BlenderProc inside this Python process, past its gate for the `blenderproc run` CLI.

    blenderproc/__init__.py expects to run in Blender's own Python: it removes its parent folder
    (our site-packages) from sys.path, deletes PYTHONPATH and calls SetupUtility.setup, which
    pip-installs its pinned packages and makes a temp folder relative to the working directory.
    We stop all three: pip is never run (our packages come from deps/render.pip.txt), sys.path and
    PYTHONPATH are restored, and BlenderProc's temp folder is a private temp dir.
    """
    mod = sys.modules.get("blenderproc")
    if mod is not None and hasattr(mod, "init"):
        return mod
    import bpy  # noqa: F401  (the wheel must be imported before any blenderproc module)

    spec = importlib.util.find_spec("blenderproc")
    if spec is None or not spec.origin:
        raise ImportError("blenderproc is not installed: pip install -r deps/render.pip.txt")
    pkg_dir = os.path.dirname(spec.origin)
    os.environ["INSIDE_OF_THE_INTERNAL_BLENDER_PYTHON_ENVIRONMENT"] = "1"

    # Load SetupUtility under a placeholder package, so its __init__ does not run yet, and neuter it.
    placeholder = types.ModuleType("blenderproc")
    placeholder.__path__ = [pkg_dir]
    sys.modules["blenderproc"] = placeholder
    try:
        setup_mod = importlib.import_module("blenderproc.python.utility.SetupUtility")
    finally:
        del sys.modules["blenderproc"]
    temp_dir = tempfile.mkdtemp(prefix="humanset-bproc-")

    def setup(*_args, **_kwargs):
        from blenderproc.python.utility.Utility import Utility
        Utility.temp_dir = temp_dir
        return sys.argv

    def setup_pip(user_required_packages=None, *_args, **_kwargs):
        raise RuntimeError(f"BlenderProc asked to pip-install {user_required_packages}; humanset never "
                           "installs packages at run time. Install them into the environment instead.")

    setup_mod.SetupUtility.setup = staticmethod(setup)
    setup_mod.SetupUtility.setup_pip = staticmethod(setup_pip)

    saved_path, saved_pythonpath = list(sys.path), os.environ.get("PYTHONPATH")
    sys.path.insert(0, os.path.abspath(os.path.join(pkg_dir, "..")))  # the copy __init__ removes
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            bproc = importlib.import_module("blenderproc")
    finally:
        sys.path[:] = saved_path
        if saved_pythonpath is not None:
            os.environ["PYTHONPATH"] = saved_pythonpath
    atexit.register(_clear_typing_caches)
    return bproc


@dataclass
class RenderSettings:
    """Cycles settings of one worker (fixed for the life of a warm Blender)."""
    samples: int = 64
    noise_threshold: float = 0.01  # adaptive sampling stops a pixel below this noise; 0 disables
    denoiser: str | None = "INTEL"  # "INTEL" (OpenImageDenoise), "OPTIX" or None
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


_RENDERER = None


def get_renderer(settings: RenderSettings | None = None) -> "BlenderRenderer":
    """The process's warm renderer, created on first use and re-configured when settings change."""
    global _RENDERER
    settings = settings or RenderSettings()
    if _RENDERER is None:
        _RENDERER = BlenderRenderer(settings)
    elif _RENDERER.settings != settings:
        _RENDERER.configure(settings)
    return _RENDERER


class BlenderRenderer:
    """One warm Blender per process (use get_renderer()). Not thread-safe: Blender has one scene."""

    _instance_made = False  # BlenderProc's init and depth output can happen once per process

    def __init__(self, settings: RenderSettings | None = None):
        if BlenderRenderer._instance_made:
            raise RuntimeError("one BlenderRenderer per process: BlenderProc initialises Blender once; "
                               "use render.blender.get_renderer()")
        BlenderRenderer._instance_made = True
        self.settings = settings or RenderSettings()
        self.bproc = import_blenderproc()
        self._scan_key, self._scan_blocks = None, []
        self._world_nodes, self._hdris = None, {}
        self._init_blender()

    def configure(self, settings: RenderSettings):
        """Apply new Cycles settings to the warm Blender (samples etc. are set per pass anyway)."""
        from blenderproc.python.renderer import RendererUtility
        self.settings = settings
        with _quiet():
            self.device = self._set_device(settings.device)
            RendererUtility.set_cpu_threads(settings.threads)
            self.bproc.renderer.set_noise_threshold(settings.noise_threshold)
            self.bproc.renderer.set_denoiser(settings.denoiser)

    # --- one-time set-up -----------------------------------------------------------------------
    def _init_blender(self):
        import bpy
        bproc = self.bproc
        from blenderproc.python.utility.Initializer import _Initializer
        from blenderproc.python.utility.GlobalStorage import GlobalStorage
        from blenderproc.python.renderer import RendererUtility

        # bproc.init() minus its language switch: the pip wheel ships no translations and rejects
        # `preferences.view.language = "en_US"`.
        with _quiet():
            bproc.clean_up(clean_up_camera=True)
            bpy.context.scene.render.engine = "CYCLES"
            _Initializer.set_default_parameters()
            GlobalStorage.add("bproc_init_complete", True)
            s = self.settings
            self.device = self._set_device(s.device)
            RendererUtility.set_cpu_threads(s.threads)
            bproc.renderer.set_max_amount_of_samples(s.samples)
            bproc.renderer.set_noise_threshold(s.noise_threshold)
            bproc.renderer.set_denoiser(s.denoiser)
            bproc.renderer.set_light_bounces(diffuse_bounces=s.max_bounces, glossy_bounces=s.max_bounces,
                                             max_bounces=s.max_bounces, transmission_bounces=0,
                                             transparent_max_bounces=4, volume_bounces=0)
            # No persistent data across a change of scan: with it, Cycles sometimes kept the previous frame's
            # texture (its cache is keyed by datablock address, which a new frame's image can reuse).
            # render() turns it on only while consecutive frames show the same scan file.
            bpy.context.scene.render.use_persistent_data = False
            # "Standard" keeps albedo colours honest (BlenderProc's default is Filmic)
            bproc.renderer.set_output_format(file_format="PNG", color_depth=8, enable_transparency=False,
                                             view_transform="Standard")
            # Planar z depth; without antialiasing the pass holds the nearest hit, not a blend with the sky.
            bproc.renderer.enable_depth_output(activate_antialiasing=False)
            tree = bpy.context.scene.node_tree
            before = set(n.name for n in tree.nodes)
            bproc.renderer.enable_normals_output()
            # BlenderProc bakes the world->camera rotation of each camera pose into nine compositor
            # multiply nodes at the time normals are enabled; we keep them and set them per frame.
            created = [n for n in tree.nodes if n.name not in before]
            self._normal_matrix_nodes = [n for n in created if n.bl_idname == "CompositorNodeMath"
                                         and n.operation == "MULTIPLY"][:9]
            if len(self._normal_matrix_nodes) != 9:
                raise RuntimeError("unexpected BlenderProc normal-output graph; this module supports "
                                   "blenderproc==2.8.0 (see deps/render.pip.txt)")
            self._enable_part_output(tree)
            if tree.animation_data is not None:
                tree.animation_data_clear()
        log.info("Blender %s ready: Cycles on %s, %d samples, denoiser %s", bpy.app.version_string,
                 self.device, s.samples, s.denoiser)

    def _enable_part_output(self, tree):
        """A float AOV pass that part-labelled materials write their face's class into, saved as EXR by the
        compositor in the ground-truth pass (one sample at the pixel centre, so the value is never blended)."""
        import bpy
        from blenderproc.python.utility.Utility import Utility
        layer = bpy.context.view_layer
        aov = layer.aovs.add()
        aov.name, aov.type = PART_AOV, "VALUE"
        layers = [n for n in tree.nodes if n.bl_idname == "CompositorNodeRLayers"]
        out_dir = Utility.get_temporary_directory()
        node = tree.nodes.new("CompositorNodeOutputFile")
        node.base_path = out_dir
        node.format.file_format = "OPEN_EXR"
        node.format.color_depth = "32"
        node.file_slots.values()[0].path = "parts_"
        # three channels, like BlenderProc's depth file (some EXR readers reject one-channel files)
        combine = tree.nodes.new("CompositorNodeCombineColor")
        combine.mode = "HSV"
        tree.links.new(layers[0].outputs[PART_AOV], combine.inputs[2])
        tree.links.new(combine.outputs["Image"], node.inputs["Image"])
        Utility.add_output_entry({"key": "parts", "path": os.path.join(out_dir, "parts_") + "%04d.exr",
                                  "version": "2.0.0", "trim_redundant_channels": True})

    def _set_device(self, device: str) -> str:
        import bpy
        from blenderproc.python.renderer import RendererUtility
        if device == "cpu":
            RendererUtility.set_render_devices(use_only_cpu=True)
        else:
            RendererUtility.set_render_devices(desired_gpu_device_type=["OPTIX", "CUDA", "HIP"])
        used = bpy.context.scene.cycles.device
        if device == "gpu" and used != "GPU":
            raise RuntimeError("render device 'gpu' requested but Blender found no OptiX/CUDA/HIP GPU")
        if used == "GPU":
            return bpy.context.preferences.addons["cycles"].preferences.compute_device_type
        return "CPU"

    # --- per frame --------------------------------------------------------------------------------
    def render(self, scene: SceneInput) -> dict:
        """Render one frame. `timings` in the result: scan_load_s, setup_s (world, camera), render_s."""
        import bpy
        bproc = self.bproc
        timings = {}
        with _quiet():
            t = time.perf_counter()
            key = _scan_key(scene.mesh)
            reload = key is None or key != self._scan_key
            # Cycles keeps its scene (BVH, textures) between renders only while the same scan stays loaded;
            # a frame that (re)loads renders without persistent data, which frees Cycles' previous scene
            # (its caches are keyed by datablock address, which new data can reuse).
            bpy.context.scene.render.use_persistent_data = not reload
            if reload:
                self._unload_scan()
                before = set(_datablocks())
                try:
                    self._load_mesh(scene)
                finally:  # a failed load is unloaded with the next frame's
                    self._scan_blocks = [b for b in _datablocks() if b not in before]
                self._scan_key = key
            timings["scan_load_s"] = round(time.perf_counter() - t, 4)
            timings["scan_loaded"] = int(reload)
            t = time.perf_counter()
            bproc.utility.reset_keyframes()
            self._set_world(scene)
            bproc.camera.set_intrinsics_from_K_matrix(np.asarray(scene.K, dtype=float), scene.width,
                                                      scene.height, clip_start=0.05, clip_end=1000.0)
            cam_gl = np.asarray(scene.cam_to_world, dtype=float) @ CV_TO_GL
            bproc.camera.add_camera_pose(cam_gl, frame=0)
            self._set_normal_matrix(cam_gl)
            timings["setup_s"] = round(time.perf_counter() - t, 4)
            t = time.perf_counter()
            self._beauty_pass()
            colors = bproc.renderer.render(load_keys={"colors"}, verbose=False)
            self._ground_truth_pass()
            gt = bproc.renderer.render(load_keys={"depth", "normals", "parts"}, output_key=None, verbose=False)
            out = self._decode({**colors, **gt}, scene)
            timings["render_s"] = round(time.perf_counter() - t, 4)
        out["timings"] = timings
        return out

    def unload(self):
        """Forget the loaded scan (the next frame loads its own); benchmarks start each mode cold."""
        with _quiet():
            self._unload_scan()

    def _unload_scan(self):
        """Remove the previous person (objects, meshes, materials, images it brought), nothing else."""
        import bpy
        order = ("objects", "meshes", "materials", "node_groups", "textures", "images")
        for kind in order:
            coll = getattr(bpy.data, kind)
            for block in [b for k, b in self._scan_blocks if k == kind]:
                with contextlib.suppress(ReferenceError):
                    coll.remove(block)
        self._scan_blocks, self._scan_key = [], None

    def _set_world(self, scene: SceneInput):
        """HDRI light: one node tree built once; per frame only the image, rotation and strength change."""
        import bpy
        world = bpy.context.scene.world
        if world is None:
            world = bpy.data.worlds.new("World")
            bpy.context.scene.world = world
        if self._world_nodes is None or self._world_nodes[0] != world.name_full:
            world.use_nodes = True
            nodes, links = world.node_tree.nodes, world.node_tree.links
            bg = next(n for n in nodes if n.bl_idname == "ShaderNodeBackground")
            env = nodes.new("ShaderNodeTexEnvironment")
            mapping = nodes.new("ShaderNodeMapping")
            coords = nodes.new("ShaderNodeTexCoord")
            links.new(coords.outputs["Generated"], mapping.inputs["Vector"])
            links.new(mapping.outputs["Vector"], env.inputs["Vector"])
            links.new(env.outputs["Color"], bg.inputs["Color"])
            self._world_nodes = (world.name_full, env, mapping, bg)
        _, env, mapping, bg = self._world_nodes
        path = str(scene.hdri_path)
        if path not in self._hdris:
            if not os.path.exists(path):
                raise FileNotFoundError(f"HDRI {path}: no such file")
            self._hdris[path] = bpy.data.images.load(path, check_existing=True)
        env.image = self._hdris[path]
        mapping.inputs["Rotation"].default_value = (0.0, 0.0, float(np.deg2rad(scene.hdri_rotation_deg)))
        bg.inputs["Strength"].default_value = float(scene.hdri_strength)

    # Two renders per frame. The beauty pass is anti-aliased: Cycles spreads a pixel's samples over a
    # 1.5 px filter, so its depth and normal passes would be averages over that footprint (and blend the
    # person with the sky at silhouettes). Ground truth instead comes from a second pass whose samples
    # all sit at the pixel centre: one sample, a 0.01 px filter, no denoiser, no bounces.
    def _beauty_pass(self):
        import bpy
        s, c = self.settings, bpy.context.scene.cycles
        c.samples = s.samples
        c.use_adaptive_sampling = s.noise_threshold > 0
        c.filter_width = 1.5
        c.use_denoising = s.denoiser is not None
        c.max_bounces = s.max_bounces
        bpy.context.scene.render.use_compositing = False  # no depth/normal files for this pass

    def _ground_truth_pass(self):
        import bpy
        c = bpy.context.scene.cycles
        c.samples = 1
        c.use_adaptive_sampling = False
        c.filter_width = 0.01
        c.use_denoising = False
        c.max_bounces = 0
        bpy.context.scene.render.use_compositing = True

    def _set_normal_matrix(self, cam_gl: np.ndarray):
        # The same product BlenderProc uses (pose @ Rx(-90°)), set as constants for this frame.
        import math
        import mathutils
        rot = mathutils.Matrix(cam_gl.tolist()) @ mathutils.Matrix.Rotation(math.radians(-90.0), 4, "X")
        for i, node in enumerate(self._normal_matrix_nodes):
            row, col = divmod(i, 3)
            node.inputs[1].default_value = rot[col][row]

    def _load_mesh(self, scene: SceneInput):
        bproc = self.bproc
        m = scene.mesh
        if isinstance(m, MeshInput):
            obj = bproc.object.create_from_blender_mesh(_blender_mesh(m), m.name)
            texture = m.texture
            if texture is not None:
                _apply_texture_array(obj, texture, m.name)
            else:
                _apply_plain(obj, scene.base_color)
            if m.face_labels is not None:
                _write_part_aov(obj)
            return obj
        objs = _import_file(bproc, m)
        if not objs:
            raise ValueError(f"{m.path}: the importer produced no mesh objects")
        import bpy
        # Y-up files: Blender's importers already rotate Y-up into Z-up; Z-up files must not be rotated
        # twice, so undo the importer's +90° about X for them.
        fix = np.eye(4)
        if m.up_axis.upper() == "Z":
            fix[:3, :3] = [[1, 0, 0], [0, 0, 1], [0, -1, 0]]
        scale = np.diag([m.unit_scale] * 3 + [1.0])
        for o in objs:
            o.set_local2world_mat(scale @ fix @ o.get_local2world_mat())
            o.persist_transformation_into_mesh()
        bpy.context.view_layer.update()
        for o in objs:
            if not _has_loaded_image(o):
                if m.texture:
                    _apply_texture_file(o, m.texture, m.name)
                else:
                    _apply_plain(o, scene.base_color)
        return objs

    def _decode(self, data: dict, scene: SceneInput) -> dict:
        rgb = np.asarray(data["colors"][0])[..., :3]
        if rgb.dtype != np.uint8:
            rgb = np.clip(np.round(rgb * 255.0), 0, 255).astype(np.uint8)
        depth = np.asarray(data["depth"][0], dtype=np.float32)
        if depth.ndim == 3:
            depth = depth[..., 0]
        hit = depth < BACKGROUND_DEPTH
        depth = np.where(hit, depth, np.inf).astype(np.float32)
        n_gl = np.asarray(data["normals"][0], dtype=np.float32)[..., :3] * 2.0 - 1.0
        n_cv = n_gl * np.array([1.0, -1.0, -1.0], dtype=np.float32)
        norm = np.linalg.norm(n_cv, axis=-1, keepdims=True)
        n_cv = np.where(hit[..., None] & (norm > 1e-6), n_cv / np.maximum(norm, 1e-6), 0.0).astype(np.float32)
        mask = (hit * 255).astype(np.uint8)
        if rgb.shape[:2] != (scene.height, scene.width):
            raise RuntimeError(f"Blender rendered {rgb.shape[:2]}, expected {(scene.height, scene.width)}")
        out = {"rgb": rgb, "depth_m": depth, "normal": n_cv, "mask": mask}
        if getattr(scene.mesh, "face_labels", None) is not None:
            part = np.asarray(data["parts"][0], dtype=np.float32)
            if part.ndim == 3:
                part = part[..., 0]
            out["parts"] = np.where(hit, np.clip(np.rint(part), 0, 255), 0).astype(np.uint8)
        return out


# --- helpers ---------------------------------------------------------------------------------------
def _scan_key(mesh):
    """Identity of a scan file load (None for generated meshes, which change every frame)."""
    if isinstance(mesh, FileMeshInput):
        return (str(mesh.path), float(mesh.unit_scale), mesh.up_axis.upper(), mesh.texture, mesh.name)
    return None


def _datablocks() -> list:
    import bpy
    return [(kind, b) for kind in ("objects", "meshes", "materials", "node_groups", "textures", "images")
            for b in getattr(bpy.data, kind)]
@contextlib.contextmanager
def _quiet():
    """Send Blender's and BlenderProc's chatter on stdout (C and Python prints) to /dev/null.

    Works on file descriptor 1, since Cycles prints from C; with DEBUG logging nothing is hidden.
    """
    if log.isEnabledFor(logging.DEBUG):
        yield
        return
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, io.UnsupportedOperation):  # stdout replaced by a non-file (pytest capture)
        yield
        return
    saved = os.dup(fd)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), fd)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, fd)
        os.close(saved)


def _blender_mesh(m: MeshInput):
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


def _import_file(bproc, m: FileMeshInput):
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


def _has_loaded_image(obj) -> bool:
    """True if one of the object's materials samples an image whose pixels Blender could read."""
    for mat in obj.get_materials():
        if mat is None:
            continue
        for node in mat.nodes:
            # size is (0, 0) for an image file that is missing or unreadable
            if node.bl_idname == "ShaderNodeTexImage" and node.image is not None and node.image.size[0] > 0:
                return True
    return False


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


def _apply_texture_image(obj, image, name):
    mat = _new_material(obj, f"{name}-skin")
    bsdf = _principled_defaults(mat)
    tex = mat.new_node("ShaderNodeTexImage")
    tex.image = image
    mat.link(tex.outputs["Color"], bsdf.inputs["Base Color"])


def _apply_texture_array(obj, texture: np.ndarray, name):
    import bpy
    h, w = texture.shape[:2]
    image = bpy.data.images.new(f"{name}-albedo", width=w, height=h, alpha=True)
    image.colorspace_settings.name = "sRGB"  # before the pixels: changing it re-generates a blank image
    rgba = np.concatenate([texture[..., :3].astype(np.float32) / 255.0,
                           np.ones((h, w, 1), np.float32)], axis=-1)
    image.pixels.foreach_set(rgba[::-1].ravel())  # Blender images start at the bottom row
    image.update()
    _apply_texture_image(obj, image, name)


def _apply_texture_file(obj, path, name):
    import bpy
    _apply_texture_image(obj, bpy.data.images.load(str(path), check_existing=True), name)


def _write_part_aov(obj):
    """Every material of obj also writes the face's part class (a face attribute) into the part AOV."""
    for mat in obj.get_materials():
        attr = mat.new_node("ShaderNodeAttribute")
        attr.attribute_type, attr.attribute_name = "GEOMETRY", PART_ATTRIBUTE
        aov = mat.new_node("ShaderNodeOutputAOV")
        aov.aov_name = PART_AOV
        mat.link(attr.outputs["Fac"], aov.inputs["Value"])


def _apply_plain(obj, color):
    mat = _new_material(obj, "plain")
    bsdf = _principled_defaults(mat)
    bsdf.inputs["Base Color"].default_value = (*color, 1.0)


# --- inspection for the scan and HDRI catalogs (same importers as rendering) ------------------------
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
        with _quiet():
            try:
                objs = _import_file(sys.modules["blenderproc"], FileMeshInput(path))
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
