"""`make check-patches`: the lint (scripts/series/lint.py), then the round trip: the series applied to a pristine
base with `git am -3` and exported again must give patches/ back byte for byte (Electron's check-patch-diff).

  python -m scripts.series.check_patches [--patches-dir DIR] [--source auto|clone|wheel] [--lint-only]

Exit status: 0 healthy; 1 a lint problem or a round-trip difference (printed, with the fix); 2 a setup problem
(no base: the message says what to do); 3 a patch does not apply to the pristine base.
"""

from __future__ import annotations

import argparse
import difflib
import os
import tempfile
from pathlib import Path

from ..lib.cli import run
from ..lib.progress import say
from .am import apply_checkout
from .base import SOURCES, clone_base, ensure_base
from .lint import lint
from .pin import export_series, load_pin, series_patches


def round_trip(patches_dir: Path | None, source: str) -> list[str]:
    """Unified diffs between patches/ and the re-export of the series applied to a pristine base (empty: same)."""
    pin = load_pin(patches_dir)
    bare, _ = ensure_base(pin, source)
    with tempfile.TemporaryDirectory(prefix="check-patches-") as tmp:
        tree, out = Path(tmp) / "sglang", Path(tmp) / "export"
        clone_base(bare, tree, pin.tag)
        apply_checkout(tree, pin, series_patches(pin))
        export_series(tree, pin, out)
        names = sorted({p.name for p in [*pin.patches_dir.glob("*.patch"), *out.glob("*.patch")]} | {pin.series_file})
        diffs = []
        for name in names:
            a, b = [(d / name).read_text().splitlines(True) if (d / name).is_file() else [] for d in (pin.patches_dir,
                                                                                                      out)]
            diffs += ["".join(difflib.unified_diff(a, b, f"patches/{name}", f"re-exported/{name}"))] if a != b else []
        return diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts.series.check_patches", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--patches-dir", type=Path)
    ap.add_argument("--source", choices=SOURCES, default=os.environ.get("SGLANG_BASE") or "auto")
    ap.add_argument("--lint-only", action="store_true")
    a = ap.parse_args(argv)
    problems = lint(a.patches_dir)
    print("".join(f"lint: {p}\n" for p in problems), end="")
    if problems:
        print(f"check-patches: {len(problems)} problem(s) in the series")
        return 1
    say("lint: ok")
    if a.lint_only:
        return 0
    diffs = round_trip(a.patches_dir, a.source)
    if diffs:
        print("\n".join(diffs) + "check-patches: the re-export differs from patches/ (above): run make export and "
              "commit, or restore the patch (git checkout -- patches/)")
        return 1
    say("round trip: apply + export gives patches/ back byte for byte")
    return 0


if __name__ == "__main__":
    run(main)
