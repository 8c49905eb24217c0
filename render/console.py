"""What a render prints: our progress and warnings, not the native libraries' chatter.

Blender's libpng and Warp (anny's skinning kernels) write some lines straight to file descriptor 2,
past Python's logging: a libpng notice for every PNG Blender writes with a duplicate eXIf chunk, and
Warp's note that there is no CUDA driver (anny skins on the CPU here; Cycles' own device is logged by
render/blender.py). `native_noise_filtered()` drops exactly those lines while a render runs; every
other byte written to stderr (our logs, tracebacks, Blender's real errors) passes through unchanged.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading

NATIVE_NOISE = (
    b"libpng warning: eXIf: duplicate",
    b"Warp CUDA warning: Could not find or load the NVIDIA CUDA driver",
)


def _keep(line: bytes, noise: tuple[bytes, ...]) -> bytes:
    """The line, or what a terminal bar wrote before it (up to its last "\r") if the rest is noise."""
    head, sep, tail = line.rpartition(b"\r")
    return head + sep if any(n in tail for n in noise) else line + b"\n"


def _pump(read_fd: int, write_fd: int, noise: tuple[bytes, ...]) -> None:
    pending = b""
    while True:
        try:
            chunk = os.read(read_fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        kept = b"".join(_keep(line, noise) for line in lines)
        cut = pending.rfind(b"\r") + 1  # a terminal bar's refresh: pass it on without waiting for "\n"
        kept, pending = kept + pending[:cut], pending[cut:]
        if kept:
            os.write(write_fd, kept)
    if pending:
        os.write(write_fd, _keep(pending, noise)[:len(pending)])
    os.close(read_fd)
    os.close(write_fd)  # the pump's own copy of the real stderr


@contextlib.contextmanager
def native_noise_filtered(noise: tuple[bytes, ...] = NATIVE_NOISE):
    """Within the block, lines on file descriptor 2 that contain one of `noise` are dropped."""
    try:
        stderr_fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr replaced by an object without a descriptor
        yield
        return
    sys.stderr.flush()
    restore, real = os.dup(stderr_fd), os.dup(stderr_fd)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, stderr_fd)
    os.close(write_fd)
    pump = threading.Thread(target=_pump, args=(read_fd, real, noise), name="stderr-filter", daemon=True)
    pump.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(restore, stderr_fd)  # the pipe's last write end closes: the pump reads to the end and stops
        os.close(restore)
        pump.join(timeout=10)  # a child process still holding the pipe keeps the pump (not us) waiting
