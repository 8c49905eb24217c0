"""HTML screenshots for the art filter's non-photo class: web pages drawn by headless Chromium.

A browser start costs about a second, so Chromium never runs per sample. Training renders a pool of pages
once (`html_pool`): each page is random HTML (nav bars, headings, paragraphs, buttons, tables, forms,
cards, sidebars, crops of the clean photos as data: URIs, random CSS colours, fonts and sizes), a pure
function of (seed, page index, photos). Several pages are laid out side by side in one window as
`<iframe srcdoc>` documents, each its own browsing context at its own viewport size, and one
`chromium --headless --screenshot` call draws them all; a few such calls run in parallel. The
screenshots are cached under OUT/html_pool/KEY/ (KEY hashes the pages' HTML, so a resume or a Ray Train
worker reuses them), and the `html` family then crops, resizes and (with every family) JPEG re-encodes
them: a pure function of (seed, sample index), like the other generators.

Nothing touches the network: pages reference only data: URIs, carry a Content-Security-Policy that
forbids any other load, and Chromium runs with background networking off and every host name
unresolvable. Without Chromium on PATH the family is left out with one warning, and the card says so.
"""
from __future__ import annotations

import base64
import hashlib
import html
import io
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

import catalog

from .filter_text import name, sentence

log = logging.getLogger(__name__)

POOL_FORMAT = "humanset-html-pool/1"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
INSTALL_HINT = "install Debian's `chromium` package (apt-get install chromium; listed in deps/stats.apt.txt)"
# viewports of desktop, laptop, tablet and phone browsers
WINDOWS = ((1280, 800), (1366, 768), (1024, 768), (800, 600), (768, 1024), (412, 915))
FONTS = ("DejaVu Sans", "DejaVu Serif", "DejaVu Sans Mono", "Liberation Sans", "Liberation Serif", "Noto Sans",
         "Arial", "Helvetica", "Georgia", "Times New Roman", "Verdana", "Courier New")
GENERIC = ("sans-serif", "serif", "monospace", "system-ui")
# a page may load nothing but its own inline styles and data: images
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; font-src data:"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-default-apps", "--disable-extensions",
         "--no-first-run", "--no-default-browser-check", "--disable-dev-shm-usage", "--mute-audio",
         "--hide-scrollbars", "--force-device-scale-factor=1", "--host-resolver-rules=MAP * ~NOTFOUND",
         "--proxy-server=127.0.0.1:9", "--virtual-time-budget=5000")
VALIDATION_EVERY = 5  # page i is a validation page when i % 5 == 0 (drawn from the validation photos)
BATCH_PAGES = 6  # pages per Chromium call (one window)
TIMEOUT_S = 180


class NoChromium(FileNotFoundError):
    """The pool is not cached and no Chromium is on PATH to render it."""


def find_chromium() -> str | None:
    for n in CHROMIUM_NAMES:
        if shutil.which(n):
            return shutil.which(n)
    return None


def is_validation_page(index: int) -> bool:
    return index % VALIDATION_EVERY == 0


# --- page HTML: pure functions of (seed, index, photos) ---------------------------------------------
def _hsl(h: float, s: float, lum: float) -> str:
    return f"hsl({h % 360:.0f},{s:.0f}%,{lum:.0f}%)"


def _words(rng, lo: int, hi: int) -> str:
    return html.escape(sentence(rng, int(rng.integers(lo, hi + 1))))


def _title(rng, lo: int = 1, hi: int = 4) -> str:
    return _words(rng, lo, hi).title()


def _image_uri(photos: list[np.ndarray], rng, w: int, h: int) -> str:
    """A crop of a clean photo with the box's aspect, w x h, as a JPEG data: URI."""
    photo = photos[int(rng.integers(len(photos)))]
    ph, pw = photo.shape[:2]
    aspect = w / h
    cw = min(pw, ph * aspect) * np.sqrt(rng.uniform(.3, 1.0))
    ch = cw / aspect
    x, y = rng.uniform(0, pw - cw), rng.uniform(0, ph - ch)
    crop = photo[int(y):int(y + ch) + 1, int(x):int(x + cw) + 1]
    crop = cv2.resize(np.ascontiguousarray(crop), (w, h), interpolation=cv2.INTER_AREA)
    buf = io.BytesIO()
    Image.fromarray(crop).save(buf, "JPEG", quality=int(rng.integers(70, 90)))
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def _img(photos, rng, w: int, h: int, cls: str = "") -> str:
    return f'<img class="{cls}" width="{w}" height="{h}" alt="" src="{_image_uri(photos, rng, w, h)}">'


def _nav(rng, photos) -> str:
    links = "".join(f"<a href='#'>{_title(rng, 1, 2)}</a>" for _ in range(int(rng.integers(3, 7))))
    search = "<input type='search' placeholder='Search'>" if rng.random() < .5 else ""
    logo = _img(photos, rng, 36, 36, "logo") if rng.random() < .3 else ""
    return f"<header class='top'><div class='brand'>{logo}{html.escape(name(rng).title())}</div>" \
           f"<nav>{links}</nav>{search}</header>"


def _hero(rng, photos, width: int) -> str:
    buttons = "".join(f"<button class='{c}'>{_title(rng, 1, 2)}</button>"
                      for c in ("btn", "btn alt")[:int(rng.integers(1, 3))])
    inner = f"<h1>{_title(rng, 2, 6)}</h1><p>{_words(rng, 8, 20)}</p>{buttons}"
    if rng.random() < .5:
        return f"<section class='hero split'><div>{inner}</div>{_img(photos, rng, width // 3, width // 5)}</section>"
    return f"<section class='hero'>{inner}</section>"


def _article(rng, photos, width: int) -> str:
    parts = [f"<h2>{_title(rng, 2, 7)}</h2>", f"<p class='meta'>{_words(rng, 3, 6)}</p>"]
    for _ in range(int(rng.integers(2, 6))):
        r = rng.random()
        if r < .2:
            w = int(width * rng.uniform(.3, .6))
            parts.append(f"<figure>{_img(photos, rng, w, int(w * rng.uniform(.5, .8)))}"
                         f"<figcaption>{_words(rng, 4, 10)}</figcaption></figure>")
        elif r < .3:
            parts.append(f"<blockquote>{_words(rng, 10, 25)}</blockquote>")
        elif r < .45:
            parts.append("<ul>" + "".join(f"<li>{_words(rng, 3, 9)}</li>" for _ in range(int(rng.integers(3, 6))))
                         + "</ul>")
        else:
            parts.append(f"<p>{_words(rng, 25, 70)}</p>")
    return "<article>" + "".join(parts) + "</article>"


def _cards(rng, photos, width: int) -> str:
    n = int(rng.integers(2, 7))
    w = max(80, int(width / min(n, 3) * .8))
    cards = "".join(f"<div class='card'>{_img(photos, rng, w, int(w * .6)) if rng.random() < .8 else ''}"
                    f"<h3>{_title(rng, 1, 4)}</h3><p>{_words(rng, 6, 18)}</p>"
                    f"<button class='btn'>{_title(rng, 1, 2)}</button></div>" for _ in range(n))
    return f"<section><h2>{_title(rng, 1, 4)}</h2><div class='cards'>{cards}</div></section>"


def _table(rng) -> str:
    cols = int(rng.integers(3, 6))
    head = "".join(f"<th>{_title(rng, 1, 2)}</th>" for _ in range(cols))

    def cell(j):
        if j == 0:
            return _title(rng, 1, 3)
        return f"{rng.uniform(0, 999):.2f}" if rng.random() < .5 else str(int(rng.integers(0, 10 ** 5)))
    rows = "".join("<tr>" + "".join(f"<td>{cell(j)}</td>" for j in range(cols)) + "</tr>"
                   for _ in range(int(rng.integers(3, 12))))
    return f"<section><h2>{_title(rng, 1, 4)}</h2><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody>" \
           f"</table></section>"


def _form(rng) -> str:
    fields = []
    for _ in range(int(rng.integers(2, 6))):
        kind = int(rng.integers(4))
        label = f"<label>{_title(rng, 1, 3)}</label>"
        if kind == 0:
            fields.append(label + f"<input type='text' value='{_words(rng, 1, 3)}'>")
        elif kind == 1:
            opts = "".join(f"<option>{_title(rng, 1, 2)}</option>" for _ in range(3))
            fields.append(label + f"<select>{opts}</select>")
        elif kind == 2:
            fields.append(label + f"<textarea rows='3'>{_words(rng, 0, 12)}</textarea>")
        else:
            fields.append(f"<label class='check'><input type='checkbox'{' checked' if rng.random() < .5 else ''}>"
                          f" {_words(rng, 2, 6)}</label>")
    return f"<section class='form'><h2>{_title(rng, 1, 4)}</h2><form>{''.join(fields)}" \
           f"<button class='btn' type='button'>{_title(rng, 1, 2)}</button></form></section>"


def _sidebar(rng, photos, width: int) -> str:
    links = "".join(f"<li><a href='#'>{_title(rng, 1, 4)}</a></li>" for _ in range(int(rng.integers(3, 9))))
    box = f"<div class='box'><h4>{_title(rng, 1, 3)}</h4><p>{_words(rng, 8, 20)}</p></div>"
    ad = _img(photos, rng, max(60, width - 24), max(40, int((width - 24) * rng.uniform(.5, 1.2)))) \
        if rng.random() < .5 else ""
    return f"<aside><h3>{_title(rng, 1, 3)}</h3><ul>{links}</ul>{box}{ad}</aside>"


def _footer(rng) -> str:
    links = " &middot; ".join(f"<a href='#'>{_title(rng, 1, 2)}</a>" for _ in range(int(rng.integers(2, 6))))
    return f"<footer>{links}<br>&copy; {int(rng.integers(1998, 2027))} {html.escape(name(rng).title())}</footer>"


def _css(rng) -> str:
    hue = rng.uniform(0, 360)
    dark = rng.random() < .2
    bg = _hsl(hue, rng.uniform(0, 30), rng.uniform(8, 18) if dark else rng.uniform(92, 100))
    fg = _hsl(hue, rng.uniform(0, 20), rng.uniform(85, 95) if dark else rng.uniform(5, 30))
    accent = _hsl(hue + rng.choice([0, 30, 150, 180, 210]), rng.uniform(40, 90), rng.uniform(30, 55))
    accent2 = _hsl(hue + rng.uniform(60, 300), rng.uniform(30, 80), rng.uniform(40, 65))
    surface = _hsl(hue, rng.uniform(5, 40), rng.uniform(18, 26) if dark else rng.uniform(86, 97))
    fonts = [f"'{FONTS[int(i)]}'" for i in rng.choice(len(FONTS), 2, replace=False)]
    body_font = f"{fonts[0]}, {GENERIC[int(rng.integers(len(GENERIC)))]}"
    head_font = f"{fonts[1]}, {GENERIC[int(rng.integers(len(GENERIC)))]}"
    size = int(rng.integers(12, 19))
    radius = int(rng.choice([0, 2, 4, 8, 16, 24]))
    header_bg = accent if rng.random() < .5 else surface
    header_fg = "#fff" if header_bg == accent else fg
    shadow = "0 2px 8px rgba(0,0,0,.25)" if rng.random() < .5 else "none"
    return f"""*{{box-sizing:border-box}}
html,body{{margin:0;overflow:hidden}}
body{{background:{bg};color:{fg};font-family:{body_font};font-size:{size}px;line-height:{rng.uniform(1.2, 1.8):.2f}}}
h1,h2,h3,h4{{font-family:{head_font};margin:.4em 0;{'text-transform:uppercase;' if rng.random() < .15 else ''}}}
h1{{font-size:{rng.uniform(1.8, 3.4):.2f}em}} h2{{font-size:{rng.uniform(1.3, 2.0):.2f}em}}
a{{color:{accent};text-decoration:{'underline' if rng.random() < .5 else 'none'}}}
.top{{display:flex;align-items:center;gap:{int(rng.integers(8, 30))}px;padding:{int(rng.integers(6, 20))}px \
{int(rng.integers(10, 40))}px;background:{header_bg};color:{header_fg};flex-wrap:wrap}}
.top a{{color:{header_fg};margin-right:{int(rng.integers(8, 24))}px}}
.brand{{font-weight:bold;font-size:{rng.uniform(1.2, 2):.2f}em;display:flex;align-items:center;gap:6px}}
.logo{{border-radius:50%}} input,select,textarea{{font:inherit;padding:4px 6px;border:1px solid {accent2};\
border-radius:{radius // 2}px;width:100%;max-width:360px;display:block;margin:2px 0 10px;\
background:{surface};color:{fg}}}
.top input{{width:auto;margin:0 0 0 auto}} .check input{{display:inline;width:auto}}
.btn{{background:{accent};color:#fff;border:0;border-radius:{radius}px;padding:{int(rng.integers(5, 12))}px \
{int(rng.integers(10, 26))}px;font:inherit;font-weight:bold;margin:4px 6px 4px 0}}
.btn.alt{{background:transparent;color:{accent};border:2px solid {accent}}}
.hero{{padding:{int(rng.integers(16, 60))}px {int(rng.integers(16, 60))}px;\
background:{accent2 if rng.random() < .5 else surface}}}
.hero.split{{display:flex;gap:20px;align-items:center}}
.wrap{{display:flex;gap:{int(rng.integers(10, 40))}px;padding:{int(rng.integers(8, 30))}px;\
max-width:{int(rng.integers(900, 1400))}px;margin:0 auto;flex-direction:{'row-reverse' if rng.random() < .3 else 'row'}}}
main{{flex:1;min-width:0}} aside{{width:{int(rng.integers(160, 300))}px;flex:none;background:{surface};padding:12px;\
border-radius:{radius}px}}
.cards{{display:grid;grid-template-columns:repeat(auto-fill,minmax({int(rng.integers(140, 260))}px,1fr));gap:14px}}
.card{{background:{surface};border-radius:{radius}px;padding:10px;box-shadow:{shadow};overflow:hidden}}
.card img,figure img,aside img{{max-width:100%;height:auto;display:block;border-radius:{radius // 2}px}}
table{{border-collapse:collapse;width:100%}} th{{background:{accent};color:#fff;text-align:left}}
th,td{{padding:{int(rng.integers(3, 10))}px 8px;border-bottom:1px solid {accent2}}}
tbody tr:nth-child(even){{background:{surface}}}
blockquote{{border-left:4px solid {accent};margin:8px 0;padding:4px 12px;font-style:italic}}
.meta{{opacity:.7;font-size:.85em}} figure{{margin:10px 0}} figcaption{{font-size:.8em;opacity:.8}}
footer{{padding:16px 30px;background:{surface};font-size:.85em;margin-top:20px}}
.box{{border:1px solid {accent2};padding:8px;margin:10px 0;border-radius:{radius}px}}"""


def page_html(seed: int, index: int, photos: list[np.ndarray]) -> tuple[str, tuple[int, int]]:
    """The HTML of pool page `index` and its window (width, height): a pure function of its arguments."""
    if not photos:
        raise ValueError("no photos to cut the pages' images from")
    rng = np.random.default_rng([seed, index, 0x48544D4C])
    w, h = WINDOWS[int(rng.integers(len(WINDOWS)))]
    css = _css(rng)
    side = w >= 700 and rng.random() < .5
    main_w = int(w * (.65 if side else .9))
    blocks = [_nav(rng, photos)]
    if rng.random() < .5:
        blocks.append(_hero(rng, photos, w))
    content = []
    for _ in range(int(rng.integers(2, 5))):
        kind = rng.choice(["article", "article", "cards", "table", "form"])
        content.append(_article(rng, photos, main_w) if kind == "article" else _cards(rng, photos, main_w)
                       if kind == "cards" else _table(rng) if kind == "table" else _form(rng))
    aside = _sidebar(rng, photos, int(w * .22)) if side else ""
    blocks.append(f"<div class='wrap'><main>{''.join(content)}</main>{aside}</div>")
    if rng.random() < .5:
        blocks.append(_footer(rng))
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\"><title>{_title(rng)}</title>"
            f"<style>{css}</style></head><body>{''.join(blocks)}</body></html>")
    return page, (w, h)


def window_html(pages: list[tuple[str, tuple[int, int]]]) -> tuple[str, tuple[int, int], list[tuple[int, int]]]:
    """Pages stacked in one window as iframes (each its own document at its own viewport):
    (HTML, window size, top-left corner of each page)."""
    width = max(w for _, (w, _h) in pages)
    frames, corners, y = [], [], 0
    for page, (w, h) in pages:
        frames.append(f"<iframe scrolling='no' style='position:absolute;left:0;top:{y}px;width:{w}px;height:{h}px;"
                      f"border:0' srcdoc=\"{html.escape(page, quote=True)}\"></iframe>")
        corners.append((0, y))
        y += h
    doc = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><meta http-equiv='Content-Security-Policy' "
           f"content=\"{CSP}\"><style>html,body{{margin:0;background:#000;overflow:hidden}}</style></head>"
           f"<body>{''.join(frames)}</body></html>")
    return doc, (width, y), corners


# --- rendering (touches Chromium and the file system) ------------------------------------------------
def screenshot_window(chromium: str, doc: str, size: tuple[int, int], workdir: Path) -> np.ndarray:
    """One headless Chromium call: the window's screenshot, RGB uint8 (H, W, 3). Raises with Chromium's
    own words when it fails."""
    workdir.mkdir(parents=True, exist_ok=True)
    page, png = workdir / "window.html", workdir / "window.png"
    page.write_text(doc, encoding="utf-8")
    cmd = [chromium, *FLAGS, f"--user-data-dir={workdir / 'profile'}", f"--window-size={size[0]},{size[1]}",
           f"--screenshot={png}", page.as_uri()]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    if not png.is_file():
        tail = " | ".join(line for line in p.stderr.splitlines()[-6:] if "dbus" not in line)
        raise RuntimeError(f"chromium drew no screenshot (exit {p.returncode}): {tail[-600:]}")
    rgb = np.asarray(Image.open(png).convert("RGB"))
    if rgb.shape[:2] != (size[1], size[0]):
        raise RuntimeError(f"chromium drew {rgb.shape[1]}x{rgb.shape[0]}, not the {size[0]}x{size[1]} window asked for")
    return rgb


@dataclass
class HtmlPool:
    """Screenshots of the pool's pages for training and for validation; `info` goes into the card."""
    train: list = field(default_factory=list)
    val: list = field(default_factory=list)
    info: dict = field(default_factory=dict)

    @property
    def available(self) -> bool:
        return bool(self.train) and bool(self.val)


def pool_key(pages: list[tuple[str, tuple[int, int]]]) -> str:
    h = hashlib.sha256(json.dumps([POOL_FORMAT, FLAGS, BATCH_PAGES]).encode())
    for page, size in pages:
        h.update(f"{size}".encode())
        h.update(page.encode())
    return h.hexdigest()[:16]


def _shrink(rgb: np.ndarray, max_side: int | None) -> np.ndarray:
    if max_side and max(rgb.shape[:2]) > max_side:
        f = max_side / max(rgb.shape[:2])
        rgb = cv2.resize(rgb, (max(8, round(rgb.shape[1] * f)), max(8, round(rgb.shape[0] * f))),
                         interpolation=cv2.INTER_AREA)
    return rgb


def render_pool(folder, n_pages: int, seed: int, train_photos: list[np.ndarray], val_photos: list[np.ndarray],
                chromium: str | None = None, processes: int = 0, max_side: int | None = None) -> HtmlPool:
    """Render (or reuse from FOLDER/KEY/) `n_pages` screenshots. Page i is drawn from the validation photos
    when i % 5 == 0, from the training photos otherwise. Returns the pool shrunk to `max_side`."""
    if n_pages < 2:
        raise ValueError(f"html_pages {n_pages}: 0 (no HTML screenshots) or at least 2")
    pages = [page_html(seed, i, val_photos if is_validation_page(i) else train_photos) for i in range(n_pages)]
    key = pool_key(pages)
    cache = Path(folder) / key
    marker = cache / "pool.json"
    t0 = time.perf_counter()
    if marker.is_file():
        meta = catalog.read_json(marker)
        reused = True
    else:
        chromium = chromium or find_chromium()
        if not chromium:
            raise NoChromium(f"no chromium on PATH ({', '.join(CHROMIUM_NAMES)})")
        meta = _render(cache, pages, chromium, processes)
        reused = False
    train, val = [], []
    for entry in meta["pages"]:
        rgb = _shrink(np.asarray(Image.open(cache / entry["file"]).convert("RGB")), max_side)
        (val if is_validation_page(entry["index"]) else train).append(rgb)
    info = {"available": bool(train) and bool(val), "pages": len(meta["pages"]), "train_pages": len(train),
            "validation_pages": len(val), "failed_pages": meta["failed"], "cache": f"{Path(folder).name}/{key}",
            "reused": reused, "render_seconds": meta["seconds"], "chromium": meta["chromium"],
            "windows": sorted({tuple(e["window"]) for e in meta["pages"]}), "load_seconds": time.perf_counter() - t0}
    if not info["available"]:
        info["reason"] = (f"{len(train)} training and {len(val)} validation pages rendered of {n_pages}: "
                          f"a split is empty")
    return HtmlPool(train, val, info)


def _render(cache: Path, pages, chromium: str, processes: int) -> dict:
    t0 = time.perf_counter()
    batches = [list(range(i, min(i + BATCH_PAGES, len(pages)))) for i in range(0, len(pages), BATCH_PAGES)]
    processes = processes or min(len(batches), max(1, min(4, os.cpu_count() or 1)))
    log.info("art: rendering %d HTML pages with headless Chromium (%d windows, %d at a time) into %s",
             len(pages), len(batches), processes, cache)
    cache.mkdir(parents=True, exist_ok=True)
    failed: list[int] = []

    def one(batch: list[int]) -> list[dict]:
        doc, size, corners = window_html([pages[i] for i in batch])
        with tempfile.TemporaryDirectory(prefix="hs-chromium-") as tmp:
            try:
                shot = screenshot_window(chromium, doc, size, Path(tmp))
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:  # one bad window never stops the run
                log.warning("art: HTML pages %d-%d not rendered, left out: %s", batch[0], batch[-1], e)
                failed.extend(batch)
                return []
        out = []
        for i, (x, y) in zip(batch, corners):
            w, h = pages[i][1]
            rgb = shot[y:y + h, x:x + w]
            if float(rgb.std()) < 2.0:  # a blank page: Chromium painted nothing
                log.warning("art: HTML page %d rendered blank, left out", i)
                failed.append(i)
                continue
            file = f"page-{i:04d}.png"
            with catalog.atomic_path(cache / file) as tmp_png:
                Image.fromarray(rgb).save(tmp_png, "PNG")
            out.append({"index": i, "file": file, "window": [w, h]})
        return out

    with ThreadPoolExecutor(processes) as pool:  # each thread waits on its own Chromium process
        done = [e for batch in pool.map(one, batches) for e in batch]
    version = ""
    try:
        version = subprocess.run([chromium, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    meta = {"format": POOL_FORMAT, "pages": sorted(done, key=lambda e: e["index"]), "failed": sorted(failed),
            "seconds": round(time.perf_counter() - t0, 2), "chromium": version}
    if done:  # the marker is written last: a pool without it is rendered again
        catalog.write_json(cache / "pool.json", meta)
    log.info("art: %d HTML screenshots in %.1f s%s", len(done), meta["seconds"],
             f" ({len(failed)} failed)" if failed else "")
    return meta


def html_pool(folder, n_pages: int, seed: int, train_photos, val_photos, max_side: int | None = None,
              warn: bool = True) -> HtmlPool:
    """The art filter's screenshot pool (from the cache when there is one: a resume, a Ray Train worker),
    or an unavailable one with its reason, warned once, when html_pages is 0, no cache and no Chromium,
    or Chromium draws nothing."""
    if n_pages <= 0:
        return HtmlPool(info={"available": False, "reason": "html_pages=0: HTML screenshots turned off"})
    try:
        pool = render_pool(folder, n_pages, seed, train_photos, val_photos, max_side=max_side)
    except NoChromium as e:
        if warn:
            log.warning("art: %s: the 'html' family (web-page screenshots) is LEFT OUT of training; %s",
                        e, INSTALL_HINT)
        return HtmlPool(info={"available": False, "reason": f"{e}; {INSTALL_HINT}"})
    if pool.info.get("reused"):
        log.info("art: %d HTML screenshots reused from %s", pool.info["pages"],
                 Path(folder) / Path(pool.info["cache"]).name)
    if not pool.available and warn:
        log.warning("art: the 'html' family is LEFT OUT of training: %s", pool.info["reason"])
    return pool


# --- the family: a view of a pool page ---------------------------------------------------------------
def screenshot(rgb: np.ndarray, rng, pages: list[np.ndarray]) -> np.ndarray:
    """A view of a pool screenshot the size of `rgb`: the whole page squashed (as the stage squashes a
    screenshot) or a crop of 15-100 % of it with `rgb`'s aspect; never mirrored (text reads one way)."""
    h, w = rgb.shape[:2]
    page = pages[int(rng.integers(len(pages)))]
    ph, pw = page.shape[:2]
    if rng.random() < .3:
        crop = page
    else:
        aspect = w / h
        cw = min(pw, ph * aspect) * np.sqrt(rng.uniform(.15, 1.0))
        ch = cw / aspect
        x, y = int(rng.uniform(0, pw - cw + 1)), int(rng.uniform(0, ph - ch + 1))
        crop = page[y:y + max(8, int(ch)), x:x + max(8, int(cw))]
    shrink = crop.shape[0] * crop.shape[1] > h * w
    return cv2.resize(np.ascontiguousarray(crop), (w, h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_CUBIC)
