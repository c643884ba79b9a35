"""Which transport NCCL picks between the TP group's GPUs, read from NCCL's own INFO lines of a short all-reduce.

`measure()` runs in the interpreter under test (doctor --python, or the serving image's python3): it spawns one
process per GPU of the TP group (the first `ranks` visible GPUs), brings up an NCCL group over them, all-reduces
one C1 verify's tensor (8 x 7168 bf16, 112 KiB), checks the sum and times 20 more, with NCCL_DEBUG=INFO and
NCCL_DEBUG_SUBSYS=INIT,ENV for those processes only (NCCL_DEBUG_FILE dropped so the lines reach stdout; whatever
the caller had set for these three is said in the result). Every other NCCL_* setting of the caller stays: a
NCCL_P2P_DISABLE=1 in the environment is what the ranks run with, and what the lines show. It prints NCCL's lines
as they come and then one result line, MARK + JSON: measured (false with why: no torch, fewer than 2 CUDA GPUs, a
rank failed, or hung: no answer within the timeout, the ranks killed), world, the sum check, us per all-reduce,
the NCCL_* variables the ranks saw. Torch, the standard library and this package only.

`parse()` reads that output back. Every transport line carries NCCL_INIT (NCCL 2.29, the release patches/pin.toml
[nccl] pins; the formats are those of src/transport/p2p.cc, shm.cc and net.cc, after the prefix of src/debug.cc,
`%s:%d:%d [%d] NCCL INFO `):
  Channel %02d/%01d : %d[%d] -> %d[%d] via P2P/%s%s%s       (P2P/CUMEM, P2P/IPC, P2P/direct pointer, /read, /CE)
  Channel %02d : %d[%d] -> %d[%d] via SHM/%s/%s             (SHM/direct/direct, SHM/CE/direct: staged in host memory)
  Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s (NET/Socket/0, NET/IB/0/GDRDMA: through the network)
as rank[NVML device] -> rank[NVML device], and NCCL's own reason where it gives one (src/graph/paths.cc, when NVML
reports no P2P between two GPUs that are not across the CPU interconnect): "P2P is disabled between connected GPUs
%d and %d".
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import tempfile
import time

from ..lib.kimi import HIDDEN

MARK = "EAGLE_NCCL_TRANSPORT "
ROWS = 8  # one C1 verify at batch 2, or 8 draft tokens: the decode-sized all-reduce of the cost model
ITERS = 20
TIMEOUT_S = 120.0  # the ranks' own deadline; the caller waits a minute longer for the result line
DEBUG = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"}
DEBUG_FILE = "NCCL_DEBUG_FILE"
KINDS = ("P2P", "SHM", "NET")
CHANNEL_RE = re.compile(r"NCCL INFO Channel (\d+)(?:/(\d+))? : (\d+)\[(\w+)\] -> (\d+)\[(\w+)\] "
                        r"(?:\[(send|receive)\] )?via (\S+(?: pointer)?)")
DISABLED_RE = re.compile(r"NCCL INFO P2P is disabled between connected GPUs (\d+) and (\d+)")
VERSION_RE = re.compile(r"NCCL INFO NCCL version (\S+)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, out: str) -> None:
    """One rank: an NCCL group over `world` GPUs, one checked all-reduce, then ITERS timed ones."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    try:
        x = torch.full((ROWS, HIDDEN), float(rank + 1), dtype=torch.bfloat16, device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        want = world * (world + 1) / 2
        sum_ok = bool((x == want).all().item())
        y = torch.zeros_like(x)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(ITERS):
            dist.all_reduce(y)
        end.record()
        torch.cuda.synchronize()
        if rank == 0:
            with open(out, "w") as f:
                json.dump({"sum_ok": sum_ok, "sum": float(x[0, 0].item()), "sum_expected": want,
                           "allreduce_us": round(start.elapsed_time(end) * 1000 / ITERS, 1),
                           "bytes": x.numel() * x.element_size(),
                           "nccl_torch_build": ".".join(map(str, torch.cuda.nccl.version()))}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(world: int, timeout: float) -> dict:
    """Run the ranks; their result, or why there is none (a rank failed; hung: killed at the deadline)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="eagle-nccl-") as tmp:
        out = os.path.join(tmp, "rank0.json")
        ctx = mp.start_processes(_rank, args=(world, _free_port(), out), nprocs=world, join=False,
                                 start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=2):
                if time.monotonic() > deadline:
                    for p in ctx.processes:
                        if p.is_alive():
                            p.kill()
                    return {"hung": True, "why": f"the all-reduce over {world} GPUs did not finish within "
                                                 f"{timeout:.0f} s (the ranks were killed)"}
        except Exception as e:  # noqa: BLE001 - mp.ProcessRaisedException / ProcessExitedException: a rank died
            lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
            return {"why": f"a rank failed: {lines[-1] if lines else type(e).__name__}"}
        if not os.path.isfile(out):
            return {"why": "rank 0 wrote no result"}
        with open(out) as f:
            return {"measured": True, **json.load(f)}


def measure(ranks: int = 0, timeout: float = TIMEOUT_S) -> dict:
    """The probe itself (see the module docstring): the result dict it prints after NCCL's lines."""
    r: dict = {"measured": False}
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - no torch, or a broken one: say which
        return {**r, "why": f"torch does not import ({type(e).__name__}: {e})"}
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    r.update(torch=torch.__version__, gpus=n)
    if n < 2:
        return {**r, "too_few_gpus": True,
                "why": f"torch {torch.__version__} sees {n} CUDA GPU(s), and the all-reduce needs 2"}
    world = min(ranks, n) if ranks > 1 else n
    had = {k: os.environ[k] for k in (*DEBUG, DEBUG_FILE) if k in os.environ and os.environ[k] != DEBUG.get(k)}
    os.environ.update(DEBUG)
    os.environ.pop(DEBUG_FILE, None)
    r.update(world=world, debug_overridden=had,
             nccl_env={k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_") and k not in DEBUG})
    return {**r, **_spawn(world, timeout)}


def cli(ranks: int = 0, timeout: float = TIMEOUT_S) -> None:
    """Print the result line after NCCL's (what source() runs)."""
    print(MARK + json.dumps(measure(ranks, timeout)), flush=True)


def source(ranks: int, home: str | None = None, timeout: float = TIMEOUT_S) -> str:
    """`python -c` code that runs the probe with this package found at `home` (None: $EAGLE_HOME, the image's)."""
    where = repr(str(home)) if home else "os.environ['EAGLE_HOME']"
    return (f"import os, sys; sys.path.insert(0, {where}); "
            f"from scripts.host.nccl_transport import cli; cli({int(ranks)}, {float(timeout)})")


def unmeasured(text: str, why: str) -> str:
    """`text` with a result line saying why nothing was measured (the last result line is the one read)."""
    return text + ("" if not text or text.endswith("\n") else "\n") + MARK + json.dumps({"measured": False,
                                                                                         "why": why}) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# reading it back


@dataclasses.dataclass
class Link:
    channel: int
    src_rank: int
    src_dev: int | None  # NVML index (older NCCL printed a bus id there: None)
    dst_rank: int
    dst_dev: int | None
    via: str  # "P2P/CUMEM", "SHM/direct/direct", "NET/Socket/0", ...

    @property
    def kind(self) -> str:
        head = self.via.split("/")[0]
        return head if head in KINDS else "other"

    @property
    def pair(self) -> str:
        name = (lambda rank, dev: f"GPU{dev}" if dev is not None else f"rank {rank}")
        return f"{name(self.src_rank, self.src_dev)}->{name(self.dst_rank, self.dst_dev)}"


@dataclasses.dataclass
class Transport:
    result: dict  # the probe's result line ({} when there is none)
    links: list[Link]
    version: str = ""  # "2.29.7+cuda13.0", from NCCL's own line
    disabled: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # NCCL: "P2P is disabled between"

    @property
    def measured(self) -> bool:
        return bool(self.result.get("measured"))

    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for link in self.links:
            out[link.kind] = out.get(link.kind, 0) + 1
        return out

    def by_kind(self, kind: str) -> list[Link]:
        """The links of one kind, one per GPU pair and direction."""
        seen: dict[str, Link] = {}
        for link in self.links:
            if link.kind == kind:
                seen.setdefault(link.pair, link)
        return [seen[k] for k in sorted(seen)]

    def summary(self) -> dict:
        """As plain data (doctor --json facts, the receipt's environment)."""
        out = {k: self.result[k] for k in ("measured", "why", "world", "allreduce_us", "sum_ok", "hung")
               if k in self.result}
        out["links"] = self.kinds()
        if self.version:
            out["nccl"] = self.version
        return out


def _dev(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def parse(text: str) -> Transport:
    """NCCL's transport lines and the probe's last result line from the probe's output."""
    links, disabled, version, result = [], [], "", {}
    seen: set[tuple] = set()
    for line in text.splitlines():
        if line.startswith(MARK):
            try:
                result = json.loads(line[len(MARK):])
            except ValueError:
                result = {"measured": False, "why": f"unreadable result line: {line[:120]}"}
            continue
        m = CHANNEL_RE.search(line)
        if m:
            ch, conn, sr, sd, dr, dd, side, via = m.groups()
            key = (ch, conn, sr, dr, side)
            if key not in seen:
                seen.add(key)
                links.append(Link(int(ch), int(sr), _dev(sd), int(dr), _dev(dd), via))
            continue
        m = DISABLED_RE.search(line)
        if m:
            disabled.append((int(m.group(1)), int(m.group(2))))
            continue
        m = VERSION_RE.search(line)
        if m and not version:
            version = m.group(1)
    return Transport(result, links, version, disabled)
