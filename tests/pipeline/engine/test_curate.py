"""The curation engine on the demo crawl and on hand-made bad inputs (real Ray, real files)."""
import io
import json
import subprocess
import sys
import tarfile

import pyarrow.parquet as pq
import pytest

import catalog
from pipeline.config import load_config
from pipeline.engine.errors import RunError
from pipeline.engine.driver import curate
from catalog.source_bytes import read_source
from pipeline.inputs.units import sample_id

CHEAP = ["stages=[decode,size,dedup]"]  # engine mechanics on generated images that hold no person


def _samples(run):
    return {r["sample_id"]: r for r in catalog.connect(run).sql("SELECT * FROM samples").to_arrow_table().to_pylist()}


def _by_caption(rows, caption):
    return [r for r in rows.values() if r["caption"] == caption]


def test_every_input_sample_is_in_the_catalog_exactly_once(demo_crawl, demo_run):
    folder, samples = demo_crawl
    run, manifest = demo_run
    con = catalog.connect(run)
    n, distinct = con.execute("SELECT count(*), count(DISTINCT sample_id) FROM samples").fetchone()
    assert n == distinct == len(samples)
    expected = {sample_id(f"{t.resolve()}#{k}.{e}") for t in sorted(folder.glob("*.tar"))
                for k, e, _, _ in samples if any(m.startswith(k + ".") for m in tarfile.open(t).getnames())}
    assert set(_samples(run)) == expected
    assert manifest["counts"]["inputs"] == len(samples)
    assert manifest["funnel"][0]["in"] == len(samples)
    # every rejected sample says why, every kept one does not
    assert con.execute("SELECT count(*) FROM samples WHERE keep = (reject_reason IS NOT NULL)").fetchone()[0] == 0


def test_kept_samples_are_in_shards_with_their_original_bytes(demo_crawl, demo_run):
    import webdataset as wds
    folder, samples = demo_crawl
    run, _ = demo_run
    rows = _samples(run)
    kept = {sid for sid, r in rows.items() if r["keep"]}
    index = catalog.read_index(run / "shards")
    assert set(index.column("sample_id").to_pylist()) == kept
    source = {}
    for t in sorted(folder.glob("*.tar")):
        for rec in catalog.iter_tar(t):
            for ext, data in rec.files.items():
                if ext not in ("txt", "json"):
                    source[sample_id(f"{t.resolve()}#{rec.key}.{ext}")] = data
    seen = 0
    for tar in catalog.list_shards(run / "shards"):
        for s in wds.WebDataset(str(tar), shardshuffle=False):
            img = next(v for k, v in s.items() if k in ("jpg", "png", "webp", "gif", "mpo"))
            assert img == source[s["__key__"]], "curated bytes must be the original bytes"
            assert json.loads(s["json"])["sample_id"] == s["__key__"]
            seen += 1
    assert seen == len(kept) >= 3


@pytest.mark.parametrize("caption,reason", [
    ("truncated_jpeg: bad or unusual input", "decode:truncated_or_corrupt_pixel_data"),
    ("zero_bytes: bad or unusual input", "decode:empty_file"),
    ("not_an_image: bad or unusual input", "decode:not_an_image"),
    ("bomb_png: bad or unusual input", "decode:decompression_bomb"),
    ("bus: thumbnail (too small)", "size:short_side<300"),
    ("bus: resized and re-encoded duplicate", "dedup:near_duplicate"),
])
def test_reject_reasons(demo_run, caption, reason):
    rows = _samples(demo_run[0])
    (row,) = _by_caption(rows, caption)
    assert row["keep"] is False and row["reject_reason"] == reason


def test_exact_duplicate_points_at_its_canonical_across_shards(demo_run):
    rows = _samples(demo_run[0])
    (copy,) = _by_caption(rows, "zidane: exact copy")
    (orig,) = _by_caption(rows, "zidane: original photo")
    # same bytes, same resolution: the canonical is the smaller sample_id (ids hash the path)
    canon, dup = sorted([copy, orig], key=lambda r: r["sample_id"])
    assert dup["dup_of"] == canon["sample_id"] and dup["dup_kind"] == "exact"
    assert dup["reject_reason"] == "dedup:exact_duplicate"
    assert canon["dup_of"] is None and canon["dup_cluster_size"] >= 2
    assert not (canon["reject_reason"] or "").startswith("dedup:")
    assert copy["shard"] != orig["shard"], "dedup runs across the whole run, not per shard"


@pytest.mark.parametrize("name,fmt,mode,frames", [
    ("cmyk_jpeg", "JPEG", "CMYK", 1), ("png_16bit", "PNG", "I;16", 1), ("grayscale", "JPEG", "L", 1),
    ("palette_transparent_png", "PNG", "P", 1), ("animated_gif", "GIF", "P", 3), ("animated_webp", "WEBP", "RGB", 3),
])
def test_unusual_but_valid_images_decode(demo_run, name, fmt, mode, frames):
    (row,) = _by_caption(_samples(demo_run[0]), f"{name}: bad or unusual input")
    assert row["decode_error"] is None and row["format"] == fmt and row["n_frames"] == frames
    assert row["mode"].startswith(mode[:3]) and row["phash"] is not None


def test_exif_rotation_swaps_width_and_height(demo_run):
    from PIL import Image
    (row,) = _by_caption(_samples(demo_run[0]), "exif_rotated: bad or unusual input")
    stored = Image.open(io.BytesIO(read_source(row["source_uri"]))).size
    assert row["exif_orientation"] == 6 and (row["width"], row["height"]) == (stored[1], stored[0])


def test_model_stages_decide_clear_cases(demo_run):
    run, manifest = demo_run
    rows = _samples(run)
    # the original and its exact copy: the canonical one reached the model stages
    (bus,) = [r for r in _by_caption(rows, "bus: original photo") + _by_caption(rows, "bus: exact copy")
              if r["dup_of"] is None]
    assert bus["n_persons"] >= 3 and bus["person_n_pass"] >= 1 and bus["keep"]
    assert len(bus["person_keypoints"][0]) == 51  # COCO-17 (x, y, conf) from the pose model
    for name in ("coffee", "chelsea", "hubble_deep_field"):
        (r,) = [r for r in rows.values() if r["caption"] in (f"{name}: original photo", f"{name}: exact copy")
                and r["dup_of"] is None]
        assert r["reject_reason"].startswith("person:") and not r["person_n_pass"], name
    graphics = _by_caption(rows, "graphic: flat synthetic graphic")
    assert all(g["reject_reason"].startswith("person:") for g in graphics)
    (meme,) = _by_caption(rows, "astronaut: caption overlay")
    assert meme["reject_reason"].startswith("text:text_area>") and meme["text_area_frac"] > 0.03
    # cascade: samples rejected before the person stage were never scored by it
    (thumb,) = _by_caption(rows, "bus: thumbnail (too small)")
    assert thumb["reject_reason"].startswith("size:") and thumb["person_scores"] is None
    assert "person" not in thumb["scored_stages"] and "person" in bus["scored_stages"]
    # no stage needs weights by default: watermark runs its ocr method, art its shipped probe, and art
    # scores only what passed every stage before it (the person stage among them)
    assert not manifest["skipped_stages"]
    assert manifest["stage_info"]["watermark"] == {"method": "ocr"}
    assert manifest["stage_info"]["art"] == {"method": "probe"}
    for r in rows.values():
        scored = "art" in (r["scored_stages"] or [])
        assert (r["art_score"] is not None) == scored, r["caption"]
        assert not scored or r["person_n_pass"], r["caption"]
    assert sum(r["art_score"] is not None for r in rows.values()) >= 5
    assert not [r["caption"] for r in rows.values() if (r["reject_reason"] or "").startswith("art:")
                and "original photo" in r["caption"]]
    marked = [r for r in rows.values() if r["caption"].endswith("crop with a copyright line in a corner")]
    assert sum((r["reject_reason"] or "").startswith("watermark:watermark>") for r in marked) >= 2
    assert bus["watermark_score"] is not None and bus["watermark_score"] <= 0.8  # scene text: kept


def test_stats_markers_and_manifest(demo_run):
    run, manifest = demo_run
    stats = [json.loads(p.read_text()) for p in sorted((run / "stats").glob("*.json"))]
    assert len(stats) == manifest["units"] == 3
    assert sum(s["inputs"] for s in stats) == manifest["counts"]["inputs"]
    assert sum(s["kept"] for s in stats) == manifest["counts"]["kept"]
    assert all("decode" in s["seconds"] for s in stats)
    assert manifest["status"] == "complete" and manifest["config"]["dedup"]["max_distance"] == 4
    assert [f["stage"] for f in manifest["funnel"]] == manifest["stages"]


def _tar_bytes(members):
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return b.getvalue()


def test_damaged_tars_lose_nothing(tmp_path, ray_local):
    from pipeline.demo.crawl import photo_like
    crawl = tmp_path / "crawl"
    crawl.mkdir()
    good = [photo_like(400, 320, s) for s in range(6)]
    (crawl / "escape.tar").write_bytes(_tar_bytes(
        [("a.jpg", good[0]), ("../../etc/x.jpg", good[1]), ("b.jpg", good[2])]))
    raw = _tar_bytes([("c.jpg", good[3]), ("c.txt", b"c"), ("d.jpg", good[4]), ("e.jpg", good[5])])
    (crawl / "cut.tar").write_bytes(raw[: len(raw) - 10240 - 1000])  # cut inside e.jpg
    run = tmp_path / "run"
    curate([str(crawl)], str(run), load_config(sets=CHEAP), progress=False)
    rows = _samples(run)
    by_key = {(r["shard"], r["key"]): r for r in rows.values()}
    assert by_key[("escape", "a")]["keep"] and by_key[("escape", "b")]["keep"]
    esc = by_key[("escape", "../../etc/x.jpg")]
    assert not esc["keep"] and "escapes the shard" in esc["decode_error"]
    assert by_key[("cut", "c")]["caption"] == "c" and by_key[("cut", "d")]["keep"]
    assert "truncated" in by_key[("cut", "e")]["decode_error"]
    cut_stats = json.loads((run / "stats" / "cut.json").read_text())
    assert "truncated" in cut_stats["unit_error"] and cut_stats["inputs"] == 3
    assert not list(run.rglob("*.tar.tmp-*")) and not (run / "shards" / "x.jpg").exists()


def test_folder_and_manifest_inputs(tmp_path, ray_local):
    import pyarrow as pa
    from pipeline.demo.crawl import photo_like
    imgs = tmp_path / "imgs" / "sub"
    imgs.mkdir(parents=True)
    for i in range(3):
        (imgs / f"{i}.jpg").write_bytes(photo_like(400, 400, 100 + i))
    (tmp_path / "imgs" / "notes.txt").write_text("not an image extension: not an input")
    manifest = tmp_path / "m" / "list.parquet"
    manifest.parent.mkdir()
    (manifest.parent / "copy.jpg").write_bytes((imgs / "0.jpg").read_bytes())
    # a file the folder input already lists (twice: absolute and relative), a copy, a missing file
    pq.write_table(pa.table({"path": [str(imgs / "0.jpg"), "../imgs/sub/1.jpg", "copy.jpg",
                                      str(tmp_path / "missing.jpg")]}), manifest)
    run = tmp_path / "run"
    result = curate([str(tmp_path / "imgs"), str(manifest)], str(run),
                    load_config(sets=["input.files_per_unit=2"] + CHEAP), progress=False)
    rows = _samples(run)
    assert len(rows) == 5 and result["repeated_inputs"] == 2
    # unit ids: position and a hash of the unit's files (never the position alone)
    assert {r["shard"].rsplit("-", 1)[0] for r in rows.values()} == {"imgs-00000", "imgs-00001", "list-00001"}
    missing = next(r for r in rows.values() if r["source_uri"].endswith("missing.jpg"))
    assert "cannot read file" in missing["decode_error"] and missing["reject_reason"].startswith("decode:")
    pair = sorted((r for r in rows.values() if r["source_uri"].endswith(("copy.jpg", "0.jpg"))),
                  key=lambda r: r["sample_id"])
    assert [r["reject_reason"] for r in pair] == [None, "dedup:exact_duplicate"]
    assert sum(r["keep"] for r in rows.values()) == 3


def test_same_run_with_other_config_is_refused(demo_crawl, demo_run):
    with pytest.raises(RunError, match="holds a curation run with other config; rerun its own command to resume it, "
                                      "or pass another --output"):
        curate([str(demo_crawl[0])], str(demo_run[0]), load_config(sets=["dedup.max_distance=2"]), progress=False)


def test_cli_errors_name_the_input(tmp_path):
    p = subprocess.run([sys.executable, "-m", "humanset.cli", "curate", "--input", str(tmp_path / "nope"),
                        "--output", str(tmp_path / "run")], capture_output=True, text=True)
    assert p.returncode == 2 and "nope: no such file or directory" in p.stderr
    p = subprocess.run([sys.executable, "-m", "humanset.cli", "curate", "--input", str(tmp_path),
                        "--output", str(tmp_path / "run"), "--set", "dedup.max_distanse=3"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "max_distanse" in p.stderr
    assert not (tmp_path / "run").exists()
