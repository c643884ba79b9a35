"""`make prove-tests`: show that the patch tests test the patches.

  python -m scripts.series.prove_tests [TESTS...] [--patched build/sglang] [--base build/sglang-base]

Runs the patch tests (tests/patches) twice: against the patched tree
(build/sglang) and against a pristine checkout of the pinned base (build/sglang-base, cloned from the base cache).
Every test must pass on the patched tree; on the base tree every test must fail, except the ones marked
`unchanged` (regression guards for behaviour the patches must leave as upstream has it), which must pass there
too. Prints a per-file table. Exit status: 0 every test follows the rule; 1 some test breaks it (each named, with
its outcome on each tree) or nothing was collected; 2 the base tree cannot be made (the message says why).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from ..lib import git, proc
from ..lib.cli import run
from ..lib.errors import UserError
from ..lib.progress import say
from ..lib.repo import BUILD_DIR, REPO_ROOT
from .base import clone_base, ensure_base
from .pin import load_pin

DEFAULT_TESTS = ["tests/patches"]
PYTEST_TIMEOUT = 3600.0


def base_tree(pin, dest: Path) -> Path:
    """A pristine tree of the pinned base at dest (made once from the base cache; refreshed if touched)."""
    if dest.exists() and git.is_repo(dest):
        if git.head(dest) == git.tag_commit(dest, pin.tag) and not git.status_porcelain(dest):
            return dest
        raise UserError(f"{dest} is not the pristine {pin.tag} any more; remove it (rm -rf {dest}: the tool made "
                        f"it from the base cache) and retry")
    clone_base(ensure_base(pin, os.environ.get("SGLANG_BASE") or "auto")[0], dest, pin.tag)
    git.git(dest, "checkout", "-q", "--detach", pin.tag)
    return dest


def run_pytest(tree: Path, tests: list[str], unchanged_only: bool | None) -> dict[str, str]:
    """nodeid -> outcome (passed/failed/error/skipped) for a run against `tree`."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *tests]
        if unchanged_only is not None:
            cmd += ["-m", "unchanged" if unchanged_only else "not unchanged"]
        env = {**os.environ, "SGLANG_TREE": str(tree)}
        say(f"pytest against {tree}: {' '.join(cmd[3:])}")
        res = proc.run(cmd, cwd=REPO_ROOT, env=env, timeout=PYTEST_TIMEOUT)
        if not xml.is_file():
            raise UserError(f"pytest produced no report against {tree} ({res.why}):\n{res.stdout[-2000:]}"
                            f"{res.stderr[-2000:]}")
        out = {}
        for case in ET.parse(xml).iter("testcase"):
            nodeid = f"{case.get('classname')}::{case.get('name')}"
            kinds = {child.tag for child in case}
            out[nodeid] = ("failed" if "failure" in kinds else "error" if "error" in kinds
                           else "skipped" if "skipped" in kinds else "passed")
        return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts.series.prove_tests", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tests", nargs="*", default=DEFAULT_TESTS)
    ap.add_argument("--patched", type=Path, default=BUILD_DIR / "sglang")
    ap.add_argument("--base", type=Path, default=BUILD_DIR / "sglang-base")
    a = ap.parse_args(argv)
    pin = load_pin()
    base = base_tree(pin, a.base.resolve())
    patched = run_pytest(a.patched.resolve(), a.tests, None)
    must_fail = run_pytest(base, a.tests, unchanged_only=False)
    guards = run_pytest(base, a.tests, unchanged_only=True)
    problems = []
    for nodeid, outcome in patched.items():
        if outcome not in ("passed",):
            problems.append(f"{nodeid}: {outcome} on the patched tree")
    for nodeid, outcome in must_fail.items():
        if outcome not in ("failed", "error"):
            problems.append(f"{nodeid}: {outcome} on the unpatched tree (a patch test must fail there; mark it "
                            f"'unchanged' if it guards upstream behaviour)")
    for nodeid, outcome in guards.items():
        if outcome != "passed":
            problems.append(f"{nodeid}: marked unchanged but {outcome} on the unpatched tree")
    per_file: dict[str, Counter] = {}
    for res, label in ((must_fail, "fail on base"), (guards, "unchanged guards")):
        for nodeid, outcome in res.items():
            per_file.setdefault(nodeid.split("::")[0], Counter())[f"{label}: {outcome}"] += 1
    print(f"{'test module':<48} patched-tree / base-tree outcomes")
    for f, c in sorted(per_file.items()):
        print(f"  {f:<46} {dict(c)}")
    print(f"patched tree: {Counter(patched.values())}; base tree, patch tests: {Counter(must_fail.values())}; "
          f"base tree, unchanged guards: {Counter(guards.values())}")
    for p in problems:
        print(f"problem: {p}")
    if not patched or not must_fail:
        print("problem: no tests were collected")
        return 1
    return 1 if problems else 0


if __name__ == "__main__":
    run(main)
