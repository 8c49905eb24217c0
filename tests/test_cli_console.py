"""A quiet console for every command: the native libraries' known chatter on file descriptor 2 is
dropped, every other byte on stderr passes; log lines are short."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import os, sys, logging
from humanset.console import native_noise_filtered
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
with native_noise_filtered():
    os.write(2, b"libpng warning: eXIf: duplicate\n")
    os.write(2, b"Warp CUDA warning: Could not find or load the NVIDIA CUDA driver. GPU execution will not be")
    os.write(2, b" available.\nError: a real Blender error\n")
    os.write(2, b"\x1b[36m(pid=gcs_server)\x1b[0m [2026-11-30 15:29:27,019 E 21170 21170] (gcs_server) "
                b"gcs_actor_scheduler.cc:538: Failed to kill actor c6bf, return status: Invalid: KillActor RPC "
                b"failed for actor c6bf: RpcError: RPC error: Socket closed rpc_code: 14\n")
    logging.getLogger("render.job").warning("our warning")
    sys.stderr.write("bar 1/2\rbar 2/2\r")
    sys.stderr.flush()
    os.write(2, b"bar 3/3\rlibpng warning: eXIf: duplicate\n")  # a noise line right after a bar's refresh
    os.write(2, b"libpng warning: eXIf: duplicate\npartial line without newline")
os.write(2, b"\nafter the block\n")
"""


def test_native_noise_is_dropped_and_the_rest_passes():
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", CHILD], stderr=subprocess.PIPE, stdout=subprocess.PIPE,
                          env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stderr.decode().split("\n") == [
        "Error: a real Blender error", "WARNING render.job: our warning",
        "bar 1/2\rbar 2/2\rbar 3/3\rpartial line without newline", "after the block", ""]


def test_compact_log_lines_keep_the_level_of_warnings_only():
    import logging

    from humanset.console import Compact

    def line(level, msg):
        return Compact().format(logging.LogRecord("render.job", level, __file__, 1, msg, None, None))

    assert line(logging.INFO, "4 rendered").split(" ", 1)[1] == "4 rendered"
    assert line(logging.WARNING, "stage art skipped").split(" ", 1)[1] == "WARNING stage art skipped"
