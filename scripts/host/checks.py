"""The doctor's checks: one small function per check over one Facts object, registered in order with @doctor_check
(as SGLang registers @register_post_process passes). Each returns its findings and changes nothing.

A finding has an id (gpu.model, host.hmm, ...), a severity (ok, info, warn, error), a message and a fix. The checks
and the ids they report are listed in scripts/host/doctor.py's docstring.
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Callable

from ..lib.errors import UserError
from . import exposure
from .facts import Facts
from .nccl import EXPECTED_VAR, KNOWN_BAD_NCCL
from .nccl_transport import ITERS
from .parsers import version_tuple
from .tools import TARGET_REPO
from .topology import P2P_LEGEND

SEVERITIES = ("ok", "info", "warn", "error")
MIN_NVCC = (12, 8)
HMM_FIX = ("echo 'options nvidia_uvm uvm_disable_hmm=1' > /etc/modprobe.d/nvidia-uvm-hmm.conf, then reload "
           "nvidia_uvm (or reboot)")
IOMMU_FIX = "add iommu=pt (or amd_iommu=off / intel_iommu=off) to GRUB_CMDLINE_LINUX, update-grub, reboot"


@dataclasses.dataclass
class Finding:
    id: str
    severity: str
    message: str
    fix: str = ""

    def __post_init__(self):
        assert self.severity in SEVERITIES, self.severity


Check = Callable[[Facts], list[Finding]]
CHECKS: list[Check] = []


def doctor_check(fn: Check) -> Check:
    CHECKS.append(fn)
    return fn


def run_checks(facts: Facts, checks: list[Check] | None = None) -> list[Finding]:
    return [finding for check in (CHECKS if checks is None else checks) for finding in check(facts)]


def _ranges(idx: list[int]) -> str:
    idx = sorted(idx)
    parts, start = [], None
    for k, v in enumerate(idx):
        if start is None:
            start = v
        if k + 1 == len(idx) or idx[k + 1] != v + 1:
            parts.append(f"{start}" if start == v else f"{start}-{v}")
            start = None
    return ",".join(parts)


# ---------------------------------------------------------------------------------------------------------------
# GPUs and driver


@doctor_check
def gpus(f: Facts) -> list[Finding]:
    if f.gpu_why:
        return [Finding("gpu.driver", "error", f"no NVIDIA driver/GPU found: {f.gpu_why}",
                        "on the host: install the NVIDIA driver (>= 580 for the image's CUDA 13.0) and check "
                        "`nvidia-smi`; in docker: run with --gpus all (NVIDIA Container Toolkit installed)")]
    if not f.n:
        return [Finding("gpu.driver", "error", "no NVIDIA driver/GPU found: nvidia-smi lists no GPU",
                        "check `nvidia-smi -L`; in docker run with --gpus all")]
    names = sorted({g.name for g in f.gpus})
    ccs = sorted({g.compute_cap for g in f.gpus})
    desc = f"{f.n}x {' + '.join(names)}, compute capability {'/'.join(c or '?' for c in ccs)}"
    if len(ccs) > 1 or len(names) > 1:
        out = [Finding("gpu.model", "warn", f"mixed GPUs: {desc}",
                       "TP ranks should be identical GPUs; set CUDA_VISIBLE_DEVICES to one kind")]
    elif ccs == ["12.0"]:
        out = [Finding("gpu.model", "ok", f"{desc} (SM120): the series' PCIe-only SM120 paths apply")]
    else:
        out = [Finding("gpu.model", "info", f"{desc}: not SM120, so the series' SM120 paths stay off "
                       "(the profile targets 8x RTX PRO 6000 Blackwell)")]
    if f.n < f.tp:
        cvd = f.env.get("CUDA_VISIBLE_DEVICES")
        out.append(Finding("gpu.count", "error", f"TP{f.tp} needs {f.tp} GPUs; this machine shows {f.n}"
                           + (f" (CUDA_VISIBLE_DEVICES={cvd})" if cvd is not None else ""),
                           "docker run --gpus all; or lower the profile's tp-size (serve -- --tp-size N)"))
    else:
        out.append(Finding("gpu.count", "ok", f"{f.n} GPUs for TP{f.tp}"))
    return out


@doctor_check
def driver_cuda(f: Facts) -> list[Finding]:
    if not f.driver or f.image_cuda is None:
        return []
    need = f"{f.image_cuda[0]}.{f.image_cuda[1]}"
    cuda = version_tuple(f.cuda)
    if cuda and cuda[:2] < f.image_cuda:
        return [Finding("driver.cuda", "error", f"driver {f.driver} supports CUDA {f.cuda}; the image is built on "
                        f"CUDA {need}", "upgrade the NVIDIA driver to the 580 branch or newer")]
    return [Finding("driver.cuda", "ok", f"driver {f.driver}, CUDA {f.cuda} (the image needs >= {need})")]


# ---------------------------------------------------------------------------------------------------------------
# topology: NVLink, P2P, NUMA


@doctor_check
def nvlink(f: Facts) -> list[Finding]:
    kinds: dict[str, int] = {}
    for (i, j), v in f.topo["links"].items():
        if i < j:
            kinds[v] = kinds.get(v, 0) + 1
    pairs = f"GPU pairs: {', '.join(f'{c}x {k}' for k, c in sorted(kinds.items())) or 'see nvidia-smi topo -m'}"
    if f.n < 2:
        return []
    if f.pcie_only is None:
        return [Finding("topo.nvlink", "warn", f"NVLink between the GPUs unknown: {f.pcie_why}",
                        "run `nvidia-smi topo -p2p n` by hand (every pair OK: NVLink; NS: PCIe only); the patched "
                        "launcher then applies no PCIe-only defaults")]
    if f.nvlink:
        links = f", {f.active_nvlinks} active links" if f.active_nvlinks else ""
        return [Finding("topo.nvlink", "info", f"NVLink present ({pairs}{links}): the PCIe-only defaults (NCCL "
                        "settings, PCIe IPC all-reduce) do not apply here")]
    return [Finding("topo.nvlink", "ok" if f.sm120 else "info", f"no NVLink, PCIe only ({pairs})")]


@doctor_check
def p2p(f: Facts) -> list[Finding]:
    if f.n < 2:
        return []
    if f.p2p_read is None:
        return [Finding("topo.p2p", "warn", f"P2P status unknown: {f.p2p_why}", "run `nvidia-smi topo -p2p r` by hand")]
    pairs = sorted((i, j) for (i, j) in f.p2p_read if i < j)
    bad = [(i, j, f.p2p_read[(i, j)]) for i, j in pairs if f.p2p_read[(i, j)] != "OK"]
    if not pairs:
        return [Finding("topo.p2p", "warn", "could not read the P2P matrix of `nvidia-smi topo -p2p r`",
                        "run it by hand and check every pair says OK")]
    if not bad:
        return [Finding("topo.p2p", "ok", f"P2P read OK between all {len(pairs)} GPU pairs")]
    codes = sorted({s for *_, s in bad})
    shown = ", ".join(f"GPU{i}-GPU{j} {s}" for i, j, s in bad[:12]) + (" ..." if len(bad) > 12 else "")
    return [Finding("topo.p2p", "warn" if f.pcie_only is not False else "info",
                    f"P2P read not available for {len(bad)} of {len(pairs)} GPU pairs "
                    f"({'; '.join(f'{c}: {P2P_LEGEND.get(c, c)}' for c in codes)}): {shown}. NCCL stages those "
                    "transfers through host memory (slower all-reduce)",
                    "BIOS: enable Above 4G decoding, Resizable BAR and PCIe peer-to-peer / ACS off for the GPU "
                    "slots; kernel: iommu=pt or off. If the patched PCIe IPC all-reduce fails to start, set "
                    "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0")]


@doctor_check
def numa(f: Facts) -> list[Finding]:
    if not f.n or not f.topo["numa"]:
        return []
    groups: dict[str, list[int]] = {}
    for i, node in sorted(f.topo["numa"].items()):
        groups.setdefault(node, []).append(i)
    desc = "; ".join(f"GPUs {_ranges(v)} on NUMA node {k}" for k, v in sorted(groups.items()))
    if "N/A" in groups and (f.numa_nodes or 1) > 1:
        return [Finding("topo.numa", "warn", f"NUMA affinity of some GPUs is unknown ({desc})",
                        "check BIOS NUMA settings (NPS) and `nvidia-smi topo -m`; sglang then cannot bind ranks to "
                        "nodes (--numa-node sets it by hand)")]
    if len(groups) == 1:
        return [Finding("topo.numa", "ok", f"all GPUs on one NUMA node ({desc})")]
    sizes = sorted(len(v) for v in groups.values())
    if len(set(sizes)) > 1:
        return [Finding("topo.numa", "warn", f"uneven GPU split across NUMA nodes: {desc}",
                        "the PCIe all-reduce's island schedule assumes equal islands (4+4 at TP8); move GPUs or "
                        "accept cross-node traffic")]
    if not all(v == list(range(v[0], v[0] + len(v))) for v in groups.values()):
        order = ",".join(str(i) for k in sorted(groups) for i in groups[k])
        return [Finding("topo.numa", "warn", f"GPU numbers interleave NUMA nodes: {desc}",
                        f"ranks 0-{f.n // 2 - 1} should share a node: CUDA_VISIBLE_DEVICES={order} "
                        "(with CUDA_DEVICE_ORDER=PCI_BUS_ID)")]
    return [Finding("topo.numa", "ok", f"{desc}: {len(groups)} islands of {sizes[0]} (the 4+4 layout the "
                    "PCIe all-reduce schedule expects at TP8)" if len(groups) == 2 else desc)]


# ---------------------------------------------------------------------------------------------------------------
# PCIe links and BAR1


@doctor_check
def pcie_link(f: Facts) -> list[Finding]:
    if not any(g.width_max for g in f.gpus):
        return []
    narrow = [g for g in f.gpus if g.width_max and g.width_current and g.width_current < g.width_max]
    slow_slot = [g for g in f.gpus if g.gen_host_max and g.gen_max and g.gen_host_max < g.gen_max]
    gens = sorted({g.gen_max for g in f.gpus if g.gen_max})
    widths = sorted({g.width_max for g in f.gpus if g.width_max})
    msg = f"PCIe Gen{'/'.join(map(str, gens))} x{'/'.join(map(str, widths))}"
    if not (narrow or slow_slot):
        return [Finding("pcie.link", "ok", f"{msg} on every GPU (a lower current generation at idle is power saving)")]
    parts = [f"{g.bus_id} x{g.width_current} (max x{g.width_max})" for g in narrow]
    parts += [f"{g.bus_id} slot Gen{g.gen_host_max} (GPU Gen{g.gen_max})" for g in slow_slot]
    return [Finding("pcie.link", "warn", f"{msg}; degraded: {', '.join(parts)}",
                    "reseat the card or riser, check the slot's lane assignment and PCIe generation in the BIOS")]


@doctor_check
def bar1(f: Facts) -> list[Finding]:
    bars = [g for g in f.gpus if g.bar1_total_mib is not None]
    if not bars:
        return []
    small = [g for g in bars if g.fb_total_mib and g.bar1_total_mib < g.fb_total_mib]
    if not small:
        return [Finding("pcie.bar1", "ok", f"BAR1 {bars[0].bar1_total_mib} MiB >= GPU memory on every GPU")]
    tiny = [g for g in small if g.bar1_total_mib <= 256]
    return [Finding("pcie.bar1", "error" if tiny and f.pcie_only else "warn",
                    f"BAR1 smaller than GPU memory on {len(small)} GPU(s) ({small[0].bar1_total_mib} MiB vs "
                    f"{small[0].fb_total_mib} MiB): peer-to-peer over PCIe and CUDA IPC need the large BAR",
                    "BIOS: enable Above 4G Decoding and Resizable BAR, then reboot; check BAR1 in `nvidia-smi -q`")]


# ---------------------------------------------------------------------------------------------------------------
# host settings


@doctor_check
def hmm(f: Facts) -> list[Finding]:
    on, how = f.hmm()
    why_bad = ", which locks up NCCL P2P on PCIe-only boxes"
    if on is False:
        return [Finding("host.hmm", "ok", f"{how} (HMM off)")]
    if on:
        return [Finding("host.hmm", "error" if f.pcie_only else "info", f"{how}: HMM is on"
                        + (why_bad if f.pcie_only else " (matters on PCIe-only boxes)"), HMM_FIX)]
    if f.n:
        return [Finding("host.hmm", "warn", f"nvidia_uvm HMM setting unknown: {how}",
                        "load nvidia_uvm (modprobe nvidia_uvm) and set options nvidia_uvm uvm_disable_hmm=1")]
    return []


@doctor_check
def iommu(f: Facts) -> list[Finding]:
    on, how = f.iommu()
    if on is None:
        return [Finding("host.iommu", "info", f"kernel command line unknown: {how}")] if f.n else []
    if not on:
        out = [Finding("host.iommu", "ok", how)]
    else:
        out = [Finding("host.iommu", "warn" if f.pcie_only is not False else "info",
                       f"IOMMU translation likely on ({how}): GPU peer-to-peer DMA then goes through the IOMMU, and "
                       "NCCL P2P can hang or crawl", IOMMU_FIX)]
    if f.pcie_only and "pcie_port_pm=off" not in f.get("cmdline").text.split():
        out.append(Finding("host.pcie_pm", "info", "PCIe port power management is on (no pcie_port_pm=off)",
                           "peers running these boxes add pcie_port_pm=off to the kernel command line"))
    return out


# ---------------------------------------------------------------------------------------------------------------
# toolchain, NCCL, environment


@doctor_check
def nvcc(f: Facts) -> list[Finding]:
    ver = f.nvcc()
    if ver is None:
        why = f.get("nvcc").why or "no version in its output"
        return [Finding("cuda.nvcc", "warn", f"nvcc not found ({why}): FlashInfer JIT-compiles kernels on first use "
                        "and needs nvcc >= 12.8 for SM120", "use the image (it has the CUDA toolkit), or install "
                        "CUDA >= 12.8 and put nvcc on PATH / set CUDA_HOME")]
    if ver < MIN_NVCC:
        return [Finding("cuda.nvcc", "error", f"nvcc {ver[0]}.{ver[1]} is older than 12.8: FlashInfer cannot JIT for "
                        "SM120", "install CUDA >= 12.8 (the image has 13.0) and point CUDA_HOME at it")]
    return [Finding("cuda.nvcc", "ok", f"nvcc {ver[0]}.{ver[1]} (FlashInfer JIT needs >= 12.8)")]


def _nccl_source(info: dict, version: str) -> str:
    if info.get("nccl_lib"):
        src = f"loaded by torch {info.get('torch')} from {info['nccl_lib']}"
    elif info.get("nccl"):
        src = f"torch {info.get('torch')}"  # a recording from before the probe read the loaded library
    else:
        src = f"{info.get('dist')} (package metadata)"
    build = info.get("nccl_build")
    return src + (f"; torch was built against {build}" if build and build != version else "")


@doctor_check
def nccl_version(f: Facts) -> list[Finding]:
    info = f.nccl_info()
    version = info.get("nccl") or info.get("dist_version")
    if not version:
        why = info.get("error") or f.get("nccl").why or "no answer"
        return [Finding("nccl.version", "info", f"NCCL version unknown (torch not importable by {f.probe.python}: "
                        f"{why})", "run `serve --check` inside the image to see the NCCL it ships")]
    src = _nccl_source(info, version)
    bad = KNOWN_BAD_NCCL.get(version)
    expected, from_ = f.expected_nccl
    in_image = bool(f.env.get(EXPECTED_VAR))
    if not bad and expected and expected != version and in_image:
        return [Finding("nccl.version", "warn", f"NCCL {version} ({src}), but the image was built to run NCCL "
                        f"{expected} ({from_})", "something in this container changed it: check LD_PRELOAD, "
                        "LD_LIBRARY_PATH and `pip list | grep nccl`, or use a fresh container of the image")]
    if not bad:
        pinned = f"; the image pins {expected}" if expected and not in_image else ""
        return [Finding("nccl.version", "ok",
                        f"NCCL {version} ({src}){pinned}; known-bad releases: {', '.join(KNOWN_BAD_NCCL)}")]
    if f.env.get("NCCL_P2P_DISABLE", "") in ("1", "true", "True"):
        return [Finding("nccl.version", "warn", f"NCCL {version} ({src}) {bad}; NCCL_P2P_DISABLE=1 is set, which "
                        "avoids the hang at the cost of single-stream speed", "use an image with another NCCL release")]
    return [Finding("nccl.version", "error" if (f.rtx_pro or f.pcie_only or not f.n) else "warn",
                    f"NCCL {version} ({src}) {bad}",
                    "NCCL_P2P_DISABLE=1, or another NCCL release: the image installs the one of patches/pin.toml "
                    f"[nccl]{f' ({expected})' if expected else ''} (make image; make image NCCL=<version> for another)")]


# NCCL's transport between the TP group's GPUs (scripts/host/nccl_transport.py)

NO_P2P_COST = ("without P2P, a kernel-side P2P all-reduce took 242 us instead of ~16 us at 114 KB on this box class "
               "(rtx6kpro optimization/pcie-oneshot-allreduce.md)")
FORCE_P2P = ("echo 'options nvidia NVreg_RegistryDwords=\"ForceP2P=0x11;RMForceP2PType=1;RMPcieP2PType=2;"
             "GrdmaPciTopoCheckOverride=1;EnableResizableBar=1\"' > /etc/modprobe.d/nvidia-p2p-override.conf, then "
             "update-initramfs -u and reboot (/proc/driver/nvidia/params then lists them under RegistryDwords; "
             "rtx6kpro hardware/pcie-bandwidth.md: direct-attach hosts only, a host with PCIe switches needs none)")
ACS_FIX = ("turn ACS off for the PCIe switch ports (BIOS: PCIe ACS / Access Control Services disabled; or at every "
           "boot `setpci -s <port> ECAP_ACS+6.w=0000` on each switch downstream port that `lspci -vvv` shows with "
           "ACSCtl ... ReqRedir+): with ACS on, peer traffic is redirected up to the root complex")
SWITCHED = ("PIX", "PXB")  # nvidia-smi topo -m: the pair meets inside a PCIe switch
TRANSPORT = "nccl.transport"


def _env_causes(env: dict[str, str], net: bool, pinned: str) -> list[str]:
    truthy = ("1", "true", "True", "yes")
    names = [k for k in ("NCCL_P2P_DISABLE",) if env.get(k) in truthy]
    names += [k for k in ("NCCL_P2P_LEVEL",) if k in env and env[k] not in ("SYS", "5")]
    names += [k for k in ("NCCL_SHM_DISABLE",) if net and env.get(k) in truthy]
    if not names:
        return []
    image = f"; the image runs NCCL {pinned}, outside the 2.30 line that hangs" if pinned else ""
    return [f"the ranks ran with {', '.join(f'{k}={env[k]}' for k in names)}: unset {' '.join(names)} (P2P off was "
            f"the workaround for NCCL 2.30.4's hang{image})"]


def _p2p_status_causes(f: Facts, bad: list) -> list[str]:
    """The pairs the driver reports without P2P (topo -p2p r), by whether they meet in a PCIe switch."""
    pairs = sorted({(min(a, b), max(a, b)) for a, b in ((x.src_dev, x.dst_dev) for x in bad)
                    if a is not None and b is not None})
    no_p2p = [(a, b, (f.p2p_read or {}).get((a, b))) for a, b in pairs if (f.p2p_read or {}).get((a, b), "OK") != "OK"]
    if not no_p2p:
        return []
    link = (lambda a, b: f.topo["links"].get((a, b), "?"))
    direct = [f"GPU{a}-GPU{b} {s} ({link(a, b)})" for a, b, s in no_p2p if link(a, b) not in SWITCHED]
    switched = [f"GPU{a}-GPU{b} {s} ({link(a, b)})" for a, b, s in no_p2p if link(a, b) in SWITCHED]
    out = []
    if direct:
        dwords = f.nvidia_params().get("RegistryDwords")
        said = f"RegistryDwords in /proc/driver/nvidia/params: {dwords!r}" if dwords is not None else \
            f"/proc/driver/nvidia/params unread: {f.get('nvidia-params').why}"
        if dwords and "ForceP2P" in dwords:
            out.append(f"the driver reports no P2P between {', '.join(direct)}, which meet at the CPU, although its "
                       f"P2P override is set ({said}): check the BIOS (PCIe peer-to-peer, ACS) and the IOMMU")
        else:
            out.append(f"the driver reports no P2P between {', '.join(direct)}, which meet at the CPU without a PCIe "
                       f"switch, and its P2P override is not set ({said}): {FORCE_P2P}")
    if switched:
        out.append(f"the driver reports no P2P between {', '.join(switched)}, which share a PCIe switch: {ACS_FIX}")
    return out


def _transport_causes(f: Facts, t, bad: list, hung: bool) -> str:
    """The fix that applies, by what the host facts show, most specific first."""
    env = t.result.get("nccl_env")
    env = env if env is not None else {k: v for k, v in f.env.items() if k.startswith("NCCL_")}
    net = any(x.kind == "NET" for x in bad)
    pinned = f.expected_nccl[0]
    causes = _env_causes(env, net, pinned) + _p2p_status_causes(f, bad)
    hmm_on, hmm_how = f.hmm()
    iommu_on, iommu_how = f.iommu()
    if hmm_on:
        causes.append(f"HMM is on ({hmm_how}), which locks up NCCL P2P on PCIe-only boxes: {HMM_FIX}")
    if iommu_on:
        causes.append(f"the IOMMU translates peer DMA ({iommu_how}): {IOMMU_FIX}")
    if hung and (t.version or "").split("+")[0] in KNOWN_BAD_NCCL:
        causes.append(f"NCCL {t.version} {KNOWN_BAD_NCCL[t.version.split('+')[0]]}: use the image's pinned NCCL")
    if net and not _env_causes(env, True, pinned):
        causes.append("the ranks do not share /dev/shm (separate containers or IPC namespaces): run them in one "
                      "container with --ipc=host")
    if not causes and not hung:
        causes.append("the driver reports P2P OK for these pairs, so NCCL's own topology rule declined it (on Intel "
                      "CPUs NCCL takes P2P only up to a PCIe host bridge, in recent releases only through PCIe "
                      "switches: src/graph/paths.cc): NCCL_P2P_LEVEL=SYS lets it cross the CPU; measure it with make "
                      "bench-comm before keeping it (the patched launcher does not set it, since a level above what "
                      "the topology carries can deadlock)")
    if not causes:
        causes.append("the host facts show no cause (HMM off, IOMMU not translating, P2P reported OK): run "
                      "NCCL_P2P_DISABLE=1 make doctor to see whether P2P is what hangs (it then reports SHM instead "
                      "of hanging), and try another NCCL release (make image NCCL=<version>)")
    return "; ".join(causes)


def _links_text(t) -> str:
    kinds = t.kinds()
    return ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + " connection(s)" if kinds else "no connection"


@doctor_check
def nccl_transport(f: Facts) -> list[Finding]:
    """NCCL's transport between the TP group's GPUs: P2P, or SHM / NET (staged through host memory or the network,
    an error for a single-node TP group), from NCCL's INFO lines of a short all-reduce."""
    if f.tp < 2:
        return [Finding(TRANSPORT, "info", f"TP{f.tp}: no NCCL group between GPUs to check")]
    t = f.nccl_transport()
    r = t.result
    nccl = f"NCCL {t.version}" if t.version else "NCCL"
    if r.get("hung"):
        return [Finding(TRANSPORT, "error", f"{nccl}: {r['why']}; it had set up {_links_text(t)}",
                        _transport_causes(f, t, t.by_kind("P2P"), hung=True))]
    if not t.measured:
        where = f.probe.image or "eagle-fast-verify/sglang:<tag> (make image)"
        return [Finding(TRANSPORT, "warn" if f.n >= 2 else "info", f"NCCL transport not measured: {r.get('why')}",
                        f"run the doctor where torch sees the GPUs: docker run --rm --gpus all --ipc=host {where} "
                        f"doctor (or doctor --python <a python with CUDA torch>, or doctor --image <image>)")]
    bad = t.by_kind("SHM") + t.by_kind("NET")
    us = f"; one all-reduce of {r.get('bytes', 0) // 1024} KiB took {r['allreduce_us']} us (eager, mean of {ITERS})" \
        if r.get("allreduce_us") is not None else ""
    if bad:
        shown = ", ".join(f"{x.pair} {x.via}" for x in bad[:8]) + (" ..." if len(bad) > 8 else "")
        return [Finding(TRANSPORT, "error", f"{nccl} does not use P2P between every GPU pair of the TP group "
                        f"({r.get('world')} ranks, {_links_text(t)}): {shown}{us}. SHM stages each transfer through "
                        f"host memory, NET through the network stack; {NO_P2P_COST}",
                        _transport_causes(f, t, bad, hung=False))]
    if r.get("sum_ok") is False:
        return [Finding(TRANSPORT, "error", f"{nccl}'s all-reduce over {r.get('world')} GPUs returned "
                        f"{r.get('sum')} instead of {r.get('sum_expected')}: P2P moves wrong data",
                        "remove a forced P2P override from the driver (/etc/modprobe.d, NVreg_RegistryDwords) on "
                        "hosts whose GPUs share PCIe switches, check the BIOS (ACS, IOMMU), and run make test-gpu")]
    if not t.links:
        return [Finding(TRANSPORT, "warn", f"{nccl} printed no transport line for the all-reduce over "
                        f"{r.get('world')} GPUs{us}", "doctor --record DIR writes the probe's output to "
                        "DIR/nccl-transport.txt: NCCL's 'Channel .. via ..' lines in a form this doctor does not read "
                        "are a bug to report with that file")]
    return [Finding(TRANSPORT, "ok", f"{nccl} uses P2P between the TP group's {r.get('world')} GPUs "
                    f"({_links_text(t)}: {', '.join(sorted({x.via for x in t.links}))}){us}")]


@doctor_check
def environment(f: Facts) -> list[Finding]:
    out = []
    alloc = f.env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments:True" in alloc.replace(" ", ""):
        out.append(Finding("env.alloc", "warn", f"PYTORCH_CUDA_ALLOC_CONF={alloc}: expandable segments are reported "
                           "to crash the PCIe one-shot all-reduce", "unset PYTORCH_CUDA_ALLOC_CONF (or drop "
                           "expandable_segments)"))
    # NCCL_VERSION is metadata that NVIDIA's CUDA images set, not an NCCL setting.
    nccl_env = {k: v for k, v in f.env.items() if k.startswith("NCCL_") and k != "NCCL_VERSION"}
    if nccl_env:
        out.append(Finding("env.nccl", "info", "NCCL settings in the environment (they win over the patched "
                           "launcher's PCIe defaults): " + ", ".join(f"{k}={v}" for k, v in sorted(nccl_env.items()))))
    return out


# ---------------------------------------------------------------------------------------------------------------
# disk and the patch set


@doctor_check
def disk(f: Facts) -> list[Finding]:
    d = f.disk()
    need = f.need_gb
    if d is None:
        why = f.get("df").why or "unreadable df output"
        return [Finding("disk.free", "warn", f"free disk for the model unknown ({why})",
                        f"check by hand: {TARGET_REPO} needs about {need:.0f} GB")]
    free_gb = d["avail_kib"] * 1024 / 1e9
    where = f"{f.probe.model_dir} (filesystem {d['mount']})"
    present = f.get("model-present")
    if present.ok and present.text.strip() == "yes":
        return [Finding("disk.free", "ok" if free_gb >= 50 else "warn",
                        f"{TARGET_REPO} is in the cache at {where}; {free_gb:.0f} GB free",
                        "" if free_gb >= 50 else "free some space for the drafter and JIT caches (>= 50 GB)")]
    if free_gb >= need:
        return [Finding("disk.free", "ok", f"{free_gb:.0f} GB free at {where} (the model needs about {need:.0f} GB)")]
    return [Finding("disk.free", "error", f"only {free_gb:.0f} GB free at {where}; {TARGET_REPO} needs about "
                    f"{need:.0f} GB", "mount a larger disk at the HF cache (docker run -v <big disk>:"
                    "/root/.cache/huggingface) or set HF_HOME")]


@doctor_check
def patchset(f: Facts) -> list[Finding]:
    sg = f.get("sglang")
    if not sg.ok:
        return [Finding("image.patchset", "info", f"sglang not found for this python ({sg.why}): a host-only "
                        "preflight", "run `serve --check` in the image to check its patch set")]
    pkg, rec = sg.text.strip(), f.record()
    if rec is None:
        return [Finding("image.patchset", "error", f"sglang at {pkg} is not patched (its git history holds no patch set)",
                        "python3 -m scripts.series.apply --python python3, or use the image built by `make image`")]
    if f.expected_patchset and rec.get("patchset") != f.expected_patchset:
        return [Finding("image.patchset", "warn", f"sglang at {pkg} carries patch set {rec.get('patchset')}, but "
                        f"the series here is {f.expected_patchset}", "rebuild the image (make image) or re-apply")]
    ids = [p.get("file", "?") for p in rec.get("patches", [])]
    return [Finding("image.patchset", "ok", f"patch set {rec.get('patchset')} ({len(ids)} patches"
                    + (f": {', '.join(ids)}" if ids else "") + f") on SGLang {rec.get('base', {}).get('tag', '?')}")]


@doctor_check
def listen(f: Facts) -> list[Finding]:
    """Who can reach the server, by the rule serve applies (scripts/host/exposure.py)."""
    try:
        where = exposure.decide(f.listen_host, f.env, f.api_key_file)
    except UserError as e:
        return [Finding("serve.listen", "error", f"serve would refuse to start: {e}")]
    if where.refusal:
        return [Finding("serve.listen", "error", f"serve is {where.refusal}", exposure.FIX)]
    return [Finding("serve.listen", "ok", where.line)]


# ---------------------------------------------------------------------------------------------------------------
# the table


def table(findings: list[Finding], width: int = 110) -> str:
    order = {s: i for i, s in enumerate(reversed(SEVERITIES))}
    rows = sorted(findings, key=lambda f: order[f.severity])
    idw = max([len(f.id) for f in rows] + [5])
    lines = [f"{'SEV':<5}  {'CHECK':<{idw}}  FINDING", f"{'-' * 5}  {'-' * idw}  {'-' * 7}"]
    body = max(40, width - idw - 9)
    pad = " " * (idw + 9)
    for f in rows:
        wrapped = textwrap.wrap(f.message, body) or [""]
        lines.append(f"{f.severity:<5}  {f.id:<{idw}}  {wrapped[0]}")
        lines += [pad + w for w in wrapped[1:]]
        if f.fix and f.severity in ("warn", "error", "info"):
            lines += [pad + w for w in textwrap.wrap("fix: " + f.fix, body)]
    counts = {s: sum(1 for f in findings if f.severity == s) for s in SEVERITIES}
    lines.append(", ".join(f"{counts[s]} {s}" for s in reversed(SEVERITIES)))
    return "\n".join(lines)
