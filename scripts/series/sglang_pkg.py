"""The one sglang locator: which sglang package an interpreter would import, found without importing it, and the
patch set it holds (from git). `probe(python)` asks another interpreter, `probe()` this one: {"sglang": its
directory or None, "patched": patch set id or None, "missing": asked-for modules it cannot import}; from a
subprocess that did not answer only {"failed": why}. torch=True (host/route.py's, going with it): also "torch" and
"gpus", or "torch_error"."""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

from ..lib import proc
from ..lib.repo import BUILD_DIR
from .pin import applied_patchset


def facts(modules: tuple = (), torch: bool = False) -> dict:
    """What this interpreter imports (standard library only: it is also the body of the subprocess probe)."""
    import importlib.util
    import os

    def importable(name):
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package that does not import
            return False

    spec = importlib.util.find_spec("sglang")
    r = {"sglang": os.path.dirname(spec.origin) if spec and spec.origin else None,
         "missing": [m for m in modules if not importable(m)]}
    if torch:
        try:
            import torch as t

            r["torch"], r["gpus"] = t.__version__, t.cuda.device_count() if t.cuda.is_available() else 0
        except Exception as e:  # noqa: BLE001 - why torch does not import is the answer
            r["torch_error"] = f"{type(e).__name__}: {e}"
    return r


def probe(python: str | None = None, modules=(), *, torch: bool = False, env: dict[str, str] | None = None,
          timeout: float = 60) -> dict:
    """facts() of `python` (a subprocess with `env`), or of this interpreter when python is None, plus "patched"."""
    if python is None:
        r = facts(tuple(modules), torch)
    else:
        code = f"{inspect.getsource(facts)}\nimport json\nprint(json.dumps(facts({tuple(modules)!r}, {torch!r})))"
        res = proc.run([python, "-c", code], env=env, timeout=max(timeout, 180) if torch else timeout)
        try:
            r = json.loads(res.stdout.strip().splitlines()[-1]) if res.ok else {"failed": res.why}
        except (ValueError, IndexError):
            r = {"failed": f"{python} printed no answer"}
    if r.get("sglang"):
        r["patched"] = applied_patchset(Path(r["sglang"]))
    return r


def find_sglang(python: str = sys.executable, timeout: float = 60.0) -> tuple[Path | None, str]:
    """(the sglang package directory `python` imports, '') or (None, why not)."""
    info = probe(python, timeout=timeout)
    if info.get("failed"):
        return None, info["failed"]
    return (Path(info["sglang"]), "") if info["sglang"] else (None, f"{python} has no sglang installed")


def patch_record(python: str = sys.executable) -> dict:
    """What `python`'s sglang holds: {patchset, sglang}; patchset "none" (stock) or "unknown" (with detail)."""
    pkg, why = find_sglang(python)
    if pkg is None:
        return {"patchset": "unknown", "detail": why}
    return {"patchset": applied_patchset(pkg) or "none", "sglang": str(pkg)}


def package_or_tree() -> Path:
    """The sglang package this interpreter imports, else build/sglang's (the patched tree `make apply` builds)."""
    found = facts().get("sglang")
    return Path(found) if found else BUILD_DIR / "sglang" / "python" / "sglang"
