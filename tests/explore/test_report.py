"""`humanset report`: one self-contained HTML file that a real headless Chromium renders, no broken images."""
from __future__ import annotations

import base64
import html
import io
import re
import shutil
import subprocess

import pytest
from PIL import Image

from explore import cli
from explore.report import _tile, write_report
from stats_run import make_run

THUMBS = 4


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    run_dir, rows = make_run(root, n=40)
    out = root / "out" / "report.html"
    assert cli.main(["report", str(run_dir), "--out", str(out), "--thumbs", str(THUMBS)]) == 0
    return run_dir, rows, out


def _imgs(page: str) -> list[tuple[str, str, str]]:
    """(alt, mime, base64) of every <img> on the page."""
    return re.findall(r'<img alt="([^"]*)" src="data:(image/\w+);base64,([A-Za-z0-9+/=]+)"', page)


def test_report_is_self_contained_and_every_image_decodes(report):
    run_dir, rows, out = report
    page = out.read_text()
    assert page.count("<img") == len(_imgs(page)) > 0  # every image is an inline data URI
    assert not re.search(r'src="(?!data:)', page) and "<link" not in page and "<script" not in page
    for _alt, _mime, b64 in _imgs(page):
        Image.open(io.BytesIO(base64.b64decode(b64))).verify()
    for section in ["Funnel", "Reject reasons", "Persons per kept image", "Score distributions",
                    "Per source", "Duplicates", "Contact sheets"]:
        assert f"<h2>{section}" in page, section


def test_report_charts_carry_the_active_thresholds(report):
    _, _, out = report
    alts = [alt for alt, _, _ in _imgs(out.read_text())]
    for want in ["funnel chart", "reasons chart", "persons per image chart",
                 "short_side histogram, threshold size.min_short_side = 300",
                 "watermark_score histogram, threshold watermark.max_score = 0.8",
                 "person score histogram, threshold person.min_score = 0.9",
                 "person box histogram, threshold person.min_box_px = 300"]:
        assert want in alts, want


def test_contact_sheets_show_kept_and_each_reason(report):
    _, rows, out = report
    page = out.read_text()
    kept_part = page.split("<h3>Kept</h3>")[1].split("<h3>")[0]
    assert kept_part.count("<img") == THUMBS
    reasons = {r["reject_reason"] for r in rows if r["reject_reason"]}
    for reason in reasons:
        assert f"<h3>Rejected: {reason.replace('<', '&lt;').replace('>', '&gt;')} (" in page, reason
    # undecodable samples are described by their decode error, not shown as a broken image
    truncated = page.split("<h3>Rejected: decode:truncated")[1].split("<h3>")[0]
    assert "<img" not in truncated and "decode error: truncated" in truncated
    size = page.split("<h3>Rejected: size:short_side&lt;300")[1].split("<h3>")[0]
    assert size.count("<img") == min(THUMBS, sum(r["reject_reason"] == "size:short_side<300" for r in rows))


def test_missing_source_becomes_a_text_tile(tmp_path):
    row = {"sample_id": "x", "key": "k", "source_uri": str(tmp_path / "gone.jpg"), "reject_reason": "size:small"}
    html_tile = _tile(row, lambda: (tmp_path / "gone.jpg").read_bytes(), {})
    assert "<img" not in html_tile and "FileNotFoundError" in html_tile


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("no chromium on PATH: install Debian's `chromium` (deps/stats.apt.txt, scripts/install.sh)")


CHECK = """<script>
window.addEventListener('load', () => {
  const imgs = Array.from(document.images);
  const broken = imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt);
  const out = document.createElement('pre');
  out.id = 'imgcheck';
  out.textContent = 'IMAGES ' + imgs.length + ' BROKEN ' + broken.length + ' ' + JSON.stringify(broken);
  document.body.appendChild(out);
});
</script>"""


def test_renders_in_headless_chromium_without_broken_images(report, tmp_path):
    chromium = _chromium()
    _, _, out = report
    page = out.read_text()
    n_imgs = page.count("<img")
    checked = tmp_path / "checked.html"
    # one image that cannot decode proves the check would catch a broken image
    bad = '<img alt="deliberately broken" src="data:image/png;base64,iVBORw0KGgoAAAAA">'
    checked.write_text(page.replace("</body>", bad + CHECK + "</body>"))
    p = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000", "--dump-dom",
         checked.as_uri()], capture_output=True, text=True, timeout=150)
    m = re.search(r"IMAGES (\d+) BROKEN (\d+) (\[.*?\])", p.stdout)
    assert m, f"chromium did not run the check (rc {p.returncode}): {p.stderr[-2000:]}"
    assert int(m[1]) == n_imgs + 1
    assert m[3] == '["deliberately broken"]', f"broken images in the report: {m[3]}"


def test_source_reader_gives_up_on_a_slow_failing_store(monkeypatch):
    from explore import report

    calls = []

    def unreachable(uri):
        calls.append(uri)
        raise FileNotFoundError(f"{uri}: cannot read the source (could not resolve host)")

    monkeypatch.setattr(report, "read_source", unreachable)
    read = report.SourceReader()
    read.slow_failure_s = 0.0  # every failure counts as slow
    for uri in ["s3://bucket/a.tar#1.jpg", "s3://bucket/b.tar#2.jpg", "s3://other/c.jpg", "/local/d.jpg",
                "/local/e.jpg"]:
        with pytest.raises(FileNotFoundError):
            read(uri)
    assert calls == ["s3://bucket/a.tar#1.jpg", "s3://other/c.jpg", "/local/d.jpg", "/local/e.jpg"]


def test_demo_run_stats_agree_with_its_manifest_and_the_report_renders(demo_run, tmp_path):
    """The real curation output (the run `make demo` makes), not a synthetic one."""
    from explore.stats import run_stats

    run_dir, manifest = demo_run
    s = run_stats(run_dir)
    assert s["totals"]["inputs"] == manifest["counts"]["inputs"]
    assert s["totals"]["kept"] == manifest["counts"]["kept"] == s["curated"]["samples"]
    ours = {f["stage"]: f["count"] for f in s["funnel"]}
    for f in manifest["funnel"]:
        assert ours[f["stage"]] == f["out"], f
    page = write_report(run_dir, tmp_path / "demo.html", thumbs=THUMBS).read_text()
    for _, _, b64 in _imgs(page):
        Image.open(io.BytesIO(base64.b64decode(b64))).verify()
    kept = page.split("<h3>Kept</h3>")[1].split("<h3>")[0]
    assert kept.count("<img") == THUMBS  # read back from the curated shards
    rejected = [r for r in s["reasons"] if not r["reason"].startswith("decode:")]
    assert rejected and all(f"<h3>Rejected: {html.escape(r['reason'])} (" in page for r in rejected)
