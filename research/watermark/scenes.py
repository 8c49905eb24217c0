"""Experiment: rendered scene text, as backgrounds for the watermark experiments (research/watermark/tile2.py
--rendered, research/watermark/detft.py --rendered; research/notes/watermark.md, "Fine-tuning the detector"). Writes PNG
frames to a folder; prints one JSON object.

Every learned watermark model tried so far scores real scene text (the bus's ad, the motorcycles'
brand) like a mark, and text painted flat on a photo did not teach it otherwise. These frames hold
scene text as a camera sees it: signs (a plate with a word), 3D lettering and printed surfaces bent
like a shirt or a bus's side, under the bpy wheel's eight CC0 world HDRIs (which are also the
backdrop), in perspective, lit, shaded and occluded by a few plain objects. Words: tile2.py's
SCENE_WORDS; fonts: the tune family's only (marks.family_fonts("tune")), so the eval fonts stay unseen.

Cycles on the CPU, plain bpy (no BlenderProc: nothing here is a humanset render). Seeded: frame i
draws from seed (SEED, i).

Cost: 8-9 s a frame at 384 px, 32 samples, one thread (2026-12-02, load ~2).

usage: python research/watermark/scenes.py OUT_DIR [--n 300] [--start 0] [--size 384] [--samples 32] [--threads 2]
then: python research/watermark/tile2.py ... --rendered OUT_DIR --rendered-share F  (or research/watermark/detft.py --rendered OUT_DIR)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT)]  # the other experiments here; the product

import tile2 as wt2  # noqa: E402

from pipeline.stages.watermark import marks  # noqa: E402

SEED = 3000


def hdri_files() -> list[Path]:
    f = wt2._pkg_file("bpy", "4.2/datafiles/studiolights/world/city.exr")
    return sorted(f.parent.glob("*.exr")) if f is not None else []


def sign_image(rng: np.random.Generator, path: Path) -> float:
    """A sign or a print as a PNG (a word on a plate, or on a patterned cloth); returns its aspect w / h."""
    word = wt2.SCENE_WORDS[int(rng.integers(len(wt2.SCENE_WORDS)))]
    fonts = marks.family_fonts("tune")
    fnt = marks.font(fonts[int(rng.integers(len(fonts)))], 96)
    l, t, r, b = fnt.getbbox(word)
    pad = int(rng.uniform(0.15, 0.6) * (b - t))
    w, h = r - l + 2 * pad, b - t + 2 * pad
    fg = tuple(int(c) for c in rng.integers(0, 256, 3))
    bg = tuple(int(255 - c) for c in fg) if rng.random() < 0.6 else tuple(int(c) for c in rng.integers(0, 256, 3))
    im = Image.new("RGB", (w, h), bg)
    d = ImageDraw.Draw(im)
    if rng.random() < 0.3:  # stripes or checks on the cloth
        step = int(rng.integers(8, 40))
        c2 = tuple(int(c) for c in rng.integers(0, 256, 3))
        for x in range(0, w, 2 * step):
            d.rectangle([x, 0, x + step, h], fill=c2)
    if rng.random() < 0.3:  # a border
        d.rectangle([3, 3, w - 4, h - 4], outline=fg, width=int(rng.integers(2, 8)))
    d.text((pad - l, pad - t), word, font=fnt, fill=fg)
    im.save(path)
    return w / h


class Scene:
    def __init__(self, size: int, samples: int, threads: int):
        import bpy

        self.bpy = bpy
        bpy.ops.wm.read_factory_settings(use_empty=True)
        sc = bpy.context.scene
        sc.render.engine = "CYCLES"
        sc.cycles.device = "CPU"
        sc.cycles.samples = samples
        sc.cycles.use_denoising = True  # OpenImageDenoise on the CPU: no grain the net could key on
        sc.cycles.denoiser = "OPENIMAGEDENOISE"
        sc.cycles.max_bounces = 4
        sc.render.threads_mode = "FIXED"
        sc.render.threads = threads
        sc.render.resolution_percentage = 100
        sc.render.image_settings.file_format = "PNG"
        sc.view_settings.view_transform = "Standard"
        sc.render.film_transparent = False
        self.size = size
        self.world = bpy.data.worlds.new("W")
        sc.world = self.world
        self.world.use_nodes = True
        nt = self.world.node_tree
        bg = next(n for n in nt.nodes if n.bl_idname == "ShaderNodeBackground")
        self.env = nt.nodes.new("ShaderNodeTexEnvironment")
        self.mapping = nt.nodes.new("ShaderNodeMapping")
        coords = nt.nodes.new("ShaderNodeTexCoord")
        nt.links.new(coords.outputs["Generated"], self.mapping.inputs["Vector"])
        nt.links.new(self.mapping.outputs["Vector"], self.env.inputs["Vector"])
        nt.links.new(self.env.outputs["Color"], bg.inputs["Color"])
        self.bg = bg
        self.hdris = [bpy.data.images.load(str(p)) for p in hdri_files()]
        cam = bpy.data.cameras.new("C")
        self.cam = bpy.data.objects.new("C", cam)
        sc.collection.objects.link(self.cam)
        sc.camera = self.cam
        self.fonts = [bpy.data.fonts.load(f) for f in marks.family_fonts("tune") if f]
        self.tmp = Path(tempfile.mkdtemp(prefix="wm-scenes-"))

    def _clear(self):
        bpy = self.bpy
        for o in list(bpy.data.objects):
            if o is not self.cam:
                bpy.data.objects.remove(o, do_unlink=True)
        for coll in (bpy.data.meshes, bpy.data.materials, bpy.data.curves):
            for b in list(coll):
                coll.remove(b)
        for im in list(bpy.data.images):
            if im not in self.hdris:
                bpy.data.images.remove(im)

    def _material(self, rng, colour=None, image=None):
        bpy = self.bpy
        m = bpy.data.materials.new("M")
        m.use_nodes = True
        p = next(n for n in m.node_tree.nodes if n.bl_idname == "ShaderNodeBsdfPrincipled")
        p.inputs["Roughness"].default_value = float(rng.uniform(0.2, 0.9))
        p.inputs["Metallic"].default_value = float(rng.choice([0.0, 0.0, 0.0, 0.5]))
        if image is not None:
            tex = m.node_tree.nodes.new("ShaderNodeTexImage")
            tex.image = bpy.data.images.load(str(image))
            m.node_tree.links.new(tex.outputs["Color"], p.inputs["Base Color"])
        else:
            c = colour if colour is not None else rng.uniform(0, 1, 3)
            p.inputs["Base Color"].default_value = (*[float(x) for x in c], 1.0)
        return m

    def _place(self, obj, rng, dist):
        """In front of the camera (which looks down -Z of its own frame, placed at the origin looking +Y)."""
        x, z = rng.uniform(-0.45, 0.45) * dist, rng.uniform(-0.3, 0.3) * dist
        obj.location = (float(x), float(dist), float(z))
        obj.rotation_euler = (math.pi / 2 + float(rng.uniform(-0.6, 0.6)), float(rng.uniform(-0.3, 0.3)),
                              float(rng.uniform(-0.9, 0.9)))

    def frame(self, i: int, out: Path) -> None:
        bpy = self.bpy
        rng = np.random.default_rng((SEED, i))
        self._clear()
        sc = bpy.context.scene
        w = self.size
        h = int(w * float(rng.choice([0.75, 1.0, 1.333])))
        sc.render.resolution_x, sc.render.resolution_y = (w, h) if rng.random() < 0.6 else (h, w)
        self.env.image = self.hdris[int(rng.integers(len(self.hdris)))]
        self.mapping.inputs["Rotation"].default_value = (0.0, 0.0, float(rng.uniform(0, 2 * math.pi)))
        self.bg.inputs["Strength"].default_value = float(rng.uniform(0.6, 2.0))
        self.cam.location = (0.0, 0.0, 0.0)
        self.cam.rotation_euler = (math.pi / 2 + float(rng.uniform(-0.25, 0.25)), 0.0, float(rng.uniform(-0.2, 0.2)))
        self.cam.data.lens = float(rng.uniform(24, 60))
        for k in range(int(rng.integers(1, 5))):  # signs, prints, lettering
            dist = float(rng.uniform(2.0, 9.0))
            kind = rng.random()
            if kind < 0.45 or not self.fonts:  # a sign: a flat plate with the word as its texture
                png = self.tmp / f"s{i}_{k}.png"
                aspect = sign_image(rng, png)
                bpy.ops.mesh.primitive_plane_add(size=1.0)
                o = bpy.context.object
                o.scale = (float(aspect * 0.5), 0.5, 1.0)
                o.data.materials.append(self._material(rng, image=png))
            elif kind < 0.7:  # a print on a bent surface (a shirt, a bus's side)
                png = self.tmp / f"s{i}_{k}.png"
                aspect = sign_image(rng, png)
                bpy.ops.mesh.primitive_plane_add(size=1.0)
                o = bpy.context.object
                o.scale = (float(aspect * 0.5), 0.5, 1.0)
                bpy.ops.object.transform_apply(scale=True)
                bpy.ops.object.mode_set(mode="EDIT")
                bpy.ops.mesh.subdivide(number_cuts=16)
                bpy.ops.object.mode_set(mode="OBJECT")
                mod = o.modifiers.new("bend", "SIMPLE_DEFORM")
                mod.deform_method = "BEND"
                mod.deform_axis = "Y"
                mod.angle = float(rng.uniform(-1.5, 1.5))
                o.data.materials.append(self._material(rng, image=png))
            else:  # 3D lettering
                cu = bpy.data.curves.new("T", "FONT")
                cu.body = wt2.SCENE_WORDS[int(rng.integers(len(wt2.SCENE_WORDS)))]
                cu.font = self.fonts[int(rng.integers(len(self.fonts)))]
                cu.extrude = float(rng.uniform(0.0, 0.08))
                cu.align_x, cu.align_y = "CENTER", "CENTER"
                cu.size = float(rng.uniform(0.3, 0.8))
                o = bpy.data.objects.new("T", cu)
                sc.collection.objects.link(o)
                o.data.materials.append(self._material(rng))
            self._place(o, rng, dist)
            o.scale = tuple(float(s * dist / 4.0) for s in o.scale)
        for _ in range(int(rng.integers(0, 4))):  # plain objects: occlusion and shadows
            j = int(rng.integers(3))
            if j == 0:
                bpy.ops.mesh.primitive_cube_add(size=float(rng.uniform(0.2, 0.8)))
            else:
                (bpy.ops.mesh.primitive_uv_sphere_add if j == 1 else bpy.ops.mesh.primitive_cylinder_add)(
                    radius=float(rng.uniform(0.1, 0.4)))
            o = bpy.context.object
            self._place(o, rng, float(rng.uniform(3.0, 10.0)))
            o.data.materials.append(self._material(rng))
        if rng.random() < 0.4:  # a sun for hard shadows
            sun = bpy.data.lights.new("S", "SUN")
            sun.energy = float(rng.uniform(1, 5))
            so = bpy.data.objects.new("S", sun)
            so.rotation_euler = tuple(float(x) for x in rng.uniform(-1, 1, 3))
            sc.collection.objects.link(so)
        sc.render.filepath = str(out)
        bpy.ops.render.render(write_still=True)
        for png in self.tmp.glob(f"s{i}_*.png"):  # the frame's sign textures: rendered, not kept
            png.unlink()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--start", type=int, default=0, help="first frame index (to split a run over processes)")
    ap.add_argument("--size", type=int, default=384)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0, c0 = time.perf_counter(), time.process_time()
    from render.blender.renderer import quiet  # Cycles prints from C

    with quiet():
        sc = Scene(a.size, a.samples, a.threads)
    done = 0
    for i in range(a.start, a.start + a.n):
        f = out / f"scene_{i:05d}.png"
        if not f.is_file():
            with quiet():
                sc.frame(i, f)
        done += 1
        if done % 20 == 0:
            print(f"{done}/{a.n} frames, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    res = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "load_avg": [round(x, 2) for x in os.getloadavg()],
           "frames": a.n, "size": a.size, "samples": a.samples, "threads": a.threads,
           "wall_s": round(time.perf_counter() - t0, 1), "cpu_s": round(time.process_time() - c0, 1)}
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
