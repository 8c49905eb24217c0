"""The two ways a curation run stops: its own setup is wrong, or the machine / store failed it.

Data never stops a run (a bad sample is a row, a bad unit a stats marker). Exit statuses of
`humanset curate` (and `pipeline/curate.py`): 2 for a RunError (config, inputs, a model that does
not load, a RUN in use), 3 for an EnvironmentFault (no space left, permission denied, a read-only
file system, an answer the store gives for good: wrong credentials, a missing bucket (StoreRefused),
or a store that kept failing past storage.retry_total_s (GaveUp)): fix the cause, then rerun the
same command to resume.
"""
from __future__ import annotations

import errno

from catalog.storage.answers import GaveUp, StoreRefused

EXIT_RUN_ERROR = 2
EXIT_ENVIRONMENT = 3


class RunError(Exception):
    """The run cannot go on (bad config for this RUN, a model that does not load, ...)."""


class EnvironmentFault(RunError):
    """The machine or the store refused a write the run needs; retrying the data would not help."""


_FIXES = {
    errno.ENOSPC: ("no space left on device", "free space on {where}"),
    errno.EDQUOT: ("disk quota exceeded", "free space or raise the quota on {where}"),
    errno.EACCES: ("permission denied", "give this user write access to {where}"),
    errno.EPERM: ("operation not permitted", "give this user write access to {where}"),
    errno.EROFS: ("read-only file system", "write the run to a writable file system, or remount {where}"),
}
# the same faults as object stores and pyarrow's file systems report them (no errno there)
_TEXT = [("no space left", errno.ENOSPC), ("quota exceeded", errno.EDQUOT), ("read-only file system", errno.EROFS),
         ("permission denied", errno.EACCES), ("access denied", errno.EACCES), ("accessdenied", errno.EACCES),
         ("invalidaccesskeyid", errno.EACCES), ("signaturedoesnotmatch", errno.EACCES),
         ("expiredtoken", errno.EACCES)]


def _code(exc: BaseException) -> int | None:
    if isinstance(exc, OSError) and exc.errno in _FIXES:
        return exc.errno
    text = str(exc).lower()
    return next((code for needle, code in _TEXT if needle in text), None) if isinstance(exc, OSError) else None


def environment_fault(exc: BaseException, where: str) -> str | None:
    """One line naming the path, the cause and the fix when `exc` is a fault of the environment
    (never of the data), else None. `where` is the path or URI being written."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:  # the cause may be wrapped (a Ray task error, pyarrow)
        seen.add(id(e))
        if isinstance(e, (StoreRefused, GaveUp)):  # the store's own line: its URI, cause and fix
            return f"{e}, then rerun the same command to resume"
        code = _code(e)
        if code is not None:
            cause, fix = _FIXES[code]
            return f"{where}: {cause}; {fix.format(where=where)}, then rerun the same command to resume"
        cause = getattr(e, "cause", None)  # a Ray task error holds the worker's exception here
        e = cause if isinstance(cause, BaseException) else (e.__cause__ or e.__context__)
    return None
