"""Unit-level isolation of containers: every way a shard, its index or a manifest row can be bad is
recorded with a fixed kind, the samples before the damage are kept, and every read is bounded."""
import gzip
import io
import json
import tarfile
import tracemalloc
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from catalog import iter_tar
from pipeline.inputs.units import Unit
from pipeline.inputs.reading import UnitReader, read_unit
from pipeline.inputs.listing import list_units
from pipeline.stages.decode import REASON_KINDS, UNIT_ERROR_KINDS, error_kind, unit_error_kind


def _jpeg(i=0) -> bytes:
    from PIL import Image
    b = io.BytesIO()
    Image.new("RGB", (24, 16), (i * 40 % 256, 90, 120)).save(b, "JPEG")
    return b.getvalue()


def _tar(members, fmt=tarfile.PAX_FORMAT) -> bytes:
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w", format=fmt) as tf:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tf.addfile(m)
                continue
            name, data = m
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return b.getvalue()


def _samples(n, prefix=""):
    return [m for i in range(n) for m in ((f"{prefix}{i:03d}.jpg", _jpeg(i)),
                                          (f"{prefix}{i:03d}.json", json.dumps({"i": i}).encode()))]


def _read(tmp_path, raw: bytes, name="s", index: bytes | None = None, limits=None):
    tar = tmp_path / f"{name}.tar"
    tar.write_bytes(raw)
    if index is not None:
        (tmp_path / f"{name}.parquet").write_bytes(index)
    reader = UnitReader(Unit(name, "tar", str(tar)), limits)
    rows = list(reader)
    return rows, reader


def _kept(rows):
    return [r["key"] for r in rows if r["image"] is not None]


@pytest.mark.parametrize("raw,what", [
    (bytes(range(256)) * 20, "not a tar"), (b"", "0 bytes"), (b"x" * 100, "100 bytes"),
    (gzip.compress(_tar(_samples(2))), "gzip-compressed"), (b"<html>404</html>" * 64, "not a tar")])
def test_a_file_that_is_no_tar_is_one_unit_error(tmp_path, raw, what):
    rows, reader = _read(tmp_path, raw)
    assert rows == [] and unit_error_kind(reader.error) == "not_a_tar" and what in reader.error
    assert reader.error.startswith("not_a_tar: ") and str(tmp_path / "s.tar") in reader.error


def test_cut_anywhere_keeps_every_sample_before_the_cut(tmp_path):
    raw = _tar(_samples(4), tarfile.GNU_FORMAT)
    ends = {m.name[:3]: m.offset_data + m.size for m in tarfile.open(fileobj=io.BytesIO(raw)) if m.name.endswith("jpg")}
    kinds = Counter()
    for cut in range(0, len(raw), 97):
        rows, reader = _read(tmp_path, raw[:cut])
        before = sorted(k for k, end in ends.items() if end <= cut)
        assert sorted(_kept(rows)) == before, cut
        kinds[unit_error_kind(reader.error) if reader.error else None] += 1
        assert all(error_kind(r["read_error"]) in REASON_KINDS for r in rows if r["read_error"])
    assert set(kinds) == {"not_a_tar", "truncated_tar", None}, kinds  # None: cut in the end-of-archive zeros


def test_damaged_header_size_and_checksum_are_corrupt_tar(tmp_path):
    raw = bytearray(_tar(_samples(3), tarfile.USTAR_FORMAT))
    second = 512 + 1024  # 000.jpg header + data (<1 KiB), then 000.json's header
    for at, value in ((second + 5, b"X"), (second + 124, b"zz"), (second + 150, b"9")):
        d = bytearray(raw)
        d[at:at + len(value)] = value
        rows, reader = _read(tmp_path, bytes(d))
        assert unit_error_kind(reader.error) == "corrupt_tar" and _kept(rows) == ["000"], reader.error


def test_a_huge_size_field_is_checked_before_anything_is_allocated(tmp_path):
    raw = bytearray(_tar(_samples(2), tarfile.USTAR_FORMAT))
    h = bytearray(raw[:512])
    h[124:136] = b"\x80" + b"\x7f" * 11  # base-256: ~10^26 bytes
    h[148:156] = b" " * 8
    h[148:155] = b"%06o\0" % sum(h)
    raw[:512] = h
    tracemalloc.start()
    rows, reader = _read(tmp_path, bytes(raw))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert unit_error_kind(reader.error) == "truncated_tar" and "declares" in reader.error
    assert peak < 4 << 20


def test_huge_or_malformed_pax_and_long_names_are_bounded(tmp_path):
    good = _samples(2)
    blobs = []
    for kind, body in ((b"x", b"9 path=x\n" * 300_000), (b"x", b"zz path=1\n"), (b"L", b"n" * (3 << 20)),
                       (b"x", b"99999 path=x\n")):
        info = tarfile.TarInfo("././@PaxHeader")
        info.type, info.size = kind, len(body)
        blobs.append(info.tobuf(tarfile.USTAR_FORMAT) + body + bytes(-len(body) % 512))
    raw = _tar(good, tarfile.USTAR_FORMAT)
    one = 512 + 1024 + 512 + 512  # the first sample's two members
    for blob in blobs:
        damaged = raw[:one] + blob + raw[one:]
        tracemalloc.start()
        rows, reader = _read(tmp_path, damaged)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert reader.error is None and _kept(rows) == ["000"]  # 001.jpg followed the bad header
        lost = [r for r in rows if r["read_error"]]
        # 001.jpg is lost; its json sidecar is a row of its own (a key with no image member)
        assert [error_kind(r["read_error"]) for r in lost] == ["bad_member_header", "no_image_member"], lost
        assert peak < (2 << 20) + (1 << 20), peak  # never read whole: the caps are 1 MiB


def test_members_of_other_types_are_counted_notes_and_sparse_files_rows(tmp_path):
    odd = []
    for kind, name in ((tarfile.SYMTYPE, "l.jpg"), (tarfile.LNKTYPE, "h.jpg"), (tarfile.DIRTYPE, "d"),
                       (tarfile.FIFOTYPE, "f"), (tarfile.CHRTYPE, "c"), (tarfile.BLKTYPE, "b")):
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, "000.jpg"
        odd.append(info)
    sparse = tarfile.TarInfo("sp.jpg")
    sparse.type, sparse.size = tarfile.GNUTYPE_SPARSE, 0
    raw = _tar(_samples(1) + odd + [sparse] + _samples(2, "z"), tarfile.GNU_FORMAT)
    rows, reader = _read(tmp_path, raw)
    assert reader.error is None and _kept(rows) == ["000", "z000", "z001"]
    assert reader.notes == Counter(symlink=1, hardlink=1, directory=1, fifo=1, char_device=1, block_device=1)
    assert [error_kind(r["read_error"]) for r in rows if r["read_error"]] == ["unsupported_member"]


def _pax_named(name: bytes, data: bytes) -> bytes:
    """A member whose pax header gives it `name` verbatim (a NUL or newline included)."""
    rec = b" path=" + name + b"\n"
    n = len(rec) + len(str(len(rec) + 3))
    body = str(n).encode() + rec
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = b"x", len(body)
    member = tarfile.TarInfo("placeholder.jpg")
    member.size = len(data)
    return (info.tobuf(tarfile.USTAR_FORMAT) + body + bytes(-len(body) % 512) + member.tobuf(tarfile.USTAR_FORMAT)
            + data + bytes(-len(data) % 512))


@pytest.mark.parametrize("name", [b"a\0b.jpg", b"new\nline.jpg", b"/etc/x.jpg", b"../../x.jpg", b"ok/../../x.jpg",
                                  b"\x1b[31mred.jpg"])
def test_names_with_nul_newline_or_escaping_are_rows_never_paths(tmp_path, name):
    first = _tar(_samples(1), tarfile.USTAR_FORMAT)
    end = 512 + 1024 + 512 + 512
    raw = first[:end] + _pax_named(name, _jpeg(5)) + _tar(_samples(1, "z"), tarfile.USTAR_FORMAT)
    before = set(p.name for p in tmp_path.iterdir())
    rows, reader = _read(tmp_path, raw)
    assert reader.error is None and _kept(rows) == ["000", "z000"]  # (the two archives: read on)
    bad = [r for r in rows if r["read_error"]]
    assert [error_kind(r["read_error"]) for r in bad] == ["unsafe_member_name"]
    assert set(p.name for p in tmp_path.iterdir()) == before | {"s.tar"}  # nothing extracted


def test_appended_archive_and_zero_blocks_in_the_middle_are_read_on(tmp_path):
    a, b = _tar(_samples(2)), _tar(_samples(2, "b"))
    members = [m.offset for m in tarfile.open(fileobj=io.BytesIO(a))]
    mid = members[2]
    for raw in (a + b, a[:mid] + bytes(512 * 3) + a[mid:]):
        rows, reader = _read(tmp_path, raw)
        assert reader.error is None and reader.notes["appended_archive_or_zero_blocks"] == 1
        assert len(_kept(rows)) == (4 if raw == a + b else 2)
    rows, reader = _read(tmp_path, a + b"garbage!" * 100)
    assert _kept(rows) == ["000", "001"] and unit_error_kind(reader.error) == "corrupt_tar"


def test_a_stream_that_cannot_seek_reads_the_same(tmp_path):
    raw = _tar(_samples(3), tarfile.GNU_FORMAT)

    class Stream(io.RawIOBase):
        def __init__(self, data):
            self.b = io.BytesIO(data)

        def readable(self):
            return True

        def seekable(self):
            return False

        def read(self, n=-1):
            return self.b.read(n)
    for cut in (len(raw), 3000, 700):
        seek = [r.key for r in _iter(io.BytesIO(raw[:cut]))]
        stream = [r.key for r in _iter(Stream(raw[:cut]))]
        assert seek == stream


def _iter(fh):
    out = []
    try:
        for r in iter_tar(fh):
            out.append(r)
    except Exception:
        pass
    return out


def test_the_reader_streams_one_sample_at_a_time(tmp_path, monkeypatch):
    import pipeline.inputs.reading as reading
    big = [m for i in range(20) for m in ((f"{i:03d}.jpg", bytes([i]) * 200_000),)]
    tar = tmp_path / "big.tar"
    tar.write_bytes(_tar(big))
    opened = []

    def counting(uri, buffer_size=None):
        fh = open(uri, "rb")
        opened.append(fh)
        return fh
    monkeypatch.setattr(reading, "open_input", counting)
    it = iter(UnitReader(Unit("big", "tar", str(tar))))
    first = next(it)
    assert first["key"] == "000" and opened[0].tell() < 3 * 200_000  # not the whole 4 MB
    assert sum(1 for _ in it) == 19


def _img2dataset_index(keys, failed):
    n = len(keys) + len(failed)
    return pa.table({
        "url": [f"http://127.0.0.1/{k}.jpg" for k in keys + failed], "key": keys + failed,
        "status": ["success"] * len(keys) + ["failed_to_download"] * len(failed),
        "error_message": [None] * len(keys) + ["HTTP Error 404: File not found"] * len(failed),
        "width": pa.array([24] * len(keys) + [None] * len(failed), pa.int32()),
        "original_width": pa.array([48] * len(keys) + [None] * len(failed), pa.int32()),
        "original_height": pa.array([32] * len(keys) + [None] * len(failed), pa.int32()),
        "exif": [None] * n, "sha256": [None] * n})


def _pq(table) -> bytes:
    b = io.BytesIO()
    pq.write_table(table, b)
    return b.getvalue()


def test_img2dataset_failed_downloads_are_rows_and_fields_are_typed(tmp_path):
    keys = ["000000", "000001"]
    members = [m for k in keys for m in ((f"{k}.jpg", _jpeg(1)), (f"{k}.json", json.dumps(
        {"url": f"http://127.0.0.1/{k}.jpg", "key": k, "status": "success", "original_width": 48,
         "original_height": 32.0, "sha256": "ab" * 32}).encode()))]
    rows, reader = _read(tmp_path, _tar(members), index=_pq(_img2dataset_index(keys, ["000002"])))
    assert reader.error is None and len(rows) == 3
    ok = [r for r in rows if r["image"] is not None]
    assert [(r["url"], r["original_width"], r["original_height"], r["download_status"]) for r in ok] == [
        ("http://127.0.0.1/000000.jpg", 48, 32, "success"), ("http://127.0.0.1/000001.jpg", 48, 32, "success")]
    (failed,) = [r for r in rows if r["read_error"]]
    assert error_kind(failed["read_error"]) == "download_failed" and "HTTP Error 404" in failed["read_error"]
    assert failed["url"] == "http://127.0.0.1/000002.jpg" and failed["download_status"] == "failed_to_download"


def test_an_index_that_disagrees_or_is_corrupt_never_outranks_the_tar(tmp_path):
    raw = _tar([(f"{k}.jpg", _jpeg()) for k in ("000000", "000001")])
    lies = _pq(_img2dataset_index(["000000", "000001", "000009"], []))  # 000009 'success', not in the tar
    rows, reader = _read(tmp_path, raw, index=lies)
    assert unit_error_kind(reader.error) == "index_mismatch" and _kept(rows) == ["000000", "000001"]
    assert [error_kind(r["read_error"]) for r in rows if r["read_error"]] == ["missing_member"]
    for bad in (b"PAR1" + b"\0" * 50, _pq(pa.table({"x": [1]}))):
        rows, reader = _read(tmp_path, raw, index=bad)
        assert unit_error_kind(reader.error) == "bad_index" and _kept(rows) == ["000000", "000001"]


def test_manifest_rows_that_are_no_path_are_rows_not_a_stop(tmp_path):
    img = tmp_path / "a.jpg"
    img.write_bytes(_jpeg())
    m = tmp_path / "m.parquet"
    pq.write_table(pa.table({"path": [str(img), None, "x" * 100_000, "", "s3x://nowhere/a.jpg",
                                      str(tmp_path / "gone.jpg")]}), m)
    (unit,) = list_units([str(m)])[0]
    rows, error = read_unit(unit)
    assert error is None and len(rows) == 6 and rows[0]["image"] is not None
    assert [error_kind(r["read_error"]) for r in rows[1:]] == ["bad_manifest_row"] * 3 + ["cannot_read_file"] * 2
    assert len({r["sample_id"] for r in rows}) == 6
    ints = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"path": [1, 2]}), ints)
    rows, _ = read_unit(list_units([str(ints)])[0][0])
    assert [error_kind(r["read_error"]) for r in rows] == ["bad_manifest_row"] * 2 and "not a string" in rows[0]["read_error"]


def test_unit_error_kinds_are_fixed_and_documented():
    assert unit_error_kind("truncated_tar: x.tar: cut") == "truncated_tar"
    assert unit_error_kind("something new") == "reader_error"
    assert all(k.isidentifier() and v for k, v in UNIT_ERROR_KINDS.items())
    doc = (__import__("pathlib").Path(__file__).resolve().parents[3] / "docs" / "curation.md").read_text()
    missing = [k for k in UNIT_ERROR_KINDS if f"`{k}`" not in doc]
    assert not missing, f"docs/curation.md's 'Bad containers' paragraph does not name {missing}"
