"""`make test-gpu` (scripts/host/test_gpu.py) on a machine without GPUs, and its result document.

The GPU tests themselves are tests/gpu (skipped here, their harness tested on CPU ranks); this is the verb around
them: it refuses clearly without GPUs, names the result file after the GPUs, and adds what ran to the document.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scripts.host import test_gpu
from scripts.lib.errors import UserError
from scripts.lib.repo import REPO_ROOT


def test_without_gpus_it_says_so_and_exits_2():
    cp = subprocess.run([sys.executable, "-m", "scripts.host.test_gpu"], cwd=REPO_ROOT, capture_output=True,
                        text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert cp.returncode == 2, cp.stderr
    assert "0 NVIDIA GPU(s) visible here" in cp.stderr and "needs at least 2" in cp.stderr
    assert "make test" in cp.stderr and "Traceback" not in cp.stderr


def test_one_gpu_is_not_enough(monkeypatch):
    monkeypatch.setattr(test_gpu, "visible_gpus", lambda: ["NVIDIA H200"])
    with pytest.raises(UserError, match="1 NVIDIA GPU"):
        test_gpu.main([])


def test_result_file_is_named_after_the_gpus():
    assert test_gpu.gpu_slug(["NVIDIA H200", "NVIDIA H200"]) == "H200"
    assert test_gpu.gpu_slug(["NVIDIA RTX PRO 6000 Blackwell Server Edition"]) == \
        "RTX-PRO-6000-Blackwell-Server-Edition"


def test_no_usable_python_and_no_image_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(test_gpu, "visible_gpus", lambda: ["NVIDIA H200"] * 2)
    monkeypatch.setattr(test_gpu, "probe_python", lambda py: (False, "python3's torch sees 0 CUDA GPU(s)"))
    monkeypatch.setattr(test_gpu, "image_ready", lambda image: (False, "docker is not installed"))
    with pytest.raises(UserError) as e:
        test_gpu.main(["--out", str(tmp_path / "r.json")])
    assert "sees 0 CUDA GPU(s)" in str(e.value) and "docker is not installed" in str(e.value)
    assert not (tmp_path / "r.json").exists()


def test_finish_adds_what_ran_to_the_tests_document(tmp_path):
    out = tmp_path / "r.json"
    out.write_text(json.dumps({"world": 2, "passed": 9, "failed": 0, "skipped": 0, "tests": [], "records": {}}))
    doc = test_gpu.finish(out, {"gpus": ["NVIDIA H200"] * 2, "command": "python3 -m scripts.host.test_gpu"})
    assert json.loads(out.read_text())["meta"]["gpus"] == ["NVIDIA H200"] * 2 and doc["passed"] == 9
    with pytest.raises(UserError, match="wrote no result document"):
        test_gpu.finish(tmp_path / "missing.json", {})
