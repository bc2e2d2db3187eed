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


@dataclass(frozen=True)
class Chart:
    height: int
    columns: list
    peak: int
    label_y: int


def stacked(columns, *, height=HEIGHT, gap=0.4):
    """`columns` is [(label, [(css class, value, title)])]; returns a Chart whose bars
    share one scale (the tallest stack fills the height). x and width are percentages."""
    peak = max((sum(v for _, v, _ in parts) for _, parts in columns), default=0)
    slot = 100 / max(len(columns), 1)
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
    return Chart(height + LABEL_SPACE, out, peak, height + LABEL_SPACE - 4)


def bars(items, *, css="bar", height=HEIGHT):
    """`items` is [(label, value)] or [(label, value, css)]: one bar each."""
    return stacked(
        [(item[0], [(item[2] if len(item) > 2 else css, item[1], f"{item[0]}: {item[1]}")]) for item in items],
        height=height,
    )
