"""BlenderProc inside our own Python: the one place humanset patches BlenderProc (and works around
bpy's teardown). Nothing else in humanset imports blenderproc before `import_blenderproc()`.

Tested on bpy 4.2.23 (the pip Blender wheel) with blenderproc 2.8.0 (deps/render.pip.txt pins both).
tests/render/test_blenderproc_compat.py fails when either changes what is patched here.
"""
from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.util
import io
import os
import shutil
import sys
import tempfile
import types

TESTED = {"blenderproc": ("2.8.0",), "bpy": ("4.2",)}  # versions (bpy: minor) these patches were tested on
SETUP_MODULE = "blenderproc.python.utility.SetupUtility"  # whose SetupUtility.setup / setup_pip we replace


def clear_typing_caches():
    # bpy's module teardown segfaults (rc 139) while typing's lru caches still hold Blender types.
    import typing
    for clear in getattr(typing, "_cleanups", []):
        with contextlib.suppress(Exception):
            clear()


TEMP_PREFIX = "humanset-bproc-"  # BlenderProc's temp folder: TEMP_PREFIX + "<pid>-<random>" in the temp dir


def bproc_temp_dir() -> str:
    """A private temp folder for BlenderProc's intermediate files (each frame is written there before it is
    read back), removed when this process exits. A process that is killed (a Ray actor at shutdown) runs no
    exit hook, so the folders of this user's processes that are gone are removed here first: a render farm's
    temp dir holds at most one folder per live process. Liveness is by process id, so a temp dir shared by
    processes of one user in different PID namespaces (containers mounting one /tmp) is not supported."""
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        pid = name[len(TEMP_PREFIX):].split("-", 1)[0]
        if not (name.startswith(TEMP_PREFIX) and pid.isdigit()):
            continue
        path = os.path.join(root, name)
        with contextlib.suppress(OSError):
            if os.lstat(path).st_uid == os.getuid() and not _alive(int(pid)):
                shutil.rmtree(path, ignore_errors=True)
    temp_dir = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-")
    atexit.register(shutil.rmtree, temp_dir, ignore_errors=True)
    return temp_dir


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        pass
    return True


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
        setup_mod = importlib.import_module(SETUP_MODULE)
    finally:
        del sys.modules["blenderproc"]
    temp_dir = bproc_temp_dir()  # BlenderProc's own CLI removes its folder after a run; in process, ours to do

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
    atexit.register(clear_typing_caches)
    return bproc
