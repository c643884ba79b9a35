"""`make doctor` (and `serve --check` in the image): preflight of the serving box.

  python -m scripts.doctor [--tp N] [--model-dir DIR] [--need-gb N] [--python PY] [--json]
  python -m scripts.doctor --record DIR     also write every raw tool output to DIR (for a bug report / fixture)
  python -m scripts.doctor --replay DIR     diagnose recorded outputs instead of this machine

Checks: GPUs and compute capability, NVLink or PCIe only, P2P status of every GPU pair, NUMA placement, driver
and CUDA versions, nvcc (FlashInfer JIT needs >= 12.8), IOMMU and the nvidia_uvm HMM setting (NCCL P2P hangs with
HMM on), BAR1 size, PCIe links, free disk for the model, the NCCL version (2.30.4 is known to hang on RTX PRO
6000 pairs), and the patch set of the installed sglang. Each finding has an id, a severity (ok, info, warn,
error), a message and a fix. Exit status 1 if any finding is an error.

Everything comes from the real tools (nvidia-smi -q, --query-gpu, topo -m, topo -p2p r, nvlink -s, nvcc, numactl,
df, /proc and /sys files), each run with a timeout; a missing tool is a finding, never a traceback. The collection
layer takes a dict of recorded outputs, so tests feed it captures of real machines (tests/fixtures/doctor/).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from .lib.cli import run
from .lib.errors import UserError

SEVERITIES = ("ok", "info", "warn", "error")
KNOWN_BAD_NCCL = {
    "2.30.4": "hangs on the first all-reduce between RTX PRO 6000 pairs unless P2P is disabled "
              "(field report: local-inference-lab/rtx6kpro#15)",
}
MIN_NVCC = (12, 8)
IMAGE_CUDA = (13, 0)  # lmsysorg/sglang:v0.5.23-cu130
DEFAULT_NEED_GB = 700  # Kimi-K2.5 weights (~600 GB) + drafter + headroom; an estimate, override with --need-gb
TARGET_REPO = "moonshotai/Kimi-K2.5"

QUERY_FIELDS = "index,name,pci.bus_id,driver_version,memory.total,compute_cap"
NCCL_PROBE = r"""
import json
r = {}
try:
    import torch
    r["torch"] = torch.__version__
    v = torch.cuda.nccl.version()
    if isinstance(v, tuple):
        r["nccl"] = ".".join(map(str, v[:3]))
    else:
        v = int(v)
        r["nccl"] = "%d.%d.%d" % ((v // 10000, v // 100 % 100, v % 100) if v >= 10000 else (v // 1000, v // 100 % 10, v % 100))
except Exception as e:
    r["error"] = "%s: %s" % (type(e).__name__, e)
try:
    import importlib.metadata as md
    for d in ("nvidia-nccl-cu13", "nvidia-nccl-cu12"):
        try:
            r["dist"], r["dist_version"] = d, md.version(d)
            break
        except md.PackageNotFoundError:
            pass
except Exception:
    pass
print(json.dumps(r))
"""
SGLANG_PROBE = ("import importlib.util,pathlib;s=importlib.util.find_spec('sglang');"
                "print(pathlib.Path(s.origin).parent if s and s.origin else '')")

# key -> file name in a recorded capture directory (--record / --replay / tests/fixtures/doctor/<box>/)
CAPTURE_FILES = {
    "smi-q": "nvidia-smi-q.txt",
    "smi-query": "query-gpu.csv",
    "topo-m": "topo-m.txt",
    "topo-p2p-r": "topo-p2p-r.txt",
    "nvlink-s": "nvlink-s.txt",
    "nvcc": "nvcc-version.txt",
    "numactl": "numactl-H.txt",
    "uvm-hmm": "uvm_disable_hmm",
    "cmdline": "proc-cmdline",
    "iommu-groups": "iommu-groups",
    "df": "df.txt",
    "model-present": "model-present",
    "nccl": "nccl.json",
    "sglang": "sglang-path",
    "patchset": "patchset.json",
}


@dataclasses.dataclass
class Finding:
    id: str
    severity: str
    message: str
    fix: str = ""

    def __post_init__(self):
        assert self.severity in SEVERITIES, self.severity


@dataclasses.dataclass
class Out:
    """One tool's result: ok with its output, or not ok and why (not installed, failed, timed out)."""

    ok: bool
    text: str = ""
    why: str = ""


# ---------------------------------------------------------------------------------------------------------------
# collection


class Probe:
    """Runs the tools and reads the files, each with a timeout; or replays a dict of recorded outputs."""

    def __init__(self, recorded: dict[str, str] | None = None, *, python: str = sys.executable,
                 model_dir: Path | None = None, timeout: float = 30.0):
        self.recorded = recorded
        self.python = python
        self.model_dir = Path(model_dir) if model_dir else default_model_dir()
        self.timeout = timeout
        self.cache: dict[str, Out] = {}

    def get(self, key: str) -> Out:
        if key not in self.cache:
            if self.recorded is not None:
                text = self.recorded.get(key)
                self.cache[key] = Out(True, text) if text is not None else Out(False, why="not recorded")
            else:
                self.cache[key] = self._live(key)
        return self.cache[key]

    # live collection --------------------------------------------------------------------------------------------

    def _cmd(self, argv: list[str], timeout: float | None = None) -> Out:
        exe = shutil.which(argv[0]) or (argv[0] if os.path.isabs(argv[0]) and os.access(argv[0], os.X_OK) else None)
        if exe is None:
            return Out(False, why=f"{argv[0]} not found (not installed or not on PATH)")
        t = timeout or self.timeout
        try:
            cp = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=t)
        except subprocess.TimeoutExpired:
            return Out(False, why=f"`{' '.join(argv)}` did not answer within {t:.0f}s")
        except OSError as e:
            return Out(False, why=f"`{' '.join(argv)}` could not run: {e}")
        if cp.returncode != 0:
            msg = (cp.stdout + cp.stderr).strip().splitlines()
            return Out(False, text=cp.stdout, why=f"`{' '.join(argv)}` exit {cp.returncode}: "
                                                  f"{msg[-1] if msg else '(no output)'}")
        return Out(True, cp.stdout)

    @staticmethod
    def _file(path: str) -> Out:
        try:
            return Out(True, Path(path).read_text())
        except OSError as e:
            return Out(False, why=f"{path}: {e.strerror or e}")

    def _live(self, key: str) -> Out:
        if key == "smi-q":
            return self._cmd(["nvidia-smi", "-q"])
        if key == "smi-query":
            return self._cmd(["nvidia-smi", f"--query-gpu={QUERY_FIELDS}", "--format=csv"])
        if key == "topo-m":
            return self._cmd(["nvidia-smi", "topo", "-m"])
        if key == "topo-p2p-r":
            return self._cmd(["nvidia-smi", "topo", "-p2p", "r"])
        if key == "nvlink-s":
            return self._cmd(["nvidia-smi", "nvlink", "-s"])
        if key == "nvcc":
            nvcc = shutil.which("nvcc")
            if nvcc is None:
                for base in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
                    if base and os.access(Path(base) / "bin" / "nvcc", os.X_OK):
                        nvcc = str(Path(base) / "bin" / "nvcc")
                        break
            return self._cmd([nvcc or "nvcc", "--version"])
        if key == "numactl":
            return self._cmd(["numactl", "-H"])
        if key == "uvm-hmm":
            return self._file("/sys/module/nvidia_uvm/parameters/uvm_disable_hmm")
        if key == "cmdline":
            return self._file("/proc/cmdline")
        if key == "iommu-groups":
            d = Path("/sys/kernel/iommu_groups")
            try:
                return Out(True, str(sum(1 for _ in d.iterdir())))
            except OSError as e:
                return Out(False, why=f"{d}: {e.strerror or e}")
        if key == "df":
            d = self.model_dir
            while not d.exists() and d != d.parent:
                d = d.parent
            return self._cmd(["df", "-Pk", str(d)])
        if key == "model-present":
            hub = self.model_dir / "hub" if (self.model_dir / "hub").is_dir() else self.model_dir
            snap = hub / f"models--{TARGET_REPO.replace('/', '--')}" / "snapshots"
            return Out(True, "yes" if snap.is_dir() and any(snap.iterdir()) else "no")
        if key == "nccl":
            return self._cmd([self.python, "-c", NCCL_PROBE], timeout=max(self.timeout, 120))
        if key == "sglang":
            out = self._cmd([self.python, "-c", SGLANG_PROBE])
            if out.ok and not out.text.strip():
                return Out(False, why=f"{self.python} has no sglang installed")
            return out
        if key == "patchset":
            pkg = self.get("sglang")
            if not pkg.ok:
                return Out(False, why=pkg.why)
            return self._file(str(Path(pkg.text.strip()) / "_patchset.json"))
        raise KeyError(key)

    def record(self, dest: Path) -> list[str]:
        dest.mkdir(parents=True, exist_ok=True)
        written = []
        for key, name in CAPTURE_FILES.items():
            out = self.get(key)
            if out.ok:
                (dest / name).write_text(out.text)
                written.append(name)
        return written


def default_model_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"])
    return Path.home() / ".cache" / "huggingface"


def load_capture(d: Path) -> dict[str, str]:
    """A recorded capture directory as a dict for Probe. Also reads the bundled forms of the 2x H200 captures
    (/work/shared/measurements/h200x2-host-tools): topo-p2p.txt ('== -p2p r' sections) and host.txt
    (uvm_disable_hmm value, lscpu, numactl -H, --query-gpu CSV, in that order)."""
    d = Path(d)
    if not d.is_dir():
        raise UserError(f"capture directory {d} does not exist")
    rec = {key: (d / name).read_text() for key, name in CAPTURE_FILES.items() if (d / name).is_file()}
    bundle = d / "topo-p2p.txt"
    if "topo-p2p-r" not in rec and bundle.is_file():
        sections = re.split(r"^== -p2p (\w)\s*$", bundle.read_text(), flags=re.M)
        for kind, body in zip(sections[1::2], sections[2::2]):
            if kind == "r":
                rec["topo-p2p-r"] = body.strip("\n") + "\n"
    host = d / "host.txt"
    if host.is_file():
        lines = host.read_text().splitlines()
        first = next((ln.strip() for ln in lines if ln.strip()), "")
        if "uvm-hmm" not in rec and first in ("Y", "N", "0", "1"):
            rec["uvm-hmm"] = first + "\n"
        start = next((i for i, ln in enumerate(lines) if ln.startswith("available:")), None)
        csv_at = next((i for i, ln in enumerate(lines) if ln.startswith("index,")), None)
        if start is not None and "numactl" not in rec:
            rec["numactl"] = "\n".join(lines[start:csv_at]) + "\n"
        if csv_at is not None and "smi-query" not in rec:
            rec["smi-query"] = "\n".join(lines[csv_at:]) + "\n"
    return rec


# ---------------------------------------------------------------------------------------------------------------
# parsers (formats of the real tools)

ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_GPU_BLOCK_RE = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_KV_RE = re.compile(r"^(\s*)([^:]+?)\s*:\s?(.*)$")


def _tree(lines: list[str]) -> dict:
    """Indented `Key : Value` lines (nvidia-smi -q) as nested dicts; a line without ':' opens a section."""
    root: dict = {}
    stack: list[tuple[int, dict]] = [(-1, root)]
    for raw in lines:
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip())
        while indent <= stack[-1][0]:
            stack.pop()
        parent = stack[-1][1]
        m = _KV_RE.match(raw)
        if m:
            parent[m.group(2).strip()] = m.group(3).strip()
        else:
            sect: dict = {}
            parent[raw.strip()] = sect
            stack.append((indent, sect))
    return root


def parse_smi_q(text: str) -> dict:
    """nvidia-smi -q: driver and CUDA versions, one dict per GPU block (keyed by the block's bus id)."""
    head: list[str] = []
    blocks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        m = _GPU_BLOCK_RE.match(line)
        if m:
            blocks.append((m.group(1), []))
        elif blocks:
            blocks[-1][1].append(line)
        else:
            head.append(line)
    top = _tree([ln for ln in head if ":" in ln])
    gpus = []
    for bus, lines in blocks:
        t = _tree(lines)
        pci = t.get("PCI", {}) if isinstance(t.get("PCI"), dict) else {}
        link = pci.get("GPU Link Info", {}) if isinstance(pci.get("GPU Link Info"), dict) else {}
        gen = link.get("PCIe Generation", {}) if isinstance(link.get("PCIe Generation"), dict) else {}
        width = link.get("Link Width", {}) if isinstance(link.get("Link Width"), dict) else {}
        gpus.append({
            "bus_id": bus,
            "name": t.get("Product Name", "?"),
            "arch": t.get("Product Architecture", ""),
            "minor": t.get("Minor Number", ""),
            "addressing_mode": t.get("Addressing Mode", ""),
            "fb_total_mib": _mib(_sect(t, "FB Memory Usage").get("Total")),
            "bar1_total_mib": _mib(_sect(t, "BAR1 Memory Usage").get("Total")),
            "gen_max": _int(gen.get("Device Max") or gen.get("Max")),
            "gen_host_max": _int(gen.get("Host Max")),
            "gen_current": _int(gen.get("Current")),
            "width_max": _int(str(width.get("Max", "")).rstrip("x")),
            "width_current": _int(str(width.get("Current", "")).rstrip("x")),
        })
    return {"driver": top.get("Driver Version", ""), "cuda": top.get("CUDA Version", ""),
            "attached": _int(top.get("Attached GPUs")), "gpus": gpus}


def _sect(t: dict, name: str) -> dict:
    v = t.get(name)
    return v if isinstance(v, dict) else {}


def _int(s) -> int | None:
    m = re.match(r"\s*(\d+)", str(s or ""))
    return int(m.group(1)) if m else None


def _mib(s) -> int | None:
    m = re.match(r"\s*(\d+)\s*MiB", str(s or ""))
    return int(m.group(1)) if m else None


def parse_query_csv(text: str) -> list[dict]:
    """nvidia-smi --query-gpu=... --format=csv: header (units in brackets dropped), one row per GPU."""
    rows = [r for r in text.splitlines() if r.strip()]
    if not rows:
        return []
    header = [re.sub(r"\s*\[.*\]$", "", h.strip()) for h in rows[0].split(",")]
    return [dict(zip(header, (c.strip() for c in r.split(",")))) for r in rows[1:]]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in ANSI_RE.sub("", line).split("\t")]


_DEV_RE = re.compile(r"(GPU|NIC)\d+")


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
            if filled and _DEV_RE.fullmatch(filled[0]) and filled[0] == "GPU0" and cells[0] == "":
                devices = [c for c in filled if _DEV_RE.fullmatch(c)]
            continue
        if not filled or filled[0].startswith("Legend"):
            break
        if not re.fullmatch(r"GPU\d+", cells[0]):
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
    """nvidia-smi topo -p2p r (or w/n/a/p): status of each GPU pair (OK, CNS, GNS, TNS, NS, U)."""
    cols: list[int] = []
    out = {}
    for line in text.splitlines():
        filled = [c for c in _cells(line) if c]
        if not filled:
            continue
        if not cols:
            if all(re.fullmatch(r"GPU\d+", c) for c in filled):
                cols = [int(c[3:]) for c in filled]
            continue
        if filled[0].startswith("Legend"):
            break
        if re.fullmatch(r"GPU\d+", filled[0]) and len(filled) > 1:
            i = int(filled[0][3:])
            for j, v in zip(cols, filled[1:]):
                if i != j:
                    out[(i, j)] = v
    return out


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


def parse_nvlink(text: str) -> int:
    """nvidia-smi nvlink -s: number of links reported with a bandwidth (active)."""
    return len(re.findall(r"Link \d+: [\d.]+ GB/s", text))


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


def _ver(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", s)[:3])


# ---------------------------------------------------------------------------------------------------------------
# diagnosis


CC_BY_NAME = (("RTX PRO 6000 Blackwell", "12.0"), ("RTX 5090", "12.0"), ("B200", "10.0"), ("B300", "10.3"),
              ("H200", "9.0"), ("H100", "9.0"), ("H20", "9.0"), ("L40S", "8.9"), ("A100", "8.0"))


def diagnose(probe: Probe, *, tp: int = 8, need_gb: float = DEFAULT_NEED_GB, environ: dict | None = None,
             expected_patchset: str | None = None) -> tuple[list[Finding], dict]:
    env = dict(os.environ if environ is None else environ)
    F: list[Finding] = []
    facts: dict = {}

    def add(id_, sev, msg, fix=""):
        F.append(Finding(id_, sev, msg, fix))

    # -- GPUs, driver ----------------------------------------------------------------------------------------
    q = probe.get("smi-q")
    if not q.ok:
        add("gpu.driver", "error", f"no NVIDIA driver/GPU found: {q.why}",
            "on the host: install the NVIDIA driver (>= 580 for the image's CUDA 13.0) and check `nvidia-smi`; "
            "in docker: run with --gpus all (NVIDIA Container Toolkit installed)")
        smi = {"driver": "", "cuda": "", "gpus": []}
    else:
        smi = parse_smi_q(q.text)
    gpus = smi["gpus"]
    rows = parse_query_csv(probe.get("smi-query").text) if probe.get("smi-query").ok else []
    by_bus = {r.get("pci.bus_id", "").upper(): r for r in rows}
    for g in gpus:
        r = by_bus.get(g["bus_id"].upper(), {})
        cc = r.get("compute_cap") or next((c for n, c in CC_BY_NAME if n in g["name"]), "")
        g["compute_cap"] = cc
        g["index"] = _int(r.get("index")) if r.get("index") else _int(g["minor"])
    facts["gpus"] = [{k: g[k] for k in ("index", "name", "bus_id", "compute_cap")} for g in gpus]
    n = len(gpus)
    if q.ok and n == 0:
        add("gpu.driver", "error", "no NVIDIA driver/GPU found: nvidia-smi lists no GPU",
            "check `nvidia-smi -L`; in docker run with --gpus all")
    if n:
        names = sorted({g["name"] for g in gpus})
        ccs = sorted({g["compute_cap"] for g in gpus})
        desc = f"{n}x {' + '.join(names)}, compute capability {'/'.join(c or '?' for c in ccs)}"
        if len(ccs) > 1 or len(names) > 1:
            add("gpu.model", "warn", f"mixed GPUs: {desc}", "TP ranks should be identical GPUs; set "
                "CUDA_VISIBLE_DEVICES to one kind")
        elif ccs == ["12.0"]:
            add("gpu.model", "ok", f"{desc} (SM120): the series' PCIe-only SM120 paths apply")
        else:
            add("gpu.model", "info", f"{desc}: not SM120, so the series' SM120 paths stay off "
                "(the profile targets 8x RTX PRO 6000 Blackwell)")
        if n < tp:
            cvd = env.get("CUDA_VISIBLE_DEVICES")
            add("gpu.count", "error", f"TP{tp} needs {tp} GPUs; this machine shows {n}"
                + (f" (CUDA_VISIBLE_DEVICES={cvd})" if cvd is not None else ""),
                "docker run --gpus all; or lower the profile's tp-size (serve -- --tp-size N)")
        else:
            add("gpu.count", "ok", f"{n} GPUs for TP{tp}")
    sm120 = any(g["compute_cap"] == "12.0" for g in gpus)
    rtx_pro = any("RTX PRO 6000" in g["name"] for g in gpus)

    if smi["driver"]:
        facts["driver"], facts["cuda"] = smi["driver"], smi["cuda"]
        cuda = _ver(smi["cuda"])
        if cuda and cuda[:2] < IMAGE_CUDA:
            add("driver.cuda", "error", f"driver {smi['driver']} supports CUDA {smi['cuda']}; the image is built "
                f"on CUDA {IMAGE_CUDA[0]}.{IMAGE_CUDA[1]}", "upgrade the NVIDIA driver to the 580 branch or newer")
        else:
            add("driver.cuda", "ok", f"driver {smi['driver']}, CUDA {smi['cuda']} "
                f"(the image needs >= {IMAGE_CUDA[0]}.{IMAGE_CUDA[1]})")

    # -- topology: NVLink, P2P, NUMA ---------------------------------------------------------------------------
    topo_out = probe.get("topo-m")
    topo = parse_topo_m(topo_out.text) if topo_out.ok else {"devices": [], "links": {}, "cpu": {}, "numa": {}}
    links = topo["links"]
    nv = {p: v for p, v in links.items() if v.startswith("NV")}
    nvl = probe.get("nvlink-s")
    active_links = parse_nvlink(nvl.text) if nvl.ok else 0
    if not topo_out.ok:
        nvlink = None
        if n:
            add("topo.nvlink", "warn", f"GPU topology unknown: {topo_out.why}", "run `nvidia-smi topo -m` by hand")
    else:
        nvlink = bool(nv) or active_links > 0
        kinds: dict[str, int] = {}
        for (i, j), v in links.items():
            if i < j:
                kinds[v] = kinds.get(v, 0) + 1
        summary = ", ".join(f"{c}x {k}" for k, c in sorted(kinds.items()))
        if nvlink:
            add("topo.nvlink", "info", f"NVLink present (GPU pairs: {summary}): the PCIe-only defaults (PCIe IPC all-reduce, "
                "NCCL env file) do not apply here")
        else:
            add("topo.nvlink", "ok" if sm120 else "info", f"no NVLink, PCIe only (GPU pairs: {summary})")
    facts["nvlink"] = nvlink
    pcie_only = nvlink is False and n > 1
    facts["pcie_only"] = pcie_only

    p2p_out = probe.get("topo-p2p-r")
    if n > 1:
        if not p2p_out.ok:
            add("topo.p2p", "warn", f"P2P status unknown: {p2p_out.why}", "run `nvidia-smi topo -p2p r` by hand")
        else:
            p2p = parse_p2p(p2p_out.text)
            pairs = sorted((i, j) for (i, j) in p2p if i < j)
            bad = [(i, j, p2p[(i, j)]) for i, j in pairs if p2p[(i, j)] != "OK"]
            facts["p2p_bad_pairs"] = [f"GPU{i}-GPU{j}:{s}" for i, j, s in bad]
            if not pairs:
                add("topo.p2p", "warn", "could not read the P2P matrix of `nvidia-smi topo -p2p r`",
                    "run it by hand and check every pair says OK")
            elif not bad:
                add("topo.p2p", "ok", f"P2P read OK between all {len(pairs)} GPU pairs")
            else:
                codes = sorted({s for *_, s in bad})
                legend = {"CNS": "chipset not supported", "GNS": "GPU not supported", "TNS": "topology not supported",
                          "NS": "not supported", "U": "unknown"}
                shown = ", ".join(f"GPU{i}-GPU{j} {s}" for i, j, s in bad[:12]) + (" ..." if len(bad) > 12 else "")
                add("topo.p2p", "warn" if pcie_only or nvlink is None else "info",
                    f"P2P read not available for {len(bad)} of {len(pairs)} GPU pairs "
                    f"({'; '.join(f'{c}: {legend.get(c, c)}' for c in codes)}): {shown}. NCCL stages those "
                    "transfers through host memory (slower all-reduce)",
                    "BIOS: enable Above 4G decoding, Resizable BAR and PCIe peer-to-peer / ACS off for the GPU "
                    "slots; kernel: iommu=pt or off. If the patched PCIe IPC all-reduce fails to start, set "
                    "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0")

    if n and topo["numa"]:
        groups: dict[str, list[int]] = {}
        for i, node in sorted(topo["numa"].items()):
            groups.setdefault(node, []).append(i)
        facts["numa"] = {k: v for k, v in groups.items()}
        desc = "; ".join(f"GPUs {_ranges(v)} on NUMA node {k}" for k, v in sorted(groups.items()))
        nodes = parse_numactl(probe.get("numactl").text)["nodes"] if probe.get("numactl").ok else None
        if "N/A" in groups and (nodes or 1) > 1:
            add("topo.numa", "warn", f"NUMA affinity of some GPUs is unknown ({desc})",
                "check BIOS NUMA settings (NPS) and `nvidia-smi topo -m`; sglang then cannot bind ranks to nodes "
                "(--numa-node sets it by hand)")
        elif len(groups) == 1:
            add("topo.numa", "ok", f"all GPUs on one NUMA node ({desc})")
        else:
            sizes = sorted(len(v) for v in groups.values())
            contiguous = all(v == list(range(v[0], v[0] + len(v))) for v in groups.values())
            if len(set(sizes)) > 1:
                add("topo.numa", "warn", f"uneven GPU split across NUMA nodes: {desc}",
                    "the PCIe all-reduce's island schedule assumes equal islands (4+4 at TP8); move GPUs or "
                    "accept cross-node traffic")
            elif not contiguous:
                order = ",".join(str(i) for k in sorted(groups) for i in groups[k])
                add("topo.numa", "warn", f"GPU numbers interleave NUMA nodes: {desc}",
                    f"ranks 0-{len(gpus) // 2 - 1} should share a node: CUDA_VISIBLE_DEVICES={order} "
                    "(with CUDA_DEVICE_ORDER=PCI_BUS_ID)")
            else:
                add("topo.numa", "ok", f"{desc}: {len(groups)} islands of {sizes[0]} (the 4+4 layout the "
                    "PCIe all-reduce schedule expects at TP8)" if len(groups) == 2 else desc)

    # -- PCIe links and BAR1 ------------------------------------------------------------------------------------
    narrow = [g for g in gpus if g["width_max"] and g["width_current"] and g["width_current"] < g["width_max"]]
    slow_slot = [g for g in gpus if g["gen_host_max"] and g["gen_max"] and g["gen_host_max"] < g["gen_max"]]
    if gpus and any(g["width_max"] for g in gpus):
        gens = sorted({g["gen_max"] for g in gpus if g["gen_max"]})
        widths = sorted({g["width_max"] for g in gpus if g["width_max"]})
        msg = f"PCIe Gen{'/'.join(map(str, gens))} x{'/'.join(map(str, widths))}"
        if narrow or slow_slot:
            parts = [f"{g['bus_id']} x{g['width_current']} (max x{g['width_max']})" for g in narrow]
            parts += [f"{g['bus_id']} slot Gen{g['gen_host_max']} (GPU Gen{g['gen_max']})" for g in slow_slot]
            add("pcie.link", "warn", f"{msg}; degraded: {', '.join(parts)}",
                "reseat the card or riser, check the slot's lane assignment and PCIe generation in the BIOS")
        else:
            add("pcie.link", "ok", f"{msg} on every GPU (a lower current generation at idle is power saving)")
    bars = [g for g in gpus if g["bar1_total_mib"] is not None]
    if bars:
        small = [g for g in bars if g["fb_total_mib"] and g["bar1_total_mib"] < g["fb_total_mib"]]
        tiny = [g for g in small if g["bar1_total_mib"] <= 256]
        if small:
            sev = "error" if tiny and pcie_only else "warn"
            add("pcie.bar1", sev, f"BAR1 smaller than GPU memory on {len(small)} GPU(s) "
                f"({small[0]['bar1_total_mib']} MiB vs {small[0]['fb_total_mib']} MiB): peer-to-peer over PCIe and "
                "CUDA IPC need the large BAR",
                "BIOS: enable Above 4G Decoding and Resizable BAR, then reboot; check BAR1 in `nvidia-smi -q`")
        else:
            add("pcie.bar1", "ok", f"BAR1 {bars[0]['bar1_total_mib']} MiB >= GPU memory on every GPU")

    # -- host settings ------------------------------------------------------------------------------------------
    hmm = probe.get("uvm-hmm")
    if hmm.ok:
        v = hmm.text.strip()
        on = v in ("N", "0")
        facts["uvm_disable_hmm"] = v
        if on:
            add("host.hmm", "error" if pcie_only else "info",
                f"nvidia_uvm uvm_disable_hmm={v}: HMM is on" + (", which locks up NCCL P2P on PCIe-only boxes"
                                                                 if pcie_only else " (matters on PCIe-only boxes)"),
                "echo 'options nvidia_uvm uvm_disable_hmm=1' > /etc/modprobe.d/nvidia-uvm-hmm.conf, then reload "
                "nvidia_uvm (or reboot)")
        else:
            add("host.hmm", "ok", f"nvidia_uvm uvm_disable_hmm={v} (HMM off)")
    elif any(g["addressing_mode"] == "HMM" for g in gpus):
        add("host.hmm", "error" if pcie_only else "info", "nvidia-smi reports Addressing Mode HMM: HMM is on"
            + (", which locks up NCCL P2P on PCIe-only boxes" if pcie_only else ""),
            "echo 'options nvidia_uvm uvm_disable_hmm=1' > /etc/modprobe.d/nvidia-uvm-hmm.conf, then reload "
            "nvidia_uvm (or reboot)")
    elif n:
        add("host.hmm", "warn", f"nvidia_uvm HMM setting unknown: {hmm.why}",
            "load nvidia_uvm (modprobe nvidia_uvm) and set options nvidia_uvm uvm_disable_hmm=1")

    cmd = probe.get("cmdline")
    if cmd.ok:
        toks = cmd.text.split()
        facts["cmdline_iommu"] = [t for t in toks if "iommu" in t or t.startswith("pcie_port_pm")]
        off = [t for t in toks if t in ("iommu=off", "amd_iommu=off", "intel_iommu=off")]
        pt = [t for t in toks if t == "iommu=pt"]
        grp = probe.get("iommu-groups")
        groups_n = _int(grp.text) if grp.ok else None
        if off:
            add("host.iommu", "ok", f"IOMMU off ({' '.join(off)})")
        elif pt:
            add("host.iommu", "ok", "IOMMU in passthrough mode (iommu=pt): device DMA is not translated")
        elif groups_n == 0:
            add("host.iommu", "ok", "no IOMMU groups: IOMMU off")
        else:
            why = f"{groups_n} IOMMU groups, " if groups_n else ""
            add("host.iommu", "warn" if pcie_only or nvlink is None else "info",
                f"IOMMU translation likely on ({why}no iommu=off/pt on the kernel command line): GPU peer-to-peer "
                "DMA then goes through the IOMMU, and NCCL P2P can hang or crawl",
                "add iommu=pt (or amd_iommu=off / intel_iommu=off) to GRUB_CMDLINE_LINUX, update-grub, reboot")
        if pcie_only and "pcie_port_pm=off" not in toks:
            add("host.pcie_pm", "info", "PCIe port power management is on (no pcie_port_pm=off)",
                "peers running these boxes add pcie_port_pm=off to the kernel command line")
    elif n:
        add("host.iommu", "info", f"kernel command line unknown: {cmd.why}")

    # -- toolchain ----------------------------------------------------------------------------------------------
    nvcc = probe.get("nvcc")
    ver = parse_nvcc(nvcc.text) if nvcc.ok else None
    if ver is None:
        add("cuda.nvcc", "warn", f"nvcc not found ({nvcc.why or 'no version in its output'}): FlashInfer "
            "JIT-compiles kernels on first use and needs nvcc >= 12.8 for SM120",
            "use the image (it has the CUDA toolkit), or install CUDA >= 12.8 and put nvcc on PATH / set CUDA_HOME")
    elif ver < MIN_NVCC:
        add("cuda.nvcc", "error", f"nvcc {ver[0]}.{ver[1]} is older than 12.8: FlashInfer cannot JIT for SM120",
            "install CUDA >= 12.8 (the image has 13.0) and point CUDA_HOME at it")
    else:
        add("cuda.nvcc", "ok", f"nvcc {ver[0]}.{ver[1]} (FlashInfer JIT needs >= 12.8)")

    nc = probe.get("nccl")
    info = {}
    if nc.ok:
        try:
            info = json.loads(nc.text.strip().splitlines()[-1])
        except (ValueError, IndexError):
            info = {}
    version = info.get("nccl") or info.get("dist_version")
    facts["nccl"] = version or "unknown"
    if not version:
        why = info.get("error") or nc.why or "no answer"
        add("nccl.version", "info", f"NCCL version unknown (torch not importable by {probe.python}: {why})",
            "run `serve --check` inside the image to see the NCCL it ships")
    else:
        src = f"torch {info['torch']}" if info.get("nccl") else f"{info.get('dist')} (package metadata)"
        bad = KNOWN_BAD_NCCL.get(version)
        if bad:
            p2p_off = env.get("NCCL_P2P_DISABLE", "") in ("1", "true", "True")
            if p2p_off:
                add("nccl.version", "warn", f"NCCL {version} ({src}) {bad}; NCCL_P2P_DISABLE=1 is set, which avoids "
                    "the hang at the cost of single-stream speed", "use an image with another NCCL release")
            else:
                add("nccl.version", "error" if (rtx_pro or pcie_only or not n) else "warn",
                    f"NCCL {version} ({src}) {bad}",
                    "NCCL_P2P_DISABLE=1, or upgrade/downgrade NCCL (pip install nvidia-nccl-cu13==<other release>; "
                    "the image's known-good NCCL is the one its pinned base image ships)")
        else:
            add("nccl.version", "ok", f"NCCL {version} ({src}); known-bad releases: {', '.join(KNOWN_BAD_NCCL)}")

    alloc = env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments:True" in alloc.replace(" ", ""):
        add("env.alloc", "warn", f"PYTORCH_CUDA_ALLOC_CONF={alloc}: expandable segments are reported to crash "
            "the PCIe one-shot all-reduce", "unset PYTORCH_CUDA_ALLOC_CONF (or drop expandable_segments)")
    # NCCL_VERSION is metadata that NVIDIA's CUDA images set, not an NCCL setting.
    nccl_env = {k: v for k, v in env.items() if k.startswith("NCCL_") and k != "NCCL_VERSION"}
    if nccl_env:
        add("env.nccl", "info", "NCCL settings in the environment (they win over the PCIe env file): "
            + ", ".join(f"{k}={v}" for k, v in sorted(nccl_env.items())))

    # -- disk --------------------------------------------------------------------------------------------------
    df = probe.get("df")
    d = parse_df(df.text) if df.ok else None
    present = probe.get("model-present")
    have = present.ok and present.text.strip() == "yes"
    if d is None:
        add("disk.free", "warn", f"free disk for the model unknown ({df.why or 'unreadable df output'})",
            f"check by hand: {TARGET_REPO} needs about {need_gb:.0f} GB")
    else:
        free_gb = d["avail_kib"] * 1024 / 1e9
        facts["disk_free_gb"] = round(free_gb, 1)
        where = f"{probe.model_dir} (filesystem {d['mount']})"
        if have:
            add("disk.free", "ok" if free_gb >= 50 else "warn",
                f"{TARGET_REPO} is in the cache at {where}; {free_gb:.0f} GB free",
                "" if free_gb >= 50 else "free some space for the drafter and JIT caches (>= 50 GB)")
        elif free_gb >= need_gb:
            add("disk.free", "ok", f"{free_gb:.0f} GB free at {where} (the model needs about {need_gb:.0f} GB)")
        else:
            add("disk.free", "error", f"only {free_gb:.0f} GB free at {where}; {TARGET_REPO} needs about "
                f"{need_gb:.0f} GB", "mount a larger disk at the HF cache (docker run -v <big disk>:"
                "/root/.cache/huggingface) or set HF_HOME")

    # -- patch set ---------------------------------------------------------------------------------------------
    sg = probe.get("sglang")
    if not sg.ok:
        add("image.patchset", "info", f"sglang not found for this python ({sg.why}): a host-only preflight",
            "run `serve --check` in the image to check its patch set")
    else:
        pkg = sg.text.strip()
        rec_out = probe.get("patchset")
        try:
            rec = json.loads(rec_out.text) if rec_out.ok else None
        except ValueError:
            rec = None
        if rec is None:
            add("image.patchset", "error", f"sglang at {pkg} is not patched (no _patchset.json)",
                "python3 -m scripts.apply --python python3, or use the image built by `make image`")
        else:
            ids = [p.get("file", "?") for p in rec.get("patches", [])]
            facts["patchset"] = rec.get("patchset")
            if expected_patchset and rec.get("patchset") != expected_patchset:
                add("image.patchset", "warn", f"sglang at {pkg} carries patch set {rec.get('patchset')}, but the "
                    f"series here is {expected_patchset}", "rebuild the image (make image) or re-apply")
            else:
                add("image.patchset", "ok", f"patch set {rec.get('patchset')} ({len(ids)} patches"
                    + (f": {', '.join(ids)}" if ids else "") + f") on SGLang {rec.get('base', {}).get('tag', '?')}")
    return F, facts


def expected_series_id() -> str | None:
    try:
        from .lib.applycore import patchset_id
        from .lib.pin import load_pin, series_patches

        return patchset_id(series_patches(load_pin()))
    except Exception:  # noqa: BLE001 - a doctor without the series still diagnoses the box
        return None


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
            fw = textwrap.wrap("fix: " + f.fix, body)
            lines += [pad + w for w in fw]
    counts = {s: sum(1 for f in findings if f.severity == s) for s in SEVERITIES}
    lines.append(", ".join(f"{counts[s]} {s}" for s in reversed(SEVERITIES)))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts.doctor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tp", type=int, default=8, help="tensor-parallel size to check for (default 8)")
    ap.add_argument("--model-dir", type=Path, default=None, help="HF cache the model goes to "
                                                                  "(default $HF_HUB_CACHE, $HF_HOME or ~/.cache/huggingface)")
    ap.add_argument("--need-gb", type=float, default=DEFAULT_NEED_GB, help=f"disk the model needs (default "
                                                                            f"{DEFAULT_NEED_GB}, an estimate)")
    ap.add_argument("--python", default=sys.executable, help="interpreter whose torch/NCCL and sglang to check")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds each tool may take (default 30)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--record", type=Path, metavar="DIR", help="also write the raw tool outputs to DIR")
    src.add_argument("--replay", type=Path, metavar="DIR", help="diagnose outputs recorded in DIR")
    a = ap.parse_args(argv)
    probe = Probe(load_capture(a.replay) if a.replay else None, python=a.python, model_dir=a.model_dir,
                  timeout=a.timeout)
    findings, facts = diagnose(probe, tp=a.tp, need_gb=a.need_gb, expected_patchset=expected_series_id())
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
