"""Names that come from data (unit ids, run folders, tar members, file names) are never parsed:
not as a path suffix, a glob, a mathtext label or a tar-member separator."""
from __future__ import annotations

import io
import re
import tarfile

import numpy as np
import pytest
from PIL import Image

import catalog
from explore import stats
from stats_run import make_run


def _jpeg(side: int = 64, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


# --- a unit id containing '.tar' keeps its shards ------------------------------------------------
def test_unit_id_with_dot_tar_keeps_its_shards(tmp_path):
    unit = "crawl.tar-00007"  # the stem of crawl.tar-00007.tar
    with catalog.ShardWriter(tmp_path, unit, catalog.CURATED_INDEX, max_count=2) as w:
        for i in range(3):
            w.add(f"s{i}", {"jpg": _jpeg(seed=i), "json": {"sample_id": f"s{i}"}}, {"sample_id": f"s{i}"})
    shards = catalog.list_shards(tmp_path)
    assert [p.name for p in shards] == [f"{unit}-00000.tar", f"{unit}-00001.tar"]
    assert sorted(catalog.read_index(tmp_path).column("key").to_pylist()) == ["s0", "s1", "s2"]
    assert catalog.index_path(shards[0]).name == f"{unit}-00000.parquet"


def test_training_stream_reads_shards_of_a_dot_tar_unit(tmp_path):
    from training.data import ShardStream

    with catalog.ShardWriter(tmp_path, "web.tar.part", catalog.CURATED_INDEX) as w:
        for i in range(4):
            w.add(f"s{i}", {"jpg": _jpeg(seed=i)}, {"sample_id": f"s{i}"})
    batch = next(iter(ShardStream(tmp_path, image_size=32, batch_size=4)))
    assert tuple(batch["images"].shape) == (4, 3, 32, 32)


# --- a run folder with glob characters reads only itself --------------------------------------------
@pytest.mark.parametrize("name", ["exp[1]", "a*b", "q?"])
def test_run_path_with_glob_characters_reads_only_that_run(tmp_path, name):
    decoys = {"exp[1]": "exp1", "a*b": "axxb", "q?": "qz"}
    run, rows = make_run(tmp_path / name, n=20)
    make_run(tmp_path / decoys[name], n=33)  # a folder the unescaped glob would match too
    assert stats.run_stats(run)["totals"]["inputs"] == len(rows) == 20
    con = catalog.connect(run)
    assert con.execute("SELECT count(*) FROM samples").fetchone()[0] == 20
    assert con.execute("SELECT count(*) FROM shards").fetchone()[0] == sum(r["keep"] for r in rows)


# --- a tar member named '$x^$.json' ------------------------------------------------------------------
WEIRD = ["$x^$", "a'b", "50%_{off}", "..\\x", "\\frac{1}{0}", "sp ace: colon (paren)"]


def test_decode_reasons_are_fixed_kinds_whatever_the_member_names(tmp_path):
    import pyarrow as pa

    from pipeline.inputs.units import Unit
    from pipeline.inputs.reading import read_unit
    from pipeline.stages.decode import DecodeStage

    tar = tmp_path / "crawl.tar"
    with tarfile.open(tar, "w") as tf:
        for name in WEIRD:  # a sidecar without an image: the reader reports it, quoting the key
            data = b'{"caption": "x"}'
            info = tarfile.TarInfo(f"{name}.json")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    rows, _ = read_unit(Unit("crawl", "tar", str(tar)))
    assert len(rows) == len(WEIRD) and all(r["read_error"] for r in rows)
    stage = DecodeStage({})
    measured = stage.measure({"image": [r["image"] for r in rows], "read_error": [r["read_error"] for r in rows]})
    reasons = stage.reject(pa.table({"decode_error": measured["decode_error"]}))
    assert "no_image_member" in reasons and all(re.fullmatch(r"[a-z_]+", r) for r in reasons), reasons
    other, none = stage.reject(pa.table({"decode_error": ["$x^$ {something} new: 'x'", None]}))
    assert re.fullmatch(r"[a-z_]+", other) and none is None


def test_report_draws_labels_from_data_literally(tmp_path):
    """A reason holding mathtext (from an older run, or any stage) renders; it is not parsed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from explore.report import render_report

    run, rows = make_run(tmp_path, n=20)
    path = run / "catalog" / "samples" / "part-00000.parquet"
    t = pq.read_table(path)
    reasons = ["decode:no_image_member_for_key_'$x^$'" if r else None for r in t.column("reject_reason").to_pylist()]
    t = t.set_column(t.schema.get_field_index("reject_reason"), "reject_reason", pa.array(reasons, pa.string()))
    pq.write_table(t, path)
    page = render_report(run, thumbs=1)
    assert "$x^$" in page.replace("&#x27;", "'")


# --- a background file name containing '#' ------------------------------------------------------------
def test_background_file_name_with_hash_reads(tmp_path):
    from training.tasks.augment import BackgroundPool

    photo = tmp_path / "beach #3.jpg"
    photo.write_bytes(_jpeg(48, seed=1))
    tar = tmp_path / "bg#1.tar"
    with tarfile.open(tar, "w") as tf:
        data = _jpeg(40, seed=2)
        info = tarfile.TarInfo("x#y.jpg")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    pool = BackgroundPool([str(photo), f"{tar}#x#y.jpg"])
    assert pool.image(0).shape == (48, 48, 3)
    assert pool.image(1).shape == (40, 40, 3)
