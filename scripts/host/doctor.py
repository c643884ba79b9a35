"""`make doctor` (and `serve --check` in the image): preflight of the serving box.

  python -m scripts.host.doctor [--tp N] [--model-dir DIR] [--need-gb N] [--python PY] [--image IMAGE] [--json]
  python -m scripts.host.doctor --record DIR     also write every raw tool output to DIR (a bug report / fixture)
  python -m scripts.host.doctor --replay DIR     diagnose recorded outputs instead of this machine

The facts are read once (scripts/host/facts.py: NVML when live, else the tools' recorded output) and each check
below is a small registered function over them (scripts/host/checks.py), reporting findings with an id, a
severity (ok, info, warn, error), a message and a fix:

  gpus            gpu.driver, gpu.model, gpu.count   a driver, identical GPUs, enough of them for --tp
  driver_cuda     driver.cuda      the driver's CUDA >= the upstream image's (from patches/pin.toml)
  nvlink          topo.nvlink      NVLink or PCIe only, by the patched launcher's rule (scripts/host/topology.py)
  p2p             topo.p2p         P2P read status of every GPU pair (nvidia-smi topo -p2p r)
  numa            topo.numa        GPUs split evenly and contiguously across NUMA nodes
  pcie_link       pcie.link        every link at its full width and generation
  bar1            pcie.bar1        BAR1 at least as large as GPU memory (Resizable BAR)
  hmm             host.hmm         nvidia_uvm HMM off (NCCL P2P hangs with it on PCIe-only boxes)
  iommu           host.iommu, host.pcie_pm   IOMMU off or passthrough; PCIe port power management
  nvcc            cuda.nvcc        nvcc >= 12.8 for FlashInfer's SM120 JIT
  nccl_version    nccl.version     the NCCL torch loaded (not only the one it was built with) is not a known-bad
                                   release (2.30.4 hangs on RTX PRO 6000 pairs); in the image, the one it was built
                                   to run (EAGLE_NCCL_VERSION), elsewhere compared with patches/pin.toml [nccl]
  nccl_transport  nccl.transport   which transport NCCL picks between the TP group's GPUs, from NCCL's INFO lines
                                   of a short all-reduce over the first --tp GPUs (scripts/host/nccl_transport.py):
                                   P2P is ok; SHM or NET (staged through host memory or the network) is an error,
                                   with the fix the host facts point to (NCCL_P2P_DISABLE in the ranks' environment,
                                   the driver's P2P override where pairs meet at the CPU, ACS where they share a
                                   switch, HMM, the IOMMU); a hang or a wrong sum is an error too. The all-reduce
                                   runs with --python when its torch sees 2 CUDA GPUs, else in --image when docker
                                   has it; where neither can, the finding says "not measured" and why
  environment     env.alloc, env.nccl   allocator settings that crash the PCIe all-reduce; NCCL_* overrides
  disk            disk.free        room for the model in the HF cache
  patchset        image.patchset   the installed sglang holds this series (its git history)
  listen          serve.listen     who can reach the server: "listening on 127.0.0.1 only", "listening on 0.0.0.0
                                   with an API key from $SGLANG_API_KEY", or serve's refusal (a host beyond
                                   loopback without a key: an error); --listen-host / --api-key-file say where
                                   serve would listen (serve --check passes its profile's), by default 127.0.0.1

Every tool runs with a timeout; a missing tool is a finding, never a traceback. Exit status: 0 no error finding;
1 at least one error finding; 2 a usage problem (e.g. --replay of a directory that does not exist).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
from pathlib import Path

from ..lib.cli import run
from ..series.pin import load_pin, patchset_id, series_patches
from .checks import Finding, run_checks, table
from .exposure import SGLANG_DEFAULT_HOST
from .nccl import expected_nccl
from .facts import build_facts, summary
from .route import default_image
from .tools import Probe, load_capture

DEFAULT_NEED_GB = 700  # Kimi-K2.5 weights (~600 GB) + drafter + headroom; an estimate, override with --need-gb


def _pin_facts() -> tuple[str | None, tuple[int, int] | None]:
    """(patch set id of the series here, CUDA release of the upstream image); None for what cannot be read."""
    try:
        pin = load_pin()
    except Exception:  # noqa: BLE001 - a doctor without the series still diagnoses the box
        return None, None
    try:
        return patchset_id(series_patches(pin)), pin.image_cuda
    except Exception:  # noqa: BLE001
        return None, pin.image_cuda


def _default_image() -> str | None:
    try:
        return default_image()
    except Exception:  # noqa: BLE001 - a doctor without the series still diagnoses the box
        return None


def diagnose(probe: Probe, *, tp: int = 8, need_gb: float = DEFAULT_NEED_GB, environ: dict | None = None,
             expected_patchset: str | None = None, listen_host: str = SGLANG_DEFAULT_HOST,
             api_key_file: str | None = None) -> tuple[list[Finding], dict]:
    """Every registered check over the facts of `probe`: (findings, the facts as plain data)."""
    _, image_cuda = _pin_facts()
    facts = build_facts(probe, tp=tp, need_gb=need_gb, environ=environ, expected_patchset=expected_patchset,
                        image_cuda=image_cuda, listen_host=listen_host, api_key_file=api_key_file,
                        expected_nccl=expected_nccl(environ))
    return run_checks(facts), summary(facts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts.host.doctor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tp", type=int, default=8, help="tensor-parallel size to check for (default 8)")
    ap.add_argument("--model-dir", type=Path, default=None,
                    help="HF cache the model goes to (default $HF_HUB_CACHE, $HF_HOME or ~/.cache/huggingface)")
    ap.add_argument("--need-gb", type=float, default=DEFAULT_NEED_GB,
                    help=f"disk the model needs (default {DEFAULT_NEED_GB}, an estimate)")
    ap.add_argument("--python", default=sys.executable, help="interpreter whose torch/NCCL and sglang to check")
    ap.add_argument("--image", default=None,
                    help="where the NCCL transport all-reduce runs when --python's torch sees fewer than 2 CUDA GPUs "
                         "(default: the pinned serving image, if docker has it)")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds each tool may take (default 30)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    ap.add_argument("--listen-host", default=SGLANG_DEFAULT_HOST,
                    help=f"where serve would listen (default {SGLANG_DEFAULT_HOST}, the profiles'; serve --check passes "
                         f"its own)")
    ap.add_argument("--api-key-file", metavar="FILE", help="the key file serve would be given (serve --api-key-file)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--record", type=Path, metavar="DIR", help="also write the raw tool outputs to DIR")
    src.add_argument("--replay", type=Path, metavar="DIR", help="diagnose outputs recorded in DIR")
    a = ap.parse_args(argv)
    probe = Probe(load_capture(a.replay) if a.replay else None, python=a.python, model_dir=a.model_dir,
                  timeout=a.timeout, image=a.image or _default_image(), ranks=a.tp)
    findings, facts = diagnose(probe, tp=a.tp, need_gb=a.need_gb, expected_patchset=_pin_facts()[0],
                               listen_host=a.listen_host, api_key_file=a.api_key_file)
    if a.record:
        written = probe.record(a.record)
        print(f"recorded {len(written)} outputs in {a.record}", file=sys.stderr)
    if a.json:
        print(json.dumps({"findings": [dataclasses.asdict(f) for f in findings], "facts": facts,
                          "errors": sum(f.severity == "error" for f in findings)}, indent=1, default=str))
    else:
        print(table(findings, shutil.get_terminal_size((110, 20)).columns))
    return 1 if any(f.severity == "error" for f in findings) else 0


if __name__ == "__main__":
    run(main)
