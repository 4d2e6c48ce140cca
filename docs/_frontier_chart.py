"""Draw docs/images/frontier.svg: billed units against the context each set-up keeps.

Reads what ``benchmarks/bench_cache_peers.py --json FIGURES.json`` wrote (one run, raf's
set-ups and the peers', on the support conversation and on the one with large tool
results) and draws a panel per conversation: a point per set-up at its mean characters a
call (the context it keeps) and its billed units, raf's in blue and the peers' in orange,
each numbered as in the table of ``docs/context-economics.md``. The frontier joins the
set-ups that no other beats (none keeps as much context for fewer units). Plain Python
writes the SVG: no plotting library.

    python docs/_frontier_chart.py FIGURES.json [OUT.svg]
    python docs/_frontier_chart.py FIGURES.json --table   (the tables of the page)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

PANEL_W, PANEL_H, MARGIN = 470, 360, 56
RAF, PEER, FRONTIER = "#4c72b0", "#dd8452", "#55a868"
TITLES = {
    "support": "120-turn support conversation",
    "large": "the same, tool results of 3,000-12,000 characters",
}


def frontier(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points no other beats: none keeps at least as much context for fewer units."""
    return sorted(
        (
            p
            for p in points
            if not any(
                q["mean_chars"] >= p["mean_chars"] and q["billed"] < p["billed"] for q in points
            )
        ),
        key=lambda p: p["mean_chars"],
    )


def panel(name: str, rows: dict[str, Any], left: float) -> list[str]:
    points = [{"name": n, **row} for n, row in rows.items()]
    xs = [math.log10(p["mean_chars"]) for p in points]
    ys = [p["billed"] / 1000 for p in points]
    x0, x1 = math.floor(min(xs) * 4) / 4, math.ceil(max(xs) * 4) / 4
    y1 = max(ys) * 1.08

    def at(p: dict[str, Any]) -> tuple[float, float]:
        x = left + MARGIN + (math.log10(p["mean_chars"]) - x0) / (x1 - x0) * (PANEL_W - MARGIN - 12)
        y = PANEL_H - MARGIN - p["billed"] / 1000 / y1 * (PANEL_H - MARGIN - 30)
        return x, y

    out = [
        f'<text x="{left + PANEL_W / 2}" y="18" text-anchor="middle" font-weight="bold">'
        f"{TITLES.get(name, name)}</text>",
        f'<line x1="{left + MARGIN}" y1="{PANEL_H - MARGIN}" x2="{left + PANEL_W - 12}" '
        f'y2="{PANEL_H - MARGIN}" stroke="#444"/>',
        f'<line x1="{left + MARGIN}" y1="30" x2="{left + MARGIN}" y2="{PANEL_H - MARGIN}" '
        f'stroke="#444"/>',
        f'<text x="{left + PANEL_W / 2}" y="{PANEL_H - 14}" text-anchor="middle">'
        "context kept: mean characters a call (log)</text>",
        f'<text x="{left + 14}" y="{PANEL_H / 2}" text-anchor="middle" '
        f'transform="rotate(-90 {left + 14} {PANEL_H / 2})">billed units (k)</text>',
    ]
    for tick in (1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000):
        if x0 <= math.log10(tick) <= x1:
            x, _ = at({"mean_chars": tick, "billed": 0})
            out.append(
                f'<text x="{x}" y="{PANEL_H - MARGIN + 16}" text-anchor="middle" '
                f'font-size="10">{tick // 1000}k</text>'
            )
    step = 10 ** math.floor(math.log10(y1 / 4))
    step *= 5 if y1 / step > 20 else 2 if y1 / step > 8 else 1
    tick = 0.0
    while tick <= y1:
        _, y = at({"mean_chars": 10**x0, "billed": tick * 1000})
        out.append(
            f'<text x="{left + MARGIN - 6}" y="{y + 4}" text-anchor="end" font-size="10">'
            f"{tick:,.0f}</text>"
        )
        tick += step
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in map(at, frontier(points)))
    out.append(f'<polyline points="{line}" fill="none" stroke="{FRONTIER}" stroke-width="2"/>')
    for number, p in enumerate(points, 1):
        x, y = at(p)
        colour = RAF if p["raf"] else PEER
        out.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}"><title>{p["name"]}: '
            f'{p["billed"] / 1000:,.0f} k units, {p["mean_chars"]:,.0f} chars a call</title>'
            "</circle>"
        )
        out.append(
            f'<text x="{x + 5:.1f}" y="{y - 4:.1f}" font-size="9" fill="{colour}">{number}</text>'
        )
    return out


def draw(figures: dict[str, Any]) -> str:
    names = [n for n in ("support", "large") if n in figures]
    width = PANEL_W * len(names) + 10
    body: list[str] = []
    for index, name in enumerate(names):
        body += panel(name, figures[name], index * PANEL_W)
    legend_y = PANEL_H + 4
    body += [
        f'<circle cx="70" cy="{legend_y}" r="4" fill="{RAF}"/>',
        f'<text x="80" y="{legend_y + 4}">raf</text>',
        f'<circle cx="130" cy="{legend_y}" r="4" fill="{PEER}"/>',
        f'<text x="140" y="{legend_y + 4}">peers</text>',
        f'<line x1="200" y1="{legend_y}" x2="225" y2="{legend_y}" stroke="{FRONTIER}" '
        'stroke-width="2"/>',
        f'<text x="232" y="{legend_y + 4}">frontier (no set-up keeps as much for less)</text>',
    ]
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{PANEL_H + 20}" '
        f'font-family="sans-serif" font-size="12">\n'
        + "\n".join(body)
        + "\n</svg>\n"
    )


def tables(figures: dict[str, Any]) -> str:
    """The figures as the Markdown tables of docs/context-economics.md, numbered as drawn."""
    out: list[str] = []
    for name in (n for n in ("support", "large") if n in figures):
        rows = figures[name]
        best = {p["name"] for p in frontier([{"name": n, **r} for n, r in rows.items()])}
        out += [
            f"**{TITLES[name][0].upper()}{TITLES[name][1:]}**",
            "",
            "| # | set-up | billed units | reuse | chars a call | per kept char | breaks |",
            "|---|---|---|---|---|---|---|",
        ]
        for number, (setup, row) in enumerate(rows.items(), 1):
            label = f"raf, `{setup}`" if row["raf"] else setup
            mark = " ◆" if setup in best else ""
            out.append(
                f"| {number} | {label}{mark} | {row['billed'] / 1000:,.0f} k | "
                f"{row['reuse']:.1%} | {row['mean_chars']:,.0f} | "
                f"{row['billed'] / row['mean_chars']:.1f} | {row['breaks']} |"
            )
        out.append("")
    return "\n".join(out)


def main() -> None:
    source = Path(sys.argv[1])
    figures = json.loads(source.read_text())
    if sys.argv[2:] == ["--table"]:
        print(tables(figures))
        return
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).parent / "images/frontier.svg"
    out.write_text(draw(figures))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
