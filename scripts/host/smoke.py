"""Import smoke of the patched SGLang: its serving entry points and every Python module the series touches.

  python -m scripts.host.smoke [--expect-nccl VERSION] [--tolerate-no-driver]

`import sglang` comes first; when the package itself fails, that failure is named once and nothing else is tried.
Each module is then ok (imported), compiled only (with --tolerate-no-driver, as in docker build, which has no GPU:
its import failed only for want of the NVIDIA driver, and its source compiles) or FAIL; the summary counts the three
apart. --expect-nccl: torch must load that NCCL release (ncclGetVersion of the library it mapped).
Exit status: 0 every module imports or compiles (and the NCCL is the one expected); 1 otherwise; 2 a usage problem.
"""

import importlib
import re
from pathlib import Path

from ..lib.cli import parser, run
from ..lib.repo import REPO_ROOT
from .nccl import nccl_report

ENTRY = (
    "sglang.srt.server_args",
    "sglang.launch_server",
    "sglang.srt.entrypoints.http_server",
    "sglang.benchmark.serving",
)
NO_DRIVER = (
    "libcuda.so",
    "libnvidia-ml.so",
    "Found no NVIDIA driver",
    "no CUDA-capable device",
    "CUDA driver version is insufficient",
    "NVML Shared Library Not Found",
    "cudaErrorNoDevice",
)


def series_modules(patches: Path = REPO_ROOT / "patches") -> list[str]:
    """The modules of python/sglang/**.py that the patches in patches/series change, in series order."""
    names = [n.strip() for n in (patches / "series").read_text().splitlines() if n.strip() and n[0] != "#"]
    files = dict.fromkeys(
        f for n in names for f in re.findall(r"^diff --git a/(\S+) b/", (patches / n).read_text(), re.M)
    )
    return [
        f[7:-3].replace("/", ".").removesuffix(".__init__")
        for f in files
        if f.startswith("python/sglang/") and f.endswith(".py")
    ]


def try_import(mod: str, pkg_parent: Path, tolerate: bool) -> tuple[str, str]:
    try:
        importlib.import_module(mod)
        return "ok", ""
    except Exception as e:  # noqa: BLE001 - any import-time failure is the finding
        said = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if tolerate and isinstance(e, (OSError, ImportError, RuntimeError)) and any(m in str(e) for m in NO_DRIVER):
            src = pkg_parent.joinpath(*mod.split("."))
            src = src / "__init__.py" if src.is_dir() else src.with_suffix(".py")
            compile(src.read_bytes(), str(src), "exec")  # a SyntaxError here is a failure of its own
            return "compiled", said
        return "FAIL", said


def main(argv=None) -> int:
    ap = parser("scripts.host.smoke", __doc__)
    ap.add_argument("--expect-nccl", metavar="VERSION", help="fail unless torch loads this NCCL release")
    no_driver = "count a driver-only import failure as compiled only (docker build)"
    ap.add_argument("--tolerate-no-driver", action="store_true", help=no_driver)
    a = ap.parse_args(argv)
    try:
        pkg = importlib.import_module("sglang")
    except Exception as e:  # noqa: BLE001
        print(f"FAIL      sglang: the package itself does not import ({type(e).__name__}: {e}); nothing else tried")
        return 1
    print(f"sglang at {Path(pkg.__file__).parent}")
    counts = {"ok": 0, "compiled": 0, "FAIL": 0}
    for mod in dict.fromkeys([*ENTRY, *series_modules()]):
        status, said = try_import(mod, Path(pkg.__file__).parent.parent, a.tolerate_no_driver)
        counts[status] += 1
        print(f"{status:<9} {mod}" + (f"  ({said})" if said else ""), flush=True)
    bad_nccl = False
    if a.expect_nccl:
        nccl = nccl_report()
        bad_nccl = nccl.get("nccl") != a.expect_nccl
        print(
            f"{'FAIL' if bad_nccl else 'ok':<9} NCCL {nccl.get('nccl') or nccl.get('error')} loaded by torch "
            f"{nccl.get('torch')} from {nccl.get('nccl_lib')}; expected {a.expect_nccl}"
        )
    print(
        f"smoke: {counts['ok']} import, {counts['compiled']} compiled only (need the NVIDIA driver), "
        f"{counts['FAIL']} failed, of {sum(counts.values())} modules"
    )
    return 1 if counts["FAIL"] or bad_nccl else 0


if __name__ == "__main__":
    run(main)
