"""Charts drawn on the server as inline SVG: no script, no library, readable without
JavaScript, scaled to the page's width by their viewBox (so a phone gets the whole chart,
not a scroll bar). Every bar carries a <title> with its exact value, and the chart a label
for screen readers.
"""

from __future__ import annotations

from dataclasses import dataclass

from markupsafe import Markup, escape

WIDTH, HEIGHT = 600, 180
LEFT, BOTTOM, TOP = 34, 22, 10


@dataclass
class Chart:
    """One chart on the overview: its id (for tests and links), title, and SVG."""

    id: str
    title: str
    svg: Markup
    note: str = ""


def _nice_max(value: int) -> int:
    """The top of the scale: the first of 2, 5, 10, 20, 50, ... at or above ``value``."""
    top = 2
    while top < value:
        top = top * 5 // 2 if str(top)[0] == "2" else top * 2
    return top


#: Roughly how wide a character of an axis label is (11 px sans-serif), to leave room for the
#: widest label: a label cut at the chart's left edge reads as a smaller number.
CHAR_WIDTH = 7


def short(value: float) -> str:
    """An axis figure in at most four characters: 0, 50, 2.5k, 200k, 1.5M."""
    for size, suffix in ((1_000_000_000, "G"), (1_000_000, "M"), (1000, "k")):
        if value >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:g}"


def bars(label: str, names: list[str], values: list[int], css: str, tick_every: int = 1,
         unit: str = "jobs") -> Markup:
    """A vertical bar chart: one bar per name; every ``tick_every``-th name is written below."""
    top = _nice_max(max(values, default=0))
    ticks = [(fraction, short(top * fraction)) for fraction in (0, 0.5, 1)]
    left = max(LEFT, 8 + CHAR_WIDTH * max(len(text) for _, text in ticks))
    plot_w, plot_h = WIDTH - left - 4, HEIGHT - BOTTOM - TOP
    slot = plot_w / max(len(values), 1)
    parts = [f'<svg class="chart {css}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(label)}" '
             f'preserveAspectRatio="xMidYMid meet" xmlns="http://www.w3.org/2000/svg">']
    for fraction, text in ticks:
        y = TOP + plot_h * (1 - fraction)
        parts.append(f'<line class="grid" x1="{left}" x2="{WIDTH - 4}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(f'<text class="axis" x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{text}</text>')
    for n, (name, value) in enumerate(zip(names, values, strict=True)):
        h = plot_h * value / top if top else 0
        x = left + n * slot + slot * 0.15
        parts.append(f'<rect class="bar" x="{x:.1f}" y="{TOP + plot_h - h:.1f}" width="{slot * 0.7:.1f}" '
                     f'height="{h:.1f}" data-value="{value}"><title>{escape(name)}: {value} {unit}</title></rect>')
        if n % tick_every == 0:
            # Kept inside the chart: the first and last names are anchored to their own edge.
            centre = x + slot * 0.35
            text = name.split("–")[0]
            half = CHAR_WIDTH * len(text) / 2
            anchor = "start" if centre - half < 0 else "end" if centre + half > WIDTH else "middle"
            at = {"start": max(centre - slot * 0.35, 0), "end": min(centre + slot * 0.35, WIDTH), "middle": centre}
            parts.append(f'<text class="axis" x="{at[anchor]:.1f}" y="{HEIGHT - 6}" text-anchor="{anchor}">'
                         f'{escape(text)}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
