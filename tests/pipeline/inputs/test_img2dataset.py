"""A real img2dataset output (the PyPI package, deps/input.pip.txt) curated end to end.

img2dataset 1.47.0 downloads 16 URLs served on 127.0.0.1 (13 photos, two 404s, a text file named
.jpg) into 4 shards of 5; the last holds only the failed text file, so its tar is empty. `humanset
curate` on that folder (in this process, on the session's Ray: the child process is not the point) exits 0
and accounts for every URL: 16 catalog rows, the three failures as
input:download_failed with img2dataset's error message, url/original_width typed columns, and the
upscaled photos judged at their original resolution (size.use_original).
"""
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

# (width, height) of the served photos; img2dataset's keep_ratio at 512 upscales the small ones
SIZES = [(451, 300), (640, 480), (300, 200), (800, 600)]


@pytest.fixture
def served(tmp_path):
    from pipeline.demo.crawl import photo_like
    www = tmp_path / "www"
    www.mkdir()
    for i in range(13):
        (www / f"p{i:02d}.jpg").write_bytes(photo_like(*SIZES[i % 4], seed=i))
    (www / "text.jpg").write_text("this is not an image\n" * 20)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(www), **kw)

        def log_message(self, *a):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    urls = [f"{base}/p{i:02d}.jpg" for i in range(13)] + [f"{base}/gone1.jpg", f"{base}/gone2.jpg", f"{base}/text.jpg"]
    yield urls
    server.shutdown()


def _img2dataset(urls, out: Path, tmp: Path):
    (tmp / "urls.txt").write_text("\n".join(urls) + "\n")
    code = (f"from img2dataset import download\n"
            f"download(url_list={str(tmp / 'urls.txt')!r}, output_folder={str(out)!r}, output_format='webdataset', "
            "image_size=512, resize_mode='keep_ratio', number_sample_per_shard=5, processes_count=1, thread_count=4, "
            "timeout=5, retries=0, distributor='multiprocessing')\n")
    env = {**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1", "WANDB_MODE": "disabled", "no_proxy": "127.0.0.1"}
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]


def test_a_real_img2dataset_crawl_is_curated_with_every_url_accounted_for(tmp_path, served, ray_local, capsys,
                                                                         monkeypatch):
    import duckdb

    from humanset.cli import main
    out, run = tmp_path / "crawl", tmp_path / "run"
    _img2dataset(served, out, tmp_path)
    assert sorted(p.name for p in out.glob("*.tar")) == ["00000.tar", "00001.tar", "00002.tar", "00003.tar"]
    assert (out / "00003.tar").stat().st_size == 10240  # the empty tar of the all-failed shard
    monkeypatch.chdir(tmp_path)  # `humanset curate` as typed, in this process on the session's Ray
    status = main(["curate", "--input", str(out), "--output", str(run), "--set", "stages=[decode,size,dedup]"])
    assert status == 0, capsys.readouterr().err[-3000:]
    con = duckdb.connect()
    parts = str(run / "catalog" / "samples" / "*.parquet")
    rows = con.execute(f"SELECT url, original_width, original_height, width, height, upscaled, short_side, "
                       f"reject_reason, decode_error, download_status FROM read_parquet('{parts}', union_by_name=true) "
                       f"ORDER BY url").fetchall()
    assert len(rows) == 16 and sorted(r[0] for r in rows) == sorted(served)  # every URL once
    failed = {r[0].rsplit("/", 1)[1]: r for r in rows if r[7] == "input:download_failed"}
    assert sorted(failed) == ["gone1.jpg", "gone2.jpg", "text.jpg"]
    assert "HTTP Error 404" in failed["gone1.jpg"][8] and "Image decoding error" in failed["text.jpg"][8]
    assert failed["text.jpg"][9] == "failed_to_resize"
    types = dict(con.execute(f"SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM read_parquet('{parts}', "
                             "union_by_name=true))").fetchall())
    assert types["url"] == "VARCHAR" and types["original_width"] == "INTEGER" and types["upscaled"] == "BOOLEAN"
    photos = [r for r in rows if r[7] != "input:download_failed"]
    for url, ow, oh, w, h, upscaled, short, reason, _, _ in photos:
        assert (ow, oh) in SIZES and upscaled == (min(ow, oh) < 512)
        assert short == min(ow, oh, w, h)  # an upscaled photo is judged at its original resolution
        assert (reason == "size:short_side<300") == (short < 300), (url, reason)
    assert sum(r[7] == "size:short_side<300" for r in photos) == 3  # the 300x200 ones: 768x512 stored
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["counts"]["inputs"] == 16
    assert manifest["funnel"][0]["stage"] == "input" and manifest["funnel"][0]["in"] - manifest["funnel"][0]["out"] == 3
    stats = {p.stem: json.loads(p.read_text()) for p in (run / "stats").glob("*.json")}
    assert stats["00003"]["inputs"] == 1 and stats["00003"]["unit_error"] is None
