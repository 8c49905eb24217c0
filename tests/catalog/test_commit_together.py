"""catalog.commit_together: a task's atomic writes land with one sync, in the order written; what
was sealed before an error lands, the rest never does; outside the block each file commits alone."""
import os

import pyarrow as pa
import pytest

from catalog import commit_together, write_json, write_parquet
from catalog.io import clean_tmp
from catalog.schema import SHARD_INDEX_CORE
from catalog.shards import ShardWriter


def _names(folder):
    return sorted(os.listdir(folder))


def test_files_appear_only_at_the_end_of_the_block(tmp_path):
    with commit_together() as c:
        write_json(tmp_path / "a.json", {"a": 1})
        write_parquet(tmp_path / "b.parquet", pa.table({"x": [1, 2]}))
        assert not (tmp_path / "a.json").exists() and len(c.pending) == 2  # temporaries only
        c.seal()
    assert _names(tmp_path) == ["a.json", "b.parquet"]
    assert (tmp_path / "a.json").read_text().strip().startswith("{")


def test_an_error_commits_the_sealed_and_removes_the_rest(tmp_path):
    with pytest.raises(RuntimeError):
        with commit_together() as c:
            write_json(tmp_path / "unit1.json", {"done": True})
            c.seal()
            write_json(tmp_path / "unit2-data.json", {"half": True})
            raise RuntimeError("the second unit failed")
    assert _names(tmp_path) == ["unit1.json"]  # no temporary left, no half unit


def test_drop_unsealed_and_the_order_of_renames(tmp_path, monkeypatch):
    order = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (order.append(os.path.basename(b)), real(a, b)))
    with commit_together() as c:
        for name in ("shard.tar.json", "part.json", "marker.json"):
            write_json(tmp_path / name, {})
        c.seal()
        write_json(tmp_path / "faulted.json", {})
        c.drop_unsealed()
    assert order == ["shard.tar.json", "part.json", "marker.json"]  # the marker last, as written
    assert _names(tmp_path) == ["marker.json", "part.json", "shard.tar.json"]


def test_shards_join_the_block_and_nested_blocks_join_the_outer(tmp_path):
    with commit_together():
        w = ShardWriter(tmp_path, "u", pa.schema(SHARD_INDEX_CORE))
        w.add("k1", {"jpg": b"\xff\xd8x"})
        with commit_together():
            written = w.close()
        assert written and not (tmp_path / written[0]).exists()
    assert (tmp_path / written[0]).exists() and clean_tmp(tmp_path) == 0


def test_outside_a_block_each_write_commits_at_once(tmp_path):
    write_json(tmp_path / "x.json", {"y": 2})
    assert _names(tmp_path) == ["x.json"]
