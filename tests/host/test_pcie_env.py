"""The patched launcher's PCIe NCCL defaults, read from the tree under test (scripts/host/pcie.py and the pcie_env
verb): the one source is _PCIE_NCCL_DEFAULTS in the patched source, read with ast; nothing in the repository keeps
a copy. These fail on the unpatched tree (prove-tests), which has no such dict."""

from __future__ import annotations

import subprocess
import sys

from scripts.host import pcie, pcie_env
from scripts.lib.envfile import parse_env
from scripts.lib.repo import REPO_ROOT


def test_pcie_env_prints_the_defaults_of_the_sglang_tree(sglang_tree, capsys):
    defaults = pcie.read_defaults(sglang_tree / "python" / "sglang")
    assert defaults and all(k.startswith("NCCL_") for k in defaults)
    assert pcie_env.main(["--tree", str(sglang_tree)]) == 0
    text = capsys.readouterr().out
    assert parse_env(text) == defaults and text.startswith("# NCCL defaults of the patched SGLang")


def test_pcie_env_check_flags_a_stale_file(sglang_tree, tmp_path):
    good = tmp_path / "good.env"
    assert pcie_env.main(["--tree", str(sglang_tree), "--out", str(good)]) == 0
    stale = tmp_path / "stale.env"
    stale.write_text(good.read_text() + "NCCL_PROTO=LL\n")
    assert pcie_env.main(["--tree", str(sglang_tree), "--check", str(good)]) == 0
    assert pcie_env.main(["--tree", str(sglang_tree), "--check", str(stale)]) == 1
    assert pcie_env.main(["--tree", str(sglang_tree), "--check", str(tmp_path / "missing.env")]) == 1
    assert not (tmp_path / "missing.env").exists()


def test_pcie_env_runs_without_importing_sglang_or_torch(sglang_tree):
    code = ("import sys; sys.modules['sglang'] = sys.modules['torch'] = None; "
            "from scripts.host.pcie_env import main; "
            f"raise SystemExit(main(['--site-packages', {str(sglang_tree / 'python')!r}, '--json']))")
    cp = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert '"defaults"' in cp.stdout and "NCCL_" in cp.stdout
