"""Charts for the overview, drawn on the server as SVG: no chart library, no script.

Every function takes plain numbers and labels and returns markup; labels are escaped here,
numbers are formatted by us, so nothing from a run reaches the page unescaped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from markupsafe import Markup, escape

WIDTH, HEIGHT = 640, 180
PAD_L, PAD_B, PAD_T, PAD_R = 44, 22, 10, 8


def _frame(inner: str, *, label: str) -> Markup:
    # Safe: every text in `inner` went through escape() above, the rest is our own numbers.
    return Markup(  # noqa: S704
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(label)}" preserveAspectRatio="none">{inner}</svg>'
    )


def _axis(top: float, unit: str) -> str:
    h = HEIGHT - PAD_B
    parts = []
    for frac in (0.0, 0.5, 1.0):
        y = h - (h - PAD_T) * frac
        parts.append(
            f'<line class="grid" x1="{PAD_L}" y1="{y:.1f}" x2="{WIDTH - PAD_R}" y2="{y:.1f}"/>'
            f'<text class="tick" x="{PAD_L - 4}" y="{y + 3:.1f}" text-anchor="end">'
            f"{escape(_fmt(top * frac))}{escape(unit)}</text>"
        )
    return "".join(parts)


def _fmt(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:.1f}k"
    if value >= 10 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.1f}"


def _time_labels(times: Sequence[datetime], x_of: list[float]) -> str:
    if not times:
        return ""
    last = len(times) - 1
    picks = sorted({0, len(times) // 2, last})
    anchor = {0: "start", last: "end"}
    return "".join(
        f'<text class="tick" x="{x_of[i]:.1f}" y="{HEIGHT - 6}" '
        f'text-anchor="{anchor.get(i, "middle") if last else "middle"}">'
        f"{times[i]:%H:%M}</text>"
        for i in picks
    )


def stacked_bars(
    times: Sequence[datetime],
    series: Mapping[str, Sequence[int]],
    *,
    label: str,
) -> Markup:
    """A bar per time bucket, stacked by series (each series a CSS class `s-<name>`)."""
    if not times:
        return _empty(label)
    totals = [sum(s[i] for s in series.values()) for i in range(len(times))]
    top = max(*totals, 1)
    span = (WIDTH - PAD_L - PAD_R) / len(times)
    h = HEIGHT - PAD_B - PAD_T
    bars, xs = [], []
    for i in range(len(times)):
        x = PAD_L + i * span
        xs.append(x + span / 2)
        y = float(HEIGHT - PAD_B)
        for name, values in series.items():
            bh = h * values[i] / top
            if bh <= 0:
                continue
            y -= bh
            bars.append(
                f'<rect class="s-{escape(name)}" x="{x + 1:.1f}" y="{y:.1f}" '
                f'width="{max(span - 2, 1):.1f}" height="{bh:.1f}">'
                f"<title>{times[i]:%H:%M} {escape(name)}: {values[i]}</title></rect>"
            )
    return _frame(_axis(top, "") + "".join(bars) + _time_labels(times, xs), label=label)


def lines(
    times: Sequence[datetime],
    series: Mapping[str, Sequence[float | None]],
    *,
    label: str,
    unit: str = "",
) -> Markup:
    """A line per series over time buckets (each series a CSS class `s-<name>`); a bucket
    without a value (None) is skipped, its neighbours joined."""
    found = [v for values in series.values() for v in values if v is not None]
    if not times or not found:
        return _empty(label)
    top = max([*found, 1.0])
    n = len(times)
    step = (WIDTH - PAD_L - PAD_R) / max(n - 1, 1)
    h = HEIGHT - PAD_B - PAD_T
    xs = [PAD_L + i * step for i in range(n)]
    paths = []
    for name, values in series.items():
        shown = [
            (xs[i], HEIGHT - PAD_B - h * v / top, i, v)
            for i, v in enumerate(values)
            if v is not None
        ]
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in shown)
        paths.append(
            f'<polyline class="line s-{escape(name)}" points="{points}">'
            f"<title>{escape(name)}</title></polyline>"
        )
        paths.extend(
            f'<circle class="dot s-{escape(name)}" cx="{x:.1f}" cy="{y:.1f}" r="2.5">'
            f"<title>{times[i]:%H:%M} {escape(name)}: {v:.0f}{escape(unit)}</title></circle>"
            for x, y, i, v in shown
        )
    return _frame(_axis(top, unit) + "".join(paths) + _time_labels(times, xs), label=label)


def _empty(label: str) -> Markup:
    return _frame(
        f'<text class="empty" x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">'
        "no data yet</text>",
        label=label,
    )


def percentile(sorted_values: Sequence[int], q: float) -> float:
    """The q-quantile (0..1) of already sorted values, nearest rank; 0 for none."""
    if not sorted_values:
        return 0.0
    rank = max(0, min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1))))
    return float(sorted_values[rank])
