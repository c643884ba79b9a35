"""`make test-gpu` on a machine without GPUs: the image's test-gpu verb (scripts/host/gpu_tier.py) through
scripts/host/in_image.py, the route of every GPU verb (the fake docker runs the image's entrypoint with this
python), its refusal inside the image and here, and the result document."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import _fake_docker
from scripts.host import docker_run, gpu_tier
from scripts.lib.errors import UserError
from scripts.lib.repo import REPO_ROOT

IMAGE = "eagle-fast-verify/sglang:test"


def verb(*args: str, path: str, module: str = "scripts.host.in_image", **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO_ROOT, text=True,
                          capture_output=True, timeout=300, env={**os.environ, "PATH": path, **env})


def test_the_image_runs_it_and_refuses_without_gpus_with_advice_for_the_image(tmp_path):
    docker = _fake_docker.install(tmp_path, images=(IMAGE,))
    cp = verb("--image", IMAGE, "--results", str(tmp_path / "r"), "test-gpu", "--out", "/results/t.json", "--",
              "-k", "faults", path=_fake_docker.path_with(docker.bindir))
    run, = docker.runs()
    assert run[:5] == ["run", "--rm", "--gpus", "all", "--ipc=host"] and docker_run.FLASHINFER_MOUNT in run
    assert f"{tmp_path / 'r'}:/results" in run
    assert run[run.index(IMAGE) + 1:] == ["test-gpu", "--out", "/results/t.json", "--", "-k", "faults"]
    assert cp.returncode == 2 and "--gpus all" in cp.stderr and "make test-gpu" not in cp.stderr  # inside the image
    assert "Traceback" not in cp.stderr


@pytest.mark.parametrize("state", ["no client", "no engine", "no image"])
def test_without_the_image_it_says_which_and_the_fix(tmp_path, state):
    docker = _fake_docker.install(tmp_path, images=() if state == "no image" else (IMAGE,),
                                  engine_up=state != "no engine")
    path = str(tmp_path / "empty") if state == "no client" else _fake_docker.path_with(docker.bindir)
    cp = verb("--image", IMAGE, "test-gpu", path=path, DOCKER_HOST=f"unix://{tmp_path}/dead.sock")
    assert cp.returncode == 2 and not docker.runs()
    assert {"no client": "install Docker", "no engine": "systemctl start docker", "no image": "make image"}[state] \
        in cp.stderr


def test_here_without_gpus_points_to_the_image(tmp_path):
    cp = verb("--out", str(tmp_path / "t.json"), path=os.environ["PATH"], module="scripts.host.gpu_tier",
              EAGLE_IMAGE="")
    assert cp.returncode == 2 and "make test-gpu" in cp.stderr and not (tmp_path / "t.json").exists()


def test_the_result_document(tmp_path):
    assert docker_run.gpu_slug(["NVIDIA RTX PRO 6000 Blackwell Server Edition"]) == \
        "RTX-PRO-6000-Blackwell-Server-Edition"
    out = tmp_path / "r.json"
    out.write_text(json.dumps({"world": 2, "passed": 9, "failed": 0, "skipped": 0, "tests": []}))
    assert gpu_tier.finish(out, {"gpus": ["NVIDIA H200"] * 2})["passed"] == 9
    assert json.loads(out.read_text())["meta"]["gpus"] == ["NVIDIA H200"] * 2
    with pytest.raises(UserError, match="wrote no result document"):
        gpu_tier.finish(tmp_path / "missing.json", {})
