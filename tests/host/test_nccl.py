"""The NCCL the image runs: the pin (patches/pin.toml [nccl]), the verb that installs it (scripts/host/image_deps.py),
and how the tooling tells which NCCL torch loaded (scripts/host/nccl.py).

torch.cuda.nccl.version() is the NCCL torch was *built* against (NCCL's headers at torch's build), not the library it
loads; the tests load another release in torch's place and check that the tooling reports the loaded one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from scripts.host import nccl
from scripts.lib.errors import UserError
from scripts.series.pin import load_pin

ROOT = Path(__file__).resolve().parents[2]
PIN = load_pin()


def test_the_pin_names_the_nccl_of_the_base_images_cuda():
    assert PIN.image_cuda == (13, 0) and PIN.nccl_package == "nvidia-nccl-cu13"  # a cu130 base: the cu13 wheel
    assert re.match(r"^\d+\.\d+\.\d+$", PIN.nccl_version) and PIN.nccl_version not in nccl.KNOWN_BAD_NCCL
    assert PIN.nccl_requirement == f"nvidia-nccl-cu13=={PIN.nccl_version}"
    wrong = dataclasses.replace(PIN, nccl_package="nvidia-nccl-cu12")
    with pytest.raises(UserError, match="nvidia-nccl-cu13"):
        _ = wrong.nccl_requirement


def _unpacked(nccl_wheels: Path, tmp_path: Path) -> Path:
    wheel = next(nccl_wheels.glob(f"{PIN.nccl_package.replace('-', '_')}-{PIN.nccl_version}-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp_path / "site")
    return tmp_path / "site"


def test_the_probe_reports_the_nccl_torch_loaded_not_the_one_it_was_built_with(nccl_wheels, tmp_path):
    """The pinned wheel first on sys.path: torch preloads its libnccl.so.2 (torch/__init__.py, _preload_cuda_deps),
    so that is the library every NCCL call of this process goes to."""
    site = _unpacked(nccl_wheels, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(site)}
    cp = subprocess.run([sys.executable, "-c", nccl.NCCL_PROBE], capture_output=True, text=True, env=env, timeout=120)
    info = json.loads(cp.stdout.strip().splitlines()[-1])
    import torch

    built = ".".join(map(str, torch.cuda.nccl.version()[:3]))
    assert info["nccl"] == PIN.nccl_version != built and info["nccl_build"] == built
    assert info["nccl_lib"].startswith(str(site))


def test_image_deps_prints_what_it_would_install(capsys):
    lock = (ROOT / "requirements" / "test.lock").read_text()
    pytest_pin = re.search(r"^pytest==(\S+)$", lock, re.M).group(1)
    cp = subprocess.run([sys.executable, "-m", "scripts.host.image_deps", "--python", sys.executable, "--dry-run"],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert f"pip install --no-deps --no-cache-dir {PIN.nccl_requirement}" in cp.stdout
    assert f"pytest=={pytest_pin}" in cp.stdout and "requirements/test.lock" in cp.stdout
    variant = subprocess.run([sys.executable, "-m", "scripts.host.image_deps", "--python", sys.executable,
                              "--dry-run", "--nccl", "2.30.7"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert variant.returncode == 0 and "nvidia-nccl-cu13==2.30.7" in variant.stdout
    assert "variant" in variant.stderr and PIN.nccl_version in variant.stderr
    bad = subprocess.run([sys.executable, "-m", "scripts.host.image_deps", "--dry-run", "--nccl", "latest"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "not a release number" in bad.stderr


def test_make_image_nccl_builds_a_distinct_variant():
    def dry(*extra):
        cp = subprocess.run(["make", "-s", "image", "DRY_RUN=1", f"PY={sys.executable}", *extra], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
        assert cp.returncode == 0, cp.stderr
        cmd = cp.stdout.strip().splitlines()[-1].split()
        pairs = dict(cmd[i + 1].split("=", 1) for i, t in enumerate(cmd) if t in ("--build-arg", "--label"))
        return cmd[cmd.index("-t") + 1], pairs, cp.stderr

    tag, pairs, _ = dry()
    assert tag == PIN.serving_image and pairs["NCCL_VERSION"] == PIN.nccl_version
    assert pairs["io.eagle-fast-verify.nccl"] == PIN.nccl_requirement
    tag, pairs, err = dry("NCCL=2.30.7")
    assert tag == f"{PIN.serving_image}-nccl2.30.7" and pairs["NCCL_VERSION"] == "2.30.7"
    assert pairs["io.eagle-fast-verify.nccl"] == "nvidia-nccl-cu13==2.30.7" and pairs["IMAGE_TAG"] == tag
    _, _, err = dry("NCCL=2.30.4")
    assert "2.30.4" in err and "hangs" in err  # a known-bad release builds (to reproduce), with a warning
