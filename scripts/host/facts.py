"""What the doctor knows about this box: one `Facts` object, built once from a Probe (live or replayed), that every
check reads. GPU facts come from NVML when live (scripts/host/nvml.py), else from the tools' recorded output
(nvidia-smi -q -x, topo -p2p n|r); PCIe-only is decided by the one rule in scripts/host/topology.py."""

from __future__ import annotations

import dataclasses
import json
import os

from . import nccl_transport
from .exposure import SGLANG_DEFAULT_HOST
from .parsers import (Gpu, GpuInventory, parse_df, parse_numactl, parse_nvcc, parse_nvlink, parse_p2p,
                      parse_query_csv, parse_smi_xml, parse_topo_m, to_int)
from .tools import Out, Probe
from .topology import pcie_only, visible_gpus

# Compute capability by product name, for recordings without the --query-gpu CSV (nvidia-smi -q lacks it).
CC_BY_NAME = (("RTX PRO 6000 Blackwell", "12.0"), ("RTX 5090", "12.0"), ("B200", "10.0"), ("B300", "10.3"),
              ("H200", "9.0"), ("H100", "9.0"), ("H20", "9.0"), ("L40S", "8.9"), ("A100", "8.0"))
EMPTY_TOPO = {"devices": [], "links": {}, "cpu": {}, "numa": {}}


@dataclasses.dataclass
class Facts:
    # what was asked
    tp: int
    need_gb: float
    env: dict[str, str]
    expected_patchset: str | None
    image_cuda: tuple[int, int] | None
    probe: Probe
    listen_host: str  # where serve would listen (serve --check passes its profile's; else sglang's default)
    api_key_file: str | None  # serve --api-key-file, if given
    expected_nccl: tuple[str, str]  # (version, source) of the NCCL the image is meant to run (nccl.expected_nccl)
    # GPUs
    gpus: list[Gpu]
    driver: str = ""
    cuda: str = ""
    gpu_why: str = ""  # why there are no GPU facts ("" when there are)
    # topology
    topo: dict = dataclasses.field(default_factory=lambda: dict(EMPTY_TOPO))
    topo_why: str = ""
    nvlink_matrix: dict | None = None
    p2p_read: dict | None = None
    p2p_why: str = ""
    pcie_only: bool | None = None
    pcie_why: str = ""
    active_nvlinks: int = 0
    numa_nodes: int | None = None

    @property
    def n(self) -> int:
        return len(self.gpus)

    @property
    def sm120(self) -> bool:
        return any(g.compute_cap == "12.0" for g in self.gpus)

    @property
    def rtx_pro(self) -> bool:
        return any("RTX PRO 6000" in g.name for g in self.gpus)

    @property
    def nvlink(self) -> bool | None:
        return None if self.pcie_only is None else not self.pcie_only

    def get(self, key: str) -> Out:
        """A raw tool output (host settings, toolchain, disk, patch set), read on first use."""
        return self.probe.get(key)

    def nccl_info(self) -> dict:
        out = self.get("nccl")
        try:
            return json.loads(out.text.strip().splitlines()[-1]) if out.ok else {}
        except (ValueError, IndexError):
            return {}

    def nccl_transport(self) -> nccl_transport.Transport:
        """NCCL's transport lines and the probe's result (scripts/host/nccl_transport.py); a result saying why when
        the probe gave none (not recorded, or it could not run)."""
        out = self.get("nccl-transport")
        t = nccl_transport.parse(out.text)
        if not t.result:
            t.result = {"measured": False, "why": out.why or "the probe printed no result line"}
        return t

    def nvidia_params(self) -> dict[str, str]:
        """/proc/driver/nvidia/params as {name: value} ({} when unreadable)."""
        out = self.get("nvidia-params")
        return {k.strip(): v.strip().strip('"') for k, _, v in (ln.partition(":") for ln in out.text.splitlines())
                if k.strip()} if out.ok else {}

    def hmm(self) -> tuple[bool | None, str]:
        """(HMM on, how that is known): nvidia_uvm's uvm_disable_hmm, else nvidia-smi's addressing mode; None: unknown
        (and why)."""
        out = self.get("uvm-hmm")
        if out.ok:
            v = out.text.strip()
            return v in ("N", "0"), f"nvidia_uvm uvm_disable_hmm={v}"
        if any(g.addressing_mode == "HMM" for g in self.gpus):
            return True, "nvidia-smi reports Addressing Mode HMM"
        return None, out.why

    def iommu(self) -> tuple[bool | None, str]:
        """(the IOMMU translates device DMA, what says so): the kernel command line and the IOMMU groups; None when
        the command line is unreadable (and why)."""
        cmd = self.get("cmdline")
        if not cmd.ok:
            return None, cmd.why
        toks = cmd.text.split()
        off = [t for t in toks if t in ("iommu=off", "amd_iommu=off", "intel_iommu=off")]
        grp = self.get("iommu-groups")
        groups_n = int(grp.text.strip()) if grp.ok and grp.text.strip().isdigit() else None
        if off:
            return False, f"IOMMU off ({' '.join(off)})"
        if "iommu=pt" in toks:
            return False, "IOMMU in passthrough mode (iommu=pt): device DMA is not translated"
        if groups_n == 0:
            return False, "no IOMMU groups: IOMMU off"
        return True, (f"{groups_n} IOMMU groups, " if groups_n else "") + "no iommu=off/pt on the kernel command line"

    def disk(self) -> dict | None:
        out = self.get("df")
        return parse_df(out.text) if out.ok else None

    def nvcc(self) -> tuple[int, int] | None:
        out = self.get("nvcc")
        return parse_nvcc(out.text) if out.ok else None

    def record(self) -> dict | None:
        """The patch record of the sglang the checked interpreter imports (None: none, or unreadable)."""
        out = self.get("patchset")
        try:
            return json.loads(out.text) if out.ok else None
        except ValueError:
            return None


def _replayed_gpus(probe: Probe) -> tuple[GpuInventory | None, dict | None, dict | None, str]:
    xml = probe.get("smi-xml")
    if not xml.ok:
        return None, None, None, xml.why
    try:
        inv = parse_smi_xml(xml.text)
    except ValueError as e:
        return None, None, None, f"unreadable nvidia-smi -q -x output ({e})"
    rows = parse_query_csv(probe.get("smi-query").text) if probe.get("smi-query").ok else []
    by_bus = {r.get("pci.bus_id", "").upper(): r for r in rows}
    for g in inv.gpus:
        r = by_bus.get(g.bus_id.upper(), {})
        g.compute_cap = r.get("compute_cap") or next((c for n, c in CC_BY_NAME if n in g.name), "")
        g.index = to_int(r.get("index")) if r.get("index") else g.minor
    matrices = [parse_p2p(probe.get(k).text) if probe.get(k).ok else None for k in ("topo-p2p-n", "topo-p2p-r")]
    return inv, matrices[0], matrices[1], ""


def gpu_facts(probe: Probe) -> tuple[GpuInventory | None, dict | None, dict | None, str]:
    """(inventory, NVLink matrix, P2P read matrix, why none): NVML when live and pynvml is there, else the tools."""
    if probe.live:
        try:
            from . import nvml

            return (*nvml.read_inventory(), "")
        except ImportError:
            pass  # no nvidia-ml-py here: the tools answer the same questions
        except Exception as e:  # noqa: BLE001 - pynvml.NVMLError and friends: no driver, no GPU
            return None, None, None, f"NVML: {type(e).__name__}: {e}"
    return _replayed_gpus(probe)


def _topology(f: Facts, nvlink: dict | None, read: dict | None) -> None:
    topo_out = f.get("topo-m")
    f.topo = parse_topo_m(topo_out.text) if topo_out.ok else dict(EMPTY_TOPO)
    f.topo_why = "" if topo_out.ok else topo_out.why
    f.nvlink_matrix, f.p2p_read = nvlink, read
    f.p2p_why = "" if read is not None else (f.get("topo-p2p-r").why or "no P2P read status")
    ids, why = visible_gpus(f.gpus, f.env)
    f.pcie_only, f.pcie_why = pcie_only(nvlink, ids) if ids is not None else (None, why)
    if nvlink is None and ids is not None:
        f.pcie_why = f.get("topo-p2p-n").why or "no NVLink status"
    nvl = f.get("nvlink-s")
    f.active_nvlinks = parse_nvlink(nvl.text) if nvl.ok else 0
    num = f.get("numactl")
    f.numa_nodes = parse_numactl(num.text)["nodes"] if num.ok else None


def build_facts(probe: Probe, *, tp: int, need_gb: float, environ: dict | None = None,
                expected_patchset: str | None = None, image_cuda: tuple[int, int] | None = None,
                listen_host: str = SGLANG_DEFAULT_HOST, api_key_file: str | None = None,
                expected_nccl: tuple[str, str] = ("", "not asked")) -> Facts:
    env = dict(os.environ if environ is None else environ)
    inv, nvlink, read, why = gpu_facts(probe)
    f = Facts(tp=tp, need_gb=need_gb, env=env, expected_patchset=expected_patchset, image_cuda=image_cuda,
              probe=probe, listen_host=listen_host, api_key_file=api_key_file, expected_nccl=expected_nccl,
              gpus=inv.gpus if inv else [], driver=inv.driver if inv else "",
              cuda=inv.cuda if inv else "", gpu_why=why)
    _topology(f, nvlink, read)
    return f


def summary(f: Facts) -> dict:
    """The facts as plain data (doctor --json "facts")."""
    out: dict = {"gpus": [{"index": g.index, "name": g.name, "bus_id": g.bus_id, "compute_cap": g.compute_cap}
                          for g in f.gpus], "nvlink": f.nvlink, "pcie_only": f.pcie_only}
    if f.driver:
        out["driver"], out["cuda"] = f.driver, f.cuda
    if f.p2p_read is not None and f.n > 1:
        out["p2p_bad_pairs"] = [f"GPU{i}-GPU{j}:{s}" for (i, j), s in sorted(f.p2p_read.items())
                                if i < j and s != "OK"]
    if f.topo["numa"]:
        groups: dict[str, list[int]] = {}
        for i, node in sorted(f.topo["numa"].items()):
            groups.setdefault(node, []).append(i)
        out["numa"] = groups
    if f.get("uvm-hmm").ok:
        out["uvm_disable_hmm"] = f.get("uvm-hmm").text.strip()
    if f.get("cmdline").ok:
        out["cmdline_iommu"] = [t for t in f.get("cmdline").text.split()
                                if "iommu" in t or t.startswith("pcie_port_pm")]
    info = f.nccl_info()
    out["nccl"] = info.get("nccl") or info.get("dist_version") or "unknown"
    if f.tp > 1:
        out["nccl_transport"] = f.nccl_transport().summary()
    d = f.disk()
    if d is not None:
        out["disk_free_gb"] = round(d["avail_kib"] * 1024 / 1e9, 1)
    rec = f.record() if f.get("sglang").ok else None
    if rec is not None:
        out["patchset"] = rec.get("patchset")
    return out
