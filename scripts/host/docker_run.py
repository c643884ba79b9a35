"""The one `docker run` of the serving image (contract 3), and the one rule for the host's HF cache.

Minimal version written by the bench helper against the documented signature; the host helper's own replaces it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

PASS_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HF_TOKEN")
PASS_PREFIXES = ("NCCL_", "SGLANG_", "FLASHINFER_")


def hf_cache_dir() -> str:
    """The host's HF cache: $HF_HOME if set, else ~/.cache/huggingface."""
    return os.environ.get("HF_HOME") or str(Path("~/.cache/huggingface").expanduser())


def docker_run(image: str, args: list[str], *, gpus: bool = True, results: Path | None = None,
               hf_cache: str | None = None, network_host: bool = False, detach: bool = False,
               name: str | None = None, env_names: Iterable[str] = (), extra: list[str] = (),
               docker: str = "docker") -> list[str]:
    """The argv of `docker run` for `image ARGS`; environment variables go by name (docker copies the values)."""
    argv = [docker, "run", "-d" if detach else "--rm"]
    argv += ["--name", name] if name else []
    argv += ["--gpus", "all", "--ipc=host"] if gpus else []
    argv += ["--network", "host"] if network_host else []
    argv += ["-v", f"{Path(results).resolve()}:/results"] if results else []
    argv += ["-v", f"{hf_cache}:/root/.cache/huggingface"] if hf_cache else []
    argv += ["-v", "sglang-flashinfer:/root/.cache/flashinfer"]
    names = [n for n in env_names if n in os.environ]
    names += sorted(n for n in os.environ if n in PASS_ENV or n.startswith(PASS_PREFIXES))
    for n in dict.fromkeys(names):
        argv += ["-e", n]
    return argv + list(extra) + [image, *args]
