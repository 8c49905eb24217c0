"""One retry policy for every request humanset makes to an object store (docs/storage.md, "Retries").

- `StorageSettings`: the `storage.retry_*` settings, one dataclass that each room's config holds as
  its `storage` section (curate and select, render, pretrain/finetune/train-filter); the defaults
  are written here only.
- `configure(settings)` makes them this process's policy and exports them (HUMANSET_STORAGE_RETRY)
  to the processes it starts; Ray workers call it with the run's config.
- what an answer means is catalog/storage/answers.py (`classify`): transient answers are retried,
  permanent ones become a `StoreRefused` (one line, never retried), anything else passes through.
- `attempt(what, uri, fn)`: fn() under the policy: exponential backoff with decorrelated jitter
  (each wait drawn between retry_first_wait_s and 3x the last, at most retry_max_wait_s; a
  Retry-After answer waits at least that long), transient faults retry_attempts tries at most,
  throttling until retry_total_s (the store asks for patience, it is not broken), everything within
  retry_total_s a request.
- Backpressure (`Limiter`): at most `retry_max_in_flight` requests of a process are in flight; a
  throttled answer halves that number and holds the process's next requests for the throttled
  one's wait; each success raises it by 1/limit (additive increase), so it recovers over ~limit^2/2
  successes once the store stops throttling.
- `COUNTS`: what was retried in this process and why (`store.retries`, `store.throttled`,
  `store.resumed_reads`, per kind of request); `snapshot()` / `since(before)` give a unit's share.
"""
from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Callable, TypeVar

from catalog.config import setting
from catalog.storage.answers import GaveUp, StoreRefused, Verdict, classify, refusal
from catalog.storage.core import scrub

log = logging.getLogger("humanset.storage")
ENV = "HUMANSET_STORAGE_RETRY"
T = TypeVar("T")


@dataclass
class StorageSettings:
    """The `storage` section of every room's settings: how requests to an object store are retried."""
    retry_attempts: int = setting(
        10, "tries of one request (the first included) on a transient answer: 500, 502,\n504, 408, a reset or "
            "refused connection, a timeout, a cut body (throttling: see\nretry_total_s); 1 = no retry", low=1)
    retry_first_wait_s: float = setting(
        0.1, "the first wait before a retry; each next one is drawn between this and 3x\nthe last (decorrelated "
             "jitter); a Retry-After answer waits at least that long", low=0, high=60)
    retry_max_wait_s: float = setting(20.0, "the longest single wait", low=0, high=600)
    retry_total_s: float = setting(
        300.0, "a request is given up after this long, its tries and waits together;\nthrottled answers (429, 503 "
               "SlowDown) are retried until then", low=1)
    retry_max_in_flight: int = setting(
        32, "requests one process sends to a store at once at most; a throttled answer\nhalves the number and "
            "pauses the process for its wait; each success raises it\nby 1/number until it is back (backpressure)",
        low=1)


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 10
    first_wait_s: float = 0.1
    max_wait_s: float = 20.0
    total_s: float = 300.0
    max_in_flight: int = 32

    @classmethod
    def of(cls, settings) -> "RetryPolicy":
        """From StorageSettings, its dict (a config's `storage` section) or None (the defaults)."""
        if settings is None:
            return cls()
        values = asdict(settings) if isinstance(settings, StorageSettings) else dict(settings)
        known = {f.name for f in fields(StorageSettings)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"storage settings: unknown {sorted(unknown)}; known: {', '.join(sorted(known))}")
        s = StorageSettings(**values)
        return cls(int(s.retry_attempts), float(s.retry_first_wait_s), float(s.retry_max_wait_s),
                   float(s.retry_total_s), int(s.retry_max_in_flight))

    def settings(self) -> dict:
        return {"retry_attempts": self.attempts, "retry_first_wait_s": self.first_wait_s,
                "retry_max_wait_s": self.max_wait_s, "retry_total_s": self.total_s,
                "retry_max_in_flight": self.max_in_flight}

    def next_wait(self, last: float | None, rng: random.Random = random) -> float:
        """Decorrelated jitter: the first wait, then uniform(first, 3 x last), capped."""
        if last is None:
            return min(self.first_wait_s, self.max_wait_s)
        return min(self.max_wait_s, rng.uniform(self.first_wait_s, max(self.first_wait_s, 3 * last)))


# --- counts ----------------------------------------------------------------------------------------
class Counts:
    """What this process retried and why; thread-safe. `as_dict()` is what markers and the manifest
    hold under `store`."""

    KEYS = ("requests", "retries", "throttled", "resumed_reads", "gave_up")

    def __init__(self):
        self._lock = threading.Lock()
        self._n = {k: 0 for k in self.KEYS}
        self._for: dict[str, int] = {}

    def add(self, key: str, n: int = 1, what: str | None = None) -> None:
        with self._lock:
            self._n[key] += n
            if what is not None and key == "retries":
                self._for[what] = self._for.get(what, 0) + n

    def as_dict(self) -> dict:
        with self._lock:
            return {**self._n, "retries_for": dict(sorted(self._for.items()))}


COUNTS = Counts()


def snapshot() -> dict:
    return COUNTS.as_dict()


def since(before: dict) -> dict:
    """The counts of this process since `before` (a snapshot): one unit's share in a worker."""
    return diff(COUNTS.as_dict(), before)


def diff(after: dict, before: dict) -> dict:
    out = {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in Counts.KEYS}
    fa, fb = after.get("retries_for") or {}, before.get("retries_for") or {}
    out["retries_for"] = {k: fa[k] - fb.get(k, 0) for k in sorted(fa) if fa[k] - fb.get(k, 0)}
    return out


def total(parts) -> dict:
    """The sum of several counts (markers of a run, the driver's, dedup's)."""
    out = {k: 0 for k in Counts.KEYS}
    out["retries_for"] = {}
    for part in parts:
        if not part:
            continue
        for k in Counts.KEYS:
            out[k] += int(part.get(k, 0))
        for k, v in (part.get("retries_for") or {}).items():
            out["retries_for"][k] = out["retries_for"].get(k, 0) + int(v)
    out["retries_for"] = dict(sorted(out["retries_for"].items()))
    return out


# --- backpressure ----------------------------------------------------------------------------------
class Limiter:
    """Requests in flight of this process: at most `limit` (AIMD), held while the store asked for a pause."""

    def __init__(self, max_in_flight: int):
        self.max = max(1, int(max_in_flight))
        self.limit = float(self.max)
        self.in_flight = 0
        self.pause_until = 0.0
        self._last_cut = 0.0
        self._cv = threading.Condition()
        self._mine = threading.local()  # a request made while this thread holds a slot (a read-back
        # inside a conditional write) uses that slot: no thread waits on itself

    @contextmanager
    def slot(self):
        if getattr(self._mine, "held", False):
            yield
            return
        with self._cv:
            while True:
                wait = self.pause_until - time.monotonic()
                if wait <= 0 and self.in_flight < int(self.limit):
                    break
                self._cv.wait(timeout=wait if wait > 0 else 0.5)
            self.in_flight += 1
        self._mine.held = True
        try:
            yield
        finally:
            self._mine.held = False
            with self._cv:
                self.in_flight -= 1
                self._cv.notify()

    def throttled(self, wait_s: float) -> None:
        """The store said slow down: halve the limit (once per wait, not once per answer of a burst)
        and hold this process's next requests for `wait_s`."""
        with self._cv:
            now = time.monotonic()
            if now >= self._last_cut + wait_s:
                self.limit = max(1.0, self.limit / 2)
                self._last_cut = now
            self.pause_until = max(self.pause_until, now + wait_s)

    def succeeded(self) -> None:
        with self._cv:
            if self.limit < self.max:
                before = int(self.limit)
                self.limit = min(float(self.max), self.limit + 1.0 / self.limit)
                if int(self.limit) > before:
                    self._cv.notify()


# --- the process's policy ----------------------------------------------------------------------------
_STATE: dict = {"policy": None, "limiter": None}
_STATE_LOCK = threading.Lock()


def configure(settings) -> RetryPolicy:
    """Make `settings` (StorageSettings, a config's `storage` dict, a whole config, whose `storage`
    section it takes, or None for the defaults) this process's policy; the processes it starts
    inherit it (HUMANSET_STORAGE_RETRY)."""
    if isinstance(settings, dict) and not set(settings) <= {f.name for f in fields(StorageSettings)}:
        settings = settings.get("storage")  # a whole config: its section (absent: the defaults)
    policy = RetryPolicy.of(settings)
    with _STATE_LOCK:
        if _STATE["policy"] != policy:  # a new policy starts with its own, fresh limit
            _STATE["policy"], _STATE["limiter"] = policy, Limiter(policy.max_in_flight)
    os.environ[ENV] = json.dumps(policy.settings(), sort_keys=True)
    return policy


def policy() -> RetryPolicy:
    with _STATE_LOCK:
        if _STATE["policy"] is None:
            text = os.environ.get(ENV)
            try:
                _STATE["policy"] = RetryPolicy.of(json.loads(text)) if text else RetryPolicy()
            except (ValueError, TypeError) as e:
                raise ValueError(f"{ENV}={text!r}: not storage settings ({e})") from None
        if _STATE["limiter"] is None:
            _STATE["limiter"] = Limiter(_STATE["policy"].max_in_flight)
        return _STATE["policy"]


def limiter() -> Limiter:
    policy()
    return _STATE["limiter"]


# --- the loop ----------------------------------------------------------------------------------------
def _short(e: BaseException) -> str:
    return scrub(str(e).split("\n\nDebug source:", 1)[0].strip().splitlines()[0] if str(e).strip() else type(e).__name__)


def attempt(what: str, uri: str, fn: Callable[[], T], *, on_fault: Callable[[BaseException, Verdict], None] | None = None,
            pol: RetryPolicy | None = None, sleep: Callable[[float], None] = time.sleep) -> T:
    """fn() under the policy. `what` names the kind of request in the counts (read, write, list, ...).
    `on_fault(exc, verdict)` runs before each retry (e.g. a read resumes from the byte reached).
    A permanent answer raises StoreRefused; an answer that is not a fault of the store (404, 412,
    a bug) is raised as it is; a transient one that outlasts the policy raises GaveUp."""
    pol = pol or policy()
    gate = limiter()
    start = time.monotonic()
    tries, wait = 0, None
    while True:
        tries += 1
        with gate.slot():
            COUNTS.add("requests")
            try:
                result = fn()
            except Exception as e:  # noqa: BLE001 - classified below; not ours: raised as it was
                exc = e
            else:
                gate.succeeded()
                return result
        verdict = classify(exc)
        if verdict.kind is None:
            raise exc
        if verdict.kind == "permanent":
            raise (exc if isinstance(exc, StoreRefused) else refusal(uri, verdict)) from None
        wait = pol.next_wait(wait)
        if verdict.retry_after is not None:  # the store said how long: at least that (within retry_total_s)
            wait = max(wait, verdict.retry_after)
        elapsed = time.monotonic() - start
        out_of_tries = verdict.kind != "throttled" and tries >= pol.attempts
        if out_of_tries or elapsed + wait > pol.total_s:
            COUNTS.add("gave_up")
            raise GaveUp(f"{uri}: {what} failed after {tries} tries in {elapsed:.0f} s "
                         f"(storage.retry_attempts={pol.attempts}, storage.retry_total_s={pol.total_s:g}): "
                         f"{_short(exc)}") from None
        COUNTS.add("retries", what=what)
        if verdict.kind == "throttled":
            COUNTS.add("throttled")
            gate.throttled(wait)
        log.debug("%s: %s: %s (%s), retry %d in %.2f s", uri, what, verdict.kind, verdict.code or verdict.status,
                  tries, wait)
        if on_fault is not None:
            on_fault(exc, verdict)
        sleep(wait)
