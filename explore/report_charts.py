"""The report's charts, drawn with matplotlib's object API (no pyplot, no global state) and embedded
as base64 PNG; their labels are drawn as literal text (never parsed as mathtext)."""
from __future__ import annotations

import base64
import functools
import io

KEEP_COLOR, FAIL_COLOR = "#1a9850", "#d73027"


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

