"""`make prove-tests`: show that the patch tests test the patches.

  python -m scripts.series.prove_tests [TESTS...] [--patched build/sglang] [--base build/sglang-base]

Runs the patch tests (default tests/patches) against the patched tree and against a pristine checkout of the pinned
base (build/sglang-base, cloned from the base cache): every test passes on the patched tree and fails on the base,
except those marked `unchanged` (guards of upstream behaviour the patches must keep), which pass on both.
Exit status: 0 every test follows the rule; 1 some test breaks it (named, with its outcomes) or none was collected;
2 the base tree cannot be made (the message says why).
"""

import os
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from ..lib import git, proc
from ..lib.cli import parser, run
from ..lib.errors import UserError
from ..lib.progress import say
from ..lib.repo import BUILD_DIR, REPO_ROOT
from .base import clone_base, ensure_base
from .pin import load_pin


def base_tree(pin, dest: Path) -> Path:
    """A pristine tree of the pinned base at dest (made once from the base cache)."""
    if git.is_repo(dest):
        if git.head(dest) != git.rev(dest, f"refs/tags/{pin.tag}") or git.status_porcelain(dest, untracked=False):
            raise UserError(
                f"{dest} is not the pristine {pin.tag} any more: rm -rf {dest} (made from the base "
                f"cache) and run it again"
            )
        return dest
    clone_base(ensure_base(pin, os.environ.get("SGLANG_BASE") or "auto")[0], dest, pin.tag)
    return dest


def run_pytest(tree: Path, tests: list[str], marker: str | None = None) -> dict[str, str]:
    """nodeid -> passed | failed | error | skipped, for a pytest run against `tree`."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *tests]
        say(f"pytest against {tree}" + (f" (-m '{marker}')" if marker else ""))
        res = proc.run(
            cmd + (["-m", marker] if marker else []),
            cwd=REPO_ROOT,
            timeout=3600,
            env={**os.environ, "SGLANG_TREE": str(tree)},
        )
        if not xml.is_file():
            raise UserError(f"pytest wrote no report against {tree} ({res.why}):\n{res.output[-3000:]}")
        return {
            f"{c.get('classname')}::{c.get('name')}": next(
                (k for k in ("failure", "error", "skipped") if c.find(k) is not None), "passed"
            )
            for c in ET.parse(xml).iter("testcase")
        }


def main(argv=None) -> int:
    ap = parser("scripts.series.prove_tests", __doc__)
    ap.add_argument("tests", nargs="*", default=["tests/patches"])
    ap.add_argument("--patched", type=Path, default=BUILD_DIR / "sglang")
    ap.add_argument("--base", type=Path, default=BUILD_DIR / "sglang-base")
    a = ap.parse_args(argv)
    base = base_tree(load_pin(), a.base.resolve())
    patched = run_pytest(a.patched.resolve(), a.tests)
    must_fail = run_pytest(base, a.tests, "not unchanged")
    guards = run_pytest(base, a.tests, "unchanged")
    problems = [f"{n}: {o} on the patched tree" for n, o in patched.items() if o != "passed"]
    problems += [
        f"{n}: {o} on the unpatched tree (a patch test must fail there; mark it 'unchanged' if it guards "
        f"upstream behaviour)"
        for n, o in must_fail.items()
        if o not in ("failure", "error")
    ]
    problems += [f"{n}: marked unchanged but {o} on the unpatched tree" for n, o in guards.items() if o != "passed"]
    print(
        f"patched tree: {dict(Counter(patched.values()))}; base, patch tests: {dict(Counter(must_fail.values()))};"
        f" base, guards: {dict(Counter(guards.values()))}"
    )
    if not patched or not must_fail:
        problems.append("no tests were collected")
    print("".join(f"problem: {p}\n" for p in problems), end="")
    return 1 if problems else 0


if __name__ == "__main__":
    run(main)
