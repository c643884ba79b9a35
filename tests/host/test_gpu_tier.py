"""`make test-gpu` (scripts/host/gpu_tier.py) on a machine without GPUs, and its result document.

The GPU tests themselves are tests/gpu (skipped here, their harness tested on CPU ranks); this is the verb around
them: it refuses clearly without GPUs, names the result file after the GPUs, and adds what ran to the document.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scripts.host import gpu_tier, route
from scripts.lib.errors import UserError
from scripts.lib.repo import REPO_ROOT


def test_without_gpus_it_says_why_for_both_routes_and_exits_2():
    """As bench-comm: which route failed and why (here: torch sees no GPU; the image: no docker), and the docker run
    that would run it there (tests/test_printed_fixes.py runs that command)."""
    cp = subprocess.run([sys.executable, "-m", "scripts.host.gpu_tier"], cwd=REPO_ROOT, capture_output=True,
                        text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert cp.returncode == 2, cp.stderr
    assert "test-gpu cannot run here (" in cp.stderr and "sees 0 CUDA GPU(s), and 2 are needed" in cp.stderr
    assert "nor in the image (docker is not installed" in cp.stderr and "Traceback" not in cp.stderr
    assert f"-v {REPO_ROOT / 'bench' / 'results'}:/results" in cp.stderr and route.default_image() in cp.stderr


def test_one_gpu_is_not_enough(monkeypatch):
    monkeypatch.setattr(route, "probe_python", lambda py: {"torch": "2.14.1", "gpus": 1})
    monkeypatch.setattr(route, "image_ready", lambda image: (False, "docker is not installed"))
    with pytest.raises(UserError, match=r"sees 1 CUDA GPU\(s\), and 2 are needed"):
        gpu_tier.main([])


def test_result_file_is_named_after_the_gpus():
    assert route.gpu_slug(["NVIDIA H200", "NVIDIA H200"]) == "H200"
    assert route.gpu_slug(["NVIDIA RTX PRO 6000 Blackwell Server Edition"]) == \
        "RTX-PRO-6000-Blackwell-Server-Edition"


def test_no_usable_python_and_no_image_is_one_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(route, "gpu_names", lambda: ["NVIDIA H200"] * 2)
    monkeypatch.setattr(route, "probe_python", lambda py: {"torch": "2.14.1", "gpus": 0})
    monkeypatch.setattr(route, "image_ready", lambda image: (False, "docker is not installed"))
    with pytest.raises(UserError) as e:
        gpu_tier.main(["--out", str(tmp_path / "r.json")])
    assert "sees 0 CUDA GPU(s)" in str(e.value) and "docker is not installed" in str(e.value)
    assert not (tmp_path / "r.json").exists()


def test_finish_adds_what_ran_to_the_tests_document(tmp_path):
    out = tmp_path / "r.json"
    out.write_text(json.dumps({"world": 2, "passed": 9, "failed": 0, "skipped": 0, "tests": [], "records": {}}))
    doc = gpu_tier.finish(out, {"gpus": ["NVIDIA H200"] * 2, "command": "python3 -m scripts.host.gpu_tier"})
    assert json.loads(out.read_text())["meta"]["gpus"] == ["NVIDIA H200"] * 2 and doc["passed"] == 9
    with pytest.raises(UserError, match="wrote no result document"):
        gpu_tier.finish(tmp_path / "missing.json", {})


def test_the_image_route_says_why_and_mounts_the_results(monkeypatch, tmp_path, capsys):
    """This python's torch sees no GPU (true here): the run goes to the image, through the docker client on PATH
    (one that records what it is asked to run and runs nothing, so no result document comes back)."""
    bindir, log = tmp_path / "bin", tmp_path / "argv"
    bindir.mkdir()
    (bindir / "docker").write_text(f"#!/bin/sh\ncase \"$1\" in image) echo sha256:00ff; exit 0;; "
                                   f"run) printf '%s\\n' \"$@\" > {log}; exit 0;; esac\nexit 3\n")
    (bindir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setattr(route, "gpu_names", lambda: ["NVIDIA H200"] * 2)
    with pytest.raises(UserError, match="wrote no result document"):
        gpu_tier.main(["--out", str(tmp_path / "r" / "t.json"), "--", "-k", "faults"])
    err = capsys.readouterr().err
    assert "test-gpu: running in the image eagle-fast-verify/sglang:" in err and "because" in err
    assert "sees 0 CUDA GPU(s)" in err
    argv = log.read_text().splitlines()
    assert argv[:5] == ["run", "--rm", "--gpus", "all", "--ipc=host"]
    assert f"{(tmp_path / 'r').resolve()}:/results" in argv
    image = route.default_image()
    assert argv[argv.index(image) + 1:] == ["test-gpu", "--here", "--out", "/results/t.json", "--timeout", "600", "--",
                                            "-k", "faults"]
