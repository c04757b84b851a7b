"""The report's plots, drawn by matplotlib (Agg) as SVG text to inline in the HTML page.

Each plot is a function of the gate's points returning an ``<svg>`` element (no XML prolog), or None
when it would carry no information the throughput table does not already give. The rule, per plot:

- ``tok_s_by_soc``: drawn for two points or more (a single bar is the table's one row again);
- ``tok_s_vs_seq_len``: drawn when some line of it (one SoC, mode and updater) has two seq_lens or
  more (with one seq_len per line the plot is a column of dots, no line);
- ``baseline_vs_now``: drawn when some point has a baseline.

Text stays text (``svg.fonttype = none``: no glyph paths, the page's
own sans-serif), and every SVG gets its own id salt: several inline SVGs in one page must not share
element ids (clip paths would cross-reference each other's).
"""

from __future__ import annotations

import io
import re
from collections import defaultdict

from farm.results.gate import PointResult, PointVerdict
from farm.vocab import Timing, Updater

__all__ = ["baseline_vs_now", "tok_s_by_soc", "tok_s_vs_seq_len", "trend"]

COLORS = {Updater.SMART_MASK: "#1f77b4", Updater.SHIFT_POINTER: "#ff7f0e"}
VERDICT_COLORS = {PointVerdict.REGRESSED: "#c62828", PointVerdict.IMPROVED: "#2e7d32",
                  PointVerdict.UNCHANGED: "#555555", PointVerdict.INCONCLUSIVE: "#b26a00",
                  PointVerdict.NEW: "#555555"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)  # never a display, whatever the environment says
    import matplotlib.pyplot as plt

    return plt


def _style():
    """Labels are data (SoC names, updaters): a "$" in one must not start mathtext."""
    import matplotlib

    return matplotlib.rc_context({"text.parse_math": False, "svg.fonttype": "none"})


def _drawn(plot):
    import functools

    @functools.wraps(plot)
    def draw(points):
        with _style():
            return plot(points)
    return draw


def _svg(fig, salt: str) -> str:
    import matplotlib

    plt = _pyplot()
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg"):]  # drop the XML prolog and doctype: it is inlined in HTML
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)  # RDF licence boilerplate
    # Element ids stay unique across the page: prefix them (matplotlib's salt alone leaves some ids
    # such as the glyph-free text's styles shared).
    text = re.sub(r'id="([^"]+)"', rf'id="{salt}-\1"', text)
    text = re.sub(r'url\(#([^)]+)\)', rf'url(#{salt}-\1)', text)
    text = re.sub(r'xlink:href="#([^"]+)"', rf'xlink:href="#{salt}-\1"', text)
    return re.sub(r'<svg ', f'<svg role="img" aria-label="{salt}" ', text, count=1)


def _figures(points: list[PointResult]) -> str:
    """Where the plotted figures come from, for the title: a SIMULATED figure never reads as measured."""
    return "figures: " + ", ".join(sorted({Timing.label(p.key.timing) for p in points}))


def _soc(p: PointResult, points: list[PointResult]) -> str:
    """The SoC as a plot names it; with its timing when the plot holds figures of several."""
    mixed = len({q.key.timing for q in points}) > 1
    return f"{p.key.soc} {Timing.label(p.key.timing)}" if mixed else p.key.soc


def _color(updater: str, i: int) -> str:
    return COLORS.get(updater, f"C{i % 10}")


@_drawn
def tok_s_by_soc(points: list[PointResult]) -> str | None:
    """Median tok/s per SoC (and mode/seq_len) and updater, bars with the min-max range; None for fewer
    than two points (one bar says what the table's one row says)."""
    if len(points) < 2:
        return None
    plt = _pyplot()
    groups = sorted({(_soc(p, points), p.key.mode, p.key.seq_len) for p in points})
    updaters = sorted({p.key.updater for p in points})
    by = {(_soc(p, points), p.key.mode, p.key.seq_len, p.key.updater): p for p in points}
    width = 0.8 / max(1, len(updaters))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(groups) + 2), 3.4))
    for i, u in enumerate(updaters):
        xs, ys, lo, hi = [], [], [], []
        for g, key in enumerate(groups):
            p = by.get((*key, u))
            if p is None:
                continue
            xs.append(g + (i - (len(updaters) - 1) / 2) * width)
            ys.append(p.now_median)
            lo.append(p.now_median - min(p.now))
            hi.append(max(p.now) - p.now_median)
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=u, color=_color(u, i))
    ax.set_xticks(range(len(groups)), [f"{s}\n{m}/{n}" for s, m, n in groups])
    ax.set_ylabel(points[0].unit)
    ax.set_title(f"Throughput per SoC and updater (median, min-max); {_figures(points)}", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _svg(fig, "plot-by-soc")


@_drawn
def tok_s_vs_seq_len(points: list[PointResult]) -> str | None:
    """Median tok/s against seq_len: one line per SoC, mode and updater; None unless some line has two
    seq_lens or more (points at one seq_len each are no line: nothing against seq_len to see)."""
    lines: dict[tuple[str, str, str], list[PointResult]] = defaultdict(list)
    for p in points:
        lines[(_soc(p, points), p.key.mode, p.key.updater)].append(p)
    if not any(len({p.key.seq_len for p in pts}) > 1 for pts in lines.values()):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 3.4))
    markers = "osD^v<>"
    socs = sorted({k[0] for k in lines})
    for i, ((soc, mode, updater), pts) in enumerate(sorted(lines.items())):
        pts.sort(key=lambda p: p.key.seq_len)
        ax.plot([p.key.seq_len for p in pts], [p.now_median for p in pts],
                marker=markers[socs.index(soc) % len(markers)], color=_color(updater, i),
                linestyle="-" if mode == "kv" else "--", label=f"{soc} {mode} {updater}")
    ax.set_xlabel("seq_len")
    ax.set_ylabel(points[0].unit)
    ax.set_title(f"Throughput against seq_len per updater (median); {_figures(points)}", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _svg(fig, "plot-seq-len")


@_drawn
def baseline_vs_now(points: list[PointResult]) -> str | None:
    """Both samples of every point with a baseline: baseline (grey) and now (coloured by the gate's
    verdict), each with its median, so a reader sees the spread the gate judged; None when no point
    has a baseline."""
    compared = [p for p in points if p.base]
    if not compared:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(compared) + 2), 3.6))
    for i, p in enumerate(compared):
        for dx, values, color in ((-0.17, p.base, "#9e9e9e"), (0.17, p.now, VERDICT_COLORS[p.verdict])):
            n = len(values)
            jitter = [dx + (j - (n - 1) / 2) * (0.12 / max(1, n - 1)) for j in range(n)]
            ax.scatter([i + j for j in jitter], values, s=14, color=color, zorder=3)
            median = sorted(values)[n // 2] if n % 2 else sum(sorted(values)[n // 2 - 1:n // 2 + 1]) / 2
            ax.hlines(median, i + dx - 0.12, i + dx + 0.12, color=color, linewidth=2, zorder=4)
        ax.annotate(str(p.verdict), (i, 1.0), xycoords=("data", "axes fraction"), ha="center",
                    va="bottom", fontsize=7, color=VERDICT_COLORS[p.verdict])
    ax.set_xticks(range(len(compared)), [f"{_soc(p, compared)}\n{p.key.mode}/{p.key.seq_len}\n{p.key.updater}"
                                         for p in compared], fontsize=7)
    ax.set_ylabel(compared[0].unit)
    ax.set_title(f"Baseline (grey) vs now, every sample and the median; {_figures(compared)}", pad=14,
                 fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    return _svg(fig, "plot-baseline")


def trend(series, changes) -> str | None:
    """One point's per-run medians over history (min-max as a band), each change point marked: the
    level before and after it as dashed lines."""
    if not series.runs:
        return None
    with _style():
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(6.4, 3.0))
        xs = list(range(len(series.runs)))
        ax.fill_between(xs, [min(r.samples) for r in series.runs], [max(r.samples) for r in series.runs],
                        color="#1f77b4", alpha=0.15, linewidth=0)
        ax.plot(xs, [r.median for r in series.runs], marker="o", markersize=3, color="#1f77b4")
        for c in changes:
            ax.axvline(c.index - 0.5, color=VERDICT_COLORS[PointVerdict.REGRESSED if c.delta < 0
                                                         else PointVerdict.IMPROVED], linewidth=1.2)
            ax.annotate(f"{c.delta:+.1%}", (c.index - 0.5, c.after), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
        ax.set_xlabel("run (oldest first)")
        ax.set_ylabel(series.unit)
        title = f"{series.label}; figures: {Timing.label(series.timing)}"
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        return _svg(fig, "trend-" + "".join(ch if ch.isalnum() else "-" for ch in series.label))
