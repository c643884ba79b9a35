"""README.md's series table, generated from the patches themselves: each patch's subject, the SGLANG_* switches its
added lines define or read, and its DEP-3 Forwarded line. `make export` writes it between the markers;
`make check-patches` fails while it differs from the series."""

import re

from ..lib.repo import REPO_ROOT
from ..lib.table import md_table
from .pin import Pin, series_patches

README = REPO_ROOT / "README.md"
START, END = "<!-- series: make export writes this table -->", "<!-- /series -->"
SWITCH = re.compile(r"^\+(?!\+\+).*?(?:envs\.|^\+\s+)(SGLANG_[A-Z0-9_]+)", re.M)
FORWARDED = re.compile(r"^Forwarded:\s*(\S+)", re.M)


def series_table(pin: Pin) -> str:
    rows = []
    for n, p in enumerate(series_patches(pin), 1):
        switches = sorted(set(SWITCH.findall(p.path.read_text().partition("\ndiff --git ")[2])))
        forwarded = FORWARDED.search(p.message)
        upstream = "not sent" if not forwarded or forwarded[1] == "no" else forwarded[1]
        rows.append([n, p.subject, ", ".join(f"`{s}`" for s in switches) or "-", upstream])
    return md_table(["#", "patch", "switches", "upstream"], rows, "r")


def with_table(text: str, pin: Pin) -> str:
    """`text` (README.md) with the table between the markers replaced; unchanged when it has no markers."""
    head, sep, rest = text.partition(START + "\n")
    if not sep or END not in rest:
        return text
    return f"{head}{START}\n{series_table(pin)}\n{END}{rest.partition(END)[2]}"


def ours(pin: Pin) -> bool:
    """Whether `pin` is this repository's series (README.md describes no other)."""
    return README.is_file() and pin.patches_dir.resolve() == (REPO_ROOT / "patches").resolve()


def write_readme(pin: Pin) -> bool:
    """Rewrite README.md's table; whether it changed."""
    if not ours(pin):
        return False
    old = README.read_text()
    new = with_table(old, pin)
    README.write_text(new)
    return new != old


def readme_problems(pin: Pin) -> list[str]:
    if ours(pin) and with_table(README.read_text(), pin) != README.read_text():
        return ["README.md: its series table differs from patches/: make export writes it"]
    return []
