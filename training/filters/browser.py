"""HTML screenshots for the art filter's non-photo class: web pages drawn by headless Chromium.

A browser start costs about a second, so Chromium never runs per sample. Training renders a pool of pages
once (`html_pool`): each page is random HTML from training/filters/pages.py (nav bars, headings,
paragraphs, buttons, tables, forms, cards, sidebars, crops of the clean photos as data: URIs, random CSS
colours, fonts and sizes), a pure function of (seed, page index, photos). Six pages are stacked in one window as
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

import hashlib
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

from training.filters.pages import page_html, window_html

log = logging.getLogger(__name__)

POOL_FORMAT = "humanset-html-pool/1"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
INSTALL_HINT = "install Debian's `chromium` package (apt-get install chromium; listed in deps/stats.apt.txt)"
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
