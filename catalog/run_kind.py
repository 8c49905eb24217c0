"""What a folder of humanset's is: FOLDER/.humanset.json, the kind marker every command writes first.

Every output folder has one owner and one kind: `curate`, `select`, `render`, `export`, `pretrain`,
`finetune`, `filter` (and `demo`, the folder `humanset demo` fills with runs). A command checks the
folder before it writes anything and refuses, in one line naming the folder and the flag to change,
a folder of another kind or one of its kind started with other settings (its `identity`: what must not
change between a run and its resume). The marker is read and written through catalog.storage, so a
RUN on s3:// has one too. Folders made before the marker existed are recognised by their files
(`LEGACY`); their identity is unknown, so only their kind is checked (the command's own manifest
check still applies).

    check(out, "render", identity, flag="--output")   # read-only, before the inputs are read: raises RunKindError
    claim(out, "render", identity, flag="--output")   # under the run's lock: check again, write the marker
    kind_of(folder)                                    # what an input folder is ("curate", ..., None)
"""
from __future__ import annotations

import json
import os
import time

from catalog.storage.paths import is_uri, storage_for

MARKER = ".humanset.json"
FORMAT = 1

KINDS = {
    "curate": "a curation run (humanset curate)",
    "select": "a re-cut of a curation run (humanset select)",
    "render": "a render run (humanset render)",
    "export": "an export of a render run (humanset render export)",
    "pretrain": "an MAE pretraining run (humanset pretrain)",
    "finetune": "a fine-tuning run (humanset finetune)",
    "filter": "a filter training run (humanset train-filter)",
    "demo": "the demo's folder of runs (humanset demo)",
}

# folders written before the marker: the files that say what they are, first match wins
LEGACY = (("render.json", "render"), ("card.json", "filter"), ("manifest.json", "manifest"),
          ("config.json", "training"))


class RunKindError(ValueError):
    """A folder of another kind, or of this kind with other settings: one line naming it and the fix."""


def _store(folder):
    return storage_for(folder) if isinstance(folder, (str, os.PathLike)) else folder


def _plain(value):
    """As JSON stores it (tuples become lists), so a value compares equal to its stored self."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def read_marker(folder) -> dict | None:
    """The folder's marker; for a folder made before markers, {"kind": ..., "legacy": True}; None if
    the folder holds neither (a new or an unrelated folder)."""
    store = _store(folder)
    try:
        if store.exists(MARKER):
            return store.read_json(MARKER)
    except ValueError as e:  # not JSON: a damaged marker is named, not guessed around
        raise RunKindError(f"{store.uri_of(MARKER)}: not a humanset marker ({e}); remove it if this folder "
                           "is yours") from None
    for name, what in LEGACY:
        if not store.exists(name):
            continue
        kind = _legacy_kind(store, name, what)
        if kind:
            return {"kind": kind, "legacy": True}
    return None


def _legacy_kind(store, name: str, what: str) -> str | None:
    if what in KINDS:
        return what
    try:
        data = store.read_json(name)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    if what == "manifest":  # curate and select write manifest.json, and so does a sapiens export
        if "selected_from" in data:
            return "select"
        if "inputs" in data and "config" in data:
            return "curate"
        return "export" if data.get("format") == "sapiens" else None
    if what == "training":  # config.json of a training run: its keys say which
        if "mask_ratio" in data:
            return "pretrain"
        if "task" in data:
            return "finetune"
        return "filter" if "filter" in data else None
    return None


def kind_of(folder) -> str | None:
    """The kind of an existing folder (None: not a humanset output, or absent)."""
    if not is_uri(os.fspath(folder)) and not os.path.isdir(os.fspath(folder)):
        return None
    found = read_marker(folder)
    return found["kind"] if found else None


def describe(kind: str) -> str:
    return KINDS.get(kind, f"a {kind!r} folder")


def check(folder, kind: str, identity: dict | None = None, flag: str = "--output",
          resume: str = "rerun the same command to resume it") -> dict | None:
    """Refuse `folder` for a `kind` command unless it is new, unrelated, or of this kind with this
    `identity`. Reads only. Returns the marker found (None: nothing of ours there)."""
    if kind not in KINDS:
        raise ValueError(f"unknown folder kind {kind!r}; known: {', '.join(KINDS)}")
    text = os.fspath(folder) if isinstance(folder, (str, os.PathLike)) else str(folder)
    if not is_uri(text) and os.path.exists(text) and not os.path.isdir(text):
        raise RunKindError(f"{text}: is a file, not a folder; pass a folder as {flag}")
    found = read_marker(folder)
    if found is None:
        return None
    if found.get("kind") != kind:
        raise RunKindError(f"{text}: holds {describe(found.get('kind'))}, not {describe(kind)}; "
                           f"pass another {flag}")
    if identity is not None and found.get("identity") is not None:
        old, new = found["identity"], _plain(identity)
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        if changed:
            shown = ", ".join(_show(k, old.get(k), new.get(k)) for k in changed[:3])
            more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
            raise RunKindError(f"{text}: holds {describe(kind)} with other settings ({shown}{more}); {resume} "
                               f"with its settings, or pass another {flag}")
    return found


def _show(key: str, old, new) -> str:
    def short(v):
        s = json.dumps(v, sort_keys=True, default=str)
        return s if len(s) <= 40 else s[:37] + "..."
    return f"{key} {short(old)}, now {short(new)}"


def claim(folder, kind: str, identity: dict | None = None, flag: str = "--output",
          resume: str = "rerun the same command to resume it") -> dict:
    """check(), then write the marker unless one of this identity is there (a legacy folder gets one
    now). Call it holding the folder's run lock, after the inputs were checked: it is the first write."""
    found = check(folder, kind, identity, flag, resume)
    if found is not None and not found.get("legacy") and (identity is None or found.get("identity") is not None):
        return found
    marker = {"format": FORMAT, "kind": kind, "identity": None if identity is None else _plain(identity),
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _store(folder).write_json(MARKER, marker)
    return marker


def require(folder, kinds: tuple[str, ...], flag: str, need: str) -> str | None:
    """An input folder must be one of `kinds` (or unmarked: a folder of files). Returns its kind."""
    kind = kind_of(folder)
    if kind is not None and kind not in kinds:
        raise RunKindError(f"{flag} {os.fspath(folder)}: is {describe(kind)}; {need}")
    return kind
