"""The one sglang locator: which sglang package an interpreter would import, found without importing it (no torch,
no GPU), whether it carries the series' record (sglang/_patchset.json), and what else the caller asks about it.

`probe(python)` asks another interpreter in a subprocess, `probe()` this one in-process; both run `facts`, so they
answer the same question the same way: {"sglang": the package directory or None, "patched": it carries the record,
"missing": the asked-for modules it cannot import}, with torch=True also {"torch", "gpus"} or {"torch_error"}, and
from a subprocess that did not answer only {"failed": why}.
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

from ..lib import proc
from ..lib.errors import UserError
from ..lib.repo import BUILD_DIR
from .record import RECORD_NAME, read_record


def facts(modules: tuple = (), torch: bool = False) -> dict:
    """What this interpreter imports (standard library only: it is also the body of the subprocess probe)."""
    import importlib.util
    import os

    def importable(name):
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package that does not import
            return False

    r = {"sglang": None, "patched": False, "missing": [m for m in modules if not importable(m)]}
    spec = importlib.util.find_spec("sglang")
    if spec and spec.origin:
        r["sglang"] = os.path.dirname(spec.origin)
        r["patched"] = os.path.isfile(os.path.join(r["sglang"], RECORD_NAME))
    if torch:
        try:
            import torch as t

            r["torch"], r["gpus"] = t.__version__, t.cuda.device_count() if t.cuda.is_available() else 0
        except Exception as e:  # noqa: BLE001 - why torch does not import is the answer
            r["torch_error"] = f"{type(e).__name__}: {e}"
    return r


def probe(python: str | None = None, modules=(), *, torch: bool = False, env: dict[str, str] | None = None,
          timeout: float | None = None) -> dict:
    """facts() of `python` (a subprocess with `env`), or of this interpreter when python is None."""
    if python is None:
        return facts(tuple(modules), torch)
    code = (f"RECORD_NAME = {RECORD_NAME!r}\n{inspect.getsource(facts)}\nimport json\n"
            f"print(json.dumps(facts({tuple(modules)!r}, {torch!r})))")
    res = proc.run([python, "-c", code], env=env, timeout=timeout or (180 if torch else 60))
    if not res.ok:
        return {"failed": res.why}
    try:
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"failed": f"{python} printed no answer"}


def package_or_tree() -> Path:
    """The sglang package this interpreter imports, else build/sglang's (the patched tree `make apply` builds)."""
    found = probe().get("sglang")
    return Path(found) if found else BUILD_DIR / "sglang" / "python" / "sglang"


def find_sglang(python: str = sys.executable, timeout: float = 60.0) -> tuple[Path | None, str]:
    """(the sglang package directory `python` imports, '') or (None, why not)."""
    info = probe(python, timeout=timeout)
    if info.get("failed"):
        return None, info["failed"]
    return (Path(info["sglang"]), "") if info["sglang"] else (None, f"{python} has no sglang installed")


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
        return {"patchset": "none", "detail": f"{pkg} carries no {RECORD_NAME} (stock sglang)", "sglang": str(pkg)}
    return {"patchset": rec.get("patchset", "unknown"), "patches": [p.get("subject") for p in rec.get("patches", [])],
            "sglang": str(pkg)}
