"""How every report prints a figure: one set of formatters, so that a missing figure reads the
same everywhere ("-") and no report prints a NaN or keeps a formatter of its own."""

from __future__ import annotations

import math

MISSING = "-"


def number(value: float | None, digits: int = 1) -> str:
    """With thousands separators and a fixed number of decimals: `1,234.5`."""
    if value is None or not math.isfinite(value):
        return MISSING
    return f"{value:,.{digits}f}"


def figure(value: float | None) -> str:
    """Decimals only where they matter: `1,234`, `156`, `56.2`, `0.3`, and a count as `3`."""
    if value is None or not math.isfinite(value):
        return MISSING
    return f"{value:,.0f}" if abs(value) >= 100 or float(value).is_integer() else f"{value:.1f}"


def share(value: float | None, digits: int = 0) -> str:
    """A fraction as a percentage: 0.123 -> `12%`."""
    if value is None or not math.isfinite(value):
        return MISSING
    return f"{value * 100:.{digits}f}%"


def with_unit(text: str, unit: str) -> str:
    """`12 ms`; a missing figure goes without its unit."""
    return f"{text} {unit}" if unit and text != MISSING else text


def verdict(ok: bool | None) -> str:
    """A goal's outcome as every report prints it."""
    return {True: "met", False: "**NOT met**", None: "not measured"}[ok]
