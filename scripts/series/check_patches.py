"""`make check-patches`: the series is healthy.

  python -m scripts.series.check_patches [--patches-dir DIR] [--source auto|clone|wheel] [--lint-only]

1. Lint (scripts/series/lint.py, like ungoogled-chromium's check_patch_files): the series file and the *.patch
   files agree; every patch is whole (hunk line counts, a proper end), stable `git format-patch --full-index`
   output whose message carries the header
   lines of README "Patch headers" (DEP-3 provenance, DEP-3 Forwarded, Patch-Filename, a real
   author); the pin's blob ids agree with the patches; the Dockerfile's copy of the pin agrees with it.
2. Round trip (like Electron's check-patch-diff): apply the series to a pristine base with `git am -3`, export it
   again, and fail if the export differs from patches/ by a single byte.

Exit status: 0 healthy; 1 a lint problem or a round-trip difference (printed, with the fix); 2 a problem with the
setup (no pin, no base: the message says what to do); 3 a patch does not apply to the pristine base.
"""

from __future__ import annotations

import argparse
import difflib
import os
import tempfile
from pathlib import Path

from ..lib.cli import run
from ..lib.progress import say
from .exporting import export
from .lint import lint
from .patching import apply_git
from .pin import load_pin
from .upstream import SOURCES, clone_base, ensure_base


def round_trip(patches_dir: Path | None, source: str) -> list[str]:
    """Unified diffs between patches/ and a re-export of the series applied to a pristine base (empty: identical)."""
    pin = load_pin(patches_dir)
    bare, info = ensure_base(pin, source, wheel_way="make check-patches SGLANG_BASE=wheel")
    with tempfile.TemporaryDirectory(prefix="check-patches-") as tmp:
        tree = Path(tmp) / "sglang"
        clone_base(bare, tree, pin.tag)
        apply_git(tree, pin, base=info)
        out = Path(tmp) / "export"
        export(tree, pin, out)
        diffs: list[str] = []
        names = {p.name for p in pin.patches_dir.glob("*.patch")} | {p.name for p in out.glob("*.patch")}
        for name in sorted(names | {pin.series_file, "pin.toml"}):
            a, b = pin.patches_dir / name, out / name
            at = a.read_text().splitlines(keepends=True) if a.is_file() else []
            bt = b.read_text().splitlines(keepends=True) if b.is_file() else []
            if at != bt:
                diffs.append("".join(difflib.unified_diff(at, bt, f"patches/{name}", f"re-exported/{name}")))
        return diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts.series.check_patches", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--patches-dir", type=Path, default=None)
    ap.add_argument("--source", choices=SOURCES, default=os.environ.get("SGLANG_BASE") or "auto")
    ap.add_argument("--lint-only", action="store_true")
    a = ap.parse_args(argv)
    problems = lint(a.patches_dir)
    for p in problems:
        print(f"lint: {p}")
    if problems:
        print(f"check-patches: {len(problems)} problem(s) in the series")
        return 1
    say("lint: ok")
    if a.lint_only:
        return 0
    diffs = round_trip(a.patches_dir, a.source)
    if diffs:
        print("\n".join(diffs))
        print("check-patches: re-exporting the applied series changes patches/ (shown above); "
              "run make export and commit, or fix the patch by hand")
        return 1
    say("round trip: apply + export reproduces patches/ byte for byte")
    return 0


if __name__ == "__main__":
    run(main)
