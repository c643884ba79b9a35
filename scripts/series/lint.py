"""The series lint (like ungoogled-chromium's check_patch_files): small registered checks over one `Series`.

Each check is a function registered with @lint_check that takes the Series and returns its problems (strings that
name the file and the fix); `lint()` runs them in order. Checks:

  series-file     every listed file exists, none is listed twice, no *.patch is left out of the series
  format          every patch parses fully as stable `git format-patch --full-index` output: mail headers, each
                  file's header lines, each hunk's line counts against its @@ header, a proper end (else "corrupt
                  patch <file>, line N: <what>" and how to restore it); no Date header, no version signature; a
                  subject; at least one changed file
  headers         the message's header lines follow README "Patch headers" (scripts/series/headers.py): Why,
                  Measured, Retire-When, Forwarded (DEP-3), Bug/Origin, Last-Update,
                  Patch-Filename naming the file, and a real author
  pin-blobs       patches/pin.toml's [base_blobs] and [patched_blobs] agree with the patches' blob ids
  pin-copies      the files that repeat a pinned fact (the Dockerfile's ARG defaults) agree with the pin
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Callable

from ..lib.errors import UserError
from .headers import check_author, check_message
from .patchfile import PatchInfo, expected_blobs, parse_patch
from .pin import Pin, load_pin, read_series
from .pin_copies import stale_copies


@dataclasses.dataclass
class Series:
    pin: Pin
    listed: list[Path]  # as the series file lists them (may name missing files)
    patches: list[PatchInfo]  # the listed files that parse
    unparsable: list[str]  # problems of the files that do not


LintCheck = Callable[[Series], list[str]]
CHECKS: list[tuple[str, LintCheck]] = []


def lint_check(name: str) -> Callable[[LintCheck], LintCheck]:
    def register(fn: LintCheck) -> LintCheck:
        CHECKS.append((name, fn))
        return fn
    return register


@lint_check("series-file")
def series_file(s: Series) -> list[str]:
    names = [p.name for p in s.listed]
    problems = [f"series lists {n} more than once" for n in sorted({n for n in names if names.count(n) > 1})]
    problems += [f"series lists {p.name}, which does not exist in {s.pin.patches_dir}" for p in s.listed
                 if not p.is_file()]
    problems += [f"{f.name} is not in the series file ({s.pin.series_file}): add it or delete it"
                 for f in sorted(s.pin.patches_dir.glob("*.patch")) if f.name not in names]
    return problems


@lint_check("format")
def stable_format(s: Series) -> list[str]:
    problems = list(s.unparsable)
    for p in s.patches:
        text = p.path.read_text()
        if not p.subject:
            problems.append(f"{p.path.name}: no Subject line")
        if re.search(r"^Date: ", text.partition("\n\n")[0], re.M):
            problems.append(f"{p.path.name}: has a Date header (not a stable export: run make export)")
        if re.search(r"^-- \n\d+\.\d+", text, re.M):
            problems.append(f"{p.path.name}: ends with a git version signature (not a stable export: run make export)")
        if not p.files:
            problems.append(f"{p.path.name}: changes no file")
    return problems


@lint_check("headers")
def headers(s: Series) -> list[str]:
    return [f"{p.path.name}: {problem}" for p in s.patches
            for problem in check_message(p.message, p.path.name) + check_author(p.author)]


@lint_check("pin-blobs")
def pin_blobs(s: Series) -> list[str]:
    if not s.patches or s.unparsable:
        return []
    base, final = expected_blobs(s.patches)
    problems = []
    if base != s.pin.base_blobs:
        problems.append("pin.toml [base_blobs] disagrees with the patches' pre-image blob ids: run make export")
    if final != s.pin.patched_blobs:
        problems.append("pin.toml [patched_blobs] disagrees with the patches' post-image blob ids: run make export")
    return problems


@lint_check("pin-copies")
def pin_copies(s: Series) -> list[str]:
    return [f"{c}: run make refresh SYNC=1 to rewrite it from the pin"
            for c in stale_copies(s.pin)]


def load_series(patches_dir: Path | None = None) -> Series:
    pin = load_pin(patches_dir)
    listed = read_series(pin.series_path)
    patches, unparsable = [], []
    for p in listed:
        if not p.is_file():
            continue
        try:
            patches.append(parse_patch(p))
        except UserError as e:
            unparsable.append(str(e))
    return Series(pin, listed, patches, unparsable)


def lint(patches_dir: Path | None = None) -> list[str]:
    """Every problem of the series, check after check (an empty list: the series is healthy)."""
    try:
        series = load_series(patches_dir)
    except UserError as e:
        return [str(e)]
    return [problem for _, check in CHECKS for problem in check(series)]
