"""The one markdown-table writer: reports, receipts, the cost model's tables and bench-comm's printout use it."""

from __future__ import annotations


def md_table(header: list[str], rows: list[list], align: str = "") -> str:
    """A markdown table; align: one letter per column, "l" (default) or "r" (numbers). No trailing newline."""
    marks = [":" if (align[i:i + 1] == "r") else "" for i in range(len(header))]
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "|".join(f"---{m}" for m in marks) + "|"]
    lines += ["| " + " | ".join("" if c is None else str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)
