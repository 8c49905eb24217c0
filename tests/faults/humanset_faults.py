"""Test-only fault injection: a process that dies on one sample or one scan, the way a segfault in
a native decoder or importer kills it.

Two ways in, neither read by product code:
- in processes a test starts (a `curate` driver and its Ray cluster, render's scan-index children):
  `env(spec)` gives the environment that loads tests/faults/sitecustomize.py, which calls
  `install(spec)` at start-up. A stage fault re-points the stage registry
  (pipeline.stages.REGISTRY) at a crashing subclass; a scan fault wraps the importer.
- in Ray actors of a cluster the test session already runs: `crashing_shard_renderer(names)`, a
  render.run.job.ShardRenderer subclass the test monkeypatches in, pickled by value so the actors need
  no path to this folder.

spec (JSON): {"stage": "decode"|"text", "uri": TEXT} kills the process running that stage on a batch
holding a source_uri containing TEXT (exit status 77); {"abort_on_import": [FILE NAME, ...]} aborts
the process importing a scan file of that name (SIGABRT) through render.blender.meshes.import_file.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENV = "HUMANSET_TEST_FAULTS"
CRASH_STATUS = 77


def env(spec: dict, base: dict | None = None) -> dict:
    """`base` (os.environ) plus what makes every Python process started with it install `spec`."""
    base = dict(os.environ if base is None else base)
    path = [str(HERE), str(HERE.parents[1]), base.get("PYTHONPATH")]
    return {**base, ENV: json.dumps(spec), "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def _die_without_core(how) -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a test's crash leaves no core file behind
    how()


# --- stage faults ---------------------------------------------------------------------------------
class _CrashOnUri:
    """Mixin: dies on a batch that holds a sample whose source_uri contains `crash_uri`."""

    crash_uri = ""

    def measure(self, batch):
        if any(self.crash_uri in (u or "") for u in batch.get("source_uri", [])):
            os._exit(CRASH_STATUS)
        return super().measure({k: v for k, v in batch.items() if k != "source_uri"})


def _crashing(stage_cls, uri: str):
    return type(f"Crashing{stage_cls.__name__}", (_CrashOnUri, stage_cls),
                {"crash_uri": uri, "reads": tuple(stage_cls.reads) + ("source_uri",), "__module__": __name__})


def _patch_stages(module) -> None:
    name = _SPEC["stage"]
    cls = _crashing(_original_class(module, name), _SPEC["uri"])
    globals()[cls.__name__] = cls
    module.REGISTRY[name] = f"{__name__}:{cls.__name__}"


def _original_class(module, name):
    import importlib
    mod, cls = module.REGISTRY[name].split(":")
    return getattr(importlib.import_module(mod), cls)


# --- scan faults ----------------------------------------------------------------------------------
def _abort_on_import(names, importer):
    def import_file(bproc, mesh):
        if Path(str(mesh.path)).name in names:
            _die_without_core(os.abort)
        return importer(bproc, mesh)
    return import_file


def _patch_importer(module) -> None:
    module.import_file = _abort_on_import(set(_SPEC["abort_on_import"]), module.import_file)


def crashing_shard_renderer(names):
    """A render.run.job.ShardRenderer whose process aborts when it imports a scan file named in `names`.
    Register this module with ray.cloudpickle.register_pickle_by_value before handing it to Ray."""
    from render.run.job import ShardRenderer

    class CrashingShardRenderer(ShardRenderer):
        def __init__(self, *args, **kwargs):
            from render.blender import meshes
            meshes.import_file = _abort_on_import(set(names), meshes.import_file)
            super().__init__(*args, **kwargs)
    return CrashingShardRenderer


# --- installing after import ----------------------------------------------------------------------
_SPEC: dict = {}
_AFTER_IMPORT = {"stage": ("pipeline.stages", _patch_stages), "abort_on_import": ("render.blender.meshes", _patch_importer)}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `patch(module)` right after `name` is imported, without importing it earlier."""

    def __init__(self, name, patch):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader, patch = spec.loader, self.patch

        class Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                patch(module)
        spec.loader = Loader()
        return spec


def install(spec_json: str) -> None:
    _SPEC.update(json.loads(spec_json))
    for key, (module, patch) in _AFTER_IMPORT.items():
        if key in _SPEC:
            if module in sys.modules:
                patch(sys.modules[module])
            else:
                sys.meta_path.insert(0, _AfterImport(module, patch))
