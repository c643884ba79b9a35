"""docker/Dockerfile and make image (scripts/host/image.py) without an engine: hadolint, the build command against the
Dockerfile's ARGs, the labels, the NCCL refusals, and what happens without docker. `make test-image` builds it for real.
"""

import dataclasses
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import _fake_docker
from scripts.host import image
from scripts.host.nccl import KNOWN_BAD_NCCL
from scripts.lib.errors import UserError
from scripts.series.pin import load_pin

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "docker" / "Dockerfile").read_text()
HADOLINT = ROOT / ".venv" / "bin" / "hadolint"


def dry_run(capsys, *argv) -> tuple[list[str], str]:
    assert image.main(["--dry-run", *argv]) == 0
    out, err = capsys.readouterr()
    return shlex.split(out.replace("\\\n", " ")), err


def pairs(cmd: list[str], opt: str) -> dict[str, str]:
    return dict(cmd[i + 1].split("=", 1) for i, t in enumerate(cmd) if t == opt)


def test_hadolint_passes_and_catches_a_bad_dockerfile(tmp_path):
    assert image.main(["--lint-only"]) == 0
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM lmsysorg/sglang\nRUN cd /tmp && pip install foo\n")
    assert image.lint(str(HADOLINT), bad) != 0


def test_make_image_passes_every_arg_and_the_dockerfile_has_no_defaults(capsys):
    args = re.findall(r"^ARG (\S+)$", DOCKERFILE, re.M)
    assert args and not re.findall(r"^ARG \S+=", DOCKERFILE, re.M)  # nothing to keep in sync with the pin
    cmd, err = dry_run(capsys)
    assert set(pairs(cmd, "--build-arg")) == set(args) and "--force-rm" in cmd  # a failed RUN leaves no container
    pin = load_pin()
    assert ("imagetools inspect" in err) == (not pin.image_digest)
    built = pairs(cmd, "--build-arg")
    assert built["BASE"].startswith(f"{pin.image_name}:{pin.image_tag}") and built["NCCL_VERSION"] == pin.nccl_version
    assert cmd[cmd.index("-t") + 1] == pin.serving_image and cmd[-1] == str(ROOT)
    assert pairs(cmd, "--label")["org.opencontainers.image.base.name"] == f"docker.io/{pin.image_name}:{pin.image_tag}"


def test_the_printed_command_runs_as_printed(capsys, tmp_path):
    docker = _fake_docker.install(tmp_path)
    assert image.main(["--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("\n") > 10  # one option a line
    subprocess.run(["bash", "-c", printed], env={"PATH": _fake_docker.path_with(docker.bindir)}, check=True)
    assert ["docker", *docker.calls()[0]] == shlex.split(printed.replace("\\\n", " "))


@pytest.mark.parametrize(
    "base, name, digest",
    [
        ("localhost/sglang-standin:0.5.23", "localhost/sglang-standin:0.5.23", "unpinned"),
        ("mirror.example/sglang:v1@sha256:" + "ab" * 32, "mirror.example/sglang:v1", "sha256:" + "ab" * 32),
    ],
)
def test_another_base_is_what_the_labels_name(capsys, base, name, digest):
    cmd, _ = dry_run(capsys, "--base", base)
    labels = pairs(cmd, "--label")
    assert pairs(cmd, "--build-arg")["BASE"] == base and labels["io.eagle-fast-verify.base-ref"] == base
    assert labels["org.opencontainers.image.base.name"] == name
    assert labels["org.opencontainers.image.base.digest"] == digest
    assert not [v for v in labels.values() if load_pin().image_name in v]


def test_the_pins_digest_and_a_nccl_release_that_is_not_a_version(monkeypatch, capsys):
    with pytest.raises(UserError, match="release number"):
        image.main(["--dry-run", "--nccl", "latest"])
    pin = load_pin()
    digest = "sha256:" + "cd" * 32
    monkeypatch.setattr(image, "load_pin", lambda: dataclasses.replace(pin, image_digest=digest))
    cmd, err = dry_run(capsys)
    assert pairs(cmd, "--build-arg")["BASE"].endswith("@" + digest) and "imagetools" not in err
    monkeypatch.setattr(image, "load_pin", lambda: dataclasses.replace(pin, image_digest="latest"))
    with pytest.raises(UserError, match="sha256"):
        image.main(["--dry-run"])


@pytest.mark.parametrize("version", sorted(KNOWN_BAD_NCCL))
def test_a_known_bad_nccl_is_refused_with_the_reason(capsys, version):
    with pytest.raises(UserError) as e:
        image.main(["--dry-run", "--nccl", version])
    assert KNOWN_BAD_NCCL[version] in str(e.value)
    cmd, _ = dry_run(capsys, "--nccl", version, "--allow-known-bad-nccl")  # on purpose: a variant tag
    assert cmd[cmd.index("-t") + 1].endswith(f"-nccl{version}")


@pytest.mark.parametrize("client, fix", [("down", "systemctl start docker"), ("missing", "install Docker Engine")])
def test_without_an_engine_nothing_is_built(tmp_path, monkeypatch, client, fix):
    """A client whose engine does not answer, or no client: one message with the fix, before any build."""
    docker = _fake_docker.install(tmp_path, engine_up=False)
    monkeypatch.setattr(image, "hadolint_path", lambda: None)
    monkeypatch.setenv("PATH", _fake_docker.path_with(docker.bindir))
    with pytest.raises(UserError, match=fix):
        image.main(["--docker", "docker" if client == "down" else str(tmp_path / "no-docker-here")])
    assert not [c for c in docker.calls() if c[0] == "build"]


def test_dockerignore_lets_through_what_the_dockerfile_copies():
    allowed = [ln[1:].rstrip("/") for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.startswith("!")]
    copied = [a.split()[0].rstrip("/") for a in re.findall(r"^COPY (.+)$", DOCKERFILE, re.M)]
    assert sorted(allowed) == sorted(copied) == sorted(image.CONTEXT)


def test_the_entrypoint_verbs(tmp_path):
    (tmp_path / "python3").symlink_to(sys.executable)  # the image's python3
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "EAGLE_HOME": str(ROOT), "HOME": str(tmp_path)}
    run = lambda *a: subprocess.run(["sh", ROOT / "docker" / "entrypoint", *a], env=env, capture_output=True, text=True)
    assert run("echo", "hi").stdout == "hi\n"  # any other command runs as is
    assert run("serve", "--bad").returncode == run("--bad").returncode == 2  # "-..." goes to serve
    assert "--draft-model" in run("serve", "--help").stdout
    env["EAGLE_RESULTS"] = str(tmp_path / "not-mounted")  # test-serve refuses, as test-gpu and bench-comm do
    cp = run("test-serve")
    assert cp.returncode == 2 and "mount a directory there" in cp.stderr and not (tmp_path / "not-mounted").exists()


@pytest.mark.parametrize("target", "serve test-gpu test-serve bench bench-comm report doctor docs".split())
def test_dry_run_is_each_verbs_own_dry_run_or_refused(target):
    cp = subprocess.run(["make", "-n", target, "DRY_RUN=1"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if target in ("doctor", "docs"):  # nothing to print instead of doing: make stops
        assert cp.returncode == 2 and f"DRY_RUN=1 means nothing to make {target}" in cp.stderr and not cp.stdout
    else:
        assert cp.returncode == 0 and " --dry-run" in cp.stdout, cp.stdout + cp.stderr


TYPOS = {"DRYRUN=1": "DRY_RUN", "dry-run=1": "DRY_RUN", "BENCH_ARG=x": "BENCH_ARGS", "SERVE_ARG=x": "SERVE_ARGS"}


@pytest.mark.parametrize("typo, right", [*TYPOS.items(), ("TEST_SERVE_ARG=x", "TEST_SERVE_ARGS")])
def test_a_make_variable_that_looks_like_ours_stops_make_with_its_name(typo, right):
    cp = subprocess.run(["make", "-n", "image", typo], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2 and f"did you mean {right}?" in cp.stderr and not cp.stdout
    unrelated = subprocess.run(["make", "-n", "image", "DRY_RUN=1", "UNRELATED=1"], cwd=ROOT, capture_output=True)
    assert unrelated.returncode == 0
