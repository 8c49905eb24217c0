"""The run lock on object stores: ROOT/.lock, created with a create-only write (`If-None-Match: *`).

The lock object holds its owner (host, pid, a random token) and is rewritten every `heartbeat_s` with
a compare-and-swap (`If-Match` on the tag this holder last wrote), so its age by the store's clock
is the time since the holder last showed life. A second run is refused with the message a local
run gets (catalog/io.py). A lock older than the lease (a crashed run: no object store lets a lock
die with its process) is taken over only with force=True (`--force-unlock`), said loudly; the
takeover is itself a compare-and-swap, so two forcing runs cannot both win. A store that ignores
conditional writes (probed, not assumed) is refused unless forced.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from contextlib import contextmanager

from catalog.io import RunLocked, lock_message
from catalog.storage.core import ConditionalWritesUnsupported

log = logging.getLogger("humanset.storage")
LOCK = ".lock"
LEASE_S = 120.0  # seconds without a heartbeat after which a lock is stale (--lock-lease of curate and render)


class LockLost(RunLocked):
    """Another run took this run's lock over (after our heartbeat stopped for longer than the lease)."""


class LockUnsupported(RunLocked):
    """The store cannot create an object only if it is absent, so a lock on it would not exclude."""


class Held:
    """What run_lock yields: `check()` raises LockLost once another run has taken the lock."""

    def __init__(self, where: str):
        self.where, self.lost, self.owner = where, False, None

    def check(self) -> None:
        if self.lost:
            raise LockLost(f"{self.where}: this run's lock was taken over by another run; stop writing")


def _loud(msg: str) -> None:
    log.warning(msg)
    print(f"humanset: WARNING: {msg}", file=sys.stderr, flush=True)


def _body(owner: str, lease_s: float) -> bytes:
    return json.dumps({"owner": owner, "host": socket.gethostname(), "pid": os.getpid(),
                       "lease_s": lease_s, "heartbeat_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                      sort_keys=True).encode()


def _holder(store) -> dict:
    try:
        return json.loads(store.read_bytes(LOCK))
    except (OSError, ValueError):
        return {}


@contextmanager
def object_run_lock(store, force: bool = False, lease_s: float = LEASE_S, heartbeat_s: float | None = None):
    heartbeat_s = heartbeat_s or max(lease_s / 4, 0.2)
    if heartbeat_s >= lease_s:
        raise ValueError(f"heartbeat_s ({heartbeat_s}) must be shorter than lease_s ({lease_s})")
    where, lock_uri = store.uri, store.uri_of(LOCK)
    held = Held(where)
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    held.owner = owner
    try:
        conditional = store.supports_conditional_writes()
    except ConditionalWritesUnsupported:
        conditional = False
    if not conditional:
        if not force:
            raise LockUnsupported(
                f"{where}: this store does not honour create-only writes (If-None-Match), so a run lock "
                f"cannot keep a second run out; pass --force-unlock to run without one (at your own risk)")
        _loud(f"{where}: the store has no conditional writes; running WITHOUT a working run lock "
              f"(--force-unlock): nothing stops a second run on this directory")
        store.write_bytes(LOCK, _body(owner, lease_s))
        try:
            yield held
        finally:
            store.delete(LOCK)
        return

    tag = store._create(LOCK, _body(owner, lease_s))
    if tag is None:
        seen = store._stat(LOCK)
        info = _holder(store)
        lease = max(lease_s, float(info.get("lease_s") or 0))
        if seen is None:  # released between our create and our look: one more try
            tag = store._create(LOCK, _body(owner, lease_s))
        elif seen[1] <= lease:
            raise RunLocked(lock_message(where, lock_uri, info))
        elif not force:
            raise RunLocked(lock_message(where, lock_uri, info) +
                            f" (its heartbeat is {seen[1]:.0f} s old, older than the {lease:.0f} s lease: if that "
                            f"run is dead, pass --force-unlock to take the lock over)")
        else:
            _loud(f"{where}: TAKING OVER a stale run lock (--force-unlock): held by {info.get('owner', '?')} (pid "
                  f"{info.get('pid', '?')} on host {info.get('host', '?')}), "
                  f"last heartbeat {seen[1]:.0f} s ago (lease {lease:.0f} s)")
            tag = store._replace_if(LOCK, _body(owner, lease_s), seen[0])
        if tag is None:
            raise RunLocked(lock_message(where, lock_uri))

    stop = threading.Event()
    state = {"tag": tag}

    def beat():
        while not stop.wait(heartbeat_s):
            try:
                new = store._replace_if(LOCK, _body(owner, lease_s), state["tag"])
            except OSError as e:  # a passing network error: the next beat retries; the lease covers it
                log.warning("%s: run lock heartbeat failed (will retry): %s", where, e)
                continue
            if new is None:
                held.lost = True
                log.error("%s: this run's lock was taken over by another run", where)
                print(f"humanset: ERROR: {where}: this run's lock was taken over by another run",
                      file=sys.stderr, flush=True)
                return
            state["tag"] = new

    thread = threading.Thread(target=beat, name="humanset-run-lock-heartbeat", daemon=True)
    thread.start()
    try:
        yield held
    finally:
        stop.set()
        thread.join()
        if not held.lost:
            store._delete_if(LOCK, state["tag"])
