"""Fuzzing as the proof that one bad file never stops a run (bench/fuzz.py runs 50,000+)."""
import importlib.util
from pathlib import Path


import catalog
from pipeline.stages.decode import REASON_KINDS

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("bench_fuzz", ROOT / "bench" / "fuzz.py")
fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz)

N = 3000


def test_seed_files_are_valid_and_cover_every_format():
    path = fuzz.DecodePath()
    seeds = fuzz.seed_files()
    assert path(list(seeds.values())) == [None] * len(seeds)
    assert {name.split("_")[0] for name in seeds} == {"jpeg", "png", "gif", "webp", "tiff", "bmp"}
    assert "gif_animated" in seeds and "webp_animated" in seeds


def test_3000_mutants_never_raise_and_each_gets_a_fixed_kind():
    result = fuzz.run(N, seed=0, max_pixels=1 << 22)
    assert result["files_tried"] == N and sum(result["outcomes"].values()) == N
    assert result["aborts"] == 0, result["abort_examples"]
    assert set(result["outcomes"]) <= set(REASON_KINDS) | {"decoded"}
    # the corpus reaches deep: many kinds, and both outcomes for every format
    assert len(result["outcomes"]) >= 5, result["outcomes"]
    for fmt, counts in result["per_format"].items():
        assert counts.get("decoded", 0) > 0 and counts.get("rejected", 0) > 0, (fmt, counts)


def test_a_mutant_crawl_completes_a_run_with_every_input_once(tmp_path, ray_local):
    from pipeline.config import load_config
    from pipeline.engine.driver import curate
    folder = tmp_path / "crawl"
    folder.mkdir()
    ext = {"jpeg": "jpg", "png": "png", "gif": "gif", "webp": "webp", "tiff": "tif", "bmp": "bmp"}
    n = 0
    for i, (name, _, data) in enumerate(fuzz.mutants(240, seed=7)):
        (folder / f"{i:04d}.{ext[name.split('_')[0]]}").write_bytes(data)
        n += 1
    run = tmp_path / "run"
    cfg = load_config(sets=["stages=[decode,size,dedup]", "input.files_per_unit=60", "decode.max_pixels=4194304",
                            "size.min_short_side=8"])
    manifest = curate([str(folder)], str(run), cfg, progress=False)
    assert manifest["status"] == "complete" and manifest["counts"]["inputs"] == n
    con = catalog.connect(run)
    total, distinct = con.execute("SELECT count(*), count(DISTINCT source_uri) FROM samples").fetchone()
    assert total == distinct == n
    reasons = {r for (r,) in con.execute("SELECT DISTINCT reject_reason FROM samples").fetchall() if r}
    for r in reasons:
        stage, kind = r.split(":", 1)
        assert stage in ("size", "dedup") or kind in REASON_KINDS, r
    assert manifest["counts"]["kept"] > 0
