"""The one `docker run` of the serving image, the HF-cache rule, and where the image's verbs write their results.

Every make target that runs the image (serve, test-gpu, test-serve, bench-comm, bench's servers and client) builds
its command with docker_run(); the image's verbs write under results_dir() and name result files with gpu_slug().
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Iterable

from ..lib import proc
from ..lib.errors import UserError
from ..lib.repo import REPO_ROOT

HF_CACHE_IN_IMAGE = "/root/.cache/huggingface"
FLASHINFER_MOUNT = "sglang-flashinfer:/root/.cache/flashinfer"  # JIT kernels and the all-reduce autotune, kept
RESULTS_IN_IMAGE = "/results"
RESULTS_VAR = "EAGLE_RESULTS"  # the image sets it to /results, the directory the host mounts
PASS_NAMES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HF_TOKEN")
PASS_PREFIXES = ("NCCL_", "SGLANG_", "FLASHINFER_")
OURS = ("SGLANG_BASE", "SGLANG_WHEEL", "SGLANG_REPO", "SGLANG_SRC", "SGLANG_TREE")  # this repository's, not SGLang's


def hf_cache_dir() -> str:
    """The HF cache on this machine: $HF_HOME if set, else ~/.cache/huggingface (mounted at HF_CACHE_IN_IMAGE)."""
    return os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface")


def docker_run(image: str, args: list[str], *, gpus: bool = True, results: Path | None = None,
               hf_cache: str | None = None, network_host: bool = False, detach: bool = False,
               name: str | None = None, env_names: Iterable[str] = (), extra: list[str] = (),
               docker: str = "docker") -> list[str]:
    """argv of `docker run` for the image's verb `args`; environment variables go by name (docker copies them)."""
    names = [*env_names, *(k for k in os.environ
                           if k in PASS_NAMES or k.startswith(PASS_PREFIXES) and k not in OURS)]
    cmd = [docker, "run", "-d" if detach else "--rm"]
    cmd += ["--gpus", "all", "--ipc=host"] if gpus else []
    cmd += ["--network", "host"] if network_host else []
    cmd += ["--name", name] if name else []
    cmd += ["-v", f"{Path(results).resolve()}:{RESULTS_IN_IMAGE}"] if results else []
    cmd += ["-v", f"{hf_cache}:{HF_CACHE_IN_IMAGE}"] if hf_cache else []
    cmd += ["-v", FLASHINFER_MOUNT]
    cmd += [x for k in sorted(set(names)) if k in os.environ for x in ("-e", k)]
    return [*cmd, *extra, image, *args]


def shown(cmd: list[str]) -> str:
    """cmd as a shell command with each option on its own line: readable, and it runs as printed."""
    lines: list[list[str]] = []
    for t in cmd:
        lines.append([t]) if t.startswith("-") or not lines else lines[-1].append(t)
    return " \\\n    ".join(shlex.join(ln) for ln in lines)


def results_dir() -> Path:
    """Where a verb writes: $EAGLE_RESULTS (in the image: the mount, which must exist), else bench/results."""
    named = os.environ.get(RESULTS_VAR)
    if not named:
        return REPO_ROOT / "bench" / "results"
    if not Path(named).is_dir():
        raise UserError(f"{RESULTS_VAR}={named} does not exist, so the results would stay in the container: mount "
                        f"a directory there (docker run -v \"$PWD/bench/results:{named}\" ...)")
    return Path(named)


def gpu_names() -> list[str]:
    """The NVIDIA GPUs this process may use (nvidia-smi -L, narrowed by CUDA_VISIBLE_DEVICES)."""
    res = proc.run(["nvidia-smi", "-L"], timeout=30)
    names = [re.sub(r"^GPU \d+: (.*?)( \(UUID:.*)?$", r"\1", ln.strip()) for ln in res.stdout.splitlines()
             if ln.startswith("GPU ")] if res.ok else []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return names if visible is None else names[:len([v for v in visible.split(",") if v.strip()])]


def gpu_slug(names: list[str]) -> str:
    """H200 from 'NVIDIA H200', RTX-PRO-6000-Blackwell-Server-Edition from the box's cards (for file names)."""
    name = re.sub(r"^NVIDIA\s+", "", names[0]) if names else "nogpu"
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")
