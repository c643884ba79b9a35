"""`make test-gpu` on a machine without GPUs: the image's verb through scripts/host/in_image.py, the route of every GPU
verb, and its refusals; a test tier's result (pytest's junitxml, scripts/box/results.py) read back as make report."""

import subprocess
import sys

import pytest

import _fake_docker
from scripts.box import docker, results
from scripts.box.docker import PATCHSET_LABEL
from scripts.series.pin import load_pin, patchset_id

IMAGE = "eagle-fast-verify/sglang:test"


def in_image(*args, path: str, **env) -> subprocess.CompletedProcess:
    return _fake_docker.verb("scripts.host.in_image", *args, timeout=300, PATH=path, **env)


def test_the_image_runs_it_and_both_it_and_this_machine_refuse_without_gpus_with_their_advice(tmp_path):
    fake = _fake_docker.install(tmp_path, images=(IMAGE,))
    args = ["--image", IMAGE, "--results", str(tmp_path / "r"), "test-gpu", "--out", "/results/t.xml", "--", "-k"]
    cp = in_image(*args, "faults", path=_fake_docker.path_with(fake.bindir))
    (run,) = fake.runs()
    assert run[:5] == ["run", "--rm", "--gpus", "all", "--ipc=host"] and docker.FLASHINFER_MOUNT in run
    assert f"{tmp_path / 'r'}:/results" in run
    assert run[run.index(IMAGE) + 1 :] == ["test-gpu", "--out", "/results/t.xml", "--", "-k", "faults"]
    assert cp.returncode == 2 and "--gpus all" in cp.stderr and "make test-gpu" not in cp.stderr  # inside the image
    assert "Traceback" not in cp.stderr
    cp = _fake_docker.verb("scripts.host.gpu_tier", "--out", tmp_path / "t.xml", PATH="/usr/bin:/bin", EAGLE_IMAGE="")
    assert cp.returncode == 2 and "make test-gpu" in cp.stderr and not (tmp_path / "t.xml").exists()  # here


FIXES = {
    "no client": "install Docker",
    "no engine": "systemctl start docker",
    "no image": f"FAIL image {IMAGE}: image {IMAGE} is not in this docker engine. Fix: make image IMAGE={IMAGE} (it",
    "no stock image": f"is not in this docker engine. Fix: docker pull {load_pin().upstream_image}\n",
    "stale image": f"image {IMAGE} holds patch set 0000000stale, but this checkout's patches/ are {patchset_id()}",
    "busy GPUs": "FAIL GPUs idle: 4242, sglang::scheduler_TP0, 88000 MiB. Fix: stop what holds them",
}


@pytest.mark.parametrize("verb", ["test-gpu", "test-serve", "bench-comm"])
@pytest.mark.parametrize("state", FIXES)
def test_a_box_that_cannot_run_it_is_named_with_the_fix_before_docker_run(tmp_path, state, verb):
    """The box's checks of every verb that runs the image: the engine, the image and its patch set, idle GPUs."""
    image = load_pin().upstream_image if state == "no stock image" else IMAGE
    images = () if state.startswith("no") else (image,)
    labels = {PATCHSET_LABEL: "0000000stale"} if state == "stale image" else None
    fake = _fake_docker.install(tmp_path, images, engine_up=state != "no engine", labels=labels, gpus=2)
    fake.busy(*["4242, sglang::scheduler_TP0, 88000 MiB"] * (state == "busy GPUs"))
    path = str(tmp_path / "empty") if state == "no client" else _fake_docker.path_with(fake.bindir)
    cp = in_image("--image", image, verb, path=path, DOCKER_HOST=f"unix://{tmp_path}/dead.sock")
    assert cp.returncode == 2 and not fake.runs() and FIXES[state] in cp.stderr, cp.stderr
    assert "make image" not in cp.stderr or state in ("no image", "stale image")


TIER = """
def test_measures(record_property):
    record_property("timings", '{"8": 12.5}')

def test_fails():
    assert False, "wrong sum"
"""


def test_a_tiers_result_is_pytests_junitxml_with_the_runs_properties(tmp_path):
    (tmp_path / "test_tier.py").write_text(TIER)
    out = tmp_path / "out" / "r.xml"
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit1"]
    subprocess.run([*pytest, f"--junitxml={out}", tmp_path / "test_tier.py"], cwd=tmp_path, capture_output=True)
    results.finish_junit(out, {"world": 2, "command": f"pytest {tmp_path}"}, {str(tmp_path): "<tmp>"})
    doc = results.read_junit(out)
    assert (doc["passed"], doc["failed"], doc["skipped"]) == (1, 1, 0)
    assert doc["properties"] == {"world": 2, "command": "pytest <tmp>"} and str(tmp_path) not in out.read_text()
    measured, failed = doc["cases"]
    assert measured["properties"] == {"timings": {"8": 12.5}} and "wrong sum" in failed["message"]
    box = results.box_name(["NVIDIA RTX PRO 6000 Blackwell Server Edition"] * 8)
    assert box == "RTX-PRO-6000-Blackwell-Server-Edition-x8"
    assert results.box_name([]) == "nogpu" and results.stamp()[8] == "T"
