"""The one number formatter of the bench reports (tables, markdown, the cost model) and the duration formatter."""

from __future__ import annotations

import statistics

DASH = "–"


def num(x: float | None, digits: int = 1, *, none: str = DASH, small: bool = False) -> str:
    """x with `digits` decimals; `none` for a missing value; small=True gives values below 10 two decimals."""
    if x is None:
        return none
    if small and abs(x) < 10 and digits < 2:
        digits = 2
    return f"{x:.{digits}f}"


def spread(vals: list[float], digits: int = 2, unit: str = "", *, sep: str = "-", none: str = "not measured") -> str:
    """One value, or the median with the range in brackets when the values differ at this precision."""
    if not vals:
        return none
    if len(vals) == 1 or max(vals) - min(vals) < 10 ** -digits:
        return f"{num(vals[0], digits)}{unit}"
    return (f"{num(statistics.median(vals), digits)}{unit} ({num(min(vals), digits)}{sep}"
            f"{num(max(vals), digits)})")


def duration(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"
