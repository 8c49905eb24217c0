"""The warm renderer: one Blender per process, `render(scene)` per frame (render.scene.SceneInput in,
arrays in humanset's conventions out; see render/blender/__init__.py)."""
from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np

from render.scene import MeshInput, RenderSettings, SceneInput, scan_key
from render.blender import materials, meshes
from render.blender.compat import import_blenderproc
from render.blender.materials import PART_AOV

log = logging.getLogger("render.blender")

# Depth pass value Cycles writes for rays that hit nothing (the world); anything above is background.
BACKGROUND_DEPTH = 1e5

# OpenCV camera axes (x right, y down, z forward) -> OpenGL/Blender camera axes (x right, y up, z back)
CV_TO_GL = np.diag([1.0, -1.0, -1.0, 1.0])


def builtin_hdri_dir() -> Path:
    """The CC0 studio-light HDRIs that ship inside the bpy wheel (Blender's 'World' lookdev lights)."""
    import bpy
    return Path(bpy.utils.system_resource("DATAFILES", path="studiolights/world"))


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
        with quiet():
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
        with quiet():
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
        with quiet():
            t = time.perf_counter()
            key = scan_key(scene.mesh)
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
        with quiet():
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
            obj = bproc.object.create_from_blender_mesh(meshes.blender_mesh(m), m.name)
            texture = m.texture
            if texture is not None:
                materials.apply_texture_array(obj, texture, m.name)
            else:
                materials.apply_plain(obj, scene.base_color)
            if m.face_labels is not None:
                materials.write_part_aov(obj)
            return obj
        objs = meshes.import_file(bproc, m)
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
            if not meshes.has_loaded_image(o):
                if m.texture:
                    materials.apply_texture_file(o, m.texture, m.name)
                else:
                    materials.apply_plain(o, scene.base_color)
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





def _datablocks() -> list:
    import bpy
    return [(kind, b) for kind in ("objects", "meshes", "materials", "node_groups", "textures", "images")
            for b in getattr(bpy.data, kind)]


@contextlib.contextmanager
def quiet():
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
