"""A local folder of image files, walked in sorted path order and cut into units of
`input.files_per_unit` files; streamed, so the driver holds one unit's files (plus one directory's
names while it sorts them), never the whole folder."""
from __future__ import annotations

import logging
import os
from typing import Iterator

from pipeline.inputs.units import Unit, chunk_id, chunks

log = logging.getLogger(__name__)


def walk(root: str, exts: tuple[str, ...]) -> Iterator[str]:
    """Paths (relative to root) of the image files under root, in sorted path order, one directory
    at a time (os.scandir, entries sorted by name: depth-first by name is sorted path order; a
    stack, not recursion, so any depth is walked). Symlinks are listed as they are, never followed:
    one that leaves the folder is a row with a read error when read, never a refusal to run."""
    stack = [("", _entries(root, ""))]
    while stack:
        rel, entries = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            continue
        name, is_dir, is_file = entry
        path = f"{rel}/{name}" if rel else name
        if is_dir:
            stack.append((path, _entries(root, path)))
        elif is_file and os.path.splitext(name)[1].lower().lstrip(".") in exts:
            yield path


def _entries(root: str, rel: str) -> Iterator[tuple[str, bool, bool]]:
    """(name, is a directory, is a file or a symlink) of one directory's entries, sorted by name."""
    folder = os.path.join(root, rel) if rel else root
    try:
        with os.scandir(folder) as it:
            return iter(sorted((e.name, e.is_dir(follow_symlinks=False), e.is_symlink() or e.is_file()) for e in it))
    except OSError as e:
        log.warning("%s: cannot list this folder (%s); its files are not in the run", folder, e)
        return iter(())


def has_images(root: str, exts: tuple[str, ...]) -> bool:
    """Whether the folder holds an image at any depth (the walk stops at the first)."""
    return next(walk(root, exts), None) is not None


def folder_units(root: str, files_per_unit: int, exts: tuple[str, ...]) -> Iterator[Unit]:
    """The folder's image files (an absolute path) in units of files_per_unit, in sorted path order."""
    name = os.path.basename(root.rstrip("/")) or "files"
    for i, keys in enumerate(chunks(walk(root, exts), files_per_unit)):
        files = [os.path.join(root, k) for k in keys]
        yield Unit(chunk_id(name, i, files), "files", root, files=files, keys=keys, root=root)
