"""What a `humanset` command prints: our progress, warnings and summaries, not library internals.

- `Compact`: log lines as `12:01:02 message` (warnings and errors keep their level); `humanset -v`
  shows the logger names and debug lines too.
- `native_noise_filtered()`: some native libraries write straight to file descriptor 2, past Python's
  logging. Exactly these known lines are dropped while a command runs; every other byte written to
  stderr (our logs, tracebacks, real errors) passes through unchanged:
  - libpng's notice for every PNG Blender writes with a duplicate eXIf chunk (render);
  - Warp's note that there is no CUDA driver (anny skins on the CPU; Cycles logs its own device);
  - Ray's core-worker notice that an actor with constructor arguments in the object store may fail to
    restart (Ray Data passes every actor pool its map function that way; the driver holds it for the
    whole run, and a unit whose actors fail is re-run sample by sample, pipeline/isolate.py).
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading

NATIVE_NOISE = (
    b"libpng warning: eXIf: duplicate",
    b"Warp CUDA warning: Could not find or load the NVIDIA CUDA driver",
    b"has constructor arguments in the object store and max_restarts > 0",
    # Ray's GCS, forwarded: an actor pool's actor had already exited when the pool was shut down at the
    # end of a phase (a race at shutdown, seen once in a demo run; the run's results are unaffected)
    b"KillActor RPC failed",
)


class Compact(logging.Formatter):
    """`12:01:02 message` for info, `12:01:02 WARNING message` for warnings and errors."""

    def __init__(self):
        super().__init__("%(asctime)s %(message)s", datefmt="%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.WARNING:
            stamp, _, rest = text.partition(" ")
            text = f"{stamp} {record.levelname} {rest}"
        return text


def setup_logging(verbose: bool = False) -> None:
    if verbose:
        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                            datefmt="%H:%M:%S")
        return
    handler = logging.StreamHandler()
    handler.setFormatter(Compact())
    logging.basicConfig(level=logging.INFO, handlers=[handler])


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
        pump.join(timeout=2)  # a child process still holding the pipe keeps the pump (not us) waiting
