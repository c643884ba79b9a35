"""The one sglang locator: the sglang package directory an interpreter would import, found without importing it."""

import sys
from pathlib import Path

from ..lib import proc

FIND = (
    "import importlib.util, os; s = importlib.util.find_spec('sglang'); "
    "print(os.path.dirname(s.origin) if s and s.origin else '')"
)


def find_sglang(
    python: str = sys.executable, timeout: float = 60.0, env: dict[str, str] | None = None
) -> tuple[Path | None, str]:
    """(the sglang package directory `python` imports, '') or (None, why not)."""
    res = proc.run([python, "-c", FIND], timeout=timeout, env=env)
    if not res.ok:
        return None, res.why
    found = (res.stdout.strip().splitlines() or [""])[-1]
    return (Path(found), "") if found else (None, f"{python} has no sglang installed")
