"""The one "PCIe-only" rule, the same as the patched launcher's (sglang/srt/entrypoints/pcie_defaults.py):

  PCIe-only  = no pair among the GPUs in question reports NVML_P2P_STATUS_OK for NVML_P2P_CAPS_INDEX_NVLINK; a
               pair whose query raises NVMLError_NotSupported counts as no NVLink;
  unknown    = any other NVML failure, fewer than two visible GPUs, GPUs that cannot be matched to CUDA's numbers
               (MIG instances; a numbered subset in CUDA_VISIBLE_DEVICES without CUDA_DEVICE_ORDER=PCI_BUS_ID).
The GPUs in question are the ones a server started here sees, matched as the launcher matches them: CUDA numbers
GPUs in PCI bus order under CUDA_DEVICE_ORDER=PCI_BUS_ID (its default, FASTEST_FIRST, leaves the order
unspecified), and CUDA_VISIBLE_DEVICES holds CUDA numbers or GPU UUID prefixes, ending at the first entry that
names no GPU. (The launcher probes exactly its TP
group; the doctor asks about every visible GPU.) Pairs are visited in the launcher's order (itertools.combinations)
and the first decisive answer wins, so the two agree pair by pair.

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


def _bus_key(bus_id: str) -> str:
    """00000000:C1:00.0 (NVML, nvidia-smi) and 0000:c1:00.0 (sysfs) as one key."""
    domain, _, rest = bus_id.partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest}".lower()
    except ValueError:
        return bus_id.lower()


def visible_gpus(gpus: list, environ: dict[str, str]) -> tuple[list[int] | None, str]:
    """NVML indices of the GPUs a server started here sees, matched as the launcher matches them
    (sglang/srt/entrypoints/pcie_defaults.py _visible_devices); (None, why) when they cannot be matched. CUDA
    numbers GPUs in PCI bus order only under CUDA_DEVICE_ORDER=PCI_BUS_ID (FASTEST_FIRST leaves the order
    unspecified): without it, GPU numbers in CUDA_VISIBLE_DEVICES name a known set only when they name them all."""
    cuda = sorted(range(len(gpus)), key=lambda k: _bus_key(gpus[k].bus_id))
    spec = environ.get("CUDA_VISIBLE_DEVICES")
    picked, numbered = (cuda if spec is None else []), False
    for entry in ([] if spec is None else [e.strip() for e in spec.split(",")]):
        if entry.startswith("MIG-"):
            return None, f"MIG instance {entry} in CUDA_VISIBLE_DEVICES"
        numbered = numbered or entry.isdigit()
        match = [cuda[int(entry)]] if entry.isdigit() and int(entry) < len(cuda) else \
            [k for k in cuda if entry and not entry.isdigit() and gpus[k].uuid.startswith(entry)]
        if len(match) != 1:
            break
        picked.append(match[0])
    if numbered and environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID" and len(set(picked)) != len(gpus):
        return None, "CUDA_VISIBLE_DEVICES selects GPUs by number in CUDA's FASTEST_FIRST order: set " \
                     "CUDA_DEVICE_ORDER=PCI_BUS_ID"
    ids = [gpus[k].index if gpus[k].index is not None else k for k in picked]
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
