"""Synthetic humans: BlenderProc renders of scans (or random `anny` bodies) under HDRI light, with exact
depth, normal and mask ground truth, written as WebDataset shards with Parquet catalogs.

Public surface: `prepare_run` / `run_local` (render.job), `run_ray` (render.distributed),
`index_scans` / `index_hdris` (render.scans), `render.demo.run`. Only render/blender.py imports Blender.
"""
from .config import RenderConfig, load_config
from .job import RunSpec, ShardRenderer, prepare_run, run_local, summary

__all__ = ["RenderConfig", "load_config", "RunSpec", "ShardRenderer", "prepare_run", "run_local", "summary"]
