"""Server-rendered SVG bar charts: geometry here, markup in templates/ops/_chart.html.

No chart library and no build step: a chart is a handful of <rect>s with <title>s, so
it prints, scales and reads out to a screen reader like any other markup. Horizontal
positions are percentages, so the chart fills its card at any width without stretching
its labels.
"""

from dataclasses import dataclass

HEIGHT, LABEL_SPACE = 160, 18


@dataclass(frozen=True)
class Segment:
    x: float
    y: float
    width: float
    height: float
    css: str
    title: str


@dataclass(frozen=True)
class Column:
    x: float
    label: str
    total: int
    segments: list
    at: str = ""  # the bucket's start (ISO), so times.js can label it in local time


@dataclass(frozen=True)
class Chart:
    height: int
    columns: list
    peak: int
    label_y: int


MAX_LABELS = 8  # x labels at 10 px stay apart down to a phone's width


def stacked(columns, *, height=HEIGHT, gap=0.4, labels=None):
    """`columns` is [(label, [(css class, value, title)])] or [(label, parts, ISO start)];
    returns a Chart whose bars share one scale (the tallest stack fills the height).
    x and width are percentages. Only every few columns is labelled when there are
    more than `labels` (so labels never overlap); every bar keeps its title."""
    labels = labels or MAX_LABELS
    peak = max((sum(v for _, v, _ in column[1]) for column in columns), default=0)
    slot = 100 / max(len(columns), 1)
    scale = (height / peak) if peak else 0
    stride = -(-len(columns) // labels) if len(columns) > labels else 1
    out = []
    for i, (label, parts, *at) in enumerate(columns):
        if i % stride:
            label = ""
        x, y = i * slot + gap / 2, float(height)
        segments = []
        for css, value, title in parts:
            if not value:
                continue
            h = value * scale
            y -= h
            segments.append(Segment(x, y, slot - gap, h, css, title))
        out.append(Column(x + (slot - gap) / 2, label, sum(v for _, v, _ in parts), segments, at[0] if at and label else ""))
    return Chart(height + LABEL_SPACE, out, peak, height + LABEL_SPACE - 4)


@dataclass(frozen=True)
class Bar:
    y: float
    width: float
    label: str
    value: int
    css: str


@dataclass(frozen=True)
class Bars:
    height: int
    bars: list
    row: int


def hbars(items, *, css="bar", row=22):
    """`items` is [(label, value)] or [(label, value, css)]: one horizontal bar per row,
    its label on its own line above it, so long labels never collide. Widths are
    percentages of the largest value."""
    peak = max((item[1] for item in items), default=0)
    bars = [
        Bar(i * row * 1.6, (item[1] / peak * 100) if peak else 0, item[0], item[1], item[2] if len(item) > 2 else css)
        for i, item in enumerate(items)
    ]
    return Bars(max(int(len(items) * row * 1.6), row), bars, row)


def bars(items, *, css="bar", height=HEIGHT):
    """`items` is [(label, value)] or [(label, value, css)]: one bar each."""
    return stacked(
        [(item[0], [(item[2] if len(item) > 2 else css, item[1], f"{item[0]}: {item[1]}")]) for item in items],
        height=height,
    )
