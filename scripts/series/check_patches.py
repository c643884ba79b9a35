"""`make check-patches`: the series is healthy.

1. Lint (like ungoogled-chromium's check_patch_files): the series and the *.patch files agree (each listed file
   exists, none listed twice, none unlisted); every patch is stable `git format-patch --full-index` output and
   its message carries the header lines Why:, Measured:, Upstream-Status: and Retire-When:; the pin's blob ids
   agree with the patches.
2. Round trip (like Electron's check-patch-diff): apply the series to a pristine base with `git am -3`, export it
   again, and fail if the export differs from patches/ by a single byte.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import tempfile
from pathlib import Path

from .export import export
from .lib.applycore import apply_git
from .lib.base import SOURCES, clone_base, ensure_base
from .lib.cli import run
from .lib.errors import UserError
from .lib.pin import REQUIRED_TRAILERS, expected_blobs, load_pin, parse_patch, read_series
from .lib.progress import say

UPSTREAM_STATUS = ("Pending", "Submitted", "Accepted", "Backport", "Inappropriate", "Not-Needed")


def lint(patches_dir: Path | None = None) -> list[str]:
    problems: list[str] = []
    pin = load_pin(patches_dir)
    d = pin.patches_dir
    try:
        listed = read_series(pin.series_path)
    except UserError as e:
        return [str(e)]
    names = [p.name for p in listed]
    for n in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"series lists {n} more than once")
    for p in listed:
        if not p.is_file():
            problems.append(f"series lists {p.name}, which does not exist in {d}")
    for f in sorted(d.glob("*.patch")):
        if f.name not in names:
            problems.append(f"{f.name} is not in the series file ({pin.series_file}): add it or delete it")
    infos = []
    for p in listed:
        if not p.is_file():
            continue
        try:
            info = parse_patch(p)
        except UserError as e:
            problems.append(str(e))
            continue
        infos.append(info)
        text = p.read_text()
        if not info.subject:
            problems.append(f"{p.name}: no Subject line")
        for t in REQUIRED_TRAILERS:
            if not re.search(rf"^{re.escape(t)}\s*\S", info.message, re.M):
                problems.append(f"{p.name}: message lacks the header line '{t} ...'")
        m = re.search(r"^Upstream-Status:\s*(\S+)", info.message, re.M)
        if m and not m.group(1).startswith(UPSTREAM_STATUS):
            problems.append(f"{p.name}: Upstream-Status '{m.group(1)}' is not one of {', '.join(UPSTREAM_STATUS)}")
        if re.search(r"^Date: ", text.partition("\n\n")[0], re.M):
            problems.append(f"{p.name}: has a Date header (not a stable export: run make export)")
        if re.search(r"^-- \n\d+\.\d+", text, re.M):
            problems.append(f"{p.name}: ends with a git version signature (not a stable export: run make export)")
        if not info.files:
            problems.append(f"{p.name}: changes no file")
    if infos and not problems:
        base, final = expected_blobs(infos)
        if base != pin.base_blobs:
            problems.append("pin.toml [base_blobs] disagrees with the patches' pre-image blob ids: run make export")
        if final != pin.patched_blobs:
            problems.append("pin.toml [patched_blobs] disagrees with the patches' post-image blob ids: run make export")
    return problems


def round_trip(patches_dir: Path | None, source: str) -> list[str]:
    pin = load_pin(patches_dir)
    bare, info = ensure_base(pin, source)
    with tempfile.TemporaryDirectory(prefix="check-patches-") as tmp:
        tree = Path(tmp) / "sglang"
        clone_base(bare, tree, pin.tag)
        apply_git(tree, pin, base=info)
        out = Path(tmp) / "export"
        export(tree, pin, out)
        diffs: list[str] = []
        want = sorted({p.name for p in pin.patches_dir.glob("*.patch")} | {pin.series_file, "pin.toml"})
        got = sorted({p.name for p in out.glob("*.patch")} | {pin.series_file, "pin.toml"})
        for name in sorted(set(want) | set(got)):
            a, b = pin.patches_dir / name, out / name
            at = a.read_text().splitlines(keepends=True) if a.is_file() else []
            bt = b.read_text().splitlines(keepends=True) if b.is_file() else []
            if at != bt:
                diffs.append("".join(difflib.unified_diff(at, bt, f"patches/{name}", f"re-exported/{name}")))
        return diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts.check_patches", description=__doc__,
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
