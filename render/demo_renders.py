"""The offline demo: a few random anny bodies under the HDRIs shipped in the bpy wheel, on CPU.

`run(out_dir, frames=4)` renders 384×288 frames with 16 Cycles samples (about half a minute per frame
on two CPU cores, plus ~2 minutes once per machine while anny builds its cache) and returns the run
summary; see OUT/contact/*.png for the contact sheets (RGB | depth | normals | Sapiens-28 part labels).
"""
from __future__ import annotations

DEMO_SETTINGS = [
    "sampling.camera.height=384", "sampling.camera.width=288", "cycles.samples=16",
    "output.frames_per_shard=4",
]


def run(out_dir="runs/render-demo", frames: int = 4, seed: int = 0, progress: bool = True) -> dict:
    from render.config import load_config
    from render.run.job import prepare_run, release_run, run_local, summary
    spec = prepare_run(out_dir, "anny", "builtin", frames, seed, load_config(sets=DEMO_SETTINGS))
    try:
        run_local(spec, progress=progress)
        return {**summary(spec), "output": spec.out}
    finally:
        release_run(spec.out)  # the demo goes on to train: OUT's lock is not held until the process ends
