"""Jupyter renderings: a trace's summary, and a replay's figures with its timeline drawn as
an inline SVG (no JavaScript, no plotting library)."""

from __future__ import annotations

import html
from typing import Any, Iterable, Sequence

_GIB = float(1 << 30)


def _table(rows: Iterable[tuple[str, Any]]) -> str:
    cells = "".join(
        f"<tr><th style='text-align:left'>{html.escape(str(k))}</th>"
        f"<td style='text-align:left'>{html.escape(str(v))}</td></tr>"
        for k, v in rows
    )
    return f"<table>{cells}</table>"


def _gib(n: int) -> str:
    return f"{n / _GIB:.3f} GiB ({n:,} B)"


def trace_html(trace: Any) -> str:
    i = trace.info
    return f"<b>allocsim trace</b> {html.escape(trace.path)}" + _table(
        [
            ("format", i["format"]),
            ("ops", f"{i['ops']:,}"),
            ("peak live", _gib(i["peak_live_bytes"])),
            ("settings", i["alloc_conf"] or "(defaults)"),
            ("streams", ", ".join(map(str, i["streams"]))),
            ("warnings", len(i["warnings"])),
        ]
    )


def timeline_svg(
    op: Sequence[int], allocated: Sequence[int], reserved: Sequence[int], width: int = 640,
    height: int = 160,
) -> str:
    """Reserved (filled) and allocated (line) bytes over ops."""
    if len(op) == 0:
        return ""
    x_max = max(max(op), 1)
    y_max = max(max(reserved), max(allocated), 1)

    def points(ys: Sequence[int]) -> str:
        return " ".join(
            f"{x * width / x_max:.1f},{height - y * height / y_max:.1f}" for x, y in zip(op, ys)
        )

    area = f"0,{height} {points(reserved)} {width},{height}"
    return (
        f"<svg width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
        "xmlns='http://www.w3.org/2000/svg' role='img'>"
        f"<title>reserved (filled) and allocated (line) over {x_max:,} ops; "
        f"top is {y_max / _GIB:.2f} GiB</title>"
        f"<polygon points='{area}' fill='#9ecae1'/>"
        f"<polyline points='{points(allocated)}' fill='none' stroke='#08519c' stroke-width='1'/>"
        "</svg>"
    )


def replay_html(result: Any) -> str:
    r = result.raw
    t = r["timeline"]
    rows = [
        ("policy", f"{r['policy']} {r['alloc_conf']}".strip()),
        ("peak reserved", _gib(r["peak_reserved_bytes"])),
        ("peak allocated", _gib(r["peak_allocated_bytes"])),
        ("fragmentation at peak", f"{r['fragmentation_at_peak']:.3f}"),
        ("OOMs", len(r["ooms"])),
        ("ops", f"{r['ops']:,}"),
    ]
    title = f"<b>allocsim replay</b> {html.escape(str(r['trace']))}"
    return title + _table(rows) + timeline_svg(t["op"], t["allocated_bytes"], t["reserved_bytes"])
