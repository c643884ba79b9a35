"""What the doctor knows about the box: each tool's output read once (live with a timeout, or replayed from a
directory that `doctor --record` wrote), one parser per output, and the facts the checks read."""

import collections
import dataclasses
import itertools
import json
import os
import re
import shlex
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

from ..box.docker import container_name, docker_run, hf_cache_dir, image_id
from ..lib import proc
from ..lib.errors import UserError
from ..lib.repo import REPO_ROOT
from ..series.pin import applied_patchset
from ..series.sglang_pkg import find_sglang
from . import drafters, nccl

TARGET_REPO = "moonshotai/Kimi-K2.5"
QUERY = "index,name,pci.bus_id,compute_cap"
CAPTURE_FILES = {  # key -> file name in a recording (doctor --record DIR / --replay DIR)
    "smi-xml": "nvidia-smi-q.xml",
    "smi-query": "query-gpu.csv",
    "topo-m": "topo-m.txt",
    "topo-p2p-r": "topo-p2p-r.txt",
    "topo-p2p-n": "topo-p2p-n.txt",
    "uvm-hmm": "uvm_disable_hmm",
    "cmdline": "proc-cmdline",
    "iommu-groups": "iommu-groups",
    "df": "df.txt",
    "model-present": "model-present",
    "nccl": "nccl.json",
    "drafters-present": "drafters-present",
    "sglang": "sglang-path",
    "patchset": "patchset",
    "nvidia-params": "proc-driver-nvidia-params",
    **{k: f"{k}.txt" for k in nccl.PROBES},  # nccl-transport, pcie-ipc-smoke, peer-bandwidth
}
COMMANDS = {
    "smi-xml": ["nvidia-smi", "-q", "-x"],
    "smi-query": ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv"],
    "topo-m": ["nvidia-smi", "topo", "-m"],
    "topo-p2p-r": ["nvidia-smi", "topo", "-p2p", "r"],
    "topo-p2p-n": ["nvidia-smi", "topo", "-p2p", "n"],
}
FILES = {
    "uvm-hmm": "/sys/module/nvidia_uvm/parameters/uvm_disable_hmm",
    "cmdline": "/proc/cmdline",
    "nvidia-params": "/proc/driver/nvidia/params",
    "iommu-groups": "/sys/kernel/iommu_groups",
}
P2P_LEGEND = {
    "OK": "ok",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "U": "unknown",
}


def image_doctor(image: str) -> str:
    """The doctor in the image, with the GPUs, the host's IPC namespace and the caches mounted as serve mounts them."""
    cmd = shlex.join(docker_run(image, ["doctor"], hf_cache="HF_CACHE"))
    return cmd.replace("HF_CACHE:", '"${HF_HUB_CACHE:-${HF_HOME:-$HOME/.cache/huggingface}/hub}":')


# One output: ok with its text, or not ok and why (not installed, failed, timed out, not recorded).
Out = collections.namedtuple("Out", "ok text why", defaults=("", ""))


class Probe:
    """Reads each output once: live (tools, files, the GPU probes of scripts/host/nccl.py) or from `recorded`."""

    def __init__(
        self,
        recorded: dict[str, str] | None = None,
        *,
        python: str = sys.executable,
        hf_cache: str | None = None,
        timeout: float = 30.0,
        image: str | None = None,
        ranks: int = 0,
        probe_timeout: float | None = None,
    ):
        self.recorded, self.python, self.timeout, self.image, self.ranks = recorded, python, timeout, image, ranks
        self.hf_cache, self.probe_timeout = Path(hf_cache or hf_cache_dir()), probe_timeout
        self.cache: dict[str, Out] = {}

    @property
    def live(self) -> bool:
        return self.recorded is None

    def get(self, key: str) -> Out:
        if key not in self.cache:
            text = (self.recorded or {}).get(key)
            if self.live:
                self.cache[key] = self._live(key)
            else:
                self.cache[key] = Out(True, text) if text is not None else Out(False, why="not recorded")
        return self.cache[key]

    def command(self, argv: list[str], timeout: float | None = None) -> Out:
        res = proc.run(argv, timeout=timeout or self.timeout)
        return Out(True, res.stdout) if res.ok else Out(False, res.stdout, res.why)

    @staticmethod
    def read(path: str, listing: bool = False) -> Out:
        try:
            return Out(True, str(len(os.listdir(path))) if listing else Path(path).read_text())
        except OSError as e:
            return Out(False, why=f"{path}: {e.strerror or e}")

    def _live(self, key: str) -> Out:
        hf = self.hf_cache
        snaps = hf / f"models--{TARGET_REPO.replace('/', '--')}" / "snapshots"
        if key in COMMANDS:
            return self.command(COMMANDS[key])
        if key in FILES:
            return self.read(FILES[key], listing=key == "iommu-groups")
        if key in nccl.PROBES:
            return Out(True, self._gpu_probe(key))
        if key == "nccl":
            return self.command([self.python, "-c", nccl.NCCL_PROBE], timeout=max(self.timeout, 120))
        if key == "df":  # the nearest existing directory: the filesystem the cache will be on
            return self.command(["df", "-Pk", str(next(d for d in (hf, *hf.parents) if d.exists()))])
        if key == "model-present":
            return Out(True, "yes" if snaps.is_dir() and any(snaps.iterdir()) else "no")
        if key == "drafters-present":  # the profiles' drafters in the cache, one per line
            return Out(True, "".join(f"{r}\n" for r in drafters.profiled() if drafters.cached(r, str(hf))))
        if key == "sglang":
            pkg, why = find_sglang(self.python, self.timeout)
            return Out(bool(pkg), f"{pkg}\n" if pkg else "", why)
        if not self.get("sglang").ok:  # "patchset"
            return Out(False, why=self.get("sglang").why)
        return Out(True, f"{applied_patchset(Path(self.get('sglang').text.strip())) or 'none'}\n")

    def _gpu_probe(self, key: str) -> str:
        """Probe `key` here when this interpreter's torch sees 2 GPUs (and has sglang, for the smoke), else in the
        image: its output, whose result line says why when it could run nowhere."""
        timeout, info = self.probe_timeout or nccl.TIMEOUTS[key], nccl_info(self.get("nccl"))
        why = f"no usable torch for {self.python} ({info.get('error') or self.get('nccl').why})"
        if "torch" in info:
            why = f"torch {info['torch']} sees {info.get('gpus', 0)} CUDA GPU(s), and the {nccl.WHAT[key]} needs 2"
        if info.get("gpus", 0) >= 2:
            if key != "pcie-ipc-smoke" or self.get("sglang").ok:
                src = nccl.source(key, self.ranks, timeout, REPO_ROOT)
                return nccl.watch([self.python, "-c", src], timeout + 30, f"{nccl.WHAT[key]} with {self.python}")
            why = f"{self.python} has no sglang ({self.get('sglang').why})"
        if not self.image:
            return nccl.unmeasured(why)
        found, missing = image_id(self.image)
        if not found:
            return nccl.unmeasured(f"here, {why}; in the image: {missing}")
        name = container_name(f"doctor-{key}")
        cmd = docker_run(self.image, ["python3", "-c", nccl.source(key, self.ranks, timeout)], name=name)
        return nccl.watch(cmd, timeout + 60, f"{nccl.WHAT[key]} in {self.image}", container=name)

    def record(self, dest: Path) -> list[str]:
        """Write every output read so far (the ok ones) to `dest`, one file each."""
        dest.mkdir(parents=True, exist_ok=True)
        done = {CAPTURE_FILES[k]: out.text for k, out in self.cache.items() if out.ok}
        for name, text in done.items():
            (dest / name).write_text(text)
        return list(done)


def load_capture(d: Path) -> dict[str, str]:
    """A recording (one file per output, named as in CAPTURE_FILES) as a dict for Probe."""
    if not Path(d).is_dir():
        raise UserError(f"capture directory {d} does not exist: give the DIR that `doctor --record DIR` wrote")
    return {k: (Path(d) / n).read_text() for k, n in CAPTURE_FILES.items() if (Path(d) / n).is_file()}


def to_int(s) -> int | None:
    m = re.match(r"\s*(\d+)", str(s or ""))
    return int(m.group(1)) if m else None


def parse_smi_xml(text: str) -> tuple[str, str, list[SimpleNamespace]]:
    """nvidia-smi -q -x: (driver, CUDA version, one namespace per GPU). ValueError when it is not that XML."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise ValueError(f"not XML: {e}") from e
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"root element <{root.tag}>, not <nvidia_smi_log>")
    t = lambda el, path: (el.findtext(path) or "").strip()
    link = lambda g, path: to_int(t(g, f"pci/pci_gpu_link_info/{path}"))
    gpus = [
        SimpleNamespace(
            bus_id=g.get("id") or t(g, "pci/pci_bus_id"),
            name=t(g, "product_name") or "?",
            index=to_int(t(g, "minor_number")),
            compute_cap="",
            addressing_mode=t(g, "addressing_mode"),
            fb_total_mib=to_int(t(g, "fb_memory_usage/total")),
            bar1_total_mib=to_int(t(g, "bar1_memory_usage/total")),
            gen_max=link(g, "pcie_gen/max_device_link_gen") or link(g, "pcie_gen/max_link_gen"),
            width_max=link(g, "link_widths/max_link_width"),
            width_current=link(g, "link_widths/current_link_width"),
        )
        for g in root.findall("gpu")
    ]
    return t(root, "driver_version"), t(root, "cuda_version"), gpus


def parse_query_csv(text: str) -> list[dict]:
    """nvidia-smi --query-gpu=... --format=csv: one dict per GPU (units in brackets dropped from the header)."""
    rows = [r for r in text.splitlines() if r.strip()]
    header = [re.sub(r"\s*\[.*\]$", "", h.strip()) for h in rows[0].split(",")] if rows else []
    return [dict(zip(header, (c.strip() for c in r.split(",")))) for r in rows[1:]]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.sub(r"\x1b\[[0-9;]*m", "", line).split("\t")]


def parse_topo_m(text: str) -> dict:
    """nvidia-smi topo -m: {"links": {(i, j): PIX|PXB|PHB|NODE|SYS|NV#}, "numa": {i: node}}."""
    devices, links, numa = [], {}, {}
    for line in text.splitlines():
        cells = _cells(line)
        filled = [c for c in cells if c]
        if not devices:
            if filled and filled[0] == "GPU0" and cells[0] == "":
                devices = [c for c in filled if re.fullmatch(r"(GPU|NIC)\d+", c)]
            continue
        if not filled or filled[0].startswith("Legend"):
            break
        if re.fullmatch(r"GPU\d+", cells[0]):
            i = int(cells[0][3:])
            for d, c in zip(devices, cells[1 : 1 + len(devices)]):
                if d.startswith("GPU") and int(d[3:]) != i:
                    links[(i, int(d[3:]))] = c
            rest = [c for c in cells[1 + len(devices) :] if c]  # CPU affinity, NUMA affinity, GPU NUMA ID
            numa.update({i: rest[1]} if len(rest) > 1 else {})
    return {"links": links, "numa": numa}


def parse_p2p(text: str) -> dict[tuple[int, int], str]:
    """nvidia-smi topo -p2p r|n: the status of each ordered GPU pair (OK, CNS, GNS, TNS, NS, U)."""
    cols, out = [], {}
    for line in text.splitlines():
        filled = [c for c in _cells(line) if c]
        if not filled or (not cols and not all(re.fullmatch(r"GPU\d+", c) for c in filled)):
            continue
        if not cols:
            cols = [int(c[3:]) for c in filled]
        elif filled[0].startswith("Legend"):
            break
        elif re.fullmatch(r"GPU\d+", filled[0]):
            out.update({(int(filled[0][3:]), j): v for j, v in zip(cols, filled[1:]) if j != int(filled[0][3:])})
    return out


def parse_df(text: str) -> dict | None:
    """df -Pk DIR: available KiB and the mount point."""
    f = text.splitlines()[-1].split() if len(text.splitlines()) > 1 else []
    return {"avail_kib": int(f[3]), "mount": f[5]} if len(f) >= 6 and f[3].isdigit() else None


def nccl_info(out: Out) -> dict:
    """The NCCL probe's JSON line (scripts/host/nccl.py nccl_report); {} when there is none."""
    try:
        return json.loads(out.text.strip().splitlines()[-1]) if out.ok else {}
    except (ValueError, IndexError):
        return {}


def pcie_only(nvlink: dict[tuple[int, int], str] | None, ids: list[int]) -> tuple[bool | None, str]:
    """PCIe only: no pair of the GPUs `ids` has NVLink (`nvidia-smi topo -p2p n` OK); None and why while one is
    unknown. The doctor asks about every GPU nvidia-smi shows (what `docker run --gpus all` gives a server)."""
    if len(ids) < 2 or nvlink is None:
        return None, f"{len(ids)} GPU(s)" if len(ids) < 2 else "no NVLink status"
    status = {(i, j): nvlink.get((i, j)) for i, j in itertools.combinations(ids, 2)}
    if "OK" in status.values():
        return False, ""
    unknown = [f"GPU{i}-GPU{j}" for (i, j), s in status.items() if s in (None, "U")]
    return (None, f"no NVLink status for {', '.join(unknown[:4])}") if unknown else (True, "")


@dataclasses.dataclass
class Facts:
    tp: int
    need_gb: float
    env: dict[str, str]
    probe: Probe
    expected_patchset: str | None = None
    image_cuda: tuple[int, int] | None = None
    expected_nccl: tuple[str, str] = ("", "not asked")  # (version, source): nccl.expected_nccl
    gpus: list[SimpleNamespace] = dataclasses.field(default_factory=list)
    driver: str = ""
    cuda: str = ""
    gpu_why: str = ""  # why there are no GPU facts
    topo: dict = dataclasses.field(default_factory=lambda: parse_topo_m(""))
    p2p_read: dict | None = None
    pcie_only: bool | None = None
    pcie_why: str = ""

    @property
    def n(self) -> int:
        return len(self.gpus)

    @property
    def sm120(self) -> bool:
        return any(g.compute_cap == "12.0" for g in self.gpus)

    def get(self, key: str) -> Out:
        return self.probe.get(key)

    def nccl_info(self) -> dict:
        return nccl_info(self.get("nccl"))

    def probe_result(self, key: str) -> tuple[dict, str]:
        """(a GPU probe's result line, its whole output); a result saying why when there is none."""
        out = self.get(key)
        r = nccl.result(out.text)
        return r or {"measured": False, "why": out.why or "the probe printed no result line"}, out.text

    def smoke_skipped(self) -> str:
        """Why the PCIe-IPC smoke does not run here ('' when it does): the server would not use PCIe IPC."""
        forced = self.env.get("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "").lower()
        if forced in ("0", "false") or self.tp < 2:
            return f"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE={forced} is set" if self.tp > 1 else f"TP{self.tp}: no all-reduce"
        if forced not in ("1", "true") and (not self.sm120 or self.pcie_only is False or self.tp < 4):
            return (
                "the series turns PCIe IPC on only for SM120 GPUs without NVLink at TP >= 4 "
                "(SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 runs the smoke anyway)"
            )
        return ""

    def hmm(self) -> tuple[bool | None, str]:
        """(HMM on, how that is known); None when unknown."""
        out = self.get("uvm-hmm")
        if out.ok:
            return out.text.strip() in ("N", "0"), f"nvidia_uvm uvm_disable_hmm={out.text.strip()}"
        if any(g.addressing_mode == "HMM" for g in self.gpus):
            return True, "nvidia-smi reports Addressing Mode HMM"
        return None, out.why

    def iommu(self) -> tuple[bool | None, str]:
        """(the IOMMU translates device DMA, what says so); None when the kernel command line is unreadable."""
        cmd = self.get("cmdline")
        if not cmd.ok:
            return None, cmd.why
        off = [t for t in cmd.text.split() if t in ("iommu=off", "amd_iommu=off", "intel_iommu=off")]
        grp = self.get("iommu-groups")
        groups = int(grp.text) if grp.ok and grp.text.strip().isdigit() else None
        if off:
            return False, f"IOMMU off ({' '.join(off)})"
        if "iommu=pt" in cmd.text.split():
            return False, "IOMMU in passthrough mode (iommu=pt)"
        if groups == 0:
            return False, "no IOMMU groups: IOMMU off"
        return True, (f"{groups} IOMMU groups, " if groups else "") + "no iommu=off/pt on the kernel command line"


def build_facts(probe: Probe, *, tp: int, need_gb: float, environ: dict | None = None, **asked) -> Facts:
    f = Facts(tp=tp, need_gb=need_gb, env=dict(os.environ if environ is None else environ), probe=probe, **asked)
    xml = probe.get("smi-xml")
    try:
        f.driver, f.cuda, f.gpus = parse_smi_xml(xml.text) if xml.ok else ("", "", [])
        f.gpu_why = "" if xml.ok else xml.why
    except ValueError as e:
        f.gpu_why = f"unreadable nvidia-smi -q -x output ({e})"
    rows = {r.get("pci.bus_id", "").upper(): r for r in parse_query_csv(probe.get("smi-query").text)}
    for g in f.gpus:
        r = rows.get(g.bus_id.upper(), {})
        g.compute_cap, g.index = r.get("compute_cap", ""), to_int(r["index"]) if r.get("index") else g.index
    topo, read, nvl = (probe.get(k) for k in ("topo-m", "topo-p2p-r", "topo-p2p-n"))
    f.topo = parse_topo_m(topo.text if topo.ok else "")
    f.p2p_read = parse_p2p(read.text) if read.ok else None
    f.pcie_only, f.pcie_why = pcie_only(parse_p2p(nvl.text) if nvl.ok else None, [g.index for g in f.gpus])
    f.pcie_why = f"`nvidia-smi topo -p2p n`: {nvl.why}" if f.n > 1 and not nvl.ok else f.pcie_why
    return f


def summary(f: Facts) -> dict:
    """The facts as plain data (doctor --json "facts"; the receipt stores it)."""
    out: dict = {
        "gpus": [{"index": g.index, "name": g.name, "bus_id": g.bus_id, "compute_cap": g.compute_cap} for g in f.gpus],
        "pcie_only": f.pcie_only,
        "driver": f.driver,
        "cuda": f.cuda,
    }
    if f.get("cmdline").ok:
        out["cmdline_iommu"] = [t for t in f.get("cmdline").text.split() if "iommu" in t or "pcie_port_pm" in t]
    info = f.nccl_info()
    out["nccl"] = info.get("nccl") or info.get("dist_version") or "unknown"
    if f.tp > 1:
        out["nccl_transport"] = nccl.transport_summary(*f.probe_result("nccl-transport"))
        skip = f.smoke_skipped()
        out["pcie_ipc_smoke"] = {"measured": False, "why": f"not run: {skip}"}
        if not skip:
            smoke = f.probe_result("pcie-ipc-smoke")[0]
            out["pcie_ipc_smoke"] = {k: v for k, v in smoke.items() if k in nccl.SMOKE_KEYS}
        bandwidth = f.probe_result("peer-bandwidth")[0]
        out["peer_bandwidth"] = {k: v for k, v in bandwidth.items() if k in nccl.BANDWIDTH_KEYS}
    if f.get("patchset").ok:
        out["patchset"] = f.get("patchset").text.strip()
    return out
