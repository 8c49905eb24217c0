"""Atomic writers: write to a temporary name in the same folder, then rename into place.

A crash leaves at most a `*.tmp-*` file, never a half file under the final name. Each file is
fsynced before its rename; inside `commit_together()` a task's many small files are flushed with
one sync of their file system instead, then renamed in the order they were written.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import shutil
import socket
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger(__name__)


def tmp_name(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


class Commits:
    """The files written inside one commit_together(), waiting for their sync and rename."""

    def __init__(self):
        self.pending, self._sealed = [], 0

    def seal(self) -> None:
        """What was written so far is complete (e.g. one unit's files, its marker last): it is
        committed even if a later write fails."""
        self._sealed = len(self.pending)

    def drop_unsealed(self) -> None:
        for tmp, _ in self.pending[self._sealed:]:
            Path(tmp).unlink(missing_ok=True)
        del self.pending[self._sealed:]

    def commit(self) -> None:
        if not self.pending:
            return
        _sync([tmp for tmp, _ in self.pending])
        for tmp, path in self.pending:  # after the sync: no name is durable before its bytes
            os.replace(tmp, path)
        self.pending.clear()


_local = threading.local()


def _sync(files: list) -> None:
    """One syncfs(2) per file system the files are on (Linux), else one fsync per file."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        syncfs = libc.syncfs
    except (OSError, AttributeError):
        for f in files:
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        return
    folders = {}
    for f in files:
        parent = os.path.dirname(os.path.abspath(f))
        folders.setdefault(os.stat(parent).st_dev, parent)
    for folder in folders.values():
        fd = os.open(folder, os.O_RDONLY)
        try:
            if syncfs(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), folder)
        finally:
            os.close(fd)


@contextmanager
def commit_together():
    """Atomic writes (local files) inside the block are committed at its end with one sync (see Commits); on an
    error the sealed ones are committed and the rest removed. Nested blocks join the outer one."""
    if getattr(_local, "commits", None) is not None:
        yield _local.commits
        return
    c = _local.commits = Commits()
    try:
        yield c
    except BaseException:
        c.drop_unsealed()
        _local.commits = None
        c.commit()
        raise
    _local.commits = None
    try:
        c.commit()
    except BaseException:
        for tmp, _ in c.pending:
            Path(tmp).unlink(missing_ok=True)
        raise


def commit(tmp: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Put a finished temporary file in place: fsync and rename now, or at the end of the
    commit_together() block this runs in. True when deferred (the temporary file stays for now)."""
    c = getattr(_local, "commits", None)
    if c is not None:
        c.pending.append((Path(tmp), Path(path)))
        return True
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return False


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path; on success fsync and rename it to `path` (see commit), on error
    remove it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(path)
    deferred = False
    try:
        yield tmp
        deferred = commit(tmp, path)
    finally:
        if not deferred and tmp.exists():
            tmp.unlink()


def write_bytes(path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(data)


def write_json(path, obj) -> None:
    write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())


def write_parquet(path, table: pa.Table) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def read_json(path):
    return json.loads(Path(path).read_text())


# exactly what tmp_name() makes: .{name}.tmp-{pid}-{8 hex}
TMP_RE = re.compile(r"^\..+\.tmp-\d+-[0-9a-f]{8}$")


def clean_tmp(folder: str | os.PathLike, where: list[str] | None = None) -> int:
    """Remove temporary files (and scratch folders) a crashed writer of ours left in `folder`; return
    how many. With `where` (sub-folders relative to `folder`, "" for itself) only those folders are
    listed, one level each: a run of 10^6 units is not walked file by file. Without it, the whole
    tree (not through symlinks). Call it only while holding run_lock(folder)."""
    root = Path(folder)
    if where is None:
        found = root.rglob(".*.tmp-*")
    else:
        found = (p for sub in where if (root / sub).is_dir() for p in (root / sub).glob(".*.tmp-*"))
    n = 0
    for p in list(found):
        if not TMP_RE.match(p.name) or p.is_symlink():
            continue
        if p.is_file():
            p.unlink(missing_ok=True)
            n += 1
        elif p.is_dir():  # a scratch folder named like one (the unit listing's sort runs)
            shutil.rmtree(p, ignore_errors=True)
            n += 1
    return n


class RunLocked(Exception):
    """Another process holds the folder's lock."""


def lock_message(folder, lock, holder: dict | None = None) -> str:
    """The one refusal a second run gets, for a local folder and an object-store RUN alike; `holder`
    (what the lock says of its owner: pid, host) is named when known."""
    who = f" (held by pid {holder.get('pid', '?')} on host {holder.get('host', '?')})" if holder else ""
    return (f"{folder}: another run is using this directory (it holds {lock}); "
            f"wait for it to finish or choose another output directory{who}")


def lock_holder(text: str) -> dict:
    """What a local .lock file says of its owner: {"pid", "host"} (older locks hold a pid only)."""
    try:
        data = json.loads(text)
        return data if isinstance(data, dict) else {}
    except ValueError:
        pid = text.strip()  # older humansets wrote the pid alone and left the file behind on every exit
        return {"pid": int(pid), "legacy": True} if pid.isdigit() else {}


@contextmanager
def run_lock(folder: str | os.PathLike):
    """Exclusive lock on a run folder (fcntl.flock on FOLDER/.lock) for the life of the block; the
    file is removed when the block ends.

    A second holder fails at once with RunLocked naming the holder's pid and host; nothing is touched.
    The lock dies with its process (even kill -9), so a crashed run never blocks the next one: its
    .lock file, left behind, is taken over and reported with the dead holder's pid and host. On a
    multi-node cluster the folder must be on a file system with working flock (local, NFSv4, Lustre)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ".lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                try:
                    holder = lock_holder(path.read_text())
                except OSError:
                    holder = {}
                raise RunLocked(lock_message(folder, path, holder)) from None
            raise
        # the file locked may have been removed by its last holder between our open and our flock:
        # then it is not the lock any more, and the next try opens (or creates) the one that is
        try:
            current = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)
    try:
        left = lock_holder(os.pread(fd, 4096, 0).decode(errors="replace"))
        if left and not left.get("legacy"):
            log.warning("%s: taking over the lock left by pid %s on host %s, which ended without releasing "
                        "it (killed?)", folder, left.get("pid", "?"), left.get("host", "?"))
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps({"pid": os.getpid(), "host": socket.gethostname()}) + "\n").encode(), 0)
        yield folder
    finally:
        try:
            path.unlink()  # while still holding it: a process that opened it since retries (above)
        except FileNotFoundError:
            pass
        os.close(fd)  # closing the descriptor releases the lock
