"""`humanset browse` in a real browser: Debian's headless Chromium (the report test's flags, a fresh
profile) driven over the DevTools protocol (tests/explore/cdp.py): the grid loads with its images, a
filter narrows it, a funnel bar opens the grid it names, a sample page draws its boxes, a label click
and a key write the labels CSV, the cluster view names the kept member; on a synthetic run and on the
demo run (the real curation output)."""
from __future__ import annotations

import json
import time

import pytest

from cdp import Browser, find_chromium
from explore.browse.server import BrowseApp, start
from stats_run import make_run


@pytest.fixture(scope="module")
def chromium():
    path = find_chromium()
    if path is None:
        pytest.skip("no chromium on PATH: install Debian's `chromium` (deps/stats.apt.txt, scripts/install.sh)")
    return path


@pytest.fixture(scope="module")
def browser(chromium, tmp_path_factory):
    b = Browser(chromium, tmp_path_factory.mktemp("profile"))
    yield b
    b.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("browse-ui")
    run_dir, rows = make_run(root, n=48)
    labels = root / "labels.csv"
    app = BrowseApp(run_dir, labels)
    server, url = start(app)
    yield url, rows, labels
    server.shutdown()
    server.server_close()
    app.close()


@pytest.fixture(autouse=True)
def fresh_console(request):
    """Each test judges the console messages of its own pages only."""
    if "browser" in request.fixturenames:
        request.getfixturevalue("browser").events.clear()


def open_page(b: Browser, url: str, ready: str) -> None:
    """Go to `url` and wait until the app has rendered that route (not the one before) and `ready` holds."""
    fragment = url.partition("#")[2]
    b.goto(url)
    b.wait_for(f"document.body.dataset.route === {json.dumps('#' + fragment if fragment else '')} && ({ready})",
               what=f"{url}: {ready}")


def errors(b: Browser) -> list[str]:
    """What the page reported as broken: exceptions, CSP violations, failed loads."""
    return [m for m in b.console() if m.startswith("error") or "Uncaught" in m or "Content Security Policy" in m]


TILES_LOADED = """(() => { const imgs = Array.from(document.querySelectorAll('.tile img')).slice(0, 8);
  return imgs.length > 0 && imgs.every(i => i.complete && i.naturalWidth > 0); })()"""
COUNT = "document.getElementById('count') && /samples match/.test(document.getElementById('count').textContent)"


def count_text(b: Browser) -> int:
    return int(b.evaluate("document.getElementById('count').textContent").split()[0].replace(",", ""))


def test_the_grid_loads_with_every_image_and_the_count(browser, site):
    url, rows, _ = site
    open_page(browser, url, f"{TILES_LOADED} && {COUNT}")
    assert count_text(browser) == len(rows)
    ids = browser.evaluate("Array.from(document.querySelectorAll('.tile')).map(t => t.dataset.id)")
    assert ids == [r["sample_id"] for r in rows]  # one page of 60 holds the 48 rows, in catalog order
    # every image of the page decodes, the undecodable ones as their placeholder (an SVG that says why)
    browser.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    browser.wait_for("Array.from(document.querySelectorAll('.tile img')).every(i => i.complete && i.naturalWidth > 0)",
                     what="every tile image")
    assert not errors(browser), errors(browser)


def test_a_filter_narrows_the_grid(browser, site):
    url, rows, _ = site
    open_page(browser, url + "#/grid", f"{TILES_LOADED} && {COUNT}")
    reason = "size:short_side<300"
    browser.wait_for("document.querySelector('select[name=reason]').dataset.ready", what="the reasons of the funnel")
    browser.evaluate(f"document.querySelector('select[name=reason]').value = {json.dumps(reason)}")
    browser.click("#apply")
    want = [r["sample_id"] for r in rows if r["reject_reason"] == reason]
    browser.wait_for(f"location.hash.includes('reason=') && {COUNT} && document.querySelectorAll('.tile').length === {len(want)}",
                     what="the filtered grid")
    assert count_text(browser) == len(want) < len(rows)
    captions = browser.evaluate("Array.from(document.querySelectorAll('.tile .cap .rej')).map(e => e.textContent)")
    assert captions == [reason] * len(want)


def test_a_funnel_bar_opens_the_grid_filtered_to_it(browser, site):
    url, rows, _ = site
    open_page(browser, url + "#/funnel", "document.getElementById('reasons-chart')")
    bars = browser.evaluate("Array.from(document.querySelectorAll('#funnel-chart a.bar-row')).map(a => a.dataset.target)")
    assert "#/grid?stage=person" in bars and "#/grid?keep=kept" in bars
    browser.click('#funnel-chart a.bar-row[data-target="#/grid?stage=person"]')
    want = sum((r["reject_reason"] or "").startswith("person:") for r in rows)
    browser.wait_for(f"location.hash === '#/grid?stage=person' && {COUNT} && document.querySelectorAll('.tile').length === {want}",
                     what="the grid of the person stage's rejections")
    assert count_text(browser) == want
    browser.goto(url + "#/funnel")
    browser.click('#reasons-chart a.bar-row[data-target="#/grid?reason=dedup%3Aexact_duplicate"]')
    browser.wait_for(f"{COUNT} && location.hash.includes('reason=dedup')", what="the grid of a reason")
    assert count_text(browser) == sum(r["reject_reason"] == "dedup:exact_duplicate" for r in rows)


def _csv_rows(path) -> list[str]:
    return path.read_text().splitlines()[1:] if path.exists() else []


def _wait_csv(path, line: str, present: bool = True, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while (line in _csv_rows(path)) != present:
        if time.monotonic() > deadline:
            raise AssertionError(f"{path}: {line!r} {'never written' if present else 'still there'}: {_csv_rows(path)}")
        time.sleep(0.1)


def test_a_sample_page_draws_its_boxes_and_labels_write_the_csv(browser, site):
    url, rows, labels = site
    r = next(r for r in rows if r["keep"] and len(r.get("person_boxes") or []) >= 3)
    open_page(browser, url + f"#/sample/{r['sample_id']}", "document.getElementById('main-img')?.dataset.ready")
    boxes = browser.evaluate("Array.from(document.querySelectorAll('#overlay rect.person-box')).map(e => e.getAttribute('stroke'))")
    assert len(boxes) == len(r["person_boxes"])
    assert boxes.count("#1a9850") == r["person_n_pass"] and boxes.count("#d73027") == len(boxes) - r["person_n_pass"]
    # the boxes lie on the image: the overlay has the image's size and the catalog's pixel frame
    frame = browser.evaluate("""(() => { const i = document.getElementById('main-img').getBoundingClientRect();
        const s = document.getElementById('overlay').getBoundingClientRect();
        return [Math.round(i.width), Math.round(i.height), Math.round(s.width), Math.round(s.height),
                document.getElementById('overlay').getAttribute('viewBox')]; })()""")
    assert frame[:2] == frame[2:4] and frame[4] == f"0 0 {r['width']} {r['height']}"
    sid = r["sample_id"]
    browser.click('#labels-panel button[data-stage="person"][data-value="1"]')  # a click
    _wait_csv(labels, f"{sid},person=1")
    browser.wait_for('document.querySelector(\'#labels-panel button[data-stage="person"][data-value="1"]\').classList.contains("on")')
    browser.key("w")  # keyboard shortcuts: w = a mark, shift+A = a photo
    _wait_csv(labels, f"{sid},watermark=1")
    browser.key("A", shift=True)
    _wait_csv(labels, f"{sid},art=0")
    browser.click('#labels-panel button[data-stage="person"][data-value="1"]')  # clicking the set label clears it
    _wait_csv(labels, f"{sid},person=1", present=False)
    from pipeline.select.calibrate import read_labels
    assert read_labels(labels) == {"watermark": {sid: 1}, "art": {sid: 0}}
    assert browser.evaluate("document.getElementById('labels-state').textContent").startswith("labels: ")
    # toggles hide and show the drawing
    browser.click('input[data-toggle="persons"]')
    browser.wait_for("document.querySelectorAll('#overlay rect.person-box').length === 0")
    assert not errors(browser), errors(browser)


def test_the_cluster_view_names_the_kept_member(browser, site):
    url, rows, _ = site
    dup = next(r for r in rows if r.get("dup_of"))
    open_page(browser, url + f"#/sample/{dup['sample_id']}", "document.getElementById('cluster-why')")
    why = browser.evaluate("document.getElementById('cluster-why').textContent")
    assert why.startswith(f"kept member {dup['dup_of']}: the canonical member")
    assert browser.evaluate("Array.from(document.querySelectorAll('#cluster .member.kept-member')).map(m => m.dataset.id)") == [dup["dup_of"]]
    members = browser.evaluate("Array.from(document.querySelectorAll('#cluster .member')).map(m => m.dataset.id)")
    assert sorted(members) == sorted([dup["sample_id"], dup["dup_of"]])
    # a member's thumbnail opens its own page
    browser.click(f'#cluster .member[data-id="{dup["dup_of"]}"] a')
    browser.wait_for(f"(document.body.dataset.route || '').startsWith('#/sample/{dup['dup_of']}')")
    assert browser.evaluate("document.querySelector('#cluster .member.current').dataset.id") == dup["dup_of"]


def test_an_unreadable_sample_shows_a_placeholder_and_its_reason(browser, site):
    url, rows, _ = site
    bad = next(r for r in rows if r["reject_reason"] == "decode:unidentified")
    open_page(browser, url + f"#/sample/{bad['sample_id']}", "document.getElementById('main-img')?.dataset.placeholder")
    note = browser.evaluate("document.getElementById('img-note').textContent")
    assert note.startswith("no image: decode error: unidentified")
    assert browser.wait_for("document.getElementById('main-img').complete && document.getElementById('main-img').naturalWidth > 0")
    open_page(browser, url + "#/sample/nosuchsample", "document.querySelector('#view .error')")
    assert "no sample" in browser.evaluate("document.querySelector('#view .error').textContent")


def test_the_grid_labels_the_focused_tile_from_the_keyboard(browser, site):
    url, rows, labels = site
    open_page(browser, url + "#/grid?keep=kept", f"{TILES_LOADED} && {COUNT}")
    browser.evaluate("document.querySelector('.tile').focus()")
    browser.key("ArrowRight")
    second = browser.evaluate("document.activeElement.dataset.id")
    assert second == [r for r in rows if r["keep"]][1]["sample_id"]
    browser.key("P", shift=True)
    _wait_csv(labels, f"{second},person=0")
    browser.wait_for("document.activeElement.querySelector('.badge.l0')")
    browser.key("Enter")
    browser.wait_for(f"(document.body.dataset.route || '').startsWith('#/sample/{second}')")
    assert browser.evaluate('document.querySelector(\'#labels-panel button[data-stage="person"][data-value="0"]\').classList.contains("on")')


def test_the_demo_run_in_the_browser(browser, demo_run, tmp_path):
    """The real curation output: persons with keypoints, text boxes and a duplicate cluster drawn."""
    run_dir, _ = demo_run
    app = BrowseApp(run_dir, tmp_path / "labels.csv")
    server, url = start(app)
    try:
        row = app.catalog.query("SELECT sample_id, len(person_boxes) AS n, len(text_det_boxes) AS t FROM samples "
                                "WHERE len(person_keypoints) > 0 AND len(text_det_boxes) > 0 ORDER BY n DESC LIMIT 1")[0]
        open_page(browser, url + f"#/sample/{row['sample_id']}", "document.getElementById('main-img')?.dataset.ready")
        assert browser.evaluate("document.querySelectorAll('#overlay rect.person-box').length") == row["n"]
        assert browser.evaluate("document.querySelectorAll('#overlay circle.keypoint').length") > 0
        assert browser.evaluate("document.querySelectorAll('#overlay polygon').length") == row["t"]
        dup = app.catalog.query("SELECT sample_id, dup_of FROM samples WHERE dup_of IS NOT NULL LIMIT 1")[0]
        open_page(browser, url + f"#/sample/{dup['sample_id']}", "document.getElementById('cluster-why')")
        assert browser.evaluate("document.querySelector('#cluster .member.kept-member').dataset.id") == dup["dup_of"]
        open_page(browser, url, f"{TILES_LOADED} && {COUNT}")
        assert count_text(browser) == app.catalog.funnel()["inputs"]
        assert not errors(browser), errors(browser)
    finally:
        server.shutdown()
        server.server_close()
        app.close()
