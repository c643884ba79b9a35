"""`python -m scripts.host.pcie_env`: the patched launcher's NCCL defaults for PCIe-only hosts, as an env file.

  python -m scripts.host.pcie_env                        print them (KEY=VALUE) from the sglang this interpreter
                                                         imports, else from build/sglang
  python -m scripts.host.pcie_env --tree DIR             ... from a git checkout (DIR/python/sglang)
  python -m scripts.host.pcie_env --site-packages DIR    ... from an installed package (DIR/sglang)
  python -m scripts.host.pcie_env --python PY            ... from the sglang PY imports (the image build)
  python -m scripts.host.pcie_env --out FILE             write them to FILE (docker run --env-file FILE)
  python -m scripts.host.pcie_env --check FILE           exit 1 if FILE differs from what would be written
  python -m scripts.host.pcie_env --json                 one JSON object

The one source is the dict literal _PCIE_NCCL_DEFAULTS in sglang/srt/entrypoints/pcie_defaults.py, which the series
adds; the patched launcher applies it itself on PCIe-only hosts, so nothing here needs to (the repository keeps no
copy). Read with `ast`, never by importing sglang: runs without torch or a GPU.
Exit status: 0 printed / written / up to date; 1 --check found a difference; 2 no patched sglang there (or the
dict is not a literal), with the fix.
"""

from __future__ import annotations

import argparse
import difflib
import json
from pathlib import Path

from ..lib.cli import run
from ..lib.progress import say
from .pcie import SOURCE, env_text, package_dir, read_defaults


def check(path: Path, text: str, source: Path) -> int:
    current = path.read_text() if path.is_file() else None
    if current == text:
        say(f"{path} matches {source}")
        return 0
    if current is None:
        print(f"{path} is missing")
    else:
        print("".join(difflib.unified_diff(current.splitlines(keepends=True), text.splitlines(keepends=True),
                                           str(path), f"generated from {source}")), end="")
    print(f"pcie_env: {path} is stale; rewrite it with `python -m scripts.host.pcie_env --out {path}`")
    return 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts.host.pcie_env", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--tree", type=Path, help="patched SGLang git checkout")
    where.add_argument("--site-packages", type=Path, metavar="DIR", help="directory holding a patched sglang/")
    where.add_argument("--python", help="read the sglang this interpreter imports")
    out = ap.add_mutually_exclusive_group()
    out.add_argument("--out", type=Path, help="write the env file here")
    out.add_argument("--check", type=Path, metavar="FILE", help="write nothing; exit 1 if FILE differs")
    out.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    pkg = package_dir(a.tree, a.site_packages, a.python)
    defaults = read_defaults(pkg)
    text = env_text(defaults)
    if a.check:
        return check(a.check, text, pkg / SOURCE)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
        say(f"wrote {a.out} ({len(defaults)} variable(s)) from {pkg / SOURCE}")
    elif a.json:
        print(json.dumps({"source": str(pkg / SOURCE), "defaults": defaults}, indent=1))
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    run(main)
