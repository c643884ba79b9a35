"""The one "PCIe-only" rule, the same as the patched launcher's (sglang/srt/entrypoints/pcie_defaults.py):

  PCIe-only  = no pair among the visible GPUs reports NVML_P2P_STATUS_OK for NVML_P2P_CAPS_INDEX_NVLINK; a pair
               whose query raises NVMLError_NotSupported counts as no NVLink;
  unknown    = any other NVML failure, fewer than two visible GPUs, or CUDA_VISIBLE_DEVICES that are not
               integers (UUIDs).
Pairs are visited in the launcher's order (itertools.combinations of the visible GPUs) and the first decisive
answer wins, so the two agree pair by pair.

The input is an NVLink status matrix {(i, j): code} with nvidia-smi's codes (OK, NS, CNS, GNS, TNS, U): read live
through NVML (scripts/host/nvml.py, where a failed query is ERR) or replayed from `nvidia-smi topo -p2p n`, which
prints the same matrix. nvidia-smi prints U both for an UNKNOWN answer and for a failed query, so a recorded U
counts as unknown.
"""

from __future__ import annotations

import itertools

OK = "OK"
FAILED = ("ERR", "U")  # the query failed (or nvidia-smi could not say)
P2P_LEGEND = {"OK": "ok", "CNS": "chipset not supported", "GNS": "GPU not supported", "TNS": "topology not supported",
              "NS": "not supported", "U": "unknown", "ERR": "NVML query failed"}


def visible_gpus(count: int, environ: dict[str, str]) -> tuple[list[int] | None, str]:
    """NVML indices of the GPUs a server started here sees, mapped from CUDA_VISIBLE_DEVICES as the launcher maps
    them; (None, why) when they cannot be mapped."""
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if cvd:
        try:
            ids = [int(x) for x in cvd.split(",")]
        except ValueError:
            return None, f"CUDA_VISIBLE_DEVICES={cvd} is not a list of GPU numbers (UUIDs cannot be mapped)"
    else:
        ids = list(range(count))
    if len(ids) < 2:
        return None, f"{len(ids)} GPU(s) visible"
    return ids, ""


def pcie_only(nvlink: dict[tuple[int, int], str] | None, ids: list[int] | None) -> tuple[bool | None, str]:
    """(True: PCIe only, False: some pair has NVLink, None: unknown; why, for unknown)."""
    if ids is None or nvlink is None:
        return None, "no NVLink status"
    for i, j in itertools.combinations(ids, 2):
        status = nvlink.get((i, j))
        if status is None:
            return None, f"no NVLink status for GPU{i}-GPU{j}"
        if status in FAILED:
            return None, f"the NVLink query for GPU{i}-GPU{j} failed ({P2P_LEGEND.get(status, status)})"
        if status == OK:
            return False, ""
    return True, ""
