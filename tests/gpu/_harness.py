"""Runs one scenario of _ranks.py on N ranks, one process each, with scripts/box/ranks.py (the box's one spawner and
watchdog: a group whose ranks disagree about a backend hangs, and the watchdog ends it, naming them in `hung`).
The children inherit sys.path; where `import sgl_kernel` fails (CI, a lent GPU machine), the import-only stand-in
tests/gpu/standin is appended: any sgl-kernel op it would reach raises, so nothing passes on it by accident."""

import collections
import dataclasses
import importlib.util
import os
import sys
from pathlib import Path

from scripts.box import ranks
from scripts.box.preflight import gpus

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "standin"
# SGLang's CPU engine for CPU ranks over gloo: no NCCL library (as with a CPU build of torch), one core per rank.
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_NCCL_SO_PATH": "/nonexistent/libnccl.so.2"}


def gpu_count() -> int:
    """Visible GPUs (the box's one GPU list: nvidia-smi -L), without initialising CUDA in this process."""
    return len(gpus()[0])


# What a scenario gets: its rank, the world, a free port for the process group, the device kind ("cuda", "cpu").
Rank = collections.namedtuple("Rank", "rank world port device")


def _scenario(rank: int, world: int, port: int, phase, device: str, scenario: str, params: dict):
    if device == "cpu":
        os.environ.setdefault(
            "SGLANG_CPU_OMP_THREADS_BIND", "|".join(str(i % (os.cpu_count() or 1)) for i in range(world))
        )
    if importlib.util.find_spec("sgl_kernel") is None:
        sys.path.append(str(STANDIN))
    import _ranks

    return getattr(_ranks, scenario)(Rank(rank, world, port, device), **params)


def run_ranks(
    scenario: str,
    *,
    world: int,
    device: str = "cuda",
    params: dict | None = None,
    timeout: float = 300.0,
    env: dict | None = None,
) -> ranks.Ranks:
    """Run `scenario` (a function of _ranks.py) on `world` ranks, never longer than `timeout` seconds."""
    env = {**(CPU_ENV if device == "cpu" else {}), **(env or {})}
    got = ranks.run(_scenario, world, timeout, device, scenario, params or {}, env=env)
    return dataclasses.replace(got, name=scenario)
