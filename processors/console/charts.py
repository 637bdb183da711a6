"""Charts as inline SVG: no script library, no CDN, the same picture offline.

Two shapes cover the analytics page: horizontal bars (a value per label, optionally a
second value drawn thinner over it, e.g. p50 inside p95) and lines over time buckets (one
line per series). Every mark carries a ``<title>`` with its exact figure, so a reader can
hover for the number the axis only approximates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agentlog.audit.report import esc

__all__ = ["PALETTE", "bar_chart", "line_chart"]

PALETTE = ("#3b5bdb", "#d9480f", "#2b8a3e", "#7b2cbf", "#0b7285", "#c92a2a", "#e67700", "#495057")


def _svg_open(width: float, height: float, title: str) -> str:
    """An SVG that scales down to its container (the page is read on laptops and in screenshots)."""
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
            f'style="max-width:100%;height:auto" role="img" aria-label="{esc(title)}">')


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.4g}"


def bar_chart(title: str, bars: Sequence[tuple[str, float]], *, unit: str = "", inner: Sequence[float] | None = None,
              inner_label: str = "", outer_label: str = "") -> str:
    """Horizontal bars, one per ``(label, value)``; ``inner`` draws a second, thinner bar per label."""
    if not bars:
        return f'<figure class="chart"><figcaption>{esc(title)}</figcaption><p class="empty">No data yet.</p></figure>'
    left, width, row = 230, 300, 26
    top = 10
    height = top + len(bars) * row + 24
    peak = max([v for _, v in bars] + list(inner or []) + [0.0]) or 1.0
    out = [f'<figure class="chart"><figcaption>{esc(title)}</figcaption>',
           _svg_open(left + width + 90, height, title)]
    for i, (label, value) in enumerate(bars):
        y = top + i * row
        w = max(value / peak * width, 1.0)
        out.append(f'<text x="{left - 8}" y="{y + 15}" class="bar-label">{esc(label[:36])}</text>')
        out.append(f'<rect class="bar" x="{left}" y="{y + 3}" width="{w:.1f}" height="16" rx="3" '
                   f'fill="{PALETTE[0]}" opacity="0.75"><title>{esc(label)}: {esc(outer_label)} '
                   f'{_fmt(value)}{esc(unit)}</title></rect>')
        if inner is not None:
            iw = max(inner[i] / peak * width, 1.0)
            out.append(f'<rect class="bar-inner" x="{left}" y="{y + 8}" width="{iw:.1f}" height="6" rx="2" '
                       f'fill="{PALETTE[1]}"><title>{esc(label)}: {esc(inner_label)} {_fmt(inner[i])}{esc(unit)}'
                       '</title></rect>')
        out.append(f'<text x="{left + w + 6}" y="{y + 15}" class="bar-value">{_fmt(value)}{esc(unit)}</text>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - 20}" class="axis"/>')
    out.append("</svg>")
    if inner is not None:
        out.append(f'<div class="legend"><span><i style="background:{PALETTE[0]};border-color:{PALETTE[0]}"></i>'
                   f'{esc(outer_label)}</span><span><i style="background:{PALETTE[1]};border-color:{PALETTE[1]}">'
                   f'</i>{esc(inner_label)}</span></div>')
    out.append("</figure>")
    return "".join(out)


def line_chart(title: str, buckets: Sequence[str], series: Mapping[str, Sequence[float]], *, unit: str = "") -> str:
    """One line per series over ``buckets`` (x labels, in order); a single bucket is drawn as dots."""
    if not buckets or not series:
        return f'<figure class="chart"><figcaption>{esc(title)}</figcaption><p class="empty">No data yet.</p></figure>'
    left, top, width, height = 70, 14, 460, 180
    peak = max((v for values in series.values() for v in values), default=0.0) or 1.0
    n = len(buckets)

    def x(i: int) -> float:
        return left + (width / 2 if n == 1 else i / (n - 1) * width)

    def y(v: float) -> float:
        return top + height - v / peak * height

    out = [f'<figure class="chart"><figcaption>{esc(title)}</figcaption>',
           _svg_open(left + width + 30, top + height + 40, title),
           f'<line x1="{left}" y1="{top + height}" x2="{left + width}" y2="{top + height}" class="axis"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + height}" class="axis"/>',
           f'<text x="{left - 6}" y="{top + 4}" class="tick-y">{_fmt(peak)}{esc(unit)}</text>',
           f'<text x="{left - 6}" y="{top + height}" class="tick-y">0</text>']
    for i in sorted({0, n - 1}):
        anchor = "middle" if n == 1 else "start" if i == 0 else "end"
        out.append(f'<text x="{x(i):.1f}" y="{top + height + 16}" class="tick" style="text-anchor:{anchor}">'
                   f'{esc(buckets[i])}</text>')
    for k, (name, values) in enumerate(series.items()):
        colour = PALETTE[k % len(PALETTE)]
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
        if n > 1:
            out.append(f'<polyline class="line" fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>')
        for i, v in enumerate(values):
            out.append(f'<circle class="dot" cx="{x(i):.1f}" cy="{y(v):.1f}" r="3.5" fill="{colour}">'
                       f'<title>{esc(name)} {esc(buckets[i])}: {_fmt(v)}{esc(unit)}</title></circle>')
    out.append("</svg>")
    out.append('<div class="legend">' + "".join(
        f'<span><i style="background:{PALETTE[k % len(PALETTE)]};border-color:{PALETTE[k % len(PALETTE)]}"></i>'
        f'{esc(name)}</span>' for k, name in enumerate(series)) + "</div></figure>")
    return "".join(out)
