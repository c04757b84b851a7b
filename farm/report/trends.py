"""A point's throughput over the history of runs like this one, with its change points, for the
qualification report (farm history --changes finds them the same way: farm/results/changes.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from farm.results.changes import Change, PointSeries, find_changes


@dataclass
class Trend:
    label: str
    timing: str
    runs: int
    changes: list[Change] = field(default_factory=list)
    svg: str | None = None  # the trend plot, when drawn


def trends(series: list[PointSeries], *, min_effect: float = 0.03, plot: bool = True) -> list[Trend]:
    """Each point's trend: its change points, and (``plot``) an SVG of its per-run medians."""
    out = []
    for s in series:
        found = find_changes(s, min_effect=min_effect)
        svg = None
        if plot:
            from farm.report.plots import trend  # matplotlib: only when there is something to draw

            svg = trend(s, found)
        out.append(Trend(s.label, s.timing, len(s.runs), found, svg))
    return out
