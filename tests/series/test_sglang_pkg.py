"""The one sglang locator: another interpreter's answer (a subprocess) and this one's are the same facts, found
without importing sglang; the patch set comes from git; a python that does not run is told apart."""

from __future__ import annotations

import os
import sys

from scripts.lib import git
from scripts.series import sglang_pkg
from scripts.series.pin import UPSTREAM_HEAD, applied_patchset


def test_another_interpreter_and_this_one_answer_alike(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("raise SystemExit('the locator must not import sglang')\n")
    env = dict(os.environ, PYTHONPATH=str(site))
    stock = sglang_pkg.probe(sys.executable, ("json", "no_such_module_xyz"), env=env)
    assert stock == {"sglang": str(site / "sglang"), "missing": ["no_such_module_xyz"], "patched": None}
    git.git(site, "init", "-q")
    git.git(site, "add", "-A")
    git.git(site, "commit", "-qm", "base")
    git.git(site, "update-ref", UPSTREAM_HEAD, "HEAD")
    (site / "sglang" / "x.py").write_text("X = 1\n")
    git.git(site, "add", "-A")
    git.git(site, "commit", "-qm", "x: one\n\nPatch-Filename: x-one.patch")
    there = sglang_pkg.probe(sys.executable, ("json", "no_such_module_xyz"), env=env)
    assert there["patched"] == applied_patchset(site / "sglang") and len(there["patched"]) == 12
    monkeypatch.delitem(sys.modules, "sglang", raising=False)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", str(site))
    assert sglang_pkg.probe(None, ("json", "no_such_module_xyz")) == there
    assert sglang_pkg.patch_record(sys.executable)["patchset"] == there["patched"]
    nowhere = sglang_pkg.probe(str(tmp_path / "no-python"))
    assert set(nowhere) == {"failed"} and "no-python" in nowhere["failed"]
