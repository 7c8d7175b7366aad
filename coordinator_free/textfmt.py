"""Number and table formatting shared by the CLI and the families' renderers.

A leaf module (it imports nothing from the package) so that both ``cli/`` and
``families/*/render.py`` can use it without either importing the other.
"""

from __future__ import annotations


def fmt(x: float | None) -> str:
    """A loss or error in a table cell: fixed point in the readable range, else scientific."""
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if abs(x) >= 1e4 or abs(x) < 1e-3:
        return f"{x:.2e}"
    return f"{x:.4f}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A right-aligned plain-text table (header, rule, rows)."""
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    return "\n".join(out)
