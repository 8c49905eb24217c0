"""catalog/source_bytes.py reads a source back through catalog.storage.open_input and the bounded tar
reader (catalog/tars.py), for plain and compressed tars, local, file:// and on a store."""
from __future__ import annotations

import io
import tarfile

import pytest

from catalog.source_bytes import read_source
from catalog.storage import is_uri, local_path, open_input, open_storage

MEMBERS = {"a.jpg": b"first image", "a.json": b"{}", "dir/b.jpg": b"second" * 1000, "c.png": b"third"}


def _tar(mode: str = "w") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for name, data in MEMBERS.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_one_test_and_one_opener_for_a_path_or_a_uri(tmp_path):
    f = tmp_path / "x.bin"
    f.write_bytes(b"0123456789")
    assert not is_uri(str(f)) and not is_uri(f"file://{f}") and is_uri("s3://b/k") and is_uri("memory://m/x")
    assert local_path(f"file://{f}") == str(f) == local_path(f)
    for name in (str(f), f"file://{f}"):
        with open_input(name) as fh:
            fh.seek(4)
            assert fh.read(3) == b"456"
    store = open_storage("memory://opener")
    store.write_bytes("x.bin", b"0123456789")
    with open_input("memory://opener/x.bin") as fh:  # random access: read_at on a store
        assert fh.read_at(3, 4) == b"456"
    with open_input("memory://opener/x.bin", buffer_size=4) as fh:  # a sequential stream
        assert fh.read() == b"0123456789"
    for missing in (str(tmp_path / "gone.bin"), "memory://opener/gone.bin"):
        with pytest.raises(FileNotFoundError):
            open_input(missing)
    with pytest.raises(FileNotFoundError, match="memory://opener/gone.bin"):
        open_input("memory://opener/gone.bin", buffer_size=4)


@pytest.mark.parametrize("suffix, mode", [(".tar", "w"), (".tar.gz", "w:gz"), (".tgz", "w:gz"),
                                          (".tar.bz2", "w:bz2"), (".tar.xz", "w:xz")])
def test_members_of_plain_and_compressed_tars(tmp_path, suffix, mode):
    tar = tmp_path / f"crawl{suffix}"
    tar.write_bytes(_tar(mode))
    for name, data in MEMBERS.items():
        assert read_source(f"{tar}#{name}") == data
        assert read_source(f"file://{tar}#{name}") == data
    with pytest.raises(FileNotFoundError, match="no member 'nope.jpg'"):
        read_source(f"{tar}#nope.jpg")


def test_a_tar_on_a_store_and_a_damaged_one(tmp_path):
    store = open_storage("memory://sources")
    store.write_bytes("crawl.tar", _tar())
    # written past Storage.write_bytes: pyarrow's output stream would gzip a .gz name a second time
    with store.fs.open_output_stream(store.fs_path("crawl.tar.gz"), compression=None) as out:
        out.write(_tar("w:gz"))
    for ext in ("tar", "tar.gz"):
        assert read_source(f"memory://sources/crawl.{ext}#dir/b.jpg") == MEMBERS["dir/b.jpg"]
    cut = tmp_path / "cut.tar"
    cut.write_bytes(_tar()[:1536])  # the first sample whole, the rest cut
    assert read_source(f"{cut}#a.jpg") == MEMBERS["a.jpg"]
    with pytest.raises(FileNotFoundError, match="cut.tar"):
        read_source(f"{cut}#c.png")
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 64)
    with pytest.raises(FileNotFoundError, match="cannot read the source .*not a tar"):
        read_source(f"{junk}#a.jpg")
