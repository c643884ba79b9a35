"""The one sglang locator: another interpreter's sglang, found without importing it; a python that does not run, or
has no sglang, is told apart."""

import os
import sys

from scripts.series import sglang_pkg


def test_another_interpreter_is_asked_without_importing_sglang(tmp_path):
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("raise SystemExit('the locator must not import sglang')\n")
    assert sglang_pkg.find_sglang(sys.executable, env=dict(os.environ, PYTHONPATH=str(site))) == (site / "sglang", "")
    pkg, why = sglang_pkg.find_sglang(str(tmp_path / "no-python"))
    assert pkg is None and "no-python" in why
    pkg, why = sglang_pkg.find_sglang(sys.executable, env=dict(os.environ, PYTHONPATH=str(tmp_path / "none")))
    assert pkg is None and "has no sglang installed" in why
