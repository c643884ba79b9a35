"""Import smoke check of the patched SGLang: every Python module the series touches, plus the serving entry points.

  python -m scripts.host.smoke                         check the sglang this interpreter imports
  python -m scripts.host.smoke --site-packages DIR     ... the one in DIR (DIR holds sglang/), e.g. an unpacked wheel

The module list comes from the series itself (scripts.series.pin touched_files): python/sglang/a/b.py
is sglang.a.b, python/sglang/a/__init__.py is sglang.a; other files (C++, JSON, tests outside python/) are listed
and skipped. Before importing, the package's git history must hold this series (so the check cannot pass
on an unpatched tree), and each module's source must compile. One line per module: ok, FAIL or skip. Exits 1 on
any FAIL. docker/Dockerfile runs this after `scripts.series.apply` (the build fails on a FAIL). Exit status: 0 every
module imports; 1 a FAIL (or the package is not this series); 2 a usage problem.

--expect-nccl [VERSION]: fail unless the NCCL library torch loaded (ncclGetVersion of the mapped libnccl.so.2, not
torch.cuda.nccl.version(), which is torch's build-time NCCL) is VERSION; empty or no VERSION: the image build's
EAGLE_NCCL_VERSION, else patches/pin.toml [nccl]. docker/Dockerfile passes its NCCL_VERSION build argument.
Without it, the NCCL line is information.

--tolerate-no-driver: `docker build` has no GPU and no libcuda; an import that fails only because the NVIDIA driver
is absent (a narrow list of messages) counts as ok-without-driver, after the source compiled. Use it only there.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

from ..lib.cli import run
from ..series.pin import applied_patchset, load_pin, patchset_id, series_patches, touched_files
from ..series.sglang_pkg import probe
from .nccl import KNOWN_BAD_NCCL, expected_nccl, nccl_report

# Imported whatever the series touches: what `serve` execs and what every profile is checked against.
ALWAYS = ("sglang", "sglang.srt.server_args", "sglang.launch_server")

# An import that fails with one of these (and nothing else) failed for want of the NVIDIA driver, not the patches.
NO_DRIVER_MARKERS = (
    "libcuda.so",
    "libnvidia-ml.so",
    "Found no NVIDIA driver",
    "no CUDA-capable device is detected",
    "CUDA driver version is insufficient",
    "NVML Shared Library Not Found",
    "cudaErrorNoDevice",
)



def module_for(repo_path: str) -> tuple[str | None, str]:
    """Module name for a file the series touches, or (None, why it is skipped)."""
    if not repo_path.startswith("python/"):
        return None, "outside python/ (not part of the installed package)"
    rel = repo_path[len("python/"):]
    if not rel.endswith(".py"):
        return None, "not a Python module"
    parts = rel[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if not parts or not all(p.isidentifier() for p in parts):
        return None, "path is not an importable module name"
    return ".".join(parts), ""


def plan(patches_dir: Path | None = None) -> tuple[str, list[tuple[str, str | None, str]]]:
    """(patchset id, [(repo path, module or None, skip reason)]) for the series."""
    pin = load_pin(patches_dir)
    patches = series_patches(pin)
    rows = [(f, *module_for(f)) for f in touched_files(patches)]
    return patchset_id(patches), rows


def _no_driver(exc: BaseException) -> bool:
    text = "".join(traceback.format_exception_only(type(exc), exc))
    return any(m in text for m in NO_DRIVER_MARKERS)


def _module_file(pkg_parent: Path, module: str) -> Path | None:
    base = pkg_parent.joinpath(*module.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def check(pkg_parent: Path, modules: list[str], tolerate_no_driver: bool, out=print) -> list[dict]:
    """Compile, then import each module; one result dict per module."""
    results = []
    for mod in modules:
        t0 = time.monotonic()
        src = _module_file(pkg_parent, mod)
        res = {"module": mod, "status": "ok", "detail": ""}
        try:
            if src is None:
                raise ModuleNotFoundError(f"no source for {mod} under {pkg_parent}")
            compile(src.read_bytes(), str(src), "exec")
            m = importlib.import_module(mod)
            origin = Path(getattr(m, "__file__", "") or "").resolve()
            if pkg_parent.resolve() not in origin.parents:
                raise ImportError(f"{mod} was imported from {origin}, not from {pkg_parent}")
        except SyntaxError as e:
            res.update(status="fail", detail=f"SyntaxError: {e}")
        except BaseException as e:  # noqa: BLE001 - any import-time failure is the finding
            if isinstance(e, KeyboardInterrupt):
                raise
            if tolerate_no_driver and _no_driver(e):
                res.update(status="ok", detail=f"compiled; import needs the NVIDIA driver ({type(e).__name__})")
            else:
                last = traceback.format_exception_only(type(e), e)[-1].strip()
                res.update(status="fail", detail=last)
        res["seconds"] = round(time.monotonic() - t0, 2)
        tag = {"ok": "ok  ", "fail": "FAIL"}[res["status"]]
        out(f"{tag}  {mod}" + (f"  ({res['detail']})" if res["detail"] else ""))
        results.append(res)
    return results


def check_nccl(expect: str | None, out) -> tuple[dict, bool]:
    """The NCCL torch loaded, against the expected one when asked: (report, failed)."""
    rep = nccl_report()
    version = rep.get("nccl")
    if version is None:
        why = rep.get("error") or "no libnccl.so.2 mapped after importing torch"
        out(f"{'FAIL' if expect is not None else 'info'}  NCCL: cannot tell which library torch loads ({why})")
        return rep, expect is not None
    where = f"NCCL {version} loaded by torch {rep.get('torch')} from {rep.get('nccl_lib')} (torch built against " \
            f"{rep.get('nccl_build')})"
    bad = KNOWN_BAD_NCCL.get(version)
    if expect is None:
        out(f"{'warn' if bad else 'info'}  {where}" + (f": {bad}; `serve --check` reports it" if bad else ""))
        return rep, False
    expected, source = (expect, "--expect-nccl") if expect else expected_nccl()
    rep["expected"], rep["expected_from"] = expected, source
    failed = version != expected
    out(f"{'FAIL' if failed else 'ok  '}  {where}; expected {expected or '(none)'} ({source})"
        + (f": {bad}" if bad else ""))
    return rep, failed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts.host.smoke", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--site-packages", type=Path, metavar="DIR", help="import sglang from DIR (DIR holds sglang/)")
    ap.add_argument("--patches-dir", type=Path, default=None, help="patch series directory (default patches/)")
    ap.add_argument("--expect-patchset", default="", metavar="ID",
                    help="fail unless the series has this patch set id (the image build passes its PATCHSET arg)")
    ap.add_argument("--expect-nccl", nargs="?", const="", default=None, metavar="VERSION",
                    help="fail unless torch loads this NCCL (empty: the image build's, else the pin's)")
    ap.add_argument("--tolerate-no-driver", action="store_true",
                    help="count an import that fails only for want of the NVIDIA driver as ok (docker build)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    a = ap.parse_args(argv)

    lines: list[str] = []
    out = (lambda s: lines.append(s)) if a.json else print
    report: dict = {"ok": False}

    def finish(rc: int) -> int:
        report["ok"] = rc == 0
        if a.json:
            report["lines"] = lines
            print(json.dumps(report, indent=1))
        return rc

    pid, rows = plan(a.patches_dir)
    report["patchset"] = pid
    if a.expect_patchset and a.expect_patchset != pid:
        out(f"FAIL  patch set: the build was told {a.expect_patchset}, but the series here is {pid} "
            f"(stale build argument: build with `make image`, which passes PATCHSET)")
        return finish(1)
    if a.site_packages:
        if not (a.site_packages / "sglang" / "__init__.py").is_file():
            out(f"FAIL  no sglang package in {a.site_packages}: pass the directory that holds sglang/")
            return finish(1)
        sys.path.insert(0, str(a.site_packages.resolve()))
    found = probe().get("sglang")
    if not found:
        out(f"FAIL  {sys.executable} cannot import sglang: install it, or pass --site-packages DIR")
        return finish(1)
    pkg_dir = Path(found).resolve()
    pkg_parent = pkg_dir.parent
    report["sglang"] = str(pkg_dir)
    out(f"sglang at {pkg_dir}; series patch set {pid}")

    rec = {"patchset": applied_patchset(pkg_dir)}
    if rec["patchset"] is None:
        out(f"FAIL  {pkg_dir} holds no patch set in git: the series was not applied "
            f"(run python3 -m scripts.series.apply --python {Path(sys.executable).name} first)")
        return finish(1)
    if rec.get("patchset") != pid:
        out(f"FAIL  {pkg_dir} holds patch set {rec.get('patchset')}, the series here is {pid}: "
            f"re-apply (python3 -m scripts.series.apply) or rebuild the image")
        return finish(1)

    modules = list(ALWAYS)
    for path, mod, why in rows:
        if mod is None:
            out(f"skip  {path}: {why}")
        elif _module_file(pkg_parent, mod) is None:
            out(f"skip  {path}: not present after the series (removed by a patch)")
        elif mod not in modules:
            modules.append(mod)
    results = check(pkg_parent, modules, a.tolerate_no_driver, out)
    report["modules"] = results

    report["nccl"], nccl_failed = check_nccl(a.expect_nccl, out)

    failed = [r["module"] for r in results if r["status"] == "fail"]
    out(f"{len(results) - len(failed)}/{len(results)} modules import" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return finish(1 if failed or nccl_failed else 0)


if __name__ == "__main__":
    run(main)
