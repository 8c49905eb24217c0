"""What a `humanset` command prints: our progress, warnings and summaries, not library internals.

Every console rule of the house is here, one owner for all rooms (the rooms import catalog/ only;):

- Libraries that log through Python's logging are quieted by logging handlers, never by text filters
  on a descriptor: `setup_logging()` shows our loggers' INFO lines (`humanset.*`, and the rooms'
  modules by their `__name__`) and other loggers' warnings and errors only (matplotlib's
  `generated new fontManager`, anny's `Loading cached model data` and the like stay out); `-v` shows
  everything. `quiet_ray()` turns Ray Data's own console handler down to warnings and drops its
  notices about progress bars; `token_auth_notice()` replaces Ray's multi-line notice about token
  authentication on a private local cluster.
- Native libraries write straight to the file descriptors, past Python: `native_noise_filtered()`
  drops exactly the lines in NATIVE_NOISE from descriptor 2 while a command runs, and `NATIVE_EXIT_NOISE`
  from descriptor 1 after it, while the interpreter shuts down (Blender's leak report is printed by a
  C++ static destructor, after Python has finished). Every other byte passes through unchanged.
- `progress(...)`: our bar on a terminal; one line every `interval` seconds otherwise, so a log file
  gets a readable history instead of carriage returns.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import subprocess
import sys
import threading

# lines native libraries write to descriptor 2 while a command runs
NATIVE_NOISE = (
    # libpng's notice for every PNG Blender writes with a duplicate eXIf chunk (render)
    b"libpng warning: eXIf: duplicate",
    # Warp's note that there is no CUDA driver (anny skins on the CPU; Cycles logs its own device)
    b"Warp CUDA warning: Could not find or load the NVIDIA CUDA driver",
    # Ray's core worker: an actor with constructor arguments in the object store may fail to restart (Ray
    # Data passes every actor pool its map function that way; a unit whose actors fail is re-run sample
    # by sample, pipeline/engine/isolate.py)
    b"has constructor arguments in the object store and max_restarts > 0",
    # Ray's GCS, forwarded: an actor pool's actor had already exited when the pool was shut down at the
    # end of a phase (a race at shutdown, seen once in a demo run; the run's results are unaffected)
    b"KillActor RPC failed",
)
# lines native libraries write to descriptor 1 as the process exits, keyed by the module that loads them:
# Blender's guarded allocator reports blocks still allocated when the bpy module is torn down (a few
# bytes BlenderProc and Blender keep until exit; printf from a static destructor, so after Python)
NATIVE_EXIT_NOISE = {"bpy": (b"Error: Not freed memory blocks: ",)}

OURS = ("humanset", "catalog", "explore", "pipeline", "render", "training", "__main__")

RAY_DATA_NOTICES = ("Progress bars disabled", "Progress bars for operators disabled",
                    "Progress will be logged", "A new progress UI is available")
TOKEN_NOTICE = "Token authentication is enabled for this Ray cluster"
# Ray Data's DataContext warns when its deprecated fields are set, which happens each time a
# worker unpickles the context: our code sets none of them
WORKER_WARNINGS = "ignore::DeprecationWarning:ray.data.context"


# --- Python logging -----------------------------------------------------------------------------------
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


class OursOrWarnings(logging.Filter):
    """Our loggers' records at any level; other libraries' from WARNING up."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or record.name.split(".")[0] in OURS


class AfterStdout(logging.StreamHandler):
    """A stderr handler that flushes stdout first: with both sent to one file (`> log 2>&1`) a log line
    lands after what the command printed before it, never inside a table still in stdout's buffer."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stdout.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader has gone
            pass
        super().emit(record)


def setup_logging(verbose: bool = False) -> None:
    if verbose:
        handler = AfterStdout()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        logging.basicConfig(level=logging.DEBUG, handlers=[handler])
        return
    handler = AfterStdout()
    handler.setFormatter(Compact())
    handler.addFilter(OursOrWarnings())
    logging.basicConfig(level=logging.INFO, handlers=[handler])


class _Drop(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def quiet_ray() -> None:
    """Keep Ray Data's progress machinery off the console (idempotent): its bars (on a terminal, a block
    of log lines every 10 s otherwise), its INFO lines and its notice about our choice to turn those bars
    off. They still go to Ray's session log (ray-data.log); Ray Data's warnings and errors still print."""
    import ray.data  # configures the 'ray.data' logger (a file handler and a console handler)

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # our bars count units; Ray Data's would count blocks
    ctx.enable_operator_progress_bars = False
    ctx.verbose_progress = False
    for h in logging.getLogger("ray.data").handlers:
        if "File" not in type(h).__name__:  # the console handler; ray-data.log keeps everything
            h.setLevel(max(h.level, logging.WARNING))
            if not any(isinstance(f, _Drop) for f in h.filters):
                h.addFilter(_Drop(RAY_DATA_NOTICES))
    old = os.environ.get("PYTHONWARNINGS")
    if WORKER_WARNINGS not in (old or ""):  # local workers inherit the driver's environment
        os.environ["PYTHONWARNINGS"] = f"{old},{WORKER_WARNINGS}" if old else WORKER_WARNINGS
    import warnings
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="ray.data.context")
    # the engine bounds worker retries with map_batches(max_retries=..., max_restarts=...), which
    # Ray 2.60 files under the deprecated `ray_remote_args` with no named replacement yet
    warnings.filterwarnings("ignore", message=r".*`ray_remote_args` is deprecated")


def token_auth_notice() -> None:
    """Replace Ray's notice that token authentication is on (a new local cluster) by one line."""
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _Drop) for f in logger.filters):
        logger.addFilter(_Drop((TOKEN_NOTICE,)))


# --- native writers: file descriptors -----------------------------------------------------------------
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
    os.close(write_fd)  # the pump's own copy of the real descriptor


class _SameTerminal:
    """sys.stderr while descriptor 2 is the filter's pipe: it still answers isatty() for the real stderr,
    so progress bars stay bars on a terminal."""

    def __init__(self, stream, tty: bool):
        self._stream, self._tty = stream, tty

    def isatty(self) -> bool:
        return self._tty

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def native_noise_filtered(noise: tuple[bytes, ...] = NATIVE_NOISE):
    """Within the block, lines on file descriptor 2 that contain one of `noise` are dropped; at the
    interpreter's exit, NATIVE_EXIT_NOISE is dropped from descriptor 1 (see `_filter_exit_noise`)."""
    try:
        stderr_fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr replaced by an object without a descriptor
        yield
        return
    _register_exit_filter()
    sys.stderr.flush()
    stream, tty = sys.stderr, os.isatty(stderr_fd)
    restore, real = os.dup(stderr_fd), os.dup(stderr_fd)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, stderr_fd)
    os.close(write_fd)
    pump = threading.Thread(target=_pump, args=(read_fd, real, noise), name="stderr-filter", daemon=True)
    pump.start()
    sys.stderr = _SameTerminal(stream, tty)
    try:
        yield
    finally:
        if isinstance(sys.stderr, _SameTerminal):
            sys.stderr = stream
        sys.stderr.flush()
        os.dup2(restore, stderr_fd)  # the pipe's last write end closes: the pump reads to the end and stops
        os.close(restore)
        pump.join(timeout=2)  # a child process still holding the pipe keeps the pump (not us) waiting


_exit_filter_registered = False
_exit_child: list = []


def _register_exit_filter() -> None:
    global _exit_filter_registered
    if not _exit_filter_registered:  # registered first, so it runs after Ray's and others' exit handlers
        atexit.register(_filter_exit_noise)
        _exit_filter_registered = True


def _filter_exit_noise() -> None:
    """At exit, if a library in NATIVE_EXIT_NOISE is loaded, descriptor 1 becomes a pipe to a small child
    process (this file run as a script: the standard library only) that drops those lines and passes
    the rest; it ends when this process has closed its last descriptor. A thread could not: static
    destructors run after Python's threads have stopped."""
    noise = tuple(n for module, lines in NATIVE_EXIT_NOISE.items() if module in sys.modules for n in lines)
    if not noise:
        return
    try:
        sys.stdout.flush()
        real = os.dup(1)
    except (AttributeError, OSError, ValueError):
        return
    try:
        child = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), *map(os.fsdecode, noise)],
                                 stdin=subprocess.PIPE, stdout=real, stderr=subprocess.DEVNULL, close_fds=True)
    except OSError:
        os.close(real)
        return
    os.close(real)
    os.dup2(child.stdin.fileno(), 1)
    child.stdin.close()  # descriptor 1 now holds the pipe's only write end in this process
    _exit_child.append(child)  # never waited for: it outlives the interpreter


# --- progress -----------------------------------------------------------------------------------------
class _Lines:
    """A file for tqdm that turns each refresh into one line (no carriage returns in a log). The bar's
    first display, before any progress, is left out: the log line before the phase announces it."""

    def __init__(self, out):
        self.out, self.started = out, False

    def write(self, s: str) -> None:
        s = s.replace("\r", "").strip()
        if s and self.started:
            self.out.write(s + "\n")
        self.started = self.started or bool(s)

    def flush(self) -> None:
        self.out.flush()


def progress(total: int | None = None, desc: str = "", unit: str = "unit", enabled: bool = True,
             interval: float = 30.0, iterable=None, file=None):
    """A tqdm bar on a terminal, else one line per `interval` seconds (and one at the end)."""
    from tqdm import tqdm

    file = file or sys.stderr
    kw = dict(iterable=iterable, total=total, desc=desc, unit=unit)
    if not enabled:
        return tqdm(**kw, disable=True)
    if hasattr(file, "isatty") and file.isatty():
        return tqdm(**kw, file=file)
    return tqdm(**kw, file=_Lines(file), mininterval=interval, maxinterval=interval, miniters=1, ncols=80, ascii=True)


if __name__ == "__main__":  # the exit filter's child: stdin -> stdout without the lines given as arguments
    _pump(0, 1, tuple(os.fsencode(a) for a in sys.argv[1:]))
