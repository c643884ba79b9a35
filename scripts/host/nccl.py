"""NCCL facts: the releases known to misbehave on this box class, the NCCL the image is meant to run, and which NCCL an
interpreter's torch actually runs (without a GPU).

torch.cuda.nccl.version() is the NCCL torch was *built* against (NCCL_MAJOR/MINOR/PATCH of the headers at torch's
build), whatever library it loads. The one that runs is the libnccl.so.2 mapped into the process: torch/__init__.py
preloads nvidia/nccl/lib/libnccl.so.* from the first sys.path entry that has one, and libtorch_cuda.so's RPATH names
$ORIGIN/../../nvidia/nccl/lib. nccl_report() asks that library (ncclGetVersion) and says where it came from.
"""

from __future__ import annotations

import inspect
import os
import re
import textwrap

from ..lib.errors import UserError
from ..lib.progress import say
from ..series.pin import Pin, load_pin

KNOWN_BAD_NCCL = {
    "2.30.4": "hangs on the first all-reduce between RTX PRO 6000 pairs unless P2P is disabled "
              "(field report: local-inference-lab/rtx6kpro#15)",
    "2.26.2": "hits an illegal memory access in all-reduces of 512 KiB and more on RTX PRO 6000 pairs (NVIDIA/nccl#2418)",
}
EXPECTED_VAR = "EAGLE_NCCL_VERSION"  # set in the image: the NCCL its build installed (docker/Dockerfile)
RELEASE_RE = re.compile(r"^\d+\.\d+\.\d+(\.post\d+)?$")


def nccl_release(pin: Pin, version: str | None) -> tuple[str, str]:
    """(package==version, version) the image gets: the pin's [nccl] (its package checked against the base image's
    CUDA major), or `version`, a variant (said; a known-bad release is built with a warning, to reproduce it)."""
    pinned = pin.nccl_requirement
    if not version or version == pin.nccl_version:
        return pinned, pin.nccl_version
    if not RELEASE_RE.match(version):
        raise UserError(f"NCCL {version!r} is not a release number such as {pin.nccl_version}: see "
                        f"`pip index versions {pin.nccl_package}`")
    say(f"NCCL variant: {pin.nccl_package}=={version} instead of the pinned {pin.nccl_version} "
        f"(patches/pin.toml [nccl])")
    if version in KNOWN_BAD_NCCL:
        say(f"warning: NCCL {version} {KNOWN_BAD_NCCL[version]}; build it only to reproduce that")
    return f"{pin.nccl_package}=={version}", version


def nccl_report() -> dict:
    """What this interpreter runs: torch (version), nccl_build (torch.cuda.nccl.version()), nccl and nccl_lib (the
    libnccl.so.2 torch loaded: ncclGetVersion, path), dist and dist_version (the pip package); error when torch does
    not import. Standard library and torch only: NCCL_PROBE runs this source in another interpreter."""
    import ctypes
    import importlib.metadata as md

    def dotted(v):  # NCCL_VERSION_CODE: 2.9 and later major*10000 + minor*100 + patch, before *1000 + *100
        parts = (v // 10000, v // 100 % 100, v % 100) if v >= 10000 else (v // 1000, v // 100 % 10, v % 100)
        return "%d.%d.%d" % parts

    r = {}
    try:
        import torch

        r["torch"] = torch.__version__
        v = torch.cuda.nccl.version()
        r["nccl_build"] = ".".join(map(str, v[:3])) if isinstance(v, tuple) else dotted(int(v))
        with open("/proc/self/maps") as maps:
            lib = next((ln.split()[-1] for ln in maps if "/libnccl.so" in ln), None)
        code = ctypes.c_int()
        if lib and ctypes.CDLL(lib).ncclGetVersion(ctypes.byref(code)) == 0:
            r["nccl"], r["nccl_lib"] = dotted(code.value), lib
    except Exception as e:  # noqa: BLE001 - no torch, a CPU build, no /proc: say what failed
        r["error"] = "%s: %s" % (type(e).__name__, e)
    for d in ("nvidia-nccl-cu13", "nvidia-nccl-cu12"):
        try:
            r["dist"], r["dist_version"] = d, md.version(d)
            break
        except md.PackageNotFoundError:
            pass
    return r


# Run with the interpreter under test (doctor --python, image_deps): prints nccl_report() as one JSON object.
NCCL_PROBE = (textwrap.dedent(inspect.getsource(nccl_report)) +
              "\nimport json\nprint(json.dumps(nccl_report()))\n")


def expected_nccl(environ: dict[str, str] | None = None) -> tuple[str, str]:
    """(version, where it comes from) of the NCCL meant to run: the image build's (EAGLE_NCCL_VERSION, set in the
    image) or the pin's ([nccl] of patches/pin.toml); ('', why) when neither says."""
    env = os.environ if environ is None else environ
    if env.get(EXPECTED_VAR):
        return env[EXPECTED_VAR], f"the image build ({EXPECTED_VAR})"
    try:
        version = load_pin().nccl_version
    except Exception as e:  # noqa: BLE001 - a copy of the tooling without the pin still reports what runs
        return "", f"no pin ({e})"
    return (version, "patches/pin.toml [nccl]") if version else ("", "patches/pin.toml has no [nccl]")
