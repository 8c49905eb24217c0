"""What an --input names, decided in one place (`classify`), and the inputs' units in listing order.

The kinds of input, local or on any store catalog/storage/__init__.py opens:
  - `tar`: one WebDataset shard (img2dataset style: {key}.jpg, {key}.json, optional {key}.txt, and an
    optional `*.parquet` index of the same name beside it): one unit;
  - `pattern`, `prefix`, `shard_list` (.txt), `shard_manifest` (.parquet with a `shard` column): many
    shards, streamed (pipeline/inputs/shards.py), one unit each;
  - `manifest`: a .parquet with a column of file paths/URIs, in units of `input.files_per_unit`
    rows (pipeline/inputs/manifests.py);
  - `folder`: a local folder: its shards, its manifests (a .parquet beside its .tar is that shard's
    index, not a manifest) and its image files at any depth, in units of `input.files_per_unit`
    files in sorted path order (pipeline/inputs/folders.py).
Listing is streamed (pipeline/inputs/listing.py): the inputs are walked and cut as they go.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from catalog.storage import globs
from catalog.storage import is_uri, local_path, scrub
from catalog.storage.answers import STORE_FAULTS

from pipeline.inputs import folders, manifests, shards
from pipeline.inputs.units import InputError, Unit, stem
from pipeline.settings import DEFAULTS

TAR, MANIFEST, FOLDER = "tar", "manifest", "folder"
PATTERN, PREFIX, SHARD_LIST, SHARD_MANIFEST = "pattern", "prefix", "shard_list", "shard_manifest"
SHARD_COLLECTIONS = (PATTERN, PREFIX, SHARD_LIST, SHARD_MANIFEST)
FORMS = ("inputs are a folder of images or shards, a .tar shard, a .txt list of shards, a pattern such as "
         "crawl/{00000..00099}.tar, or a .parquet manifest")


def is_pattern(text: str) -> bool:
    return "{" in text or globs.has_wildcard(text)


def is_prefix(text: str) -> bool:
    """A remote input that is a folder of shards: ends with '/', or has no file suffix we read."""
    if not is_uri(text) or is_pattern(text):
        return False
    return text.endswith("/") or not text.rsplit("/", 1)[-1].endswith((".tar", ".parquet", ".txt"))


def classify(inp: str) -> str:
    """The kind of one --input (see the module docstring). Reads no more than a local path's type
    and, for a .parquet, its schema; raises InputError naming the input for one that is no input."""
    local = not is_uri(inp)
    path = Path(local_path(inp)) if local else None
    exists = local and path.exists()
    if not exists and is_pattern(inp):
        return PATTERN
    if is_prefix(inp):
        return PREFIX
    named_file = not exists or path.is_file()  # an existing folder named x.txt is a folder
    if named_file and inp.endswith(".txt"):
        return SHARD_LIST
    if named_file and inp.endswith(".parquet"):
        try:
            with manifests.open_parquet(inp) as pf:
                names = pf.schema_arrow.names
        except STORE_FAULTS:
            raise  # the store's own line (its URI, the cause, the fix): exit 3, not a bad --input
        except (OSError, ValueError) as e:
            raise InputError(f"--input {inp}: cannot be listed or read ({scrub(str(e))}); "
                             "check the URI and the store's credentials") from None
        return SHARD_MANIFEST if shards.is_shard_manifest(names) else MANIFEST
    if not local:
        if inp.endswith(".tar"):
            return TAR
        raise InputError(f"--input {inp}: not a shard, a list of shards (.txt) or a manifest (.parquet)")
    if not exists:
        raise InputError(f"--input {inp}: no such file or directory; check the path ({FORMS})")
    if path.is_file():
        if path.suffix == ".tar":
            return TAR
        raise InputError(f"--input {inp}: a single file must be a .tar shard, a .txt list of shards or "
                         "a .parquet manifest; pass its folder to curate loose images")
    return FOLDER


def _where(inp: str) -> str:
    """The name a tar or manifest input is listed under: a local one's absolute path, a URI as it is."""
    return inp if is_uri(inp) else str(Path(local_path(inp)).resolve())


def _shards(kind: str, inp: str) -> Iterator[str]:
    expander = {PATTERN: shards.pattern_shards, PREFIX: shards.prefix_shards, SHARD_LIST: shards.txt_shards,
                SHARD_MANIFEST: shards.manifest_shards}[kind]
    return expander(inp)


def _first_or_refuse(inp: str, kind: str, found: Iterator[str]) -> None:
    """Refuse a collection of shards that names none (looks at its first entry only)."""
    if next(iter(found), None) is None:
        what = {PATTERN: "no file matches this pattern", PREFIX: "no .tar shard under this prefix"}.get(
            kind, "lists no shard")
        raise InputError(f"--input {inp}: {what}; check the URI (a prefix ends with '/', a pattern "
                         "uses {00000..00099} or *, a .txt has one shard URI a line)")


def _is_shard_index(path: Path) -> bool:
    return path.suffix == ".parquet" and path.with_suffix(".tar").exists()


def input_parts(inputs: list[str], exts: tuple[str, ...], check_only: bool = False) -> Iterator[tuple[str, str]]:
    """(kind, uri) of every tar, manifest and image folder the inputs name, kind being tar, manifest
    or folder, in listing order, one at a time (a prefix of 10^6 shards is listed page by page,
    never held).

    Raises InputError naming the input for anything unusable; looks only as far as the first image
    of a folder and the first shard of a prefix, pattern or list. With check_only, only that look."""
    for inp in inputs:
        kind = classify(inp)
        if kind in SHARD_COLLECTIONS:
            try:
                found = _shards(kind, inp)
                if check_only:
                    _first_or_refuse(inp, kind, found)
                else:
                    yield from ((TAR, s) for s in found)
            except STORE_FAULTS:
                raise  # the store's own line (its URI, the cause, the fix): exit 3, not a bad --input
            except (OSError, ValueError) as e:
                raise InputError(f"--input {inp}: cannot be listed or read ({scrub(str(e))}); "
                                 "check the URI and the store's credentials") from None
        elif kind == TAR:
            yield TAR, _where(inp)
        elif kind == MANIFEST:
            manifests.manifest_column(_where(inp))
            yield MANIFEST, _where(inp)
        else:
            yield from _folder_parts(inp, exts)


def _folder_parts(inp: str, exts: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    p = Path(local_path(inp))
    tars = [(TAR, str(t.resolve())) for t in sorted(p.glob("*.tar")) if t.is_file()]
    found = [(MANIFEST, str(m.resolve())) for m in sorted(p.glob("*.parquet"))
             if m.is_file() and not _is_shard_index(m)]
    for _, m in found:
        manifests.manifest_column(m)
    root = str(p.resolve())
    images = folders.has_images(root, exts)
    if not (tars or found or images):
        raise InputError(f"--input {inp}: no .tar shards, .parquet manifests or images "
                         f"({', '.join(exts)}) found in this folder")
    yield from tars + found + ([(FOLDER, root)] if images else [])


def image_exts(exts=None) -> tuple[str, ...]:
    """The image file extensions, lower case without a dot (None: input.extensions' default)."""
    return tuple(e.lower().lstrip(".") for e in (DEFAULTS.input.extensions if exts is None else exts))


def check_inputs(inputs: list[str], exts=None) -> None:
    """Refuse unusable inputs (InputError naming the input) before anything is written."""
    for _ in input_parts(inputs, image_exts(exts), check_only=True):
        pass


def iter_units(inputs: list[str], files_per_unit: int | None = None, exts=None) -> Iterator[Unit]:
    """The inputs' units in listing order, one at a time (before repeated listings are dropped and
    unit ids made unique: pipeline/inputs/listing.py write_listing does both). files_per_unit and
    exts: input.files_per_unit and input.extensions (None: their defaults)."""
    files_per_unit = DEFAULTS.input.files_per_unit if files_per_unit is None else files_per_unit
    exts = image_exts(exts)
    for kind, uri in input_parts(inputs, exts):
        if kind == TAR:
            yield Unit(stem(uri), "tar", str(uri), bytes=getattr(uri, "size", 0) or _size(uri))
        elif kind == MANIFEST:
            yield from manifests.manifest_units(uri, files_per_unit)
        else:
            yield from folders.folder_units(uri, files_per_unit, exts)


def _size(uri: str) -> int:
    """A local shard's size in bytes (one stat); 0 for a remote one (a prefix's listing says it)."""
    if is_uri(uri):
        return 0
    try:
        return Path(local_path(uri)).stat().st_size
    except OSError:
        return 0
