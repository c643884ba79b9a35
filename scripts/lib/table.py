"""How the reports print: the one markdown-table writer (make bench's report, the receipt, the cost model's blocks,
bench-comm's printout, the README's series table) and the number and duration formats in them."""

import statistics

DASH = "–"


def md_table(header: list[str] | str, rows: list[list | str], align: str = "") -> str:
    """A markdown table. The header and each row: its cells, or one string of them as the table shows them
    ("a | b | c"); align: one letter per column, "l" (default) or "r" (numbers). No trailing newline."""
    header, rows = _cells(header), [_cells(r) for r in rows]
    marks = [":" if (align[i : i + 1] == "r") else "" for i in range(len(header))]
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "|".join(f"---{m}" for m in marks) + "|"]
    lines += ["| " + " | ".join("" if c is None else str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _cells(row: list | str) -> list:
    return row.split(" | ") if isinstance(row, str) else row


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
    if len(vals) == 1 or max(vals) - min(vals) < 10**-digits:
        return f"{num(vals[0], digits)}{unit}"
    median, low, high = (num(x, digits) for x in (statistics.median(vals), min(vals), max(vals)))
    return f"{median}{unit} ({low}{sep}{high})"


def duration(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"
