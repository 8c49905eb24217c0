"""BlenderProc's temp folders (render/blender/compat.py): one per live process, whatever killed the others."""
import os
import subprocess
import sys
import tempfile

from render.blender import compat


def test_a_new_folder_sweeps_those_of_processes_that_are_gone(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(gone.stdout)
    stale = tmp_path / f"{compat.TEMP_PREFIX}{dead_pid}-abc123"
    stale.mkdir()
    (stale / "rgb_0000.png").write_bytes(b"frame")  # what a killed render leaves
    live = tmp_path / f"{compat.TEMP_PREFIX}{os.getppid()}-def456"  # a live process's (our parent's)
    live.mkdir()
    other = tmp_path / "humanset-bproc-notapid"  # not of this form: never touched
    other.mkdir()
    new = compat.bproc_temp_dir()
    try:
        assert os.path.basename(new).startswith(f"{compat.TEMP_PREFIX}{os.getpid()}-") and os.path.isdir(new)
        assert not stale.exists() and live.is_dir() and other.is_dir()
    finally:
        os.rmdir(new)
