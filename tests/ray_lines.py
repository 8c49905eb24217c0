"""The lines Ray forwards to a driver's stderr from its own processes, and a command's stderr without them.

Ray prints what its processes say on the stderr of the process that called `ray.init` (`log_to_driver`):
"(raylet) ...", "(autoscaler +1m2s) ...", "(Name pid=N) ...", "(pid=gcs_server) ...", with ", ip=..." for
another node's and colour codes around the prefix (ray/_private/worker.py, `print_worker_logs`). In the full
suite the session's Ray (conftest's `ray_local`), or a cluster an earlier test started, says something
whenever it has to (a raylet's "over 95% full" warning about the disk, Ray Train's PlacementGroupCleaner),
and the line lands in whichever test's stderr capture is open. A test that asserts on a command's own
stderr, in this process, reads it through `ours`.
"""
from __future__ import annotations

import re

_COLOUR = r"(?:\x1b\[[0-9;]*m)*"
# a task's or an actor's name may hold parentheses and spaces: "(MapBatches(Person) pid=4712)"
RAY_LINE = re.compile(rf"^{_COLOUR}\((?:raylet|autoscaler [^)]*|(?:.*? )?pid=[^,()\s]+)(?:, ip=[^)\s]*)?\){_COLOUR} ")


def ours(err: str) -> list[str]:
    """stderr's lines (blank ends stripped, as `err.strip().splitlines()`) without Ray's forwarded ones."""
    return [line for line in err.strip().splitlines() if not RAY_LINE.match(line)]
