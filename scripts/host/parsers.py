"""Parsers of the real tools' outputs (what `doctor --record` keeps and tests/fixtures/doctor/ holds).

nvidia-smi -q -x (XML, schema nvsmi_device_v12.dtd) for GPU facts; --query-gpu CSV for the compute capability
(-q does not print it); topo -m for link types and CPU/NUMA affinity; topo -p2p r|n for the P2P status matrices;
nvlink -s, nvcc --version, numactl -H, df -Pk.
"""

from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ET

ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_DEV_RE = re.compile(r"(GPU|NIC)\d+")
_GPU_RE = re.compile(r"GPU\d+")


@dataclasses.dataclass
class Gpu:
    """One GPU as nvidia-smi -q and NVML describe it (None: not reported)."""

    bus_id: str
    name: str = "?"
    arch: str = ""
    index: int | None = None
    uuid: str = ""
    minor: int | None = None
    compute_cap: str = ""
    addressing_mode: str = ""  # None, HMM or ATS
    fb_total_mib: int | None = None
    bar1_total_mib: int | None = None
    gen_max: int | None = None  # the device's own maximum PCIe generation
    gen_host_max: int | None = None  # the slot's (host's) maximum
    gen_current: int | None = None
    width_max: int | None = None
    width_current: int | None = None


@dataclasses.dataclass
class GpuInventory:
    driver: str = ""
    cuda: str = ""
    gpus: list[Gpu] = dataclasses.field(default_factory=list)


def to_int(s) -> int | None:
    m = re.match(r"\s*(\d+)", str(s or ""))
    return int(m.group(1)) if m else None


def _text(el: ET.Element | None, path: str) -> str:
    found = el.find(path) if el is not None else None
    return (found.text or "").strip() if found is not None and found.text else ""


def _gpu_from_xml(g: ET.Element) -> Gpu:
    link = g.find("pci/pci_gpu_link_info")
    return Gpu(
        bus_id=g.get("id") or _text(g, "pci/pci_bus_id"),
        name=_text(g, "product_name") or "?",
        uuid=_text(g, "uuid"),
        arch=_text(g, "product_architecture"),
        minor=to_int(_text(g, "minor_number")),
        addressing_mode=_text(g, "addressing_mode"),
        fb_total_mib=to_int(_text(g, "fb_memory_usage/total")),
        bar1_total_mib=to_int(_text(g, "bar1_memory_usage/total")),
        gen_max=to_int(_text(link, "pcie_gen/max_device_link_gen") or _text(link, "pcie_gen/max_link_gen")),
        gen_host_max=to_int(_text(link, "pcie_gen/max_host_link_gen")),
        gen_current=to_int(_text(link, "pcie_gen/current_link_gen")),
        width_max=to_int(_text(link, "link_widths/max_link_width")),
        width_current=to_int(_text(link, "link_widths/current_link_width")),
    )


def parse_smi_xml(text: str) -> GpuInventory:
    """nvidia-smi -q -x: driver and CUDA versions, one Gpu per <gpu> element. ValueError if it is not that XML."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise ValueError(f"not XML: {e}") from e
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"root element <{root.tag}>, not <nvidia_smi_log>")
    return GpuInventory(driver=_text(root, "driver_version"), cuda=_text(root, "cuda_version"),
                        gpus=[_gpu_from_xml(g) for g in root.findall("gpu")])


def parse_query_csv(text: str) -> list[dict]:
    """nvidia-smi --query-gpu=... --format=csv: header (units in brackets dropped), one row per GPU."""
    rows = [r for r in text.splitlines() if r.strip()]
    if not rows:
        return []
    header = [re.sub(r"\s*\[.*\]$", "", h.strip()) for h in rows[0].split(",")]
    return [dict(zip(header, (c.strip() for c in r.split(",")))) for r in rows[1:]]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in ANSI_RE.sub("", line).split("\t")]


def parse_topo_m(text: str) -> dict:
    """nvidia-smi topo -m: link type of each GPU pair, CPU and NUMA affinity of each GPU (NIC rows ignored).

    The header is a tab-separated row of device names (GPU0.., NIC0..) then the affinity columns; each GPU row
    starts with its name, then one cell per device, then CPU Affinity, NUMA Affinity (and GPU NUMA ID)."""
    devices: list[str] = []
    links, cpu, numa = {}, {}, {}
    for line in text.splitlines():
        cells = _cells(line)
        filled = [c for c in cells if c]
        if not devices:
            if filled and filled[0] == "GPU0" and cells[0] == "":
                devices = [c for c in filled if _DEV_RE.fullmatch(c)]
            continue
        if not filled or filled[0].startswith("Legend"):
            break
        if not _GPU_RE.fullmatch(cells[0]):
            continue
        i = int(cells[0][3:])
        for dev, cell in zip(devices, cells[1:1 + len(devices)]):
            if dev.startswith("GPU") and int(dev[3:]) != i:
                links[(i, int(dev[3:]))] = cell
        rest = [c for c in cells[1 + len(devices):] if c]
        if rest:
            cpu[i] = rest[0]
        if len(rest) > 1:
            numa[i] = rest[1]
    return {"devices": devices, "links": links, "cpu": cpu, "numa": numa}


def parse_p2p(text: str) -> dict[tuple[int, int], str]:
    """nvidia-smi topo -p2p r|w|n|a|p: the status of each ordered GPU pair (OK, CNS, GNS, TNS, NS, U)."""
    cols: list[int] = []
    out = {}
    for line in text.splitlines():
        filled = [c for c in _cells(line) if c]
        if not filled:
            continue
        if not cols:
            if all(_GPU_RE.fullmatch(c) for c in filled):
                cols = [int(c[3:]) for c in filled]
            continue
        if filled[0].startswith("Legend"):
            break
        if _GPU_RE.fullmatch(filled[0]) and len(filled) > 1:
            i = int(filled[0][3:])
            for j, v in zip(cols, filled[1:]):
                if i != j:
                    out[(i, j)] = v
    return out


def parse_nvlink(text: str) -> int:
    """nvidia-smi nvlink -s: number of links reported with a bandwidth (active)."""
    return len(re.findall(r"Link \d+: [\d.]+ GB/s", text))


def parse_nvcc(text: str) -> tuple[int, int] | None:
    m = re.search(r"release (\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_numactl(text: str) -> dict:
    m = re.search(r"available:\s*(\d+) nodes?", text)
    return {"nodes": int(m.group(1)) if m else None}


def parse_df(text: str) -> dict | None:
    """df -Pk DIR: available KiB and mount point of the last line."""
    rows = [r for r in text.splitlines() if r.strip()]
    if len(rows) < 2:
        return None
    f = rows[-1].split()
    if len(f) < 6:
        return None
    return {"avail_kib": int(f[3]), "size_kib": int(f[1]), "mount": f[5]}


def version_tuple(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", s)[:3])
