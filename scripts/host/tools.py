"""The host's tools and files, each read once with a timeout (lib.proc), or replayed from a recording.

A `Probe` answers a key (CAPTURE_FILES) with an `Out`: ok and the text, or not ok and why (not installed, failed,
timed out, not recorded). Live, it runs the tool or reads the file; with `recorded`, it replays a dict of earlier
outputs, which is how tests/fixtures/doctor/ feeds real captures to the doctor. `record()` writes what it read to a
directory that `load_capture()` reads back (doctor --record / --replay).

"nccl-transport" is the one output that is a measurement: a short all-reduce over the TP group's GPUs with NCCL's
INFO lines (scripts/host/nccl_transport.py), run by the interpreter under test when its torch sees 2 CUDA GPUs,
else in `image` (`docker run --gpus all --ipc=host -v sglang-flashinfer:/root/.cache/flashinfer`, as every run of
the image, with the caller's NCCL_*/CUDA_* variables passed) when the docker engine has it; otherwise its result
line says why it was not measured.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from pathlib import Path

from ..lib import proc
from ..lib.errors import UserError
from ..lib.repo import REPO_ROOT
from ..series.pin import applied_patchset
from ..series.sglang_pkg import find_sglang
from . import nccl_transport as transport
from .nccl import NCCL_PROBE
from .route import JIT_VOLUME, image_ready, passed_env

TARGET_REPO = "moonshotai/Kimi-K2.5"
QUERY_FIELDS = "index,name,pci.bus_id,driver_version,memory.total,compute_cap"
# key -> file name in a recorded capture directory (--record / --replay / tests/fixtures/doctor/<box>/)
CAPTURE_FILES = {
    "smi-xml": "nvidia-smi-q.xml",
    "smi-query": "query-gpu.csv",
    "topo-m": "topo-m.txt",
    "topo-p2p-r": "topo-p2p-r.txt",
    "topo-p2p-n": "topo-p2p-n.txt",
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
    "nccl-transport": "nccl-transport.txt",
    "nvidia-params": "proc-driver-nvidia-params",
}
COMMANDS = {  # key -> the tool command that answers it live
    "smi-xml": ["nvidia-smi", "-q", "-x"],
    "smi-query": ["nvidia-smi", f"--query-gpu={QUERY_FIELDS}", "--format=csv"],
    "topo-m": ["nvidia-smi", "topo", "-m"],
    "topo-p2p-r": ["nvidia-smi", "topo", "-p2p", "r"],
    "topo-p2p-n": ["nvidia-smi", "topo", "-p2p", "n"],
    "nvlink-s": ["nvidia-smi", "nvlink", "-s"],
    "numactl": ["numactl", "-H"],
}
FILES = {"uvm-hmm": "/sys/module/nvidia_uvm/parameters/uvm_disable_hmm", "cmdline": "/proc/cmdline",
         "nvidia-params": "/proc/driver/nvidia/params"}


@dataclasses.dataclass
class Out:
    """One tool's result: ok with its output, or not ok and why (not installed, failed, timed out)."""

    ok: bool
    text: str = ""
    why: str = ""


def default_model_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"])
    return Path.home() / ".cache" / "huggingface"


class Probe:
    """Runs the tools and reads the files, each with a timeout; or replays a dict of recorded outputs."""

    def __init__(self, recorded: dict[str, str] | None = None, *, python: str = sys.executable,
                 model_dir: Path | None = None, timeout: float = 30.0, image: str | None = None, ranks: int = 0):
        self.recorded = recorded
        self.python = python
        self.model_dir = Path(model_dir) if model_dir else default_model_dir()
        self.timeout = timeout
        self.image = image  # where the NCCL transport probe runs when `python` cannot (None: nowhere else)
        self.ranks = ranks  # GPUs of the TP group for that probe (0: every visible GPU)
        self.cache: dict[str, Out] = {}

    @property
    def live(self) -> bool:
        return self.recorded is None

    def get(self, key: str) -> Out:
        if key not in self.cache:
            if self.recorded is not None:
                text = self.recorded.get(key)
                self.cache[key] = Out(True, text) if text is not None else Out(False, why="not recorded")
            else:
                self.cache[key] = self._live(key)
        return self.cache[key]

    def command(self, argv: list[str], timeout: float | None = None) -> Out:
        res = proc.run(argv, timeout=timeout or self.timeout)
        return Out(True, res.stdout) if res.ok else Out(False, res.stdout, res.why)

    @staticmethod
    def read(path: str) -> Out:
        try:
            return Out(True, Path(path).read_text())
        except OSError as e:
            return Out(False, why=f"{path}: {e.strerror or e}")

    def _nvcc(self) -> Out:
        nvcc = proc.which("nvcc")
        if nvcc is None:  # not on PATH: the CUDA toolkit's usual places
            homes = [h for h in (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if h]
            nvcc = next((str(Path(h) / "bin" / "nvcc") for h in homes if proc.which(str(Path(h) / "bin" / "nvcc"))),
                        None)
        return self.command([nvcc or "nvcc", "--version"])

    def _iommu_groups(self) -> Out:
        d = Path("/sys/kernel/iommu_groups")
        try:
            return Out(True, str(sum(1 for _ in d.iterdir())))
        except OSError as e:
            return Out(False, why=f"{d}: {e.strerror or e}")

    def _df(self) -> Out:
        d = self.model_dir
        while not d.exists() and d != d.parent:
            d = d.parent
        return self.command(["df", "-Pk", str(d)])

    def _model_present(self) -> Out:
        hub = self.model_dir / "hub" if (self.model_dir / "hub").is_dir() else self.model_dir
        snap = hub / f"models--{TARGET_REPO.replace('/', '--')}" / "snapshots"
        return Out(True, "yes" if snap.is_dir() and any(snap.iterdir()) else "no")

    def _sglang(self) -> Out:
        pkg, why = find_sglang(self.python, self.timeout)
        return Out(True, f"{pkg}\n") if pkg else Out(False, why=why)

    def _patchset(self) -> Out:
        pkg = self.get("sglang")
        pid = applied_patchset(Path(pkg.text.strip())) if pkg.ok else None
        return Out(True, json.dumps({"patchset": pid})) if pid else Out(False, why=pkg.why or "no patch set in git")

    def _nccl_transport(self) -> Out:
        wait = transport.TIMEOUT_S + 60
        here = self.command([self.python, "-c", transport.source(self.ranks, REPO_ROOT)], timeout=wait)
        if not here.ok or not transport.parse(here.text).result.get("too_few_gpus") or not self.image:
            return here
        ok, why = image_ready(self.image)
        if not ok:
            return Out(True, transport.unmeasured(here.text, f"here, {transport.parse(here.text).result['why']}; "
                                                             f"in the image: {why}"))
        env = [x for k in passed_env() for x in ("-e", k)]
        return self.command(["docker", "run", "--rm", "--gpus", "all", "--ipc=host", "-v", JIT_VOLUME, *env, self.image,
                             "python3", "-c", transport.source(self.ranks)], timeout=wait + 60)

    def _live(self, key: str) -> Out:
        if key in COMMANDS:
            return self.command(COMMANDS[key])
        if key in FILES:
            return self.read(FILES[key])
        if key == "nccl":
            return self.command([self.python, "-c", NCCL_PROBE], timeout=max(self.timeout, 120))
        special = {"nvcc": self._nvcc, "iommu-groups": self._iommu_groups, "df": self._df,
                   "model-present": self._model_present, "sglang": self._sglang, "patchset": self._patchset,
                   "nccl-transport": self._nccl_transport}
        if key not in special:
            raise KeyError(key)
        return special[key]()

    def record(self, dest: Path) -> list[str]:
        dest.mkdir(parents=True, exist_ok=True)
        written = []
        for key, name in CAPTURE_FILES.items():
            out = self.get(key)
            if out.ok:
                (dest / name).write_text(out.text)
                written.append(name)
        return written


def _bundled(d: Path, rec: dict[str, str]) -> None:
    """The bundled forms of a hand capture: topo-p2p.txt ('== -p2p r|w|n|a|p' sections) and host.txt (the
    uvm_disable_hmm value, lscpu, numactl -H, the --query-gpu CSV, in that order)."""
    bundle = d / "topo-p2p.txt"
    if bundle.is_file():
        sections = re.split(r"^== -p2p (\w)\s*$", bundle.read_text(), flags=re.M)
        for kind, body in zip(sections[1::2], sections[2::2]):
            if kind in ("r", "n"):
                rec.setdefault(f"topo-p2p-{kind}", body.strip("\n") + "\n")
    host = d / "host.txt"
    if host.is_file():
        lines = host.read_text().splitlines()
        first = next((ln.strip() for ln in lines if ln.strip()), "")
        if first in ("Y", "N", "0", "1"):
            rec.setdefault("uvm-hmm", first + "\n")
        start = next((i for i, ln in enumerate(lines) if ln.startswith("available:")), None)
        csv_at = next((i for i, ln in enumerate(lines) if ln.startswith("index,")), None)
        if start is not None:
            rec.setdefault("numactl", "\n".join(lines[start:csv_at]) + "\n")
        if csv_at is not None:
            rec.setdefault("smi-query", "\n".join(lines[csv_at:]) + "\n")


def load_capture(d: Path) -> dict[str, str]:
    """A recorded capture directory as a dict for Probe (one file per key, or the bundled forms of a capture made
    by hand, as tests/fixtures/doctor/h200x2/ holds)."""
    d = Path(d)
    if not d.is_dir():
        raise UserError(f"capture directory {d} does not exist")
    rec = {key: (d / name).read_text() for key, name in CAPTURE_FILES.items() if (d / name).is_file()}
    _bundled(d, rec)
    return rec
