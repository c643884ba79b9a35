"""`python -m scripts.host.image_deps`: what the serving image adds to the upstream image's python, at build time.

  python -m scripts.host.image_deps --python python3 [--nccl VERSION]             install (docker/Dockerfile)
  python -m scripts.host.image_deps --python python3 [--nccl VERSION] --dry-run   print the pip commands only

1. NCCL, part of what the image ships: PACKAGE==VERSION of patches/pin.toml [nccl] (the package follows the base
   image's CUDA major; --nccl VERSION builds a variant, `make image NCCL=<version>`; an empty --nccl means the pin's),
   installed with `PY -m pip install --no-deps` into PY's environment, where torch loads it: libtorch_cuda.so's RPATH
   names nvidia/nccl/lib of the same site-packages, and torch/__init__.py preloads nvidia/nccl/lib/libnccl.so.* from
   the first sys.path entry that has one. --no-deps: the wheel has no dependencies, and it replaces torch's own pin of
   the package on purpose (pip reports that difference). Then PY is asked which NCCL torch loaded
   (scripts/host/nccl.py: ncclGetVersion of the mapped libnccl.so.2, not torch.cuda.nccl.version(), which is the NCCL
   torch was built against); it must be VERSION.
2. pytest, which `test-gpu` runs in the image: pytest at its version in requirements/test.lock, constrained by that
   file (`PY -m pip install -c requirements/test.lock pytest==X`).

pip runs with your PIP_* settings (e.g. PIP_INDEX_URL, PIP_FIND_LINKS); where PY's environment is marked externally
managed (PEP 668), --break-system-packages is added, and said: the image build owns that environment.
Exit status: 0 installed and torch loads VERSION (or printed, with --dry-run); 1 torch loads another NCCL after the
install; 2 a problem named with its fix (a malformed version, a pin whose package does not fit the base image, pip
failed, PY does not answer).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

from ..lib import proc
from ..lib.cli import run
from ..lib.errors import UserError
from ..lib.progress import say
from ..lib.repo import REPO_ROOT
from ..series.pin import load_pin
from .nccl import NCCL_PROBE, nccl_release

LOCK = REPO_ROOT / "requirements" / "test.lock"
PIP_TIMEOUT = 1800.0  # the NCCL wheel is ~200 MB
_MANAGED = ("import os, sysconfig; "
            "print(os.path.isfile(os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')))")


def pytest_requirement(lock: Path = LOCK) -> str:
    m = re.search(r"^pytest==(\S+)$", lock.read_text(), re.M) if lock.is_file() else None
    if m is None:
        raise UserError(f"{lock} pins no pytest (a line pytest==X): make setup's lock must list it")
    return f"pytest=={m.group(1)}"


def pip_commands(python: str, nccl_req: str, pytest_req: str, managed: bool) -> list[list[str]]:
    extra = ["--break-system-packages"] if managed else []
    return [[python, "-m", "pip", "install", "--no-deps", "--no-cache-dir", *extra, nccl_req],
            [python, "-m", "pip", "install", "--no-cache-dir", *extra, "-c", str(LOCK), pytest_req]]


def loaded_nccl(python: str) -> dict:
    res = proc.run([python, "-c", NCCL_PROBE], timeout=300)
    if not res.ok:
        raise UserError(f"cannot ask {python} which NCCL torch loads ({res.why})")
    return json.loads(res.stdout.strip().splitlines()[-1])


def install(cmds: list[list[str]], python: str, version: str) -> int:
    for cmd in cmds:
        say(f"running: {shlex.join(cmd)}")
        res = proc.run(cmd, timeout=PIP_TIMEOUT, capture=False)
        if not res.ok:
            raise UserError(f"pip failed ({res.why}); the log above says why (no network in docker build? a "
                            f"release PyPI does not have: pip index versions {cmd[-1].split('==')[0]})")
    info = loaded_nccl(python)
    if info.get("nccl") != version:
        print(f"image_deps: after installing NCCL {version}, torch loads {info.get('nccl') or 'no NCCL'} from "
              f"{info.get('nccl_lib') or '?'} ({info.get('error') or 'another copy comes first on its search path'})",
              file=sys.stderr)
        return 1
    say(f"torch loads NCCL {version} from {info['nccl_lib']} (torch was built against {info.get('nccl_build')})")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts.host.image_deps", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable, help="the interpreter that serves (the image: python3)")
    ap.add_argument("--nccl", default="", metavar="VERSION",
                    help="NCCL release to install (default, or empty: patches/pin.toml [nccl])")
    ap.add_argument("--dry-run", action="store_true", help="print the pip commands, install nothing")
    a = ap.parse_args(argv)
    nccl_req, version = nccl_release(load_pin(), a.nccl)
    pytest_req = pytest_requirement()
    managed = False
    if not a.dry_run:
        res = proc.run([a.python, "-c", _MANAGED], timeout=60)
        if not res.ok:
            raise UserError(f"{a.python} does not answer ({res.why}); pass --python with the serving interpreter")
        managed = res.stdout.strip() == "True"
        if managed:
            say(f"{a.python}'s environment is marked externally managed (PEP 668): installing with "
                f"--break-system-packages, as the image build owns it")
    cmds = pip_commands(a.python, nccl_req, pytest_req, managed)
    if a.dry_run:
        print("\n".join(shlex.join(c) for c in cmds))
        return 0
    return install(cmds, a.python, version)


if __name__ == "__main__":
    run(main)
