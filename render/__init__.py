"""Synthetic humans: BlenderProc renders of scans (or random `anny` bodies) under HDRI light, with exact
depth, normal and mask ground truth, written as WebDataset shards with Parquet catalogs.

Public surface: `prepare_run` / `run_local` / `summary` (render.run.job), `run_ray` (render.run.distributed),
`load_config`, `render.demo_renders.run` and `render.export.export` (`humanset render export`). Only
render/blender/ imports Blender. Names load lazily, so `humanset --help` does not import pyarrow,
duckdb or numpy through here.
"""
_EXPORTS = {"RenderConfig": "config", "load_config": "config", "RunSpec": "run_spec", "ShardRenderer": "job",
            "prepare_run": "job", "run_local": "job", "summary": "job", "run_ray": "distributed"}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'render' has no attribute {name!r}")
