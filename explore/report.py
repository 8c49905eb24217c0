"""A self-contained HTML report of a curation run: charts and thumbnails embedded as base64.

    from explore.report import write_report
    write_report("runs/demo", "runs/demo/report.html")

Numbers come from explore.stats (DuckDB over the run's Parquet); histograms are binned in SQL, so
the report of a billion-row catalog costs a few scans, not a copy of it. Thumbnails are decoded
from the stored bytes: kept samples from the curated shards, rejected ones from their sources.

Size: one concern, the report: its charts, thumbnails and HTML, in the order a page is built.
"""
from __future__ import annotations

import base64
import functools
import html
import io
import time
from pathlib import Path

from catalog.io import write_bytes
from catalog.rules import PERSON_BOX, PERSON_SCORE
from catalog.shards import read_member
from catalog.source_bytes import read_source
from catalog.storage import is_uri
from catalog.tars import IMAGE_EXTS
from explore import stats as st
from explore.person_rule import box_verdicts, describe

# ----------------------------------------------------------------------------------------------------
# The report's charts, drawn with matplotlib's object API (no pyplot, no global state) and embedded
# as base64 PNG; their labels are drawn as literal text (never parsed as mathtext).

KEEP_COLOR, FAIL_COLOR, UNKNOWN_COLOR = "#1a9850", "#d73027", "#fdae61"


def _literal_text(chart):
    """Draw every label as plain text: reasons and names come from data, and matplotlib would parse
    `$...$` in them as mathtext (and fail on `$x^$`). Tick labels are made at draw time, so the
    setting covers the whole chart function, savefig included."""
    @functools.wraps(chart)
    def wrapped(*args, **kwargs):
        import matplotlib

        with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
            return chart(*args, **kwargs)
    return wrapped


def new_figure(w=7.0, h=3.2):
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), dpi=100, layout="constrained")


def png_base64(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode()


@_literal_text
def funnel_chart(funnel: list[dict]) -> str:
    rows = [f for f in funnel if not f.get("skipped")]
    fig = new_figure(7, 0.45 * len(rows) + 1)
    ax = fig.subplots()
    names = [f["stage"] for f in rows][::-1]
    counts = [f["count"] for f in rows][::-1]
    bars = ax.barh(names, counts)
    for b, f in zip(bars, rows[::-1]):
        b.set_color(KEEP_COLOR if f["stage"] == "kept" else "#4575b4")
        ax.annotate(f" {f['count']:,} ({f['pct']:.1f}%)", (b.get_width(), b.get_y() + b.get_height() / 2),
                    va="center", fontsize=8)
    ax.set_xlim(0, max(counts + [1]) * 1.3)
    ax.set_xlabel("samples left after the stage")
    ax.set_title("Funnel")
    return png_base64(fig)


@_literal_text
def bar_chart(labels: list[str], values: list[int], title: str, xlabel: str, color="#d73027",
              horizontal=True) -> str:
    fig = new_figure(7, 0.35 * len(labels) + 1.2 if horizontal else 3.2)
    ax = fig.subplots()
    if horizontal:
        bars = ax.barh(labels[::-1], values[::-1], color=color)
        for b, v in zip(bars, values[::-1]):
            ax.annotate(f" {v:,}", (b.get_width(), b.get_y() + b.get_height() / 2), va="center", fontsize=8)
        ax.set_xlim(0, max(values + [1]) * 1.2)
        ax.set_xlabel(xlabel)
    else:
        bars = ax.bar(labels, values, color=color)
        for b, v in zip(bars, values):
            ax.annotate(f"{v:,}", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom",
                        fontsize=8)
        ax.set_ylim(0, max(values + [1]) * 1.15)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("images")
    ax.set_title(title)
    return png_base64(fig)


@_literal_text
def histogram_chart(hist: dict, title: str, xlabel: str, threshold=None, keep_side=None) -> str:
    """A histogram from SQL-binned counts; the active threshold is drawn and the rejected side shaded."""
    fig = new_figure(4.6, 2.8)
    ax = fig.subplots()
    edges, counts = hist["edges"], hist["counts"]
    if counts:
        ax.stairs(counts, edges, fill=True, color="#4575b4", alpha=0.8)
    if threshold is not None:
        ax.axvline(threshold, color=FAIL_COLOR, lw=2, label=f"threshold {threshold:g} (kept {keep_side})")
        lo, hi = (edges[0], edges[-1]) if edges else (threshold, threshold)
        if keep_side in (">", ">="):  # a minimum: the rejected side is below
            ax.axvspan(min(lo, threshold), threshold, color=FAIL_COLOR, alpha=0.08)
        else:
            ax.axvspan(threshold, max(hi, threshold), color=FAIL_COLOR, alpha=0.08)
        ax.legend(fontsize=7, loc="upper center")
    clipped = f" ({hist['clipped']:,} outside the range, in the edge bins)" if hist.get("clipped") else ""
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel + clipped, fontsize=8)
    ax.set_ylabel("count", fontsize=8)
    ax.tick_params(labelsize=7)
    return png_base64(fig)


# ----------------------------------------------------------------------------------------------------
THUMB_PX = 200


# --- charts (matplotlib's object API: no pyplot, no global state) ------------------------------


# --- thumbnails ------------------------------------------------------------------------------

def thumbnail(data: bytes, row: dict, person: dict) -> str:
    """JPEG thumbnail (base64) with person boxes: green passes the person rule, red does not, amber
    where the catalog cannot say (explore.person_rule.box_verdicts)."""
    from PIL import Image, ImageDraw, ImageOps

    img = Image.open(io.BytesIO(data))
    full_width = row.get("width")  # boxes are in these pixels (after EXIF orientation)
    if full_width and img.format == "JPEG":
        img.draft("RGB", (THUMB_PX * 2, THUMB_PX * 2))  # decode at reduced size: much faster
    img = ImageOps.exif_transpose(img).convert("RGB")
    full_width = full_width or img.width
    img.thumbnail((THUMB_PX, THUMB_PX))
    scale = img.width / full_width
    draw = ImageDraw.Draw(img)
    for box, passes in zip(row.get("person_boxes") or [], box_verdicts(row, person)):
        if box is None:
            continue
        color = KEEP_COLOR if passes else FAIL_COLOR if passes is False else UNKNOWN_COLOR
        draw.rectangle([v * scale for v in box], outline=color, width=2)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=80)
    return base64.b64encode(buf.getvalue()).decode()


def _tile(row: dict, data_fn, person: dict) -> str:
    caption = html.escape(f"{row.get('key') or row['sample_id']}"
                          + (f" {row['width']}x{row['height']}" if row.get("width") else "")
                          + (f" persons {row['person_n_pass']}/{row['n_persons']}"
                             if row.get("n_persons") is not None else ""))
    detail = html.escape(row.get("reject_reason") or "")
    try:
        if row.get("decode_error"):  # the curation could not decode it either: say why, do not retry
            raise ValueError(row["decode_error"])
        b64 = thumbnail(data_fn(), row, person)
        body = f'<img alt="{caption}" src="data:image/jpeg;base64,{b64}">'
    except Exception as e:  # undecodable or missing bytes are shown as text, never as a broken image
        why = f"decode error: {e}" if row.get("decode_error") else f"{type(e).__name__}: {e}"
        body = f'<div class="noimg">{html.escape(why[:200])}</div>'
    return (f'<figure title="{html.escape(row.get("source_uri") or "")}">{body}'
            f'<figcaption>{caption}<br><b>{detail}</b></figcaption></figure>')


class SourceReader:
    """read_source that stops asking a remote store whose first failure was slow (no network, no
    credentials): one timeout per store instead of one per thumbnail. Missing files fail fast and
    are not held against their store."""

    slow_failure_s = 2.0

    def __init__(self):
        self.dead: dict[str, str] = {}

    def __call__(self, uri: str) -> bytes:
        from urllib.parse import urlsplit

        u = urlsplit(uri) if is_uri(uri) else None
        root = f"{u.scheme}://{u.netloc}" if u else None
        if root in self.dead:
            raise FileNotFoundError(f"not read, {root} failed before: {self.dead[root]}")
        t0 = time.monotonic()
        try:
            return read_source(uri)
        except FileNotFoundError as e:
            if root and time.monotonic() - t0 >= self.slow_failure_s:
                self.dead[root] = str(e)
            raise


def _row_dicts(cur) -> list[dict]:
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


SAMPLE_COLS = ("s.sample_id, s.key, s.source_uri, s.width, s.height, s.decode_error, s.reject_reason, s.n_persons, "
               "s.person_n_pass, s.person_boxes, s.person_scores, s.resolution_scale")


def kept_sheet(con, run: Path, n: int, seed: int, person: dict, read=read_source) -> str:
    """Random kept samples, bytes read from the curated shards through the index offsets."""
    if not st.has_view(con, "shards"):
        rows = _row_dicts(con.execute(
            f"SELECT {SAMPLE_COLS} FROM samples s WHERE keep ORDER BY hash(s.sample_id, ?) LIMIT ?", [seed, n]))
        return "".join(_tile(r, lambda r=r: read(r["source_uri"]), person) for r in rows)
    rows = _row_dicts(con.execute(f"""
        SELECT {SAMPLE_COLS}, x.shard AS curated_shard, x.members
        FROM shards x LEFT JOIN samples s ON s.sample_id = x.sample_id
        ORDER BY hash(x.sample_id, ?) LIMIT ?""", [seed, n]))

    def data(r):
        m = next((m for m in r["members"] if m["name"].rsplit(".", 1)[-1].lower() in IMAGE_EXTS), None)
        if m is None:
            raise FileNotFoundError(f"{r['curated_shard']}: no image member for {r['sample_id']}")
        if isinstance(run, str):  # a run on an object store: one ranged read
            from catalog.storage import storage_for
            return storage_for(run).read_range(f"shards/{r['curated_shard']}", m["offset"], m["size"])
        return read_member(run / "shards" / r["curated_shard"], m["offset"], m["size"])

    return "".join(_tile(r, lambda r=r: data(r), person) for r in rows)


def rejected_sheets(con, n: int, seed: int, person: dict, max_reasons: int,
                    read=read_source) -> list[tuple[str, int, str]]:
    """(reason, rejected count, tiles html) for the most common reasons, random samples of each.

    One scan keeps the n smallest hash(sample_id, seed) per raw reason (no sort of all rejected
    rows); raw reasons are then merged into kinds, and a second scan fetches the chosen rows.
    """
    picks: dict[str, list] = {}
    counts: dict[str, int] = {}
    for reason, count, top in con.execute("""
            SELECT reject_reason, count(*), min_by({'h': hash(sample_id, ?), 'id': sample_id}, hash(sample_id, ?), ?)
            FROM samples WHERE reject_reason IS NOT NULL GROUP BY 1""", [seed, seed, max(n, 1)]).fetchall():
        kind = st.reason_kind(reason)
        counts[kind] = counts.get(kind, 0) + count
        picks[kind] = sorted(picks.get(kind, []) + list(top), key=lambda x: x["h"])[:n]
    kinds = sorted(counts, key=lambda k: (-counts[k], k))[:max_reasons]
    ids = [x["id"] for k in kinds for x in picks[k]]
    rows = {r["sample_id"]: r for r in _row_dicts(con.execute(
        f"SELECT {SAMPLE_COLS} FROM samples s WHERE s.sample_id IN (SELECT unnest(?::VARCHAR[]))", [ids]))} \
        if ids else {}
    return [(k, counts[k], "".join(_tile(rows[x["id"]], lambda r=rows[x["id"]]: read(r["source_uri"]), person)
                                   for x in picks[k] if x["id"] in rows))
            for k in kinds]


# --- HTML ------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px} h2{font-size:18px;border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:32px}
table{border-collapse:collapse;font-size:13px;margin:8px 0} td,th{border:1px solid #ddd;padding:3px 8px}
td.n{text-align:right;font-variant-numeric:tabular-nums} th{background:#f3f3f3}
.charts{display:flex;flex-wrap:wrap;gap:8px} .sheet{display:flex;flex-wrap:wrap;gap:6px}
figure{margin:0;width:200px;font-size:11px} figure img{display:block;max-width:200px;max-height:200px}
.noimg{width:196px;height:120px;border:2px dashed #d73027;font-size:11px;padding:2px;overflow:hidden;color:#a00}
.muted{color:#777}
"""


def _img(b64: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}">'


def _alt(name: str, key, value) -> str:
    return f"{name}, threshold {key} = {value}" if value is not None else f"{name}, no threshold"


def _html_table(header: list[str], rows: list[list]) -> str:
    def cell(v):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            text = f"{v:,}" if isinstance(v, int) else f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
            return f'<td class="n">{text}</td>'
        return f"<td>{html.escape('' if v is None else str(v))}</td>"

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(cell(v) for v in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _quantile_rows(named: list[tuple[str, dict]]) -> list[list]:
    keys = ["p0", "p5", "p25", "p50", "p75", "p95", "p100"]
    return [[name, d.get("n", 0)] + [d["quantiles"][k] if d.get("n") else None for k in keys] for name, d in named]


QHEAD = ["measure", "n", "min", "p5", "p25", "p50", "p75", "p95", "max"]


def render_report(run_dir, *, thumbs: int = 12, seed: int = 0, max_reasons: int = 12, max_sources: int = 200) -> str:
    """The report of `run_dir` as one HTML string."""
    from catalog.duck import retry_by_generation, run_location
    return retry_by_generation(lambda by_generation: _render(run_location(run_dir), thumbs, seed, max_reasons, max_sources,
                                                             by_generation))


def _render(run: Path, thumbs: int, seed: int, max_reasons: int, max_sources: int, by_generation: bool) -> str:
    con, (p,) = st.open_runs(run, by_generation=by_generation, load=True)
    try:
        manifest = st.read_manifest(run)
        s = st.collect(con, manifest, run, p)
        person = s["persons"]
        parts = [f"<h1>humanset run report: {html.escape(str(run))}</h1>"]

        info, tot = s["run"], s["totals"]
        meta = [["inputs", tot["inputs"]], ["kept", f"{tot['kept']:,} ({tot['kept_pct']:.1f}%)"],
                ["decode errors", tot["decode_errors"]],
                ["input units", tot["units"]], ["units with errors", tot["units_with_errors"]],
                ["stages", " → ".join(info["stages"] or []) or "unknown (no manifest.json)"],
                ["started", info["started"]], ["finished", info["finished"]]]
        meta += [[f"skipped: {k}", v] for k, v in (info["skipped_stages"] or {}).items()]
        parts.append(_html_table(["", ""], meta))

        parts.append("<h2>Funnel</h2>")
        parts.append(_img(funnel_chart(s["funnel"]), "funnel chart"))
        parts.append(_html_table(["stage", "left", "%", "dropped"],
                                 [[f["stage"], "skipped" if f.get("skipped") else f["count"],
                                   "" if f.get("skipped") else f["pct"], f["dropped"]] for f in s["funnel"]]))

        parts.append("<h2>Reject reasons</h2>")
        if s["reasons"]:
            top = s["reasons"][:25]
            parts.append(_img(bar_chart([r["reason"] for r in top], [r["first"] for r in top],
                                        "Reject reasons (first failing stage)", "samples"), "reasons chart"))
            parts.append(_html_table(["reason", "rejected first", "% of inputs", "failed at all", "example"],
                                     [[r["reason"], r["first"], r["pct"], r["any"], r["example"]]
                                      for r in s["reasons"]]))
        else:
            parts.append("<p class=muted>nothing was rejected</p>")
        parts.append("<h3>Decode errors by kind</h3>")
        parts.append(_html_table(["kind", "count", "example"], [[d["kind"], d["count"], d["example"]]
                                                                  for d in s["decode_errors"]])
                     if s["decode_errors"] else "<p class=muted>none</p>")

        parts.append("<h3>Formats of decoded images</h3>")
        parts.append(_html_table(["format", "decoded", "kept"], [[f["format"], f["count"], f["kept"]]
                                                                  for f in s["formats"]]))

        parts.append("<h2>Persons per kept image</h2>")
        ppi = s["persons_per_kept_image"]
        if any(n for b, n in ppi.items() if b != "not measured"):
            parts.append(_img(bar_chart(list(ppi), list(ppi.values()),
                                        "Persons per kept image (passing the person rule)", "persons",
                                        color="#4575b4", horizontal=False), "persons per image chart"))
        else:
            parts.append("<p class=muted>The person stage measured no kept image (did it run?).</p>")

        parts.append("<h2>Score distributions (active threshold in red, rejected side shaded)</h2>")
        charts = []
        for sc in s["scores"]:
            col = sc["column"]
            unit = col in st.UNIT_RANGE
            hist = st.histogram_from(con, col, f"{p}samples", sc, lo=0.0 if unit else None, hi=1.0 if unit else None)
            t = sc["threshold"]
            charts.append(_img(histogram_chart(hist, f"{sc['stage']}: {col} (n={sc['n']:,})", col,
                                               t["value"] if t else None, t["keep"].split()[0] if t else None),
                               _alt(f"{col} histogram", t and t["key"], t and t["value"])))
        persons_src = st.persons_source(p)
        if person["detected"]["score"].get("n"):
            # per box only the raw score is stored: the threshold goes on it only when the cut reads it
            raw_cut = person["score_kind"] == "raw"
            cut = person["min_score"] if raw_cut else None
            charts.append(_img(histogram_chart(st.histogram_from(con, "score", persons_src,
                                                                 person["detected"]["score"], lo=0.0, hi=1.0),
                                               "person: raw score of every detected person", "raw score",
                                               cut, PERSON_SCORE.keep),
                               _alt("person score histogram", "person.min_score", cut)
                               + ("" if raw_cut else f" (the cut reads {person['column']}, per image)")))
            side = "box_shorter_side" if person["box_rule"] in ("shorter_side", "both") else "box_longer_side"
            charts.append(_img(histogram_chart(st.histogram_from(con, side, persons_src, person["detected"][side]),
                                               f"person: {side} of every detected person", f"{side} (px)",
                                               person["min_box_px"], PERSON_BOX.keep),
                               _alt("person box histogram", "person.min_box_px", person["min_box_px"])))
        parts.append(f'<div class="charts">{"".join(charts)}</div>' if charts else "<p class=muted>no scores</p>")
        parts.append(_html_table(["score", "n", "min", "p5", "p25", "p50", "p75", "p95", "max", "kept if",
                                  "fail threshold"],
                                 [r + [sc["threshold"]["keep"] if sc["threshold"] else "", sc.get("fail_threshold")]
                                  for r, sc in zip(_quantile_rows([(f"{x['stage']}.{x['column']}", x)
                                                                   for x in s["scores"]]), s["scores"])]))

        parts.append("<h2>Image and person-box sizes</h2>")
        g = s["geometry"]
        parts.append(_html_table(QHEAD, _quantile_rows(
            [(f"{c} ({scope})", g[scope][c]) for c in ("width", "height", "aspect", "short_side", "file_bytes")
             for scope in ("decoded", "kept")])))
        if person["detected"]["score"].get("n"):
            parts.append(_html_table(QHEAD, _quantile_rows(
                [(f"person {'raw score' if c == 'score' else c} ({scope})", person[scope][c])
                 for c in ("score", "box_longer_side", "box_shorter_side") for scope in ("detected", "in_kept_images")])))
        else:
            parts.append("<p class=muted>No person boxes in the catalog.</p>")

        parts.append("<h2>Duplicates</h2>")
        d = s["duplicates"]
        parts.append(_html_table(["", ""], [["duplicate samples", d["duplicates"]], ["exact", d["exact"]],
                                            ["near", d["near"]], ["clusters", d["clusters"]],
                                            ["largest cluster", d["largest_cluster"]],
                                            ["largest cluster's canonical", d["largest_canonical"]]]))

        u = s["units"]
        parts.append(f"<h2>Units with errors ({u['units_with_errors']:,} of {u['units']:,} input units)</h2>")
        if u["units_with_errors"]:
            parts.append(_html_table(["kind", "units", "example"],
                                     [[k["kind"], k["units"], k["example"]] for k in u["error_kinds"]]))
            parts.append(_html_table(["unit", "kind", "inputs read", "error"],
                                     [[f["unit"], f["kind"], f["inputs"], f["error"]] for f in u["failed_units"]]))
            if u["units_with_errors"] > u["failed_units_listed"]:
                parts.append(f"<p class=muted>first {u['failed_units_listed']:,} by name; the rest: "
                             "RUN/stats/*.json</p>")
        else:
            parts.append("<p class=muted>every unit was read to its end</p>")

        src = s["per_source"]
        n_src = src[0]["sources"] if src else 0
        parts.append(f"<h2>Per source ({n_src:,} input units with rows)</h2>")
        parts.append(_html_table(["source", "inputs", "kept", "kept %", "decode errors", "top reason"],
                                 [[r["shard"], r["inputs"], r["kept"], r["kept_pct"], r["decode_errors"],
                                   r["top_reason"]] for r in src[:max_sources]]))
        if n_src > min(len(src), max_sources):
            parts.append(f"<p class=muted>... {n_src - min(len(src), max_sources):,} more: "
                         "humanset query RUN \"SELECT shard, count(*) FROM samples GROUP BY 1\"</p>")
        if s["curated"]:
            c = s["curated"]
            parts.append(f"<p>Curated shards: {c['shards']:,} files, {c['samples']:,} samples, "
                         f"{c['bytes'] / 1e6:,.1f} MB.</p>")

        unknown = ("" if person["score_kind"] == "raw" else
                   " Amber: the catalog stores the calibrated score per image, not per box, and the image's "
                   "count of passing persons leaves this box open.")
        parts.append("<h2>Contact sheets</h2><p class=muted>Boxes: green passes the person rule ({}), red does "
                     "not.{} Random samples (seed {}).</p>".format(html.escape(describe(person)), unknown, seed))
        read = SourceReader()
        parts.append(f'<h3>Kept</h3><div class="sheet">{kept_sheet(con, run, thumbs, seed, person, read)}</div>')
        for reason, count, tiles in rejected_sheets(con, thumbs, seed, person, max_reasons, read):
            parts.append(f'<h3>Rejected: {html.escape(reason)} ({count:,})</h3><div class="sheet">{tiles}</div>')
    finally:
        con.close()
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>humanset report</title>'
            f"<style>{CSS}</style></head><body>{''.join(parts)}</body></html>")


def write_report(run_dir, out=None, *, thumbs: int = 12, seed: int = 0) -> Path:
    """Write the report of `run_dir` to `out` (default RUN/report.html) atomically; return its path."""
    from catalog.storage import join, write_bytes_at
    if out is None and is_uri(run_dir):
        out = join(run_dir, "report.html")
    out = out if is_uri(str(out or "")) else Path(out) if out else Path(run_dir) / "report.html"
    data = render_report(run_dir, thumbs=thumbs, seed=seed).encode()
    if isinstance(out, str):
        write_bytes_at(out, data)  # RUN/report.html on the object store
    else:
        write_bytes(out, data)
    return out
