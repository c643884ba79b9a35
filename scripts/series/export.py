"""`make export`: regenerate patches/ (series, *.patch, pin blob ids) from the commits of build/sglang.

  python -m scripts.series.export [--tree build/sglang] [--patches-dir patches] [--out DIR]

Each commit after the pinned tag becomes one patch, in order, named by its `Patch-Filename:` line (or, for a new
commit, from its subject; the line is then added to its patch). See scripts/series/exporting.py for what makes the
export byte-stable. Exit status: 0 exported; 2 the tree is not a linear series on the pinned tag (the message says
what to do).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..lib.cli import run
from ..lib.progress import say
from ..lib.repo import BUILD_DIR
from .exporting import export
from .pin import load_pin


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts.series.export", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", type=Path, default=BUILD_DIR / "sglang")
    ap.add_argument("--patches-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="write here instead of the patches directory")
    a = ap.parse_args(argv)
    pin = load_pin(a.patches_dir)
    out = a.out or pin.patches_dir
    names = export(a.tree, pin, out)
    say(f"exported {len(names)} patches to {out}")
    return 0


if __name__ == "__main__":
    run(main)
