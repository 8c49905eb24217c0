"""render/blender/compat.py against the installed bpy and BlenderProc: fails when a new version changes
the gate it opens (BlenderProc's __init__) or the set-up it replaces (SetupUtility.setup / setup_pip)."""
import importlib.metadata as md
import importlib.util
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.blender

pytest.importorskip("bpy", reason="render tests need the Blender wheel: pip install -r deps/render.pip.txt")

from render.blender import compat  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_bpy_and_blenderproc_are_tested_versions():
    assert md.version("blenderproc") in compat.TESTED["blenderproc"], md.version("blenderproc")
    assert ".".join(md.version("bpy").split(".")[:2]) in compat.TESTED["bpy"], md.version("bpy")


def test_blenderprocs_gate_is_the_one_the_shim_opens():
    init = Path(importlib.util.find_spec("blenderproc").origin).read_text()
    # what import_blenderproc counters: the gate variable, the sys.path and PYTHONPATH edits, the set-up call
    for expected in ('"INSIDE_OF_THE_INTERNAL_BLENDER_PYTHON_ENVIRONMENT" in os.environ',
                     'sys.path.remove(os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))',
                     'del os.environ["PYTHONPATH"]', "from .python.utility.SetupUtility import SetupUtility",
                     "SetupUtility.setup([])"):
        assert expected in init, f"blenderproc/__init__.py no longer has {expected!r}"
    pkg = Path(importlib.util.find_spec("blenderproc").origin).parent  # (importing it would run the gate)
    source = (pkg / Path(*compat.SETUP_MODULE.split(".")[1:])).with_suffix(".py").read_text()
    assert "class SetupUtility" in source and "def setup(" in source and "def setup_pip(" in source


PROBE = """
import os, sys
import bpy  # the wheel adds its own folders to sys.path; the shim must add none and remove none
before_path, before_pp = list(sys.path), os.environ.get("PYTHONPATH")
from render.blender.compat import import_blenderproc
bproc = import_blenderproc()
from blenderproc.python.utility.SetupUtility import SetupUtility
from blenderproc.python.utility.Utility import Utility
assert hasattr(bproc, "init") and hasattr(bproc, "renderer"), "blenderproc's API did not load"
assert sys.path == before_path, "sys.path changed"
assert os.environ.get("PYTHONPATH") == before_pp, "PYTHONPATH changed"
assert os.path.basename(Utility.temp_dir).startswith("humanset-bproc-"), Utility.temp_dir
try:
    SetupUtility.setup_pip(["left-pad"])
except RuntimeError as e:
    assert "never installs packages" in str(e)
else:
    raise AssertionError("setup_pip ran")
with open(os.path.join(Utility.temp_dir, "rgb_0000.png"), "wb") as f:  # what a render leaves there
    f.write(b"frame")
print(Utility.temp_dir)
print("ok")
"""


def test_import_blenderproc_loads_its_api_and_leaves_path_pip_and_cwd_alone(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.split()[-1:] == ["ok"], out.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []  # BlenderProc's temp folder is not made in the working directory
    temp_dir = out.stdout.split()[-2]
    assert not os.path.exists(temp_dir), f"{temp_dir} was left behind when the process exited"
    assert inspect.signature(compat.import_blenderproc).parameters == {}
