"""Curation inputs at crawl scale on a real S3 server (SeaweedFS on 127.0.0.1): a prefix, a brace
pattern, `*`, a .txt of shard URIs and a Parquet with a `shard` column, listed streamed; phase 3's
second read of a remote shard is ranged reads at the measured offsets."""
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pyarrow as pa
import pytest

import catalog
from catalog import storage as st
from pipeline.inputs import kinds
from pipeline.inputs.fetch import ByteSource
from pipeline.inputs.kinds import check_inputs, iter_units
from pipeline.inputs.listing import iter_listing, list_units, write_listing
from pipeline.inputs.reading import DEFAULT_LIMITS, UnitReader
from pipeline.inputs.units import InputError, Unit
from s3server import CountingProxy

ROOT = Path(__file__).resolve().parents[3]


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def crawl(s3_server, demo_crawl):
    """The demo crawl's shards under s3://.../crawl/, with a shard index and a stats file beside one."""
    folder, samples = demo_crawl
    store = st.open_storage(s3_server.prefix("crawl"))
    tars = sorted(folder.glob("*.tar"))
    for t in tars:
        store.write_bytes(f"crawl/{t.name}", t.read_bytes())
    store.write_bytes("crawl/00000_stats.json", b"{}")  # img2dataset's stats: not an input
    return store, [t.name for t in tars], len(samples)


def _sources(inputs):
    units, _ = list_units(inputs)
    return sorted(u.uri for u in units)


def test_a_prefix_a_pattern_a_txt_and_a_shard_manifest_list_the_same_shards(crawl, tmp_path):
    store, names, _ = crawl
    want = sorted(store.uri_of(f"crawl/{n}") for n in names)
    assert _sources([store.uri_of("crawl") + "/"]) == want
    assert _sources([store.uri_of("crawl")]) == want  # no suffix: a prefix too
    last = len(names) - 1
    assert _sources([store.uri_of("crawl") + f"/{{00000..{last:05d}}}.tar"]) == want
    assert _sources([store.uri_of("crawl") + "/*.tar"]) == want
    store.write_bytes("lists/shards.txt", ("# the crawl\n\n" + "\n".join(
        [store.uri_of(f"crawl/{names[0]}")] + [f"../crawl/{n}" for n in names[1:]]) + "\n").encode())
    assert [u.replace("/lists/../", "/") for u in _sources([store.uri_of("lists/shards.txt")])] == want
    store.write_parquet("lists/shards.parquet", pa.table({"shard": want, "n": list(range(len(want)))}))
    assert _sources([store.uri_of("lists/shards.parquet")]) == want
    local = tmp_path / "shards.txt"  # a local list of remote shards
    local.write_text("\n".join(want))
    assert _sources([str(local)]) == want


def test_a_prefix_of_many_shards_is_listed_a_page_at_a_time(s3_server, tmp_path, monkeypatch):
    store = st.open_storage(s3_server.prefix("many"))
    from concurrent.futures import ThreadPoolExecutor
    n = 1_100  # two ListObjectsV2 pages (1,000 keys a page)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: store.write_bytes(f"c/{i:04d}.tar", b""), range(n)))
    proxy = CountingProxy(s3_server.endpoint)  # counts the list requests of every client opened now
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    try:
        it = iter_units([store.uri_of("c") + "/"])
        assert next(it).unit_id == "0000" and proxy.lists == 1  # the first unit came from the first page
        assert sum(1 for _ in it) == n - 1 and proxy.lists == 2
        listing = tmp_path / "units.jsonl"
        count, _ = write_listing([store.uri_of("c") + "/"], listing)
        assert count == n and len(set(u.unit_id for u in iter_listing(listing))) == n
    finally:
        proxy.close()


def test_inputs_that_name_nothing_are_refused_naming_the_input(crawl):
    store, _, _ = crawl
    for inp, words in ((store.uri_of("nothing") + "/", "no .tar shard under this prefix"),
                       (store.uri_of("crawl") + "/*.tgz", "no file matches this pattern")):
        with pytest.raises(InputError) as e:
            check_inputs([inp])
        assert inp in str(e.value) and words in str(e.value)
    assert "remote inputs must be" not in Path(kinds.__file__).read_text()


def test_phase_3_reads_a_remote_shard_by_ranges_at_the_measured_offsets(s3_server):
    store = st.open_storage(s3_server.prefix("ranged"))
    images = {f"{i:03d}": os.urandom(5000 + i) for i in range(4)}
    pad = os.urandom(1 << 20)  # members between samples 1 and 2: a read never spans them
    blob = _tar({"000.jpg": images["000"], "001.jpg": images["001"], "pad.bin": pad, "002.jpg": images["002"],
                 "003.jpg": images["003"], "tail.bin": pad})
    store.write_bytes("a.tar", blob)
    unit = Unit("a", "tar", store.uri_of("a.tar"))
    rows = [r for r in UnitReader(unit, DEFAULT_LIMITS) if r.get("_offset") is not None]
    assert len(rows) == 4
    import hashlib
    table = pa.Table.from_pylist([{k: r[k] for k in ("sample_id", "source_uri", "key", "_offset", "_size")}
                                  | {"sha256": hashlib.sha256(r["image"]).hexdigest()} for r in rows])
    got = []
    real = type(store).open_input  # S3Storage's own (resumed ranged reads)

    def counting(self, path):
        f = real(self, path)
        orig = f.read_at
        return _Spy(f, lambda n, off: got.append((off, n)) or orig(n, off))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(store), "open_input", counting)
        with ByteSource(unit, DEFAULT_LIMITS) as src:
            data, why = src.fetch(table)
    assert why == [None] * 4 and data == [images[r["key"]] for r in rows]
    o, n = [r["_offset"] for r in rows], [r["_size"] for r in rows]
    # two ranged GETs at the measured offsets: members 0-1 together, 2-3 together, never the pad between
    assert got == [(o[0], o[1] + n[1] - o[0]), (o[2], o[3] + n[3] - o[2])]
    assert sum(x for _, x in got) < len(blob) / 50


class _Spy:
    def __init__(self, f, read_at):
        self._f, self.read_at = f, read_at

    def __getattr__(self, name):
        return getattr(self._f, name)

    def close(self):
        self._f.close()


def test_curate_a_prefix_on_s3_into_a_local_run(crawl, tmp_path):
    store, _, n_samples = crawl
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    p = subprocess.run([sys.executable, str(ROOT / "pipeline" / "curate.py"), "--input", store.uri_of("crawl") + "/",
                        "--output", str(run), "--no-progress", "--set", "ray.num_cpus=2",
                        "--set", "stages=[decode,size,dedup]"], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    n, = catalog.connect(run).execute("SELECT count(*) FROM samples").fetchone()
    assert n == n_samples
    assert s3_server_secret() not in p.stderr + p.stdout + (run / "manifest.json").read_text()


def s3_server_secret() -> str:
    return os.environ["AWS_SECRET_ACCESS_KEY"]
