"""The docker engine and the one `docker run` of the serving image.

engine() asks whether the engine answers (and names the fix when it does not), image_id() whether it has an image:
asked before anything is built or started, so a missing engine is one message, never a failed step. docker_run()
builds every command that runs the image (serve, test-gpu, test-serve, bench-comm, the bench's servers and client,
the profile's servers, the doctor's probes) with the HF-cache rule of hf_cache_dir().
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from pathlib import Path
from typing import Iterable

from ..lib import proc

HF_CACHE_IN_IMAGE = "/root/.cache/huggingface"
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


def image_id(image: str, docker: str = "docker") -> tuple[str | None, str]:
    """(the image's id, '') when the engine has it, else (None, why, with the fix)."""
    eng = engine(docker)
    if not eng.ok:
        return None, f"the docker engine {eng.why}. Fix: {eng.fix}"
    res = proc.run([docker, "image", "inspect", "--format", "{{.Id}}", image], timeout=PROBE_TIMEOUT)
    if res.ok:
        return res.stdout.strip(), ""
    return None, f"image {image} is not in this docker engine. Fix: make image (it builds {image})"


def hf_cache_dir() -> str:
    """The HF cache on this machine: $HF_HOME if set, else ~/.cache/huggingface (mounted at HF_CACHE_IN_IMAGE)."""
    return os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface")


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
    """argv of `docker run` for the image's verb `args`; environment variables go by name (docker copies them)."""
    passed = (k for k in os.environ if k in PASS_NAMES or k.startswith(PASS_PREFIXES) and k not in OURS)
    names = [*env_names, *passed]
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
    cmd += [x for k in sorted(set(names)) if k in os.environ for x in ("-e", k)]
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
