"""Live GPU facts through NVML (nvidia-ml-py's pynvml, the library the patched launcher uses).

`read_inventory()` gives what `nvidia-smi -q -x` would (scripts/host/parsers.py parses that for recordings), and
`p2p_matrix()` the status matrix `nvidia-smi topo -p2p n|r` prints, with ERR where the query itself failed (other
than NVMLError_NotSupported, which counts as NS, as in the launcher). No CUDA context is created.
"""

from __future__ import annotations

from .parsers import Gpu, GpuInventory

STATUS_CODES = {"NVML_P2P_STATUS_OK": "OK", "NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED": "CNS",
                "NVML_P2P_STATUS_GPU_NOT_SUPPORTED": "GNS", "NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED": "TNS",
                "NVML_P2P_STATUS_DISABLED_BY_REGKEY": "NS", "NVML_P2P_STATUS_NOT_SUPPORTED": "NS",
                "NVML_P2P_STATUS_UNKNOWN": "U"}
ADDRESSING = {0: "None", 1: "HMM", 2: "ATS"}


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _ask(nvml, fn: str, *args):
    """One NVML query; None when this driver or GPU does not answer it."""
    try:
        return getattr(nvml, fn)(*args)
    except Exception:  # noqa: BLE001 - NVMLError, a pynvml without this call, an old driver: not reported
        return None


def _arch_name(nvml, value) -> str:
    names = {getattr(nvml, k): k[len("NVML_DEVICE_ARCH_"):].title() for k in dir(nvml)
             if k.startswith("NVML_DEVICE_ARCH_")}
    return names.get(value, "") if value is not None else ""


def _gpu(nvml, index: int, h) -> Gpu:
    pci = _ask(nvml, "nvmlDeviceGetPciInfo", h)
    cc = _ask(nvml, "nvmlDeviceGetCudaComputeCapability", h)
    mem = _ask(nvml, "nvmlDeviceGetMemoryInfo", h)
    bar1 = _ask(nvml, "nvmlDeviceGetBAR1MemoryInfo", h)
    return Gpu(
        bus_id=_s(pci.busId) if pci is not None else f"index {index}",
        name=_s(_ask(nvml, "nvmlDeviceGetName", h) or "?"),
        uuid=_s(_ask(nvml, "nvmlDeviceGetUUID", h) or ""),
        arch=_arch_name(nvml, _ask(nvml, "nvmlDeviceGetArchitecture", h)),
        index=index,
        minor=_ask(nvml, "nvmlDeviceGetMinorNumber", h),
        compute_cap=f"{cc[0]}.{cc[1]}" if cc else "",
        addressing_mode=ADDRESSING.get(_ask(nvml, "nvmlDeviceGetAddressingMode", h), ""),
        fb_total_mib=mem.total >> 20 if mem is not None else None,
        bar1_total_mib=bar1.bar1Total >> 20 if bar1 is not None else None,
        gen_max=_ask(nvml, "nvmlDeviceGetGpuMaxPcieLinkGeneration", h),
        gen_host_max=_ask(nvml, "nvmlDeviceGetMaxPcieLinkGeneration", h),
        gen_current=_ask(nvml, "nvmlDeviceGetCurrPcieLinkGeneration", h),
        width_max=_ask(nvml, "nvmlDeviceGetMaxPcieLinkWidth", h),
        width_current=_ask(nvml, "nvmlDeviceGetCurrPcieLinkWidth", h),
    )


def p2p_matrix(nvml, handles: list, caps_index: int) -> dict[tuple[int, int], str]:
    codes = {getattr(nvml, k): v for k, v in STATUS_CODES.items() if hasattr(nvml, k)}
    out = {}
    for i, a in enumerate(handles):
        for j, b in enumerate(handles):
            if i == j:
                continue
            try:
                out[(i, j)] = codes.get(nvml.nvmlDeviceGetP2PStatus(a, b, caps_index), "U")
            except nvml.NVMLError_NotSupported:
                out[(i, j)] = "NS"
            except nvml.NVMLError:
                out[(i, j)] = "ERR"
    return out


def read_inventory() -> tuple[GpuInventory, dict, dict]:
    """(GPUs with driver and CUDA versions, NVLink status matrix, P2P read status matrix). Raises ImportError
    without pynvml and pynvml.NVMLError without a driver."""
    import pynvml as nvml

    nvml.nvmlInit()
    try:
        cuda = _ask(nvml, "nvmlSystemGetCudaDriverVersion_v2")
        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        inv = GpuInventory(driver=_s(nvml.nvmlSystemGetDriverVersion()),
                           cuda=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else "",
                           gpus=[_gpu(nvml, i, h) for i, h in enumerate(handles)])
        return (inv, p2p_matrix(nvml, handles, nvml.NVML_P2P_CAPS_INDEX_NVLINK),
                p2p_matrix(nvml, handles, nvml.NVML_P2P_CAPS_INDEX_READ))
    finally:
        nvml.nvmlShutdown()
