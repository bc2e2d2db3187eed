"""Server-rendered SVG bar charts: geometry here, markup in templates/ops/_chart.html.

No chart library and no build step: a chart is a handful of <rect>s with <title>s, so
it prints, scales and reads out to a screen reader like any other markup.
"""

from dataclasses import dataclass

WIDTH, HEIGHT, LABEL_SPACE = 720, 160, 18


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


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    columns: list
    peak: int
    label_y: int


def stacked(columns, *, width=WIDTH, height=HEIGHT, gap=3):
    """`columns` is [(label, [(css class, value, title)])]; returns a Chart whose bars
    share one scale (the tallest stack fills the height)."""
    peak = max((sum(v for _, v, _ in parts) for _, parts in columns), default=0)
    slot = width / max(len(columns), 1)
    scale = (height / peak) if peak else 0
    out = []
    for i, (label, parts) in enumerate(columns):
        x, y = i * slot + gap / 2, float(height)
        segments = []
        for css, value, title in parts:
            if not value:
                continue
            h = value * scale
            y -= h
            segments.append(Segment(x, y, slot - gap, h, css, title))
        out.append(Column(x + (slot - gap) / 2, label, sum(v for _, v, _ in parts), segments))
    return Chart(width, height + LABEL_SPACE, out, peak, height + LABEL_SPACE - 4)


def bars(items, *, css="bar", width=WIDTH, height=HEIGHT):
    """`items` is [(label, value)]: one plain bar each."""
    return stacked([(label, [(css, value, f"{label}: {value}")]) for label, value in items], width=width, height=height)
