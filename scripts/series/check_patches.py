"""`make check-patches`: the lint (scripts/series/lint.py), then the round trip: the series applied to a pristine base
with `git am -3` and exported again must give patches/ back byte for byte (Electron's check-patch-diff).

  python -m scripts.series.check_patches [--patches-dir DIR]       (the base: SGLANG_BASE, SGLANG_WHEEL as for apply)

Exit status: 0 healthy; 1 a lint problem or a round-trip difference (printed, with the fix); 2 a setup problem
(the message says what to do); 3 a patch does not apply to the pristine base.
"""

import os
import shutil
import tempfile
from pathlib import Path

from ..lib import proc
from ..lib.cli import parser, run
from ..lib.progress import say
from .am import apply_tree
from .base import clone_base, ensure_base
from .lint import lint
from .pin import export_series, load_pin, series_patches


def round_trip(patches_dir: Path | None) -> str:
    """git diff between patches/ and the re-export of the series applied to a pristine base ('' when the same)."""
    pin = load_pin(patches_dir)
    with tempfile.TemporaryDirectory(prefix="check-patches-") as tmp:
        tree, out = Path(tmp) / "sglang", Path(tmp) / "re-exported"
        clone_base(ensure_base(pin, os.environ.get("SGLANG_BASE") or "auto")[0], tree, pin.tag)
        apply_tree(tree, pin, series_patches(pin))
        export_series(tree, pin, out)
        shutil.copy2(pin.path, out / "pin.toml")
        return proc.run(["git", "diff", "--no-index", "--no-color", "--", str(pin.patches_dir), str(out)]).stdout


def main(argv=None) -> int:
    ap = parser("scripts.series.check_patches", __doc__)
    ap.add_argument("--patches-dir", type=Path)
    a = ap.parse_args(argv)
    problems = lint(a.patches_dir)
    print("".join(f"lint: {p}\n" for p in problems), end="")
    if problems:
        print(f"check-patches: {len(problems)} problem(s) in the series")
        return 1
    say("lint: ok")
    diff = round_trip(a.patches_dir)
    if diff:
        print(
            f"{diff}check-patches: the re-export differs from patches/ (above): make export from the tree the patch "
            f"came from, or restore the patch (git checkout -- patches/)"
        )
        return 1
    say("round trip: apply + export gives patches/ back byte for byte")
    return 0


if __name__ == "__main__":
    run(main)
