"""An SVG chart of replays: each call's context, the part a prefix cache serves, where it broke.

One panel per replayed stack, on one scale: a bar per model call, as tall as
its prompt; the pale lower part is what the previous call already sent (a
prefix cache serves it at a tenth of the price), the solid upper part what is
billed in full. A red mark over a bar: the call broke the cache. Plain Python
writes the SVG: no plotting library.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Final

from raf._observers.replay_report import ReplayReport

__all__: list[str] = []

COLOURS: Final = ("#4c72b0", "#dd8452", "#55a868", "#8172b2")
BROKEN: Final = "#c44e52"
WIDTH: Final = 960
PANEL: Final = 210  # the height of one stack's panel
LEFT, RIGHT, TOP = 64, 24, 58


def replay_chart(reports: Sequence[tuple[str, ReplayReport]], *, title: str = "") -> str:
    """The SVG of ``reports`` (each named), one panel each on one scale, as a string."""
    if not reports:
        raise ValueError("replay_chart needs at least one report")
    calls = max(len(report.calls) for _, report in reports)
    top = _nice(max((c.input_tokens for _, r in reports for c in r.calls), default=1))
    height = TOP + len(reports) * (PANEL + 64) + 30
    plot_w = WIDTH - LEFT - RIGHT
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="system-ui, sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="{LEFT}" y="24" font-size="16" font-weight="600">'
        f"{escape(title or 'What each model call sends, and what a prompt cache serves')}</text>",
        f'<text x="{LEFT}" y="44" fill="#555">Each bar is one model call, as tall as its prompt '
        f"(tokens). Pale: the prefix the previous call sent, served from the cache; solid: "
        f"billed in full.</text>",
    ]
    first = reports[0][1]
    for index, (name, report) in enumerate(reports):
        y0 = TOP + index * (PANEL + 64) + 22
        colour = COLOURS[index % len(COLOURS)]
        out += _panel(name, report, first if index else None, y0, top, calls, plot_w, colour)
    legend_y = height - 14
    out += [
        f'<rect x="{LEFT}" y="{legend_y - 10}" width="12" height="12" fill="#888" '
        f'fill-opacity="0.3"/>',
        f'<text x="{LEFT + 18}" y="{legend_y}">served from the cache</text>',
        f'<rect x="{LEFT + 170}" y="{legend_y - 10}" width="12" height="12" fill="#888"/>',
        f'<text x="{LEFT + 188}" y="{legend_y}">billed in full</text>',
        f'<path d="M{LEFT + 300} {legend_y - 10} l6 8 l6 -8 z" fill="{BROKEN}"/>',
        f'<text x="{LEFT + 318}" y="{legend_y}">this call broke the cache</text>',
        "</svg>",
    ]
    return "\n".join(out) + "\n"


def _panel(
    name: str,
    report: ReplayReport,
    base: ReplayReport | None,
    y0: float,
    top: int,
    calls: int,
    plot_w: float,
    colour: str,
) -> list[str]:
    """One stack's panel: its headline, its gridlines, a bar per call, its turns."""
    bottom = y0 + PANEL
    summary = (
        f"{len(report.calls)} calls · {report.input_tokens:,} tokens · "
        f"{report.cached_share:.0%} cached · {report.billed_units:,.0f} billed units"
    )
    if base is not None and base.billed_units:
        summary += f" ({report.billed_units / base.billed_units:.2f}x the first)"
    if report.diverged:
        summary += f" · diverged {len(report.divergences)}x"
    out = [
        f'<text x="{LEFT}" y="{y0 - 6}" font-size="14" font-weight="600" fill="{colour}">'
        f"{escape(name)}</text>",
        f'<text x="{WIDTH - RIGHT}" y="{y0 - 6}" text-anchor="end" fill="#333">'
        f"{escape(summary)}</text>",
    ]
    for step in range(5):  # gridlines at 0, 1/4 ... of the scale
        value = top * step // 4
        y = bottom - PANEL * step / 4
        out.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" '
            f'stroke="{"#444" if step == 0 else "#e4e4e4"}"/>'
        )
        out.append(
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#666">'
            f"{_short(value)}</text>"
        )
    bar = plot_w / max(calls, 1)
    gap = min(2.0, bar * 0.2)
    last_turn = 0
    for number, call in enumerate(report.calls):
        x = LEFT + number * bar
        if call.turn != last_turn and number:  # a faint tick where a new turn begins
            out.append(
                f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 4}" stroke="#999"/>'
            )
        last_turn = call.turn
        whole = PANEL * call.input_tokens / top
        served = PANEL * call.cached_tokens / top
        tip = (
            f"call {number + 1} (turn {call.turn}): {call.input_tokens:,} tokens, "
            f"{call.cached_share:.0%} cached, {call.billed_units:,.0f} billed"
            + (f"; broken by {call.broken_by}" if call.broken_by else "")
        )
        out.append(f"<g><title>{escape(tip)}</title>")
        out.append(
            f'<rect x="{x:.1f}" y="{bottom - served:.1f}" width="{bar - gap:.1f}" '
            f'height="{served:.1f}" fill="{colour}" fill-opacity="0.3"/>'
        )
        out.append(
            f'<rect x="{x:.1f}" y="{bottom - whole:.1f}" width="{bar - gap:.1f}" '
            f'height="{whole - served:.1f}" fill="{colour}"/>'
        )
        if call.broken_by:
            mid, peak = x + (bar - gap) / 2, bottom - whole - 3
            out.append(f'<path d="M{mid - 4:.1f} {peak - 7:.1f} l4 7 l4 -7 z" fill="{BROKEN}"/>')
        out.append("</g>")
    out.append(f'<text x="{LEFT}" y="{bottom + 18}" fill="#666">call 1</text>')
    out.append(
        f'<text x="{WIDTH - RIGHT}" y="{bottom + 18}" text-anchor="end" fill="#666">'
        f"call {calls} · {report.turns} turns (ticks: a new turn)</text>"
    )
    return out


def _nice(value: int) -> int:
    """The scale's top: ``value`` rounded up to 1, 2 or 5 times a power of ten, in quarters."""
    magnitude = 1
    while magnitude * 10 <= value:
        magnitude *= 10
    for step in (1, 2, 2.5, 4, 5, 10):
        if step * magnitude >= value:
            return int(step * magnitude)
    return 10 * magnitude


def _short(value: int) -> str:
    """``12500`` as ``12.5k``."""
    if value >= 1000:
        return f"{value / 1000:.1f}k".replace(".0k", "k")
    return str(value)
