"""The docker engine and the one `docker run` of the serving image.

engine() asks whether the engine answers (and names the fix when it does not), image_id() whether it has an image
(built from the series a caller names): asked before anything is built or started, so a missing engine is one message,
never a failed step. docker_run() builds every command that runs the image (serve, test-gpu, test-serve, bench-comm,
the bench's servers and client, the profile's servers, the doctor's probes) with the HF-cache rule of hf_cache_dir().
A container this tooling starts is named by container_name(): whose it is, so a later run stops one left behind.
"""

import dataclasses
import json
import os
import re
import shlex
from pathlib import Path
from typing import Iterable

from ..lib import proc

HF_CACHE_IN_IMAGE = "/root/.cache/huggingface/hub"
PATCHSET_LABEL = "io.eagle-fast-verify.patchset"  # make image's label: the series the image holds (patchset_id)
OWNER = re.compile(r"^eagle-.+-pid(\d+)$")  # container_name(): the pid of the process that started it
FLASHINFER_MOUNT = "sglang-flashinfer:/root/.cache/flashinfer"  # JIT kernels and the all-reduce autotune, kept
RESULTS_IN_IMAGE = "/results"
PASS_NAMES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HF_TOKEN")
PASS_PREFIXES = ("NCCL_", "SGLANG_", "FLASHINFER_")
OURS = ("SGLANG_BASE", "SGLANG_WHEEL", "SGLANG_REPO", "SGLANG_SRC", "SGLANG_TREE")  # this repository's, not SGLang's
PROBE_TIMEOUT = 60.0
NOT_RUNNING = (
    "cannot connect to the docker daemon",
    "is the docker daemon running",
    "error during connect",
    "failed to connect to the docker api",
)
NO_PERMISSION = "permission denied while trying to connect to the docker"


@dataclasses.dataclass
class Engine:
    ok: bool
    version: str = ""
    why: str = ""
    fix: str = ""


def diagnose(output: str, docker: str = "docker") -> tuple[str, str]:
    """(why, fix) for a docker client's output that reached no engine; ('', '') when it names no such cause."""
    low = output.lower()
    if NO_PERMISSION in low:
        return (
            "refuses this user (permission denied on its socket)",
            "add yourself to the docker group (sudo usermod -aG docker $USER, then log in again), or run as root",
        )
    if any(s in low for s in NOT_RUNNING):
        return (
            "is not running or not reachable",
            f"start it (sudo systemctl start docker), or point DOCKER_HOST / `{docker} context use` at a running "
            f"engine, then retry",
        )
    return "", ""


def engine(docker: str = "docker") -> Engine:
    """Ask the client for the engine's version: the one call that needs a running, permitted engine."""
    if proc.which(docker) is None:
        return Engine(
            False,
            why=f"is missing here ({docker} not found on PATH)",
            fix="install Docker Engine and the NVIDIA Container Toolkit (docs.docker.com/engine/install)",
        )
    res = proc.run([docker, "version", "--format", "{{.Server.Version}}"], timeout=PROBE_TIMEOUT)
    if res.ok and res.stdout.strip():
        return Engine(True, version=res.stdout.strip())
    why, fix = diagnose(res.output, docker)
    said = (res.stderr.strip() or res.why or "no server version").splitlines()[-1][-300:]
    return Engine(
        False,
        why=why or f"does not answer `{docker} version` ({said})",
        fix=fix or "check that the engine runs and this user may use it (docker info), then retry",
    )


def image_info(image: str, docker: str = "docker") -> dict | None:
    """`docker image inspect`'s object for the image (Id, RepoDigests, ...) with its Labels at the top; None when the
    engine lacks it."""
    res = proc.run([docker, "image", "inspect", image], timeout=PROBE_TIMEOUT)
    try:
        info = json.loads(res.stdout)[0] if res.ok else None
    except (ValueError, IndexError, KeyError):
        return None
    return info and {**info, "Labels": (info.get("Config") or {}).get("Labels") or {}}


def image_id(image: str, patchset: str = "", docker: str = "docker") -> tuple[str | None, str]:
    """(the image's id, '') when the engine has it and, given a patch set (an image make image builds from this
    checkout's patches/: series.pin.patchset_id), its label names that one; else (None, why, with the fix)."""
    eng = engine(docker)
    if not eng.ok:
        return None, f"the docker engine {eng.why}. Fix: {eng.fix}"
    info, build = image_info(image, docker), f"make image IMAGE={image} (it builds {image} from this checkout)"
    if info is None:
        return None, f"image {image} is not in this docker engine. Fix: " + (
            build if patchset else f"docker pull {image}"
        )
    label = info["Labels"].get(PATCHSET_LABEL)
    if patchset and label != patchset:
        why = (
            f"holds patch set {label or 'none (not built by make image)'}, but this checkout's patches/ are {patchset}"
        )
        return None, f"image {image} {why}: it would run another series. Fix: {build}"
    return info["Id"], ""


def container_name(what: str) -> str:
    """eagle-<what>-pid<this process>: a container this process starts; OWNER reads the pid back, so a later run
    knows one whose process is gone (a SIGKILL, a crash) was left behind."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"eagle-{what}-pid{os.getpid()}")


def hf_cache_dir() -> str:
    """The HF hub cache, where `hf download` puts models, found as `hf` finds it (mounted at HF_CACHE_IN_IMAGE):
    $HF_HUB_CACHE, else $HF_HOME/hub, else ${XDG_CACHE_HOME:-~/.cache}/huggingface/hub."""
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return os.path.expanduser(os.environ.get("HF_HUB_CACHE") or os.path.join(home, "hub"))


def docker_run(
    image: str,
    args: list[str],
    *,
    gpus: bool = True,
    results: Path | None = None,
    hf_cache: str | None = None,
    network_host: bool = False,
    detach: bool = False,
    name: str | None = None,
    env_names: Iterable[str] = (),
    extra: list[str] = (),
    docker: str = "docker",
) -> list[str]:
    """argv of `docker run` for the image's verb `args`: environment variables go by name (docker copies them), and
    a path of this machine among `args` (absolute, existing: a model, drafter, profile, key file) is mounted
    read-only where it is, so the container sees it as named."""
    # env_names go whether set now or not (docker copies each from its own environment when it runs: a key set
    # after the command is built still reaches the container); SGLang's own variables, where set
    passed = [k for k in os.environ if k in PASS_NAMES or k.startswith(PASS_PREFIXES) and k not in OURS]
    cmd = [docker, "run", "-d" if detach else "--rm"]
    if gpus:
        cmd += ["--gpus", "all", "--ipc=host"]
    if network_host:
        cmd += ["--network", "host"]
    if name:
        cmd += ["--name", name]
    if results:
        cmd += ["-v", f"{Path(results).resolve()}:{RESULTS_IN_IMAGE}"]
    if hf_cache:
        cmd += ["-v", f"{hf_cache}:{HF_CACHE_IN_IMAGE}"]
    cmd += ["-v", FLASHINFER_MOUNT]
    paths = [a for a in args if a.startswith("/") and not a.startswith(RESULTS_IN_IMAGE) and os.path.exists(a)]
    cmd += [x for p in dict.fromkeys(paths) for x in ("-v", f"{p}:{p}:ro")]
    cmd += [x for k in sorted({*env_names, *passed}) for x in ("-e", k)]
    return [*cmd, *extra, image, *args]


def shown(cmd: list[str]) -> str:
    """cmd as a shell command with each option on its own line: readable, and it runs as printed."""
    lines: list[list[str]] = []
    for t in cmd:
        if t.startswith("-") or not lines:
            lines.append([t])
        else:
            lines[-1].append(t)
    return " \\\n    ".join(shlex.join(ln) for ln in lines)
