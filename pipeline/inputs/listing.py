"""The run's unit listing, RUN/units.jsonl: written streaming from the inputs (repeated listings
dropped and unit ids made unique by sorts on disk, in bounded memory), read back a line at a time
without the units' files, and one unit's line by its offset. The listing may live on an object
store (a RUN on s3://): it is sorted in a local scratch folder and written as one object, and its
lines are read back with ranged reads."""
from __future__ import annotations

import hashlib
import heapq
import json
import logging
import os
import pickle
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import catalog
import catalog.storage
from catalog.io import tmp_name
from catalog.storage import is_uri

from pipeline.inputs.kinds import iter_units
from pipeline.inputs.units import InputError, Unit, chunks, unit_sources

log = logging.getLogger(__name__)


# External sort: sorted runs of at most run_size items spilled to scratch, merged FAN_IN at a time.
FAN_IN = 64
RUN_SIZE = 200_000


def _write_run(items, scratch: Path) -> Path:
    """Items to a scratch file, pickled in batches (a private file this process writes and reads)."""
    fd, name = tempfile.mkstemp(dir=scratch, suffix=".run")
    with os.fdopen(fd, "wb") as fh:
        for batch in chunks(iter(items), 256):
            pickle.dump(batch, fh, protocol=pickle.HIGHEST_PROTOCOL)
    return Path(name)


def _read_run(path: Path) -> Iterator[tuple]:
    with open(path, "rb") as fh:
        while True:
            try:
                yield from pickle.load(fh)
            except EOFError:
                return


def _sorted_file(items: Iterator[tuple], scratch: Path, run_size: int = RUN_SIZE) -> Path:
    """A file of the items in sorted order, sorted in bounded memory."""
    runs, buf = [], []
    for x in items:
        buf.append(x)
        if len(buf) >= run_size:
            runs.append(_write_run(sorted(buf), scratch))
            buf = []
    runs.append(_write_run(sorted(buf), scratch))
    del buf
    while len(runs) > 1:
        merged = []
        for i in range(0, len(runs), FAN_IN):
            group = runs[i:i + FAN_IN]
            if len(group) == 1:
                merged.append(group[0])
                continue
            merged.append(_write_run(heapq.merge(*map(_read_run, group)), scratch))
            for r in group:
                r.unlink()
        runs = merged
    return runs[0]


def _repeats(raw: Path, scratch: Path, run_size: int) -> Path:
    """Sorted file of the sequence numbers of repeated listings (every listing of a source but its
    first), by sorting (source, sequence number) pairs."""
    def pairs():
        seq = 0
        for u in _read_units(raw):
            for src in unit_sources(u):
                yield src, seq
                seq += 1

    def later():
        prev = None
        for src, seq in _read_run(_sorted_file(pairs(), scratch, run_size)):
            if src == prev:
                yield (seq,)
            prev = src
    return _sorted_file(later(), scratch, run_size)


def _read_units(path) -> Iterator[Unit]:
    with _open_listing(path) as fh:
        for line in fh:
            if line.strip():
                yield Unit.from_dict(json.loads(line))


def _without_repeats(raw: Path, repeats: Path) -> Iterator[Unit]:
    """The raw listing's units minus repeated listings (a unit left empty is dropped)."""
    drops = (seq for (seq,) in _read_run(repeats))
    nxt = next(drops, None)
    seq = 0
    for u in _read_units(raw):
        keep = []
        for i in range(len(unit_sources(u))):
            if seq == nxt:
                nxt = next(drops, None)
            else:
                keep.append(i)
            seq += 1
        if not keep:
            continue
        if u.kind == "files" and len(keep) < len(u.files):
            if u.errors:
                u.errors = {str(n): u.errors[str(i)] for n, i in enumerate(keep) if str(i) in u.errors}
            u.keys, u.files = [u.keys[i] for i in keep], [u.files[i] for i in keep]
        yield u


def _repeated_ids(path: Path, scratch: Path, run_size: int) -> set[str]:
    """Unit ids that occur more than once in a listing (rare: two inputs with one name), found by
    sorting the ids on disk; only the repeated ones are held."""
    prev, out = None, set()
    for (uid,) in _read_run(_sorted_file(((u.unit_id,) for u in _read_units(path)), scratch, run_size)):
        if uid == prev:
            out.add(uid)
        prev = uid
    return out


def _remote(path) -> bool:
    return isinstance(path, str) and is_uri(path)


@contextmanager
def _listing_output(path):
    """Where the final listing is written: temp + fsync + rename locally, one object on a store."""
    if _remote(path):
        store, name = catalog.storage.locate(path)
        with store.open_output(name) as fh:
            yield fh
    else:
        with catalog.atomic_path(path) as tmp, open(tmp, "wb") as fh:
            yield fh


def _open_listing(path):
    """The saved listing as a buffered binary file (readline, tell), local or on a store."""
    if _remote(path):
        store, name = catalog.storage.locate(path)
        return store.open_stream(name, 1 << 20)
    return open(path, "rb")


def write_listing(inputs: list[str], path, files_per_unit: int | None = None, exts=None,
                  run_size: int = RUN_SIZE) -> tuple[int, int]:
    """List the inputs into `path` (JSON lines, one unit with its files a line), streaming; return
    how many units it holds and how many repeated listings were dropped. The listing is written as
    it is walked: memory holds one unit's files, one directory's names and the repeated unit ids
    (iter_listing reads the units back without their files). `path` is a local path or a URI (the
    listing of a RUN on an object store: sorted in a local scratch folder, written as one object).
    files_per_unit and exts: input.files_per_unit and input.extensions (None: their defaults)."""
    with _scratch(None if _remote(path) else Path(path).parent) as scratch:
        raw = scratch / "raw.jsonl"
        with open(raw, "w") as fh:
            for u in iter_units(inputs, files_per_unit, exts):
                fh.write(json.dumps(u.to_dict()) + "\n")
        repeats = _repeats(raw, scratch, run_size)
        n_repeats = os.path.getsize(repeats) and sum(1 for _ in _read_run(repeats))
        if n_repeats:
            log.warning("%d inputs were listed more than once; each is curated once", n_repeats)
        deduped = scratch / "units.jsonl"
        with open(deduped, "w") as fh:
            for u in _without_repeats(raw, repeats):
                fh.write(json.dumps(u.to_dict()) + "\n")
        # unit ids name files in RUN/: make them unique, keeping the readable stem
        same = _repeated_ids(deduped, scratch, run_size)
        n = 0
        with _listing_output(path if _remote(path) else Path(path)) as fh:
            for u in _read_units(deduped):
                if u.unit_id in same:
                    u.unit_id = f"{u.unit_id}-{hashlib.blake2b(u.uri.encode(), digest_size=4).hexdigest()}"
                fh.write((json.dumps(u.to_dict()) + "\n").encode())
                n += 1
    return n, n_repeats


def iter_listing(path) -> Iterator[Unit]:
    """A saved listing's units without their files, one line at a time (each knows its line's
    offset: load_unit reads the files back). `path`: a local path or a URI."""
    with _open_listing(path) as fh:
        pos = 0
        while line := fh.readline():
            pos += len(line)
            if line.strip():
                u = Unit.from_dict(json.loads(line))
                u.offset, u.count = pos - len(line), len(unit_sources(u))
                yield u.brief()


def read_listing(path) -> list[Unit]:
    """A saved listing's units without their files, in memory (tests and small runs)."""
    return list(iter_listing(path))


def _line_at(path, offset: int) -> bytes:
    """The listing's line that starts at `offset` (ranged reads on a store, growing until a newline)."""
    if not _remote(path):
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.readline()
    store, name = catalog.storage.locate(path)
    with store.open_input(name) as f:
        size, want, buf = f.size(), 64 << 10, b""
        while True:
            buf = f.read_at(min(want, size - offset), offset)
            if b"\n" in buf or offset + len(buf) >= size:
                return buf.split(b"\n", 1)[0] + b"\n"
            want *= 4


def load_unit(unit: Unit, listing) -> Unit:
    """The unit with its files: from its line in the listing when it carries only the offset."""
    if unit.offset < 0:
        return unit
    full = Unit.from_dict(json.loads(_line_at(listing, unit.offset)))
    if full.unit_id != unit.unit_id:
        raise InputError(f"{listing}: line at offset {unit.offset} is unit {full.unit_id}, expected "
                         f"{unit.unit_id}; the listing was changed by hand")
    return full


def count_new(inputs: list[str], listing: Path, files_per_unit: int | None = None, exts=None,
              run_size: int = RUN_SIZE) -> int:
    """How many sources the inputs hold now that the saved listing does not: a merge of the two
    source lists, each sorted on disk."""
    with _scratch(None if _remote(listing) else Path(listing).parent) as scratch:
        now = _sorted_file(((s,) for u in iter_units(inputs, files_per_unit, exts) for s in unit_sources(u)),
                           scratch, run_size)
        saved = _sorted_file(((s,) for u in _read_units(listing) for s in unit_sources(u)), scratch, run_size)
        old = _read_run(saved)
        cur, new, prev = next(old, None), 0, None
        for x in _read_run(now):
            if x == prev:
                continue
            prev = x
            while cur is not None and cur < x:
                cur = next(old, None)
            new += cur != x
    return new


@contextmanager
def _scratch(parent: Path | None):
    """A scratch folder for listing files; its name is a writer's temp name (clean_tmp removes
    one left by a crash). None: in the system's temporary folder (a RUN on an object store)."""
    if parent is None:
        d = Path(tempfile.mkdtemp(prefix="humanset-listing-"))
    else:
        parent.mkdir(parents=True, exist_ok=True)
        d = tmp_name(parent / "listing")
        d.mkdir()
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def list_units(inputs: list[str], files_per_unit: int | None = None, exts=None) -> tuple[list[Unit], int]:
    """The inputs' units with their files, in memory (tests and small inputs; a run streams the
    listing into RUN/units.jsonl with write_listing). Raises InputError naming an unusable input."""
    with tempfile.TemporaryDirectory() as d:
        listing = Path(d) / "units.jsonl"
        _, repeated = write_listing(inputs, listing, files_per_unit, exts)
        return [load_unit(u, listing) for u in iter_listing(listing)], repeated
