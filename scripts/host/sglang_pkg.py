"""The one way to find the sglang package an interpreter would import, without importing it (no torch, no GPU),
and the patch record (sglang/_patchset.json) it carries."""

from __future__ import annotations

import sys
from pathlib import Path

from ..lib import proc
from ..lib.errors import UserError
from ..series.record import read_record

_FIND = ("import importlib.util,pathlib;s=importlib.util.find_spec('sglang');"
         "print(pathlib.Path(s.origin).parent if s and s.origin else '')")


def find_sglang(python: str = sys.executable, timeout: float = 60.0) -> tuple[Path | None, str]:
    """(the sglang package directory `python` imports, '') or (None, why not)."""
    res = proc.run([python, "-c", _FIND], timeout=timeout)
    if not res.ok:
        return None, res.why
    pkg = res.stdout.strip()
    return (Path(pkg), "") if pkg else (None, f"{python} has no sglang installed")


def site_packages_of(python: str = sys.executable) -> Path:
    """The directory holding `python`'s sglang/ (what apply --python and the image build patch)."""
    pkg, why = find_sglang(python)
    if pkg is None:
        raise UserError(f"{why}: install sglang for {python} first, or pass --site-packages DIR")
    return pkg.parent


def patch_record(python: str = sys.executable) -> dict:
    """What `python`'s sglang says about its patches: {patchset, patches, sglang}, or {patchset: none|unknown,
    detail}."""
    pkg, why = find_sglang(python)
    if pkg is None:
        return {"patchset": "unknown", "detail": why}
    rec = read_record(pkg)
    if rec is None:
        return {"patchset": "none", "detail": f"{pkg} carries no _patchset.json (stock sglang)", "sglang": str(pkg)}
    return {"patchset": rec.get("patchset", "unknown"), "patches": [p.get("subject") for p in rec.get("patches", [])],
            "sglang": str(pkg)}
