"""Runs one scenario on N ranks, one process each, and brings back what every rank returned; a hang is a result.

    outcome = run_ranks("allreduce_routing", world=8, device="cuda", params={...}, timeout=300)
    outcome.ok, outcome.results (one dict per rank), outcome.errors, outcome.hung

Each rank is a fresh process (multiprocessing "spawn": no CUDA state is inherited) that imports the scenario
function from _ranks.py, runs it with a Rank context, and writes {"ok", "result" | "error"} to its own JSON file.
The parent waits at most `timeout` seconds: the collectives under test spin on peer flags without a timeout of
their own, so a group whose ranks disagree about a backend hangs, and that must end the test, not stall it.
Ranks still running then are killed and reported in `outcome.hung`. A rank exits with os._exit after writing its
result, so a peer that died cannot block it in process-group teardown.

Where the SGLang under test comes from: the patched tree that tests/conftest.py put on sys.path (make apply), or,
in the serving image, the installed (patched) sglang; the children inherit the parent's sys.path. Where
`import sgl_kernel` fails (a lent GPU machine without a matching sgl-kernel build, the CPU-only CI machine), the
import-only stand-in in tests/gpu/standin is appended to the children's path: any sgl-kernel op it would reach
raises, so nothing passes on it by accident.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "standin"
# SGLang's CPU engine for CPU ranks over gloo: no NCCL library (as with a CPU build of torch), one core per rank.
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_NCCL_SO_PATH": "/nonexistent/libnccl.so.2"}


def gpu_count() -> int:
    """Visible CUDA GPUs, without initialising CUDA in this process (NVML; torch as a fallback)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            n = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return n if visible is None else min(n, len([v for v in visible.split(",") if v.strip()]))
    except Exception:  # noqa: BLE001 - no driver, no NVML: no GPUs
        return 0


@dataclasses.dataclass
class Outcome:
    scenario: str
    world: int
    results: list  # per rank: the scenario's dict, or None
    errors: dict  # rank -> traceback
    hung: list  # ranks killed at the timeout
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.errors and not self.hung and all(r is not None for r in self.results)

    def explain(self) -> str:
        lines = [f"{self.scenario} on {self.world} ranks, {self.seconds:.0f} s:"]
        if self.hung:
            lines.append(f"  ranks {self.hung} still running at the timeout (killed): a hang")
        for rank, tb in sorted(self.errors.items()):
            lines.append(f"  rank {rank} failed:\n    " + tb.strip().replace("\n", "\n    ")[-3000:])
        return "\n".join(lines)


@dataclasses.dataclass
class Rank:
    """What a scenario gets: its rank, the world, a free port for the process group, the device kind."""

    rank: int
    world: int
    port: int
    device: str

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(rank: int, world: int, port: int, device: str, scenario: str, params: dict, out: str, env: dict):
    os.environ.update(env)
    if device == "cpu":
        os.environ.setdefault("SGLANG_CPU_OMP_THREADS_BIND",
                              "|".join(str(i % (os.cpu_count() or 1)) for i in range(world)))
    if importlib.util.find_spec("sgl_kernel") is None:
        sys.path.append(str(STANDIN))
    path = Path(out) / f"rank{rank}.json"
    try:
        import _ranks

        result = getattr(_ranks, scenario)(Rank(rank, world, port, device), **params)
        path.write_text(json.dumps({"ok": True, "result": result}, default=str))
    except BaseException:  # noqa: BLE001 - everything a rank hits is the test's evidence
        path.write_text(json.dumps({"ok": False, "error": traceback.format_exc()}))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def run_ranks(scenario: str, *, world: int, device: str = "cuda", params: dict | None = None,
              timeout: float = 300.0, env: dict | None = None) -> Outcome:
    """Run `scenario` (a function of _ranks.py) on `world` ranks; never waits longer than `timeout` seconds."""
    env = {**(CPU_ENV if device == "cpu" else {}), **(env or {})}
    ctx = mp.get_context("spawn")
    port = _free_port()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"gpu-{scenario}-") as out:
        procs = [ctx.Process(target=_child, args=(r, world, port, device, scenario, params or {}, out, env),
                             name=f"{scenario}-rank{r}") for r in range(world)]
        for p in procs:
            p.start()
        deadline = t0 + timeout
        while time.monotonic() < deadline and any(p.is_alive() for p in procs):
            time.sleep(0.2)
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        results, errors = [], {}
        for r in range(world):
            f = Path(out) / f"rank{r}.json"
            data = json.loads(f.read_text()) if f.is_file() else None
            if data is None:
                results.append(None)
                if r not in hung:
                    errors[r] = f"rank {r} exited (code {procs[r].exitcode}) without a result"
            elif data["ok"]:
                results.append(data["result"])
            else:
                results.append(None)
                errors[r] = data["error"]
    return Outcome(scenario, world, results, errors, hung, time.monotonic() - t0)
