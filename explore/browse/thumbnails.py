"""The images `humanset browse` shows, made on demand from a sample's stored bytes and cached.

Where the bytes come from: a kept sample from the run's curated shards (its unit's shard indexes
`shards/{unit}-NNNNN.parquet` give the member's offset, else the catalog's `shards` view; one ranged
read through the storage layer, local or on an object store), any other sample, or one the shards lack, from its `source_uri`
(catalog/source_bytes.py: a file, or a tar member by its offset, again a ranged read). The bytes are
decoded by PIL and re-encoded as a JPEG of at most SIZES[size] pixels a side: nothing but a decoded
image ever leaves the server, whatever a catalog row names. A sample that cannot be shown (a decode
error the curation recorded, bytes gone, a store that does not answer) becomes a placeholder image
that says why. Rendered images are kept in a bounded LRU in memory (CACHE_BYTES); nothing is written
anywhere, least of all into RUN.
"""
from __future__ import annotations

import html
import io
import re
import textwrap
import threading
import time
from collections import OrderedDict
from pathlib import Path
from urllib.parse import urlsplit

from catalog.source_bytes import read_source
from catalog.storage import is_uri

SIZES = {"s": 256, "l": 1280}  # grid thumbnail, sample page
CACHE_BYTES = 128 << 20
QUALITY = 82
UNITS_CACHED = 256  # units whose curated shard indexes are kept (sample_id -> member offset)
DEAD_STORE_S = 60.0  # a store whose read failed slowly is not asked again for this long
SLOW_FAILURE_S = 2.0
_SAFE_NAME = re.compile(r"^[^/\\\x00]+$")


class Unreadable(Exception):
    """The sample's image cannot be shown; str(e) says why (shown on the placeholder)."""


class SampleBytes:
    """The original bytes of a catalog row: curated shard first (kept samples), else the source."""

    def __init__(self, run, find_member=None):
        self.run = run  # a Path, or the URI of a run on an object store (catalog.duck.run_location)
        # sample_id -> (shard tar, offset, size) from the catalog's shard index, for shards not named
        # after their unit (the engine's naming, which _unit_index reads without a catalog scan)
        self.find_member = find_member
        self._units: OrderedDict[str, dict] = OrderedDict()
        self._dead: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()

    def __call__(self, row: dict) -> tuple[bytes, str]:
        """(bytes, where they were read). Raises Unreadable."""
        if row.get("decode_error"):  # the curation could not decode it either: say why, do not retry
            raise Unreadable(f"decode error: {row['decode_error']}")
        note = ""
        if row.get("keep"):
            try:
                data = self.curated(row)
            except Exception as e:  # a damaged or vanished shard, an unreadable index: try the source
                data, note = None, f"; curated shard: {type(e).__name__}: {e}"
            if data is not None:
                return data, "curated shard"
            note = note or "; not in the run's curated shards"
        uri = row.get("source_uri")
        if not uri:
            raise Unreadable("no source_uri in the catalog" + note)
        try:
            return self.source(uri), "source"
        except Unreadable as e:
            raise Unreadable(f"{e}{note}") from None

    # --- the curated shards ------------------------------------------------------------------------
    def curated(self, row: dict) -> bytes | None:
        unit = row.get("shard") or ""
        # a unit id names files: never a path
        where = self._unit_index(unit).get(row["sample_id"]) if _SAFE_NAME.match(unit) and not unit.startswith(".") \
            else None
        if where is None and self.find_member is not None:
            where = self.find_member(row["sample_id"])
        if where is None or not _SAFE_NAME.match(where[0]) or where[0].startswith("."):
            return None
        tar, offset, size = where
        if isinstance(self.run, str):
            from catalog.storage import storage_for
            return storage_for(self.run).read_range(f"shards/{tar}", offset, size)
        from catalog.shards import read_member
        data = read_member(Path(self.run) / "shards" / tar, offset, size)
        if len(data) != size:
            raise OSError(f"shards/{tar}: ends inside the member of {row['sample_id']}")
        return data

    def _unit_index(self, unit: str) -> dict:
        with self._lock:
            hit = self._units.get(unit)
            if hit is not None:
                self._units.move_to_end(unit)
                return hit
        index = {}
        for i in range(1 << 20):  # the unit's curated shards: {unit}-00000, -00001, ... (pipeline/engine)
            table = self._read_index(f"{unit}-{i:05d}.parquet")
            if table is None:
                break
            for sid, tar, members in zip(*(table.column(c).to_pylist() for c in ("sample_id", "shard", "members"))):
                m = next((m for m in members or [] if not m["name"].lower().endswith(".json")), None)
                if sid and m and _SAFE_NAME.match(tar or "") and not tar.startswith("."):
                    index[sid] = (tar, m["offset"], m["size"])
        with self._lock:
            self._units[unit] = index
            while len(self._units) > UNITS_CACHED:
                self._units.popitem(last=False)
        return index

    def _read_index(self, name: str):
        import pyarrow.parquet as pq

        cols = ["sample_id", "shard", "members"]
        if isinstance(self.run, str):
            from catalog.storage import storage_for
            store = storage_for(self.run)
            if not store.exists(f"shards/{name}"):
                return None
            with store.open_input(f"shards/{name}") as f:
                return pq.read_table(f, columns=cols)
        path = Path(self.run) / "shards" / name
        return pq.read_table(path, columns=cols) if path.is_file() else None

    # --- the source ----------------------------------------------------------------------------------
    def source(self, uri: str) -> bytes:
        """read_source, except that a remote store whose read failed slowly (no network, no credentials)
        is not asked again for DEAD_STORE_S: one timeout, not one per thumbnail."""
        u = urlsplit(uri) if is_uri(uri) else None  # on a store (file:// is local)
        root = f"{u.scheme}://{u.netloc}" if u else None
        dead = self._dead.get(root) if root else None
        if dead and time.monotonic() - dead[0] < DEAD_STORE_S:
            raise Unreadable(f"not read: {root} failed a moment ago ({dead[1]})")
        t0 = time.monotonic()
        try:
            return read_source(uri)
        except FileNotFoundError as e:
            if root and time.monotonic() - t0 >= SLOW_FAILURE_S:
                self._dead[root] = (time.monotonic(), str(e))
            raise Unreadable(str(e)) from None
        except (OSError, ValueError) as e:
            raise Unreadable(f"{uri}: cannot read the source ({e})") from None


def render_jpeg(data: bytes, px: int) -> tuple[bytes, tuple[int, int]]:
    """The image in `data` as a JPEG of at most px pixels a side, EXIF orientation applied (the
    catalog's boxes are in those pixels); returns it and the decoded size before scaling."""
    from PIL import Image, ImageOps

    img = Image.open(io.BytesIO(data))
    if img.format == "JPEG":
        img.draft("RGB", (px, px))  # decode at a reduced size: much faster for a thumbnail
    img = ImageOps.exif_transpose(img)
    size = img.size
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        img = img.convert("RGBA")
        back = Image.new("RGBA", img.size, (238, 238, 238, 255))
        img = Image.alpha_composite(back, img)
    img = img.convert("RGB")
    img.thumbnail((px, px))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=QUALITY)
    return buf.getvalue(), size


def placeholder(reason: str, px: int) -> bytes:
    """An SVG that says why the image is missing (escaped text: reasons come from data)."""
    width = max(18, px // 9)
    lines = textwrap.wrap(reason, width)[:12] or ["no image"]
    h = max(px * 3 // 4, 30 + 16 * len(lines))
    text = "".join(f'<tspan x="10" dy="16">{html.escape(line)}</tspan>' for line in lines)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{px}" height="{h}" viewBox="0 0 {px} {h}">'
            f'<rect width="100%" height="100%" fill="#fbecec" stroke="#d73027" stroke-width="3" '
            f'stroke-dasharray="8 5"/><text x="10" y="8" font-family="sans-serif" font-size="12" '
            f'fill="#8a1c1c">{text}</text></svg>').encode()


class Thumbnails:
    """Rendered images by (sample_id, size), a bounded LRU in memory. `get` never raises for a
    sample that cannot be shown: it answers a placeholder and the reason."""

    def __init__(self, read: SampleBytes, max_bytes: int = CACHE_BYTES):
        self.read, self.max_bytes = read, max_bytes
        self._d: OrderedDict = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, sample_id: str, size: str, row_of) -> dict | None:
        """{'body', 'type', 'reason' (None for a real image), 'where', 'decoded' (w, h)}; None when
        `row_of(sample_id)` finds no such sample (asked only when the image is not cached)."""
        key = (sample_id, size)
        with self._lock:
            hit = self._d.get(key)
            if hit is not None:
                self._d.move_to_end(key)
                return hit
        row = row_of(sample_id)
        if row is None:
            return None
        px = SIZES[size]
        try:
            data, where = self.read(row)
            try:
                body, decoded = render_jpeg(data, px)
            except Exception as e:  # PIL raises many kinds for bytes that are not an image (and bombs)
                raise Unreadable(f"{where} bytes do not decode: {type(e).__name__}: {e}") from None
            out = {"body": body, "type": "image/jpeg", "reason": None, "where": where, "decoded": decoded}
        except Exception as e:  # Unreadable, or anything else: a placeholder that says why, never a traceback
            why = str(e) if isinstance(e, Unreadable) else f"{type(e).__name__}: {e}"
            out = {"body": placeholder(why, px), "type": "image/svg+xml", "reason": why, "where": None,
                   "decoded": None}
        with self._lock:
            if key not in self._d:
                self._d[key] = out
                self._bytes += len(out["body"])
            while self._bytes > self.max_bytes and self._d:
                _, old = self._d.popitem(last=False)
                self._bytes -= len(old["body"])
        return out
