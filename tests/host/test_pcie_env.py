"""docker/pcie-nccl.env and the patched SGLang source agree: the file is what scripts/pcie_env.py generates from
_PCIE_NCCL_DEFAULTS of the tree under test (one source of truth, read with ast)."""

from __future__ import annotations

import subprocess
import sys

from scripts import pcie_env
from scripts.lib.applycore import Layout
from scripts.lib.pin import REPO_ROOT


def test_pcie_env_file_is_generated_from_the_sglang_tree(sglang_tree):
    generated = pcie_env.render(pcie_env.read_defaults(Layout(sglang_tree, "git")))
    assert pcie_env.DEFAULT_OUT.read_text() == generated, (
        "docker/pcie-nccl.env is stale: python -m scripts.pcie_env --tree <patched tree>")


def test_pcie_env_check_flags_a_stale_file(sglang_tree, tmp_path):
    good = tmp_path / "good.env"
    good.write_text(pcie_env.DEFAULT_OUT.read_text())
    stale = tmp_path / "stale.env"
    stale.write_text(pcie_env.DEFAULT_OUT.read_text() + "NCCL_PROTO=LL\n")
    assert pcie_env.main(["--tree", str(sglang_tree), "--out", str(good), "--check"]) == 0
    assert pcie_env.main(["--tree", str(sglang_tree), "--out", str(stale), "--check"]) == 1
    assert pcie_env.main(["--tree", str(sglang_tree), "--out", str(tmp_path / "missing.env"), "--check"]) == 1
    assert not (tmp_path / "missing.env").exists()


def test_pcie_env_runs_without_importing_sglang_or_torch(sglang_tree):
    code = ("import sys; sys.modules['sglang'] = sys.modules['torch'] = None; "
            "from scripts.pcie_env import main; "
            f"raise SystemExit(main(['--site-packages', {str(sglang_tree / 'python')!r}, '--check']))")
    cp = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert cp.returncode == 0, cp.stdout + cp.stderr
