"""Damaged shards for fuzzing the container reader (bench/fuzz.py --tars N, tests/pipeline/inputs/test_fuzz_tars.py).

Valid WebDataset shards (USTAR, GNU and pax tars, some with img2dataset's or humanset's Parquet
index beside them) are damaged in one of DAMAGES ways, each deterministic in its seed. Every case
knows which samples are whole before the damage (`intact`): the reader must yield those with
their bytes, whatever follows. run() reads each case with pipeline's UnitReader and prints JSON:
shards tried, aborts (an exception out of the reader, must be 0), slow reads, outcome kinds.
"""
from __future__ import annotations

import functools
import io
import json
import random
import tarfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# a damage: (label, what it does)
DAMAGES = {
    "not_a_tar": "random bytes, a compressed tar, an empty or tiny file",
    "truncate": "cut at a random offset (inside a header, a size field, a member, the end marker)",
    "header_flip": "bytes of a header changed (name, size, checksum, typeflag, magic): a bad checksum",
    "size_field": "a header's size field set to a huge, negative or non-octal value (checksum fixed up)",
    "data_flip": "bytes inside a member's data changed (the container stays whole)",
    "member_type": "a member of a type read as no sample inserted (symlink, hardlink, dir, fifo, device, sparse)",
    "pax": "a pax header that is huge, claims a huge size, or holds malformed records",
    "longname": "a GNU long name that is huge or not terminated",
    "bad_name": "a member whose name holds NUL or newline, is absolute or climbs with '..'",
    "appended": "a second archive appended after the first one's end",
    "zero_blocks": "zero blocks in the middle of the archive",
    "trailing_garbage": "random bytes after the end-of-archive marker",
    "bad_index": "the Parquet index beside the tar is corrupt, foreign, or lists keys the tar lacks",
}


@dataclass
class Case:
    damage: str
    detail: str
    tar: bytes
    keys: list[str]  # every sample key of the valid shard, in order
    intact: list[str]  # keys that must come back with their image bytes
    index: bytes | None = None  # the Parquet beside the tar, if any
    extra: dict = field(default_factory=dict)


@functools.lru_cache(maxsize=None)
def _jpeg(seed: int) -> bytes:
    from PIL import Image
    b = io.BytesIO()
    Image.new("RGB", (24, 16), (seed * 37 % 256, seed * 91 % 256, 120)).save(b, "JPEG", quality=70)
    return b.getvalue()


_FORMATS = (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT)


def valid_shard(rnd: random.Random, n: int | None = None, prefix: str = "") -> tuple[bytes, list[str], list]:
    """(tar bytes, keys, per member (header offset, data offset, data end)); members {key}.jpg/.json[/.txt]."""
    n = n or rnd.randint(2, 6)
    fmt = rnd.choice(_FORMATS)
    long_keys = fmt != tarfile.USTAR_FORMAT and rnd.random() < 0.3
    keys = [(f"{'d' * 120}/" if long_keys else "") + f"{prefix}{i:06d}" for i in range(n)]
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w", format=fmt) as tf:
        for i, k in enumerate(keys):
            members = [("jpg", _jpeg(i)), ("json", json.dumps({"url": f"http://h/{i}.jpg", "key": k}).encode())]
            if rnd.random() < 0.3:
                members.append(("txt", b"a caption"))
            if rnd.random() < 0.3:
                members.reverse()  # the sidecar first, the image second
            for ext, data in members:
                info = tarfile.TarInfo(f"{k}.{ext}")
                info.size, info.mtime = len(data), 1_700_000_000
                tf.addfile(info, io.BytesIO(data))
    raw = b.getvalue()
    spans = [(m.offset, m.offset_data, m.offset_data + m.size) for m in tarfile.open(fileobj=io.BytesIO(raw))]
    return raw, keys, spans


def _image_ends(raw: bytes) -> dict[str, int]:
    return {m.name.rsplit(".", 1)[0]: m.offset_data + m.size for m in tarfile.open(fileobj=io.BytesIO(raw))
            if m.name.endswith(".jpg")}


def _before(raw: bytes, at: int) -> list[str]:
    return [k for k, end in _image_ends(raw).items() if end <= at]


def _header(name: str, size: int, kind: bytes = b"0", linkname: str = "") -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.linkname = size, kind, linkname
    return info.tobuf(tarfile.USTAR_FORMAT)


def _fix_checksum(h: bytearray) -> None:
    h[148:156] = b" " * 8
    h[148:155] = b"%06o\0" % sum(h[:512])


def _raw_member(name: bytes, data: bytes, kind: bytes = b"0") -> bytes:
    h = bytearray(_header("x", len(data), kind))
    h[0:100] = name[:100].ljust(100, b"\0")
    _fix_checksum(h)
    return bytes(h) + data + bytes(-len(data) % 512)


def _end(raw: bytes) -> int:
    """Offset of the end-of-archive marker (just after the last member)."""
    tf = tarfile.open(fileobj=io.BytesIO(raw))
    tf.getmembers()
    return tf.offset


def _insert(raw: bytes, at_member: int, blob: bytes) -> tuple[bytes, int]:
    spans = [m.offset for m in tarfile.open(fileobj=io.BytesIO(raw))] + [_end(raw)]
    at = spans[min(at_member, len(spans) - 1)]
    return raw[:at] + blob + raw[at:], at


def make_case(seed: int, damage: str | None = None) -> Case:
    rnd = random.Random(seed)
    damage = damage or sorted(DAMAGES)[seed % len(DAMAGES)]
    raw, keys, spans = valid_shard(rnd)
    everything = list(keys)
    if damage == "not_a_tar":
        how = rnd.choice(("random", "gzip", "empty", "tiny", "text"))
        data = {"random": lambda: rnd.randbytes(rnd.randint(513, 6000)),
                "gzip": lambda: __import__("gzip").compress(raw, mtime=0),
                "empty": lambda: b"", "tiny": lambda: rnd.randbytes(rnd.randint(1, 511)),
                "text": lambda: b"<html>404 not found</html>\n" * 40}[how]()
        return Case(damage, how, data, keys, [])
    if damage == "truncate":
        cut = rnd.randrange(1, len(raw))
        return Case(damage, f"cut at {cut}", raw[:cut], keys, _before(raw, cut))
    if damage == "header_flip":
        h, _, _ = rnd.choice(spans)
        at = h + rnd.choice((rnd.randrange(100), 124 + rnd.randrange(12), 148 + rnd.randrange(8), 156,
                             257 + rnd.randrange(6), rnd.randrange(512)))
        d = bytearray(raw)
        d[at] = (d[at] + rnd.randrange(1, 256)) % 256
        return Case(damage, f"byte {at}", bytes(d), keys, _before(raw, h))
    if damage == "size_field":
        h, _, _ = rnd.choice(spans)
        value = rnd.choice((b"77777777777\0", b"\x80" + b"\xff" * 11, b"\xff" * 12, b"9999zzzz\0\0\0\0",
                            b"%011o\0" % rnd.randrange(1 << 33)))
        d = bytearray(raw)
        # the member's own pax/longname header may sit before; the ustar header holding the size is at h
        hdr = bytearray(d[h:h + 512])
        hdr[124:136] = value
        _fix_checksum(hdr)
        d[h:h + 512] = hdr
        return Case(damage, value.hex(), bytes(d), keys, _before(raw, h))
    if damage == "data_flip":
        _, a, b = rnd.choice([s for s in spans if s[2] > s[1]])
        d = bytearray(raw)
        for _ in range(rnd.choice((1, 4))):
            at = rnd.randrange(a, b)
            d[at] ^= 1 + rnd.randrange(255)
        return Case(damage, f"in [{a}, {b})", bytes(d), keys, everything)
    if damage == "member_type":
        kind = rnd.choice((b"1", b"2", b"3", b"4", b"5", b"6", b"S", b"V"))
        blob = _raw_member(b"weird.jpg" if kind == b"S" else b"weird", b"" if kind != b"S" else b"x" * 700, kind)
        if kind in b"12":
            h = bytearray(blob[:512])
            h[157:157 + 12] = b"000000.jpg\0\0"
            _fix_checksum(h)
            blob = bytes(h) + blob[512:]
        out, _ = _insert(raw, rnd.randrange(len(spans) + 1), blob)
        return Case(damage, kind.decode(), out, keys, everything)
    if damage == "pax":
        how = rnd.choice(("huge", "claims_huge", "malformed", "huge_path", "bad_size"))
        i = rnd.randrange(len(spans))
        if how == "huge":  # a real 2 MiB pax header: over the reader's cap, skipped
            body = b"%d comment=" % 0 + b"c" * (2 << 20)
            blob = _raw_member(b"PaxHeader", body, b"x")
        elif how == "claims_huge":  # size field says 8 GiB, the file holds a few bytes
            h = bytearray(_header("PaxHeader", 0, b"x"))
            h[124:136] = b"77777777777\0"
            _fix_checksum(h)
            blob = bytes(h)
        elif how == "malformed":
            blob = _raw_member(b"PaxHeader", rnd.choice((b"abc path=x\n", b"99999 path=x\n", b"5 p\n", b"12 path=x")), b"x")
        elif how == "huge_path":
            rec = b"path=" + b"p" * 300_000 + b"\n"
            blob = _raw_member(b"PaxHeader", b"%d " % (len(rec) + 7) + rec, b"x")
        else:
            blob = _raw_member(b"PaxHeader", b"14 size=12ab\n", b"x")
        out, at = _insert(raw, i, blob)
        # the member after the header is lost (or, for a bad size, the rest): those before it are kept
        keep = _before(raw, at) if how in ("claims_huge", "bad_size") else [k for k in keys if k != _key_at(raw, i)]
        return Case(damage, how, out, keys, keep)
    if damage == "longname":
        how = rnd.choice(("huge", "unterminated", "claims_huge"))
        i = rnd.randrange(len(spans))
        if how == "huge":
            blob = _raw_member(b"././@LongLink", b"n" * (3 << 20) + b"\0", b"L")
        elif how == "unterminated":
            blob = _raw_member(b"././@LongLink", b"q" * 700, b"L")
        else:
            h = bytearray(_header("././@LongLink", 0, b"L"))
            h[124:136] = b"\x80" + b"\x00" * 3 + b"\xff" * 8
            _fix_checksum(h)
            blob = bytes(h)
        out, at = _insert(raw, i, blob)
        # an unterminated long name renames the next member (read as a sample named q...q)
        keep = _before(raw, at) if how == "claims_huge" else [k for k in keys if k != _key_at(raw, i)]
        return Case(damage, how, out, keys, keep)
    if damage == "bad_name":
        name = rnd.choice((b"evil\0.jpg", b"new\nline.jpg", b"/abs/x.jpg", b"../../etc/passwd.jpg", b"a/../../b.jpg",
                           b"\x1b[31mred.jpg", b"..\\win.jpg"))
        out, _ = _insert(raw, rnd.randrange(len(spans) + 1), _raw_member(name, _jpeg(99)))
        return Case(damage, repr(name), out, keys, everything, extra={"name": name})
    if damage == "appended":
        raw2, keys2, _ = valid_shard(rnd, prefix="b")
        return Case(damage, "second archive", raw + raw2, keys + keys2, keys + keys2)
    if damage == "zero_blocks":
        out, _ = _insert(raw, rnd.randrange(1, len(spans) + 1), bytes(512 * rnd.choice((1, 2, 3, 40))))
        return Case(damage, "zeros", out, keys, everything)
    if damage == "trailing_garbage":
        end = _end(raw) + 1024
        return Case(damage, "garbage", raw[:end] + rnd.randbytes(rnd.randint(1, 3000)) + raw[end:], keys, everything)
    if damage == "bad_index":
        return _index_case(rnd, raw, keys)
    raise ValueError(f"unknown damage {damage!r}")


def _key_at(raw: bytes, i: int) -> str | None:
    ms = tarfile.open(fileobj=io.BytesIO(raw)).getmembers()
    return ms[i].name.rsplit(".", 1)[0] if i < len(ms) else None


def _index_case(rnd: random.Random, raw: bytes, keys: list[str]) -> Case:
    import pyarrow as pa
    import pyarrow.parquet as pq
    how = rnd.choice(("corrupt", "foreign", "img2dataset_failed", "img2dataset_lies", "ours_lies", "null_keys"))
    b = io.BytesIO()
    if how == "corrupt":
        ok = io.BytesIO()
        pq.write_table(pa.table({"key": keys, "status": ["success"] * len(keys)}), ok)
        data = bytearray(ok.getvalue())
        for _ in range(8):
            data[rnd.randrange(len(data))] ^= 0xFF
        return Case("bad_index", how, raw, keys, keys, index=bytes(data[: rnd.randrange(8, len(data))]))
    if how == "foreign":
        pq.write_table(pa.table({"x": [1, 2]}), b)
    elif how in ("img2dataset_failed", "img2dataset_lies"):
        extra = [f"{900000 + i}" for i in range(rnd.randint(1, 3))]
        status = ["success"] * len(keys) + (["failed_to_download"] * len(extra) if how == "img2dataset_failed"
                                            else ["success"] * len(extra))
        pq.write_table(pa.table({"url": [f"http://h/{k}" for k in keys + extra], "key": keys + extra,
                                 "status": status, "error_message": [None] * len(keys) + ["HTTP Error 404"] * len(extra),
                                 "original_width": pa.array([451] * (len(keys) + len(extra)), pa.int32())}), b)
        return Case("bad_index", how, raw, keys, keys, index=b.getvalue(), extra={"index_only": extra})
    elif how == "ours_lies":
        pq.write_table(pa.table({"key": keys[:-1] + ["zzz"], "shard": ["s.tar"] * len(keys),
                                 "members": [[{"name": "a", "offset": 0, "size": 1}]] * len(keys)}), b)
    else:
        pq.write_table(pa.table({"key": pa.array([None, "", "x" * 10_000]),
                                 "status": ["success", "failed_to_download", "success"]}), b)
    return Case("bad_index", how, raw, keys, keys, index=b.getvalue())


def cases(n: int, seed: int = 0):
    for i in range(n):
        yield make_case(seed * 1_000_003 + i)


def write_case(case: Case, folder: Path, name: str) -> Path:
    tar = folder / f"{name}.tar"
    tar.write_bytes(case.tar)
    if case.index is not None:
        (folder / f"{name}.parquet").write_bytes(case.index)
    return tar


def read_case(case: Case, folder: Path, name: str, limits: dict | None = None) -> dict:
    """Write the case to `folder`, read it with UnitReader; the outcome and whether it is right."""
    from pipeline.inputs.units import Unit
    from pipeline.inputs.reading import UnitReader
    from pipeline.stages.decode import unit_error_kind
    tar = write_case(case, folder, name)
    reader = UnitReader(Unit(name, "tar", str(tar)), limits)
    t0 = time.perf_counter()
    rows = list(reader)
    seconds = time.perf_counter() - t0
    got = {r["key"] for r in rows if r["image"] is not None}
    lost = [k for k in case.intact if k not in got]
    return {"kind": unit_error_kind(reader.error) if reader.error else "ok", "lost": lost, "rows": len(rows),
            "seconds": seconds, "error": reader.error, "notes": dict(reader.notes),
            "reasons": Counter((r["read_error"] or "").split(":", 1)[0] for r in rows if r["read_error"])}


def run(n: int, seed: int = 0, folder: Path | None = None, trace_memory: bool = True) -> dict:
    """Read n cases; the counts as JSON. trace_memory: the peak of Python's allocations (tracemalloc, which
    makes the reads about six times slower) as peak_traced_mb, else None."""
    import logging
    import tempfile
    import tracemalloc
    logging.disable(logging.WARNING)  # every damaged unit logs its error; the counts are the output
    outcomes, per_damage, aborts, wrong, slow, examples = Counter(), Counter(), 0, 0, 0, []
    t0 = time.perf_counter()
    if trace_memory:
        tracemalloc.start()
    with tempfile.TemporaryDirectory() as d:
        folder = Path(folder or d)
        for i, case in enumerate(cases(n, seed)):
            try:
                r = read_case(case, folder, f"c{i % 16}")
            except Exception as e:  # an abort: the reader raised
                aborts += 1
                if len(examples) < 10:
                    examples.append({"case": i, "damage": case.damage, "detail": case.detail, "error": repr(e)})
                continue
            outcomes[r["kind"]] += 1
            per_damage[case.damage, r["kind"]] += 1
            slow += r["seconds"] > 2
            if r["lost"]:
                wrong += 1
                if len(examples) < 10:
                    examples.append({"case": i, "damage": case.damage, "detail": case.detail, "lost": r["lost"],
                                     "error": r["error"]})
            for f in folder.iterdir():
                f.unlink()
    peak = tracemalloc.get_traced_memory()[1] if trace_memory else None
    tracemalloc.stop()
    by_damage: dict[str, dict] = {}
    for (dmg, kind), c in sorted(per_damage.items()):
        by_damage.setdefault(dmg, {})[kind] = c
    return {"shards_tried": n, "aborts": aborts, "intact_samples_lost": wrong, "slow_reads_over_2s": slow,
            "outcomes": dict(outcomes.most_common()), "per_damage": by_damage,
            "peak_traced_mb": None if peak is None else round(peak / 2 ** 20, 1), "seconds": round(time.perf_counter() - t0, 1),
            "examples": examples}
