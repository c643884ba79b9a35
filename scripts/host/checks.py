"""The doctor's checks: functions over one Facts object, registered in order (@doctor_check), returning findings
(id, severity, message, fix). A check's docstring is its line in `doctor --list`: its finding ids, what it checks."""

import collections
import dataclasses
import itertools
import textwrap
from typing import Callable

from ..lib.kimi import HIDDEN
from . import drafters, nccl
from .facts import P2P_LEGEND, TARGET_REPO, Facts, image_doctor, parse_df

SEVERITIES = ("ok", "info", "warn", "error")
SLOW_FLOW_GBPS = 15.0  # per flow, every GPU writing at once (rtx6kpro collapse-report: 52 -> 7 GB/s per pair)
SLOW_NCCL_US = 60.0  # one eager 112 KiB all-reduce; tuned NCCL: 24-60 us on this box class
PCIE_IPC_OFF = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0"
HMM_FIX = "echo 'options nvidia_uvm uvm_disable_hmm=1' > /etc/modprobe.d/nvidia-uvm-hmm.conf, then reboot"
IOMMU_FIX = "add iommu=pt (or amd_iommu=off / intel_iommu=off) to GRUB_CMDLINE_LINUX, update-grub, reboot"
FORCE_P2P = (
    "echo 'options nvidia NVreg_RegistryDwords=\"ForceP2P=0x11;RMForceP2PType=1;RMPcieP2PType=2;"
    "GrdmaPciTopoCheckOverride=1;EnableResizableBar=1\"' > /etc/modprobe.d/nvidia-p2p-override.conf, "
    "update-initramfs -u, reboot (direct-attached GPUs only: rtx6kpro hardware/pcie-bandwidth.md)"
)
ACS_FIX = (
    "turn ACS off on the PCIe switch ports (BIOS: ACS disabled; or at each boot `setpci -s <port> "
    "ECAP_ACS+6.w=0000` on every switch port that `lspci -vvv` shows with ACSCtl ... ReqRedir+)"
)
NO_P2P_COST = (
    "without P2P, a kernel-side P2P all-reduce took 242 us instead of ~16 us at 114 KB on this box class "
    "(rtx6kpro optimization/pcie-oneshot-allreduce.md)"
)


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


def listing() -> str:
    """`doctor --list`: every check's docstring, in order."""
    return "\n".join(f"{c.__name__:<15} {' '.join((c.__doc__ or '').split())}" for c in CHECKS)


def _ranges(idx: list[int]) -> str:
    groups = itertools.groupby(enumerate(sorted(idx)), key=lambda t: t[1] - t[0])
    return ",".join(f"{g[0][1]}-{g[-1][1]}" if len(g) > 1 else str(g[0][1]) for g in (list(v) for _, v in groups))


def _not_measured_fix(f: Facts) -> str:
    if image := f.env.get("EAGLE_IMAGE"):
        return f"this already runs in the image {image}, without GPUs: start it with them: {image_doctor(image)}"
    image = f.probe.image or "eagle-fast-verify/sglang:<tag>"
    return f"run the doctor where torch sees the GPUs: {image_doctor(image)} (after make image), or --python PY"


@doctor_check
def gpus(f: Facts) -> list[Finding]:
    """gpu.driver, gpu.model, gpu.count: a driver, identical GPUs, enough of them for --tp."""
    if f.gpu_why or not f.n:
        msg = f"no NVIDIA driver/GPU found: {f.gpu_why or 'nvidia-smi lists none'}"
        fix = (
            "install the NVIDIA driver (>= 580 for CUDA 13.0) and check `nvidia-smi`; in docker: docker run --gpus all"
        )
        return [Finding("gpu.driver", "error", msg, fix + " (NVIDIA Container Toolkit)")]
    names, ccs = sorted({g.name for g in f.gpus}), sorted({g.compute_cap for g in f.gpus})
    desc = f"{f.n}x {' + '.join(names)}, compute capability {'/'.join(c or '?' for c in ccs)}"
    if len(ccs) > 1 or len(names) > 1:
        out = [Finding("gpu.model", "warn", f"mixed GPUs: {desc}", "set CUDA_VISIBLE_DEVICES to one kind of GPU")]
    elif ccs == ["12.0"]:
        out = [Finding("gpu.model", "ok", f"{desc} (SM120): the series' PCIe-only SM120 paths apply")]
    else:
        out = [Finding("gpu.model", "info", f"{desc}: not SM120, so the series' SM120 paths stay off")]
    if f.n < f.tp:
        fix = "docker run --gpus all, or a smaller TP (make serve SERVE_ARGS='-- --tp-size N')"
        return out + [Finding("gpu.count", "error", f"TP{f.tp} needs {f.tp} GPUs; this machine shows {f.n}", fix)]
    return out + [Finding("gpu.count", "ok", f"{f.n} GPUs for TP{f.tp}")]


@doctor_check
def driver_cuda(f: Facts) -> list[Finding]:
    """driver.cuda: the driver's CUDA >= the upstream image's (patches/pin.toml)."""
    if not f.driver or f.image_cuda is None:
        return []
    need, cuda = "%d.%d" % f.image_cuda, tuple(int(x) for x in f.cuda.split(".")[:2] if x.isdigit())
    if cuda and cuda < f.image_cuda:
        msg = f"driver {f.driver} supports CUDA {f.cuda}; the image needs {need}"
        return [Finding("driver.cuda", "error", msg, "upgrade the NVIDIA driver to the 580 branch or newer")]
    return [Finding("driver.cuda", "ok", f"driver {f.driver}, CUDA {f.cuda} (the image needs >= {need})")]


@doctor_check
def nvlink(f: Facts) -> list[Finding]:
    """topo.nvlink: NVLink or PCIe only between the GPUs a server sees (nvidia-smi topo -p2p n)."""
    if f.n < 2:
        return []
    kinds = collections.Counter(v for (i, j), v in f.topo["links"].items() if i < j)
    pairs = ", ".join(f"{c}x {k}" for k, c in sorted(kinds.items()))
    if f.pcie_only is None:
        fix = "run `nvidia-smi topo -p2p n` by hand (OK: NVLink, NS: PCIe only)"
        return [Finding("topo.nvlink", "warn", f"NVLink between the GPUs unknown: {f.pcie_why}", fix)]
    if not f.pcie_only:
        return [Finding("topo.nvlink", "info", f"NVLink present ({pairs}): the series' PCIe-only paths stay off")]
    return [Finding("topo.nvlink", "ok" if f.sm120 else "info", f"no NVLink, PCIe only ({pairs})")]


@doctor_check
def p2p(f: Facts) -> list[Finding]:
    """topo.p2p: P2P read status of every GPU pair (nvidia-smi topo -p2p r)."""
    if f.n < 2:
        return []
    pairs = sorted((i, j) for (i, j) in (f.p2p_read or {}) if i < j)
    if not pairs:
        msg = f"P2P status unknown: {f.get('topo-p2p-r').why or 'no pairs read'}"
        return [Finding("topo.p2p", "warn", msg, "run `nvidia-smi topo -p2p r` by hand: every pair should say OK")]
    bad = [(i, j, f.p2p_read[(i, j)]) for i, j in pairs if f.p2p_read[(i, j)] != "OK"]
    if not bad:
        return [Finding("topo.p2p", "ok", f"P2P read OK between all {len(pairs)} GPU pairs")]
    legend = "; ".join(f"{c}: {P2P_LEGEND.get(c, c)}" for c in sorted({s for *_, s in bad}))
    shown = ", ".join(f"GPU{i}-GPU{j} {s}" for i, j, s in bad[:12]) + (" ..." if len(bad) > 12 else "")
    msg = f"no P2P read for {len(bad)} of {len(pairs)} GPU pairs ({legend}): {shown}"
    fix = "BIOS: Above 4G decoding, Resizable BAR, ACS off for the GPU slots; kernel: iommu=pt. Until then serve with "
    return [Finding("topo.p2p", "warn" if f.pcie_only is not False else "info", msg, fix + PCIE_IPC_OFF)]


@doctor_check
def numa(f: Facts) -> list[Finding]:
    """topo.numa: GPUs split evenly and contiguously across NUMA nodes (4+4 at TP8)."""
    groups: dict[str, list[int]] = {}
    for i, node in sorted(f.topo["numa"].items()):
        groups.setdefault(node, []).append(i)
    if not f.n or not groups:
        return []
    desc = "; ".join(f"GPUs {_ranges(v)} on NUMA node {k}" for k, v in sorted(groups.items()))
    sizes = sorted(len(v) for v in groups.values())
    if len(set(sizes)) > 1:
        fix = "the PCIe all-reduce's island schedule wants equal islands (4+4 at TP8): move GPUs"
        return [Finding("topo.numa", "warn", f"uneven GPU split across NUMA nodes: {desc}", fix)]
    if not all(v == list(range(v[0], v[0] + len(v))) for v in groups.values()):
        order = ",".join(str(i) for k in sorted(groups) for i in groups[k])
        fix = f"export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={order}"
        return [Finding("topo.numa", "warn", f"GPU numbers interleave NUMA nodes: {desc}", fix)]
    return [Finding("topo.numa", "ok", desc + (f": {len(groups)} islands of {sizes[0]}" if len(groups) > 1 else ""))]


@doctor_check
def pcie_link(f: Facts) -> list[Finding]:
    """pcie.link: every GPU link at its full width and generation."""
    if not any(g.width_max for g in f.gpus):
        return []
    link = "PCIe " + " ".join(sorted({f"Gen{g.gen_max} x{g.width_max}" for g in f.gpus}))
    slow = [g for g in f.gpus if (g.width_current or 99) < (g.width_max or 0)]
    if not slow:
        return [Finding("pcie.link", "ok", f"{link} on every GPU")]
    bad = ", ".join(f"{g.bus_id} x{g.width_current} (max x{g.width_max})" for g in slow)
    fix = "reseat the card or riser; check the slot's lanes and PCIe generation in the BIOS"
    return [Finding("pcie.link", "warn", f"{link}; degraded: {bad}", fix)]


@doctor_check
def bar1(f: Facts) -> list[Finding]:
    """pcie.bar1: BAR1 at least as large as GPU memory (Resizable BAR)."""
    bars = [g for g in f.gpus if g.bar1_total_mib is not None]
    small = [g for g in bars if g.fb_total_mib and g.bar1_total_mib < g.fb_total_mib]
    if not bars:
        return []
    if not small:
        return [Finding("pcie.bar1", "ok", f"BAR1 {bars[0].bar1_total_mib} MiB >= GPU memory on every GPU")]
    severity = "error" if f.pcie_only and min(g.bar1_total_mib for g in small) <= 256 else "warn"
    msg = (
        f"BAR1 smaller than GPU memory on {len(small)} GPU(s) ({small[0].bar1_total_mib} MiB vs "
        f"{small[0].fb_total_mib} MiB): PCIe peer-to-peer and CUDA IPC need the large BAR"
    )
    return [Finding("pcie.bar1", severity, msg, "BIOS: enable Above 4G Decoding and Resizable BAR, reboot")]


@doctor_check
def hmm(f: Facts) -> list[Finding]:
    """host.hmm: nvidia_uvm HMM off (NCCL P2P locks up with it on PCIe-only boxes)."""
    on, how = f.hmm()
    if on is False:
        return [Finding("host.hmm", "ok", f"{how} (HMM off)")]
    if on and f.pcie_only:
        return [Finding("host.hmm", "error", f"{how}: HMM is on, which locks up NCCL P2P on PCIe-only boxes", HMM_FIX)]
    if on:
        return [Finding("host.hmm", "info", f"{how}: HMM is on", HMM_FIX)]
    return [Finding("host.hmm", "warn", f"nvidia_uvm HMM setting unknown: {how}", HMM_FIX)] if f.n else []


@doctor_check
def iommu(f: Facts) -> list[Finding]:
    """host.iommu, host.pcie_pm: IOMMU off or passthrough; PCIe port power management."""
    on, how = f.iommu()
    if on is None:
        return [Finding("host.iommu", "info", f"kernel command line unknown: {how}")] if f.n else []
    out = [Finding("host.iommu", "ok", how)]
    if on:
        msg = f"IOMMU translation likely on ({how}): peer-to-peer DMA then goes through it, and NCCL P2P can hang or crawl"
        out = [Finding("host.iommu", "warn" if f.pcie_only is not False else "info", msg, IOMMU_FIX)]
    if f.pcie_only and "pcie_port_pm=off" not in f.get("cmdline").text.split():
        fix = "add pcie_port_pm=off to the kernel command line, as peers running these boxes do"
        out.append(Finding("host.pcie_pm", "info", "PCIe port power management is on (no pcie_port_pm=off)", fix))
    return out


@doctor_check
def nccl_version(f: Facts) -> list[Finding]:
    """nccl.version: the NCCL torch loaded is not a known-bad release (2.26.2, 2.30.4)."""
    info = f.nccl_info()
    version = info.get("nccl") or info.get("dist_version")
    if not version:
        why = info.get("error") or f.get("nccl").why or "no answer"
        msg = f"NCCL version unknown (torch not usable by {f.probe.python}: {why})"
        return [Finding("nccl.version", "info", msg, _not_measured_fix(f))]
    src = f"{info.get('dist')} (package metadata)"
    if info.get("nccl_lib"):
        src = f"loaded by torch {info.get('torch')} from {info['nccl_lib']}"
    elif info.get("nccl"):
        src = f"torch {info.get('torch')}"
    if info.get("nccl_build") not in (None, version):
        src += f"; torch was built against {info['nccl_build']}"
    expected, from_ = f.expected_nccl
    bad = nccl.KNOWN_BAD_NCCL.get(version)
    if bad:
        fix = f"use another release: make image installs the pinned NCCL {expected}".rstrip()
        if version == "2.30.4":
            fix += ", or set NCCL_P2P_DISABLE=1 (slower)"
        p2p_off = version == "2.30.4" and f.env.get("NCCL_P2P_DISABLE") in ("1", "true", "True")
        severity = "warn" if p2p_off or not (f.sm120 or f.pcie_only or not f.n) else "error"
        msg = f"NCCL {version} ({src}) {bad}" + ("; NCCL_P2P_DISABLE=1 avoids it" if p2p_off else "")
        return [Finding("nccl.version", severity, msg, fix)]
    pinned = f"; {from_} expects {expected}" if expected else ""
    return [Finding("nccl.version", "ok", f"NCCL {version} ({src}){pinned}")]


def _p2p_causes(f: Facts, pairs: list[tuple[int, int]]) -> list[str]:
    """Of `pairs`, those the driver reports without P2P, with the fix by whether they share a PCIe switch."""
    no = [(a, b, f.p2p_read.get((a, b))) for a, b in sorted(pairs) if (f.p2p_read or {}).get((a, b), "OK") != "OK"]
    link = lambda a, b: f.topo["links"].get((a, b), "?")
    direct = [f"GPU{a}-GPU{b} {s} ({link(a, b)})" for a, b, s in no if link(a, b) not in ("PIX", "PXB")]
    switched = [f"GPU{a}-GPU{b} {s} ({link(a, b)})" for a, b, s in no if link(a, b) in ("PIX", "PXB")]
    out = []
    if direct:
        params = f.get("nvidia-params")
        lines = (ln.partition(":") for ln in params.text.splitlines())
        dwords = next((v.strip().strip('"') for k, _, v in lines if k.strip() == "RegistryDwords"), None)
        said = f"/proc/driver/nvidia/params unread: {params.why}"
        if dwords is not None:
            said = f"RegistryDwords in /proc/driver/nvidia/params: {dwords!r}"
        where = f"no P2P between {', '.join(direct)}, which meet at the CPU"
        if dwords and "ForceP2P" in dwords:
            bios = "check the BIOS (PCIe peer-to-peer, ACS)"
            out.append(f"{where}, although the driver's P2P override is set ({said}): {bios}")
        else:
            out.append(f"{where}, and the driver's P2P override is not set ({said}): {FORCE_P2P}")
    if switched:
        out.append(f"no P2P between {', '.join(switched)}, which share a PCIe switch: {ACS_FIX}")
    return out


def _host_causes(f: Facts, pairs: list[tuple[int, int]]) -> list[str]:
    causes = _p2p_causes(f, pairs)
    iommu_on, how = f.iommu()
    if iommu_on:
        causes.append(f"the IOMMU translates peer DMA ({how}): {IOMMU_FIX}")
    phb = [f"GPU{a}-GPU{b}" for a, b in sorted(pairs) if f.topo["links"].get((a, b)) == "PHB"]
    if phb:
        causes.append(
            f"{', '.join(phb[:6])} meet at a PCIe host bridge (PHB), where peer-flag IPC all-reduces were "
            f"seen to hang (rtx6kpro#21)"
        )
    return causes


def _group_pairs(f: Facts, world: int | None) -> list[tuple[int, int]]:
    indexes = sorted(g.index if g.index is not None else k for k, g in enumerate(f.gpus))
    return list(itertools.combinations(indexes[: world or f.tp], 2))


def _transport_causes(f: Facts, r: dict, bad: list[dict], hung: bool) -> str:
    env = r["nccl_env"] if r.get("nccl_env") is not None else {k: v for k, v in f.env.items() if k[:5] == "NCCL_"}
    net = any(x["kind"] == "NET" for x in bad)
    names = [k for k in ("NCCL_P2P_DISABLE",) + (("NCCL_SHM_DISABLE",) if net else ()) if env.get(k) in ("1", "true")]
    names += ["NCCL_P2P_LEVEL"] if env.get("NCCL_P2P_LEVEL", "SYS") not in ("SYS", "5") else []
    causes = []
    if names:
        causes.append(f"the ranks ran with {', '.join(f'{k}={env[k]}' for k in names)}: unset {' '.join(names)}")
    pairs = {(min(x["src"], x["dst"]), max(x["src"], x["dst"])) for x in bad if None not in (x["src"], x["dst"])}
    causes += _host_causes(f, sorted(pairs) if not hung else _group_pairs(f, r.get("world")))
    hmm_on, hmm_how = f.hmm()
    if hmm_on:
        causes.append(f"HMM is on ({hmm_how}), which locks up NCCL P2P on PCIe-only boxes: {HMM_FIX}")
    version = (r.get("nccl") or "").split("+")[0]
    if hung and version in nccl.KNOWN_BAD_NCCL:
        causes.append(f"NCCL {version} {nccl.KNOWN_BAD_NCCL[version]}: use the image's pinned NCCL")
    if net and not names:
        causes.append("the ranks do not share /dev/shm: run them in one container with --ipc=host")
    if not causes and not hung:
        causes.append(
            "the driver reports P2P OK here, so NCCL's own topology rule declined it: NCCL_P2P_LEVEL=SYS "
            "lets it cross the CPU; measure it with make bench-comm before keeping it"
        )
    return "; ".join(causes) or (
        "no cause in the host facts (HMM off, IOMMU not translating, P2P OK): run "
        "NCCL_P2P_DISABLE=1 make doctor to see whether P2P is what hangs, and try another "
        "NCCL release (make image NCCL=<version>)"
    )


@doctor_check
def nccl_transport(f: Facts) -> list[Finding]:
    """nccl.transport, nccl.latency: NCCL's transport between the TP group's GPUs from its INFO lines of a short
    all-reduce (P2P ok; SHM or NET, a hang or a wrong sum an error, with the host setting that causes it), and one
    eager 112 KiB all-reduce against 60 us."""
    if f.tp < 2:
        return [Finding("nccl.transport", "info", f"TP{f.tp}: no NCCL group between GPUs to check")]
    r, text = f.probe_result("nccl-transport")
    version, links = nccl.transport_links(text)
    r["nccl"] = version
    kinds = collections.Counter(x["kind"] for x in links)
    setup = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + " connection(s)" if kinds else "no connection"
    name = f"NCCL {version}" if version else "NCCL"
    if r.get("hung"):
        causes = _transport_causes(f, r, [], hung=True)
        return [Finding("nccl.transport", "error", f"{name}: {r['why']}; it had set up {setup}", causes)]
    if not r.get("measured"):
        msg = f"NCCL transport not measured: {r.get('why')}"
        return [Finding("nccl.transport", "warn" if f.n >= 2 else "info", msg, _not_measured_fix(f))]
    bad = [x for x in links if x["kind"] in ("SHM", "NET")]
    us, kib, world = r.get("allreduce_us"), r.get("bytes", 0) // 1024, r.get("world")
    if bad:
        shown = ", ".join(sorted({f"{x['pair']} {x['via']}" for x in bad})[:8])
        took = f"; one {kib} KiB all-reduce took {us} us" if us is not None else ""
        msg = (
            f"{name} does not use P2P between every GPU pair of the TP group ({world} ranks, {setup}): {shown}"
            f"{took}. SHM stages through host memory, NET through the network; {NO_P2P_COST}"
        )
        return [Finding("nccl.transport", "error", msg, _transport_causes(f, r, bad, hung=False))]
    if r.get("sum_ok") is False:
        msg = f"{name}'s all-reduce over {world} GPUs returned {r.get('sum')} instead of {r.get('sum_expected')}"
        fix = (
            "remove a forced P2P override (NVreg_RegistryDwords in /etc/modprobe.d) on hosts whose GPUs share PCIe "
            "switches, check ACS and the IOMMU in the BIOS, then run make test-gpu"
        )
        return [Finding("nccl.transport", "error", f"{msg}: P2P moves wrong data", fix)]
    vias = ", ".join(sorted({x["via"] for x in links}))
    out = [Finding("nccl.transport", "ok", f"{name} uses P2P between the TP group's {world} GPUs ({setup}: {vias})")]
    if not links:
        msg = f"{name} printed no transport line for the all-reduce over {world} GPUs"
        fix = "report it with DIR/nccl-transport.txt, written by doctor --record DIR"
        out = [Finding("nccl.transport", "warn", msg, fix)]
    return out + _latency(us, kib, world)


def _latency(us: float | None, kib: int, world: int | None) -> list[Finding]:
    if us is None:
        return []
    msg = (
        f"one eager {kib} KiB all-reduce over {world} GPUs took {us} us (mean of {nccl.ITERS}; tuned NCCL on this box "
    )
    if us <= SLOW_NCCL_US:
        return [Finding("nccl.latency", "ok", msg + "class: 24-60 us)")]
    fix = (
        "tune NCCL: NCCL_P2P_LEVEL=SYS, a fixed ring (NCCL_GRAPH_FILE=<topology XML>, as rtx6kpro's Kimi pages run "
        "it); compare with make bench-comm"
    )
    return [Finding("nccl.latency", "warn", msg, fix)]


@doctor_check
def pcie_ipc(f: Facts) -> list[Finding]:
    """pcie_ipc.smoke: the series' PCIe-IPC all-reduce on SGLang's tp group (4 and 8 rows of 7168 bf16, 300 times,
    every sum checked) in a child process with a watchdog: a hang or a wrong sum is an error."""
    skip = f.smoke_skipped()
    if skip:
        return [Finding("pcie_ipc.smoke", "info", f"PCIe-IPC smoke not run: {skip}")]
    r, _ = f.probe_result("pcie-ipc-smoke")
    causes = _host_causes(f, _group_pairs(f, r.get("world"))) or [
        "none in the host facts (IOMMU off, P2P OK, no PHB pair): check ACS on the PCIe switch ports "
        "(lspci -vvv | grep ACSCtl) and the driver's P2P override"
    ]
    fix = f"serve with {PCIE_IPC_OFF} (NCCL then takes these all-reduces); likely cause: {'; '.join(causes)}"
    if r.get("hung"):
        return [Finding("pcie_ipc.smoke", "error", f"the PCIe-IPC all-reduce hung: {r.get('why')}", fix)]
    if r.get("sum_ok") is False:
        msg = (
            f"the PCIe-IPC all-reduce over {r['world']} GPUs returned wrong sums (wrong values per rank: {r['wrong']})"
        )
        return [Finding("pcie_ipc.smoke", "error", msg, fix)]
    if r.get("engaged") is False and not r.get("measured"):
        fix = "the server would use NCCL here too; its log says why"
        return [Finding("pcie_ipc.smoke", "warn", f"SGLang did not take the PCIe-IPC path: {r.get('why')}", fix)]
    if not r.get("measured"):
        msg = f"PCIe-IPC smoke not measured: {r.get('why')}"
        return [Finding("pcie_ipc.smoke", "warn" if f.n >= 2 else "info", msg, _not_measured_fix(f))]
    us = ", ".join(f"{k}x{HIDDEN} {v} us" for k, v in (r.get("us") or {}).items())
    rows = " and ".join(map(str, r.get("rows", [])))
    msg = f"PCIe-IPC all-reduce over {r['world']} GPUs: {r.get('iters')} each of {rows} rows, every sum right ({us})"
    return [Finding("pcie_ipc.smoke", "ok", msg)]


@doctor_check
def peer_write(f: Facts) -> list[Finding]:
    """pcie.peer_write: every GPU writing to a peer at once (the PCIe-IPC kernels' pattern), ~2 s: below 15 GB/s
    per flow is the posted-write collapse of AMD hosts with Broadcom/Microchip switches."""
    if f.tp < 2:
        return []
    r, _ = f.probe_result("peer-bandwidth")
    if r.get("hung"):
        fix = f"serve with {PCIE_IPC_OFF}; {'; '.join(_host_causes(f, _group_pairs(f, r.get('gpus'))))}"
        return [Finding("pcie.peer_write", "error", f"peer writes between the GPUs hung: {r.get('why')}", fix)]
    if not r.get("measured"):
        msg = f"peer-write bandwidth not measured: {r.get('why')}"
        return [Finding("pcie.peer_write", "info", msg, _not_measured_fix(f))]
    worst = min(r["rounds"], key=lambda x: x["gbps"])
    n, k = r["gpus"], worst["shift"]
    desc = f"{worst['gbps']}-{max(x['gbps'] for x in r['rounds'])} GB/s per flow with all {n} GPUs writing at once"
    if worst["gbps"] >= SLOW_FLOW_GBPS:
        return [Finding("pcie.peer_write", "ok", desc)]
    msg = f"{desc}: {worst['gbps']} GB/s when every GPU i writes to GPU i+{k} mod {n}, below {SLOW_FLOW_GBPS:.0f}"
    fix = (
        "check pcie.link and ACS; on AMD hosts with Broadcom/Microchip PCIe switches this is the posted-write "
        f"collapse (rtx6kpro#25, #32; no driver, kernel or IOMMU setting fixed it): compare {PCIE_IPC_OFF} with the "
        "default using make bench-comm"
    )
    return [Finding("pcie.peer_write", "warn", msg, fix)]


@doctor_check
def environment(f: Facts) -> list[Finding]:
    """env.alloc, env.graph_file, env.nccl: allocator settings that crash the PCIe all-reduce, NCCL_GRAPH_FILE set
    but empty, the NCCL_* settings in effect."""
    out = []
    alloc = f.env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments:True" in alloc.replace(" ", ""):
        msg = f"PYTORCH_CUDA_ALLOC_CONF={alloc}: expandable segments are reported to crash the PCIe one-shot all-reduce"
        out.append(Finding("env.alloc", "warn", msg, "unset PYTORCH_CUDA_ALLOC_CONF"))
    graph = f.env.get("NCCL_GRAPH_FILE")
    if graph is not None and not graph.strip():
        msg = "NCCL_GRAPH_FILE is set to an empty string: NCCL then fails to load its topology graph"
        out.append(Finding("env.graph_file", "error", msg, "unset NCCL_GRAPH_FILE (or point it at a graph XML file)"))
    settings = {k: v for k, v in f.env.items() if k.startswith("NCCL_") and k != "NCCL_VERSION"}  # image metadata
    if settings:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(settings.items()))
        msg = f"NCCL settings in the environment (they win over the series' PCIe defaults): {shown}"
        out.append(Finding("env.nccl", "info", msg))
    return out


@doctor_check
def disk(f: Facts) -> list[Finding]:
    """disk.free: room for the model in the HF cache every verb mounts ($HF_HUB_CACHE, else $HF_HOME/hub)."""
    d = parse_df(f.get("df").text) if f.get("df").ok else None
    where = f"the HF cache {f.probe.hf_cache}"
    if d is None:
        msg = f"free disk at {where} unknown ({f.get('df').why or 'unreadable df'})"
        return [Finding("disk.free", "warn", msg, f"check by hand: {TARGET_REPO} needs about {f.need_gb:.0f} GB")]
    free = d["avail_kib"] * 1024 / 1e9
    if (image := f.env.get("EAGLE_IMAGE")) and d["mount"] == "/":
        msg = (
            f"{where} is the container's own disk, not the host's cache: the weights there are lost with the container"
        )
        return [Finding("disk.free", "warn", msg, f"mount the host's cache: {image_doctor(image)}")]
    there = f.get("model-present").text.strip() == "yes"
    need, what = f.need_gb, f"{TARGET_REPO} needs"
    if there:
        need, what = 50, f"{TARGET_REPO} is there; the drafter and JIT caches need"
    msg = f"{free:.0f} GB free at {where} (filesystem {d['mount']}); {what} about {need:.0f} GB"
    if free >= need:
        return [Finding("disk.free", "ok", msg)]
    fix = (
        "free space there, or put the cache on a bigger disk: export HF_HUB_CACHE=/big/disk/hub (hf download and every "
        'make verb use it; by hand: docker run -v "$HF_HUB_CACHE":/root/.cache/huggingface/hub ...)'
    )
    return [Finding("disk.free", "warn" if there else "error", msg, fix)]


@doctor_check
def drafter_weights(f: Facts) -> list[Finding]:
    """weights.drafters: the drafters the shipped profiles name (docker/profiles) in the HF cache serve mounts."""
    got, where = f.get("drafters-present"), f"the HF cache {f.probe.hf_cache}"
    if not got.ok:
        return [Finding("weights.drafters", "info", f"drafters in {where} unknown: {got.why}")]
    have = got.text.split()
    missing = [r for r in drafters.profiled() if r not in have]
    if not missing:
        return [Finding("weights.drafters", "ok", f"{where} holds every profile's drafter ({', '.join(have)})")]
    msg = f"{where} lacks {', '.join(missing)}: serve downloads a profile's drafter when it starts"
    return [Finding("weights.drafters", "info", msg, "; ".join(f"hf download {r}" for r in missing))]


@doctor_check
def patchset(f: Facts) -> list[Finding]:
    """image.patchset: the sglang the checked python imports carries this series (git log of its tree)."""
    sg, got = f.get("sglang"), f.get("patchset")
    if not sg.ok:
        msg = f"no sglang for {f.probe.python} ({sg.why}): a host-only check"
        return [Finding("image.patchset", "info", msg, "the doctor in the image checks its patch set")]
    pkg, ps = sg.text.strip(), got.text.strip() if got.ok else None
    if not got.ok:
        return [Finding("image.patchset", "warn", f"patch set of sglang at {pkg} unknown: {got.why}")]
    if ps == "none":
        fix = "python3 -m scripts.series.apply --python python3, or use the image (make image)"
        return [Finding("image.patchset", "error", f"sglang at {pkg} is not patched", fix)]
    if f.expected_patchset and ps != f.expected_patchset:
        msg = f"sglang at {pkg} carries patch set {ps}, the series here is {f.expected_patchset}"
        return [Finding("image.patchset", "warn", msg, "rebuild the image (make image) or re-apply the series")]
    return [Finding("image.patchset", "ok", f"sglang at {pkg} carries patch set {ps}")]


def table(findings: list[Finding], width: int = 110) -> str:
    idw = max([len(x.id) for x in findings] + [5])
    pad, lines = " " * (idw + 9), [f"{'SEV':<5}  {'CHECK':<{idw}}  FINDING"]
    for x in sorted(findings, key=lambda x: -SEVERITIES.index(x.severity)):
        lines += textwrap.wrap(f"{x.severity:<5}  {x.id:<{idw}}  {x.message}", width, subsequent_indent=pad)
        if x.fix and x.severity != "ok":
            lines += textwrap.wrap(f"fix: {x.fix}", width, initial_indent=pad, subsequent_indent=pad)
    return "\n".join(lines + [", ".join(f"{sum(x.severity == s for x in findings)} {s}" for s in reversed(SEVERITIES))])
