"""What a curation run prints: our progress, our warnings and the summary, not Ray's internals.

- `quiet_ray()` before a driver starts or joins Ray: Ray Data's own progress (bars on a terminal,
  a block of log lines every 10 s otherwise), its INFO lines and its notice about our choice to
  turn those bars off stay out of the console; they still go to Ray's session log
  (ray-data.log). Deprecation warnings of Ray Data's own settings are silenced in the workers
  too. Ray Data's warnings and errors still print.
- `token_auth_notice()`: a private local cluster keeps Ray's token authentication on; Ray's
  multi-line notice about it becomes one line of ours.
- `progress(...)`: our bar on a terminal; one line every `interval` seconds otherwise, so a log
  file gets a readable history instead of carriage returns.
"""
from __future__ import annotations

import logging
import os
import sys

RAY_DATA_NOTICES = ("Progress bars disabled", "Progress bars for operators disabled",
                    "Progress will be logged", "A new progress UI is available")
TOKEN_NOTICE = "Token authentication is enabled for this Ray cluster"
# Ray Data's DataContext warns when its deprecated fields are set, which happens each time a
# worker unpickles the context: our code sets none of them
WORKER_WARNINGS = "ignore::DeprecationWarning:ray.data.context"


class _Drop(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def quiet_ray() -> None:
    """Keep Ray Data's progress machinery off the console (idempotent)."""
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
