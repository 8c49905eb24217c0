"""Random web pages for the art filter's `html` family: the HTML only, pure functions of (seed, page index,
photos). training/filters/browser.py has Chromium screenshot them. Every page loads nothing but its own inline
CSS and data: images (its Content-Security-Policy forbids the rest)."""
from __future__ import annotations

import base64
import html
import io

import cv2
import numpy as np
from PIL import Image

from training.filters.lettering import name, sentence

# viewports of desktop, laptop, tablet and phone browsers
WINDOWS = ((1280, 800), (1366, 768), (1024, 768), (800, 600), (768, 1024), (412, 915))
FONTS = ("DejaVu Sans", "DejaVu Serif", "DejaVu Sans Mono", "Liberation Sans", "Liberation Serif", "Noto Sans",
         "Arial", "Helvetica", "Georgia", "Times New Roman", "Verdana", "Courier New")
GENERIC = ("sans-serif", "serif", "monospace", "system-ui")
# a page may load nothing but its own inline styles and data: images
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; font-src data:"


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
