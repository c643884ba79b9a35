"""`make export`: patches/ (*.patch and the series file) from the commits of build/sglang after its base.

  python -m scripts.series.export [--tree build/sglang] [--patches-dir patches]

A commit keeps its file name through its `Patch-Filename:` line; a new commit is named from its subject and gets the
line. README.md's series table is rewritten from the patches (scripts/series/readme.py). Exit status: 0 exported; 2 the tree is not a linear series on its base (the message says what to do).
"""

from pathlib import Path

from ..lib import git
from ..lib.cli import parser, run
from ..lib.progress import say
from ..lib.repo import BUILD_DIR
from .am import APPLIED
from .pin import export_series, load_pin
from .readme import write_readme


def main(argv=None) -> int:
    ap = parser("scripts.series.export", __doc__)
    ap.add_argument("--tree", type=Path, default=BUILD_DIR / "sglang")
    ap.add_argument("--patches-dir", type=Path)
    a = ap.parse_args(argv)
    pin = load_pin(a.patches_dir)
    names = export_series(a.tree, pin, pin.patches_dir)
    git.git(a.tree, "update-ref", APPLIED, "HEAD")  # the tree and patches/ agree again
    say(
        f"exported {len(names)} patches to {pin.patches_dir}"
        + (" and README.md's series table" if write_readme(pin) else "")
    )
    return 0


if __name__ == "__main__":
    run(main)
