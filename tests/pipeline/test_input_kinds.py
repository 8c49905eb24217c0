"""What an --input is, decided in one place (pipeline/inputs/kinds.py `classify`), and input.extensions
read the same way by the folder walk and the tar reader."""
from __future__ import annotations

import io
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.inputs import kinds
from pipeline.inputs.kinds import check_inputs, classify, iter_units
from pipeline.inputs.listing import list_units
from pipeline.inputs.reading import read_unit
from pipeline.inputs.units import InputError, Unit


def _tar(path, members: dict[str, bytes]):
    with tarfile.open(path, "w") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_every_kind_of_input_is_told_apart(tmp_path):
    (tmp_path / "imgs" / "sub").mkdir(parents=True)
    (tmp_path / "imgs" / "sub" / "a.jpg").write_bytes(b"x")
    _tar(tmp_path / "s.tar", {"k.jpg": b"x"})
    (tmp_path / "list.txt").write_text("s.tar\n")
    (tmp_path / "folder.txt").mkdir()  # a folder is a folder, whatever its name
    pq.write_table(pa.table({"shard": ["s.tar"]}), tmp_path / "shards.parquet")
    pq.write_table(pa.table({"path": ["imgs/sub/a.jpg"]}), tmp_path / "files.parquet")
    (tmp_path / "a*.tar").write_bytes((tmp_path / "s.tar").read_bytes())  # an existing name is never a pattern
    cases = {
        str(tmp_path / "imgs"): kinds.FOLDER, str(tmp_path / "s.tar"): kinds.TAR,
        f"file://{tmp_path / 's.tar'}": kinds.TAR, str(tmp_path / "list.txt"): kinds.SHARD_LIST,
        str(tmp_path / "folder.txt"): kinds.FOLDER, str(tmp_path / "shards.parquet"): kinds.SHARD_MANIFEST,
        str(tmp_path / "files.parquet"): kinds.MANIFEST, str(tmp_path / "a*.tar"): kinds.TAR,
        str(tmp_path / "{00000..00003}.tar"): kinds.PATTERN, "memory://kinds/crawl/": kinds.PREFIX,
        "memory://kinds/crawl": kinds.PREFIX, "memory://kinds/crawl/*.tar": kinds.PATTERN,
        "memory://kinds/crawl/00000.tar": kinds.TAR, "memory://kinds/lists/shards.txt": kinds.SHARD_LIST,
    }
    assert {inp: classify(inp) for inp in cases} == cases


@pytest.mark.parametrize("name, words", [
    ("missing", "no such file or directory; check the path"),
    ("photo.jpg", "a single file must be a .tar shard"),
    ("nothing.parquet", "cannot be listed or read"),
])
def test_what_is_no_input_is_refused_naming_it(tmp_path, name, words):
    if name == "photo.jpg":
        (tmp_path / name).write_bytes(b"x")
    inp = str(tmp_path / name)
    with pytest.raises(InputError) as e:
        classify(inp)
    assert inp in str(e.value) and words in str(e.value)


def test_a_parquet_without_a_column_of_paths_is_refused_before_listing(tmp_path):
    pq.write_table(pa.table({"n": [1]}), tmp_path / "m.parquet")
    with pytest.raises(InputError, match="manifest has no column of file paths; expected one of path"):
        check_inputs([str(tmp_path / "m.parquet")])


def test_a_list_named_without_a_folder_resolves_against_the_working_folder(tmp_path, monkeypatch):
    _tar(tmp_path / "a.tar", {"k.jpg": b"x"})
    (tmp_path / "list.txt").write_text("a.tar\n")
    pq.write_table(pa.table({"shard": ["a.tar"]}), tmp_path / "shards.parquet")
    monkeypatch.chdir(tmp_path)
    assert [u.uri for u in iter_units(["list.txt"])] == ["a.tar"]  # not list.txt/a.tar
    assert [u.uri for u in iter_units(["shards.parquet"])] == ["a.tar"]


def test_input_extensions_decide_for_folders_and_tar_members_alike(tmp_path):
    (tmp_path / "imgs").mkdir()
    for name in ("a.jpg", "b.PNG", "c.txt"):
        (tmp_path / "imgs" / name).write_bytes(b"x")
    _tar(tmp_path / "s.tar", {"k1.jpg": b"j", "k2.png": b"p"})

    def folder_keys(exts=None):
        (unit,), _ = list_units([str(tmp_path / "imgs")], exts=exts)
        return unit.keys

    def tar_rows(limits=None):
        rows, _ = read_unit(Unit("s", "tar", str(tmp_path / "s.tar")), limits)
        return {r["key"]: (r["image"], (r["read_error"] or "").split(":")[0]) for r in rows}

    assert folder_keys() == ["a.jpg", "b.PNG"] and folder_keys(["png"]) == ["b.PNG"]
    assert tar_rows() == {"k1": (b"j", ""), "k2": (b"p", "")}
    assert tar_rows({"extensions": [".PNG"]}) == {"k1": (None, "no image member"), "k2": (b"p", "")}
