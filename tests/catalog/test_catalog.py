import io
import tarfile

import pytest

import catalog
from catalog import CURATED_INDEX, ShardTruncated, ShardWriter, iter_tar, read_index, read_member


def _write(folder, n=5, max_count=2):
    with ShardWriter(folder, "part", CURATED_INDEX, max_count=max_count) as w:
        for i in range(n):
            w.add(f"k{i:03d}", {"jpg": bytes([i]) * (100 + i), "json": {"i": i}},
                  {"sample_id": f"s{i}", "width": i})
    return w.written


def test_shards_roll_and_index_points_at_the_bytes(tmp_path):
    names = _write(tmp_path)
    assert names == ["part-00000.tar", "part-00001.tar", "part-00002.tar"]
    idx = read_index(tmp_path)
    assert idx.num_rows == 5 and idx.schema.metadata[b"humanset.schema"] == b"curated_index"
    for row in idx.to_pylist():
        i = int(row["key"][1:])
        jpg = next(m for m in row["members"] if m["name"].endswith(".jpg"))
        assert read_member(tmp_path / row["shard"], jpg["offset"], jpg["size"]) == bytes([i]) * (100 + i)


def test_tars_are_webdataset_readable(tmp_path, ray_local):
    import webdataset as wds
    _write(tmp_path, n=3, max_count=10)
    got = [(s["__key__"], s["jpg"][:1]) for s in wds.WebDataset(str(tmp_path / "part-00000.tar"), shardshuffle=False)]
    assert got == [("k000", b"\x00"), ("k001", b"\x01"), ("k002", b"\x02")]
    rows = ray_local.data.read_webdataset(str(tmp_path / "part-00000.tar"), decoder=None).take_all()
    assert sorted(r["__key__"] for r in rows) == ["k000", "k001", "k002"]


def test_writer_leaves_nothing_that_looks_whole_on_error(tmp_path):
    with pytest.raises(RuntimeError):
        with ShardWriter(tmp_path, "part", CURATED_INDEX) as w:
            w.add("a", {"jpg": b"x"}, {})
            raise RuntimeError("crash")
    assert list(tmp_path.iterdir()) == []


def test_keys_with_dots_are_refused(tmp_path):
    with pytest.raises(ValueError, match="dots"):
        ShardWriter(tmp_path, "p", CURATED_INDEX).add("a.b", {"jpg": b"x"}, {})


def _tar(members):
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return b.getvalue()


def test_iter_tar_flags_escaping_members():
    raw = _tar([("a.jpg", b"1"), ("../evil.jpg", b"2"), ("/abs.jpg", b"3"), ("b.jpg", b"4")])
    recs = list(iter_tar(io.BytesIO(raw)))
    assert [(r.key, r.error is None) for r in recs] == [("a", True), ("../evil.jpg", False),
                                                        ("/abs.jpg", False), ("b", True)]
    assert "escapes the shard" in recs[1].error


@pytest.mark.parametrize("cut,kept,lost", [(4 * 3584 + 1512, ["000", "001"], "002"), (3036, [], "000")])
def test_iter_tar_truncated_keeps_what_came_before(cut, kept, lost):
    raw = _tar([(f"{k:03d}.{e}", b"x" * 3000) for k in range(3) for e in ("jpg", "json")])
    got = []
    with pytest.raises(ShardTruncated) as e:
        for r in iter_tar(io.BytesIO(raw[:cut])):
            got.append(r.key)
    assert got == kept and e.value.key == lost


def test_conform_refuses_unknown_columns():
    t = catalog.conform([{"sample_id": "a", "keep": True}], catalog.SAMPLES)
    assert t.schema == catalog.SAMPLES and t.column("keep").to_pylist() == [True]
    with pytest.raises(KeyError, match="kep"):
        catalog.conform([{"kep": True}], catalog.SAMPLES)


def test_duckdb_views(tmp_path):
    rows = [{"sample_id": "a", "keep": True, "person_scores": [0.95, 0.5],
             "person_boxes": [[0, 0, 100, 400], [0, 0, 10, 10]]},
            {"sample_id": "b", "keep": False, "person_scores": [], "person_boxes": []}]
    catalog.write_parquet(tmp_path / "catalog/samples/p.parquet", catalog.conform(rows, catalog.SAMPLES))
    _write(tmp_path / "shards", n=2)
    con = catalog.connect(tmp_path)
    assert con.execute("SELECT count(*) FROM samples").fetchone()[0] == 2
    assert con.execute("SELECT count(*) FROM shards").fetchone()[0] == 2
    persons = con.execute("SELECT sample_id, score, box_longer_side FROM persons ORDER BY score").fetchall()
    assert persons == [("a", pytest.approx(0.5), 10.0), ("a", pytest.approx(0.95), 400.0)]
