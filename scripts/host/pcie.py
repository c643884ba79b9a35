"""The patched launcher's PCIe-only defaults, asked of the patched SGLang itself (never copied into this repository).

- `launcher_decision(python, sgl_args, environ)`: what the launcher will decide (topology, NCCL values set, kept and
  skipped, the PCIe-IPC all-reduce, ranks to GPUs and NUMA nodes, warnings). `python`, the interpreter that will run
  sglang, parses the server arguments with SGLang's own prepare_server_args and calls the patched module's
  decide_pcie_only_defaults, in a subprocess with the environment the server will get, so the answer is the one
  the launcher reaches at start. `serve --dry-run` reports it.
- `launcher_nccl_defaults()`: the NCCL values the launcher sets in a clean environment (the patched module's
  nccl_defaults({})), from the sglang this interpreter imports: bench-comm's `pcie_defaults` variant.
"""

from __future__ import annotations

import dataclasses
import importlib
import json

from ..lib import proc
from ..lib.errors import UserError
from .exposure import redacted

MODULE = "sglang.srt.entrypoints.pcie_defaults"
SKIP_VAR = "SGLANG_PCIE_NCCL_DEFAULTS"
AT_START = (f"the patched launcher decides the PCIe-only defaults when it starts: with no NVLink between the visible "
            f"GPUs (NVML) it sets its NCCL defaults where the environment does not ({SKIP_VAR}=0 skips them) and, on "
            f"SM120, the PCIe-IPC all-reduce (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0 skips it); it logs what it applied")
# Runs in the server's interpreter and environment: its own parse of the arguments, its own decision.
ASK = ("import dataclasses, json, sys\n"
       "from sglang.srt.server_args import prepare_server_args\n"
       f"from {MODULE} import decide_pcie_only_defaults\n"
       "print(json.dumps(dataclasses.asdict(decide_pcie_only_defaults(prepare_server_args(sys.argv[1:])))))\n")
ASK_TIMEOUT = 300.0  # importing sglang's argument layer (torch included) on a slow host


@dataclasses.dataclass
class LauncherDecision:
    """What serve can say about the launcher's PCIe-only defaults before starting it."""

    known: bool  # the patched module answered
    lines: list[str]  # human-readable, one statement each
    data: dict | None = None  # its answer as plain data (serve --dry-run --json)


def launcher_decision(python: str, sgl_args: list[str], environ: dict[str, str]) -> LauncherDecision:
    """Ask the patched launcher of `python`, under `environ`, what it will decide for the server arguments
    `sgl_args` (an API key given there is not passed on: the decision does not read it)."""
    res = proc.run([python, "-c", ASK, *redacted(sgl_args)], env=environ, timeout=ASK_TIMEOUT)
    answer = res.stdout.strip().splitlines()[-1:] if res.ok else []
    try:
        data = json.loads(answer[0]) if answer else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        said = (res.stderr.strip().splitlines() or [res.why or "no answer"])[-1]
        return LauncherDecision(False, [f"{AT_START} ({python} cannot say in advance: {said})"])
    lines = [f"launcher PCIe defaults: {k}: {v}" for k, v in data.items() if v not in ([], {}, "")]
    return LauncherDecision(True, lines, data)


def launcher_nccl_defaults() -> dict[str, str]:
    """The NCCL values the patched launcher sets in a clean environment, asked of the sglang this interpreter
    imports; a UserError naming what is missing otherwise."""
    try:
        module = importlib.import_module(MODULE)
    except ImportError as e:
        raise UserError(f"the patched launcher's NCCL defaults come from {MODULE}, which this python cannot import "
                        f"({e}): run where the patched sglang is importable (the serving image, or "
                        f"PYTHONPATH=build/sglang/python after make apply)") from e
    return dict(module.nccl_defaults({})[0])
