"""The one sglang locator (scripts/series/sglang_pkg.py): another interpreter's answer (a subprocess) and this
interpreter's (in-process) are the same facts, found without importing sglang; a stock package, missing modules and
an interpreter that does not run are told apart."""

from __future__ import annotations

import json
import os
import sys

from scripts.series import sglang_pkg
from scripts.series.record import RECORD_NAME


def _site(tmp_path, patched: bool):
    site = tmp_path / ("patched" if patched else "stock")
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("raise SystemExit('the locator must not import sglang')\n")
    if patched:
        (site / "sglang" / RECORD_NAME).write_text(json.dumps({"patchset": "0123456789ab", "patches": []}))
    return site


def test_another_interpreter_and_this_one_answer_alike(tmp_path, monkeypatch):
    site = _site(tmp_path, patched=True)
    env = dict(os.environ, PYTHONPATH=str(site))
    there = sglang_pkg.probe(sys.executable, ("json", "no_such_module_xyz", "no_such_pkg.sub"), env=env)
    assert there == {"sglang": str(site / "sglang"), "patched": True,
                     "missing": ["no_such_module_xyz", "no_such_pkg.sub"]}
    monkeypatch.delitem(sys.modules, "sglang", raising=False)
    monkeypatch.syspath_prepend(str(site))
    assert sglang_pkg.probe(None, ("json", "no_such_module_xyz", "no_such_pkg.sub")) == there


def test_stock_package_missing_torch_and_a_python_that_does_not_run(tmp_path):
    site = _site(tmp_path, patched=False)
    blocker = tmp_path / "blocker"
    (blocker / "torch").mkdir(parents=True)
    (blocker / "torch" / "__init__.py").write_text("raise ImportError('no torch in this sandbox')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker), str(site)]))
    info = sglang_pkg.probe(sys.executable, torch=True, env=env)
    assert info["sglang"] == str(site / "sglang") and info["patched"] is False
    assert info["torch_error"] == "ImportError: no torch in this sandbox" and "gpus" not in info
    nowhere = sglang_pkg.probe(str(tmp_path / "no-python"))
    assert set(nowhere) == {"failed"} and "no-python" in nowhere["failed"]
    pkg, why = sglang_pkg.find_sglang(str(tmp_path / "no-python"))
    assert pkg is None and "no-python" in why
