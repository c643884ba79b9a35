"""NCCL facts and the doctor's GPU probes, each run in a child process (`python -c 'from scripts.host.nccl import run;
run("pcie-ipc-smoke", 8)'`) that prints what it saw, then one result line (MARK + JSON). nccl-transport: NCCL's INFO
lines of an all-reduce of 8 x 7168 bf16, the sum checked, 20 more timed. pcie-ipc-smoke: SGLang's tp group with
SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1, its workspace prepared as the model runner does, 300 all-reduces of 4 and of 8
rows of 7168 bf16, every sum checked. peer-bandwidth: n-1 rounds; in round k every GPU i writes to GPU i+k mod n."""

import collections
import contextlib
import functools
import inspect
import json
import os
import re
import signal
import tempfile
import textwrap
import time
from pathlib import Path

from ..box import ranks
from ..lib import proc
from ..lib.kimi import HIDDEN
from ..lib.progress import say
from ..series.pin import load_pin

KNOWN_BAD_NCCL = {
    "2.26.2": "crashes with an illegal memory access on collectives of 512 KiB and more between RTX PRO 6000 "
    "pairs (NVIDIA/nccl#2418)",
    "2.30.4": "hangs on the first all-reduce between RTX PRO 6000 pairs unless P2P is disabled "
    "(local-inference-lab/rtx6kpro#15)",
}
EXPECTED_VAR = "EAGLE_NCCL_VERSION"  # set in the image: the NCCL its build installed (docker/Dockerfile)
MARK = "EAGLE_PROBE "
PROBES = ("nccl-transport", "pcie-ipc-smoke", "peer-bandwidth")
WHAT = {"nccl-transport": "all-reduce", "pcie-ipc-smoke": "PCIe-IPC smoke", "peer-bandwidth": "peer-write probe"}
TIMEOUTS = {"nccl-transport": 120.0, "pcie-ipc-smoke": 600.0, "peer-bandwidth": 60.0}  # the smoke may JIT-compile
ROWS, ITERS = 8, 20  # the transport probe: one C1 verify's all-reduce (112 KiB), timed over 20
SMOKE_ROWS, SMOKE_ITERS, TIMED = (4, 8), 300, 50
STALL = 60.0  # seconds a rank may stay in one "iterate" phase (a few hundred all-reduces take milliseconds)
DEBUG = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"}
TRANSPORT_KEYS = ("measured", "why", "world", "allreduce_us", "sum_ok", "hung")
SMOKE_KEYS = ("measured", "why", "world", "hung", "phase", "engaged", "sum_ok", "wrong", "rows", "iters", "us")
BANDWIDTH_KEYS = ("measured", "why", "gpus", "hung", "rounds", "min_gbps")


def nccl_report() -> dict:
    """torch, gpus, nccl_build (the NCCL headers torch was built with), nccl and nccl_lib (the libnccl.so.2 it loaded),
    dist and dist_version (the pip package), or error. Standard library and torch only: NCCL_PROBE runs this source."""
    import ctypes
    import importlib.metadata as md

    def dotted(v):  # NCCL_VERSION_CODE: 2.9 and later major*10000 + minor*100 + patch, before *1000 + *100
        return "%d.%d.%d" % (
            (v // 10000, v // 100 % 100, v % 100) if v >= 10000 else (v // 1000, v // 100 % 10, v % 100)
        )

    r = {}
    try:
        import torch

        r["torch"] = torch.__version__
        r["gpus"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
        v = torch.cuda.nccl.version()
        r["nccl_build"] = ".".join(map(str, v[:3])) if isinstance(v, tuple) else dotted(int(v))
        with open("/proc/self/maps") as maps:
            lib = next((ln.split()[-1] for ln in maps if "/libnccl.so" in ln), None)
        code = ctypes.c_int()
        if lib and ctypes.CDLL(lib).ncclGetVersion(ctypes.byref(code)) == 0:
            r["nccl"], r["nccl_lib"] = dotted(code.value), lib
    except Exception as e:  # noqa: BLE001 - no torch, a CPU build, no /proc: say what failed
        r["error"] = "%s: %s" % (type(e).__name__, e)
    for d in ("nvidia-nccl-cu13", "nvidia-nccl-cu12"):
        try:
            r["dist"], r["dist_version"] = d, md.version(d)
            break
        except md.PackageNotFoundError:
            pass
    return r


NCCL_PROBE = textwrap.dedent(inspect.getsource(nccl_report)) + "\nimport json\nprint(json.dumps(nccl_report()))\n"


def expected_nccl(environ: dict[str, str] | None = None) -> tuple[str, str]:
    """(version, where it comes from) of the NCCL meant to run: the image build's or the pin's; ('', why) if neither."""
    env = os.environ if environ is None else environ
    if env.get(EXPECTED_VAR):
        return env[EXPECTED_VAR], f"the image build ({EXPECTED_VAR})"
    try:
        version = load_pin().nccl_version
    except Exception as e:  # noqa: BLE001 - a copy of the tooling without the pin still reports what runs
        return "", f"no pin ({e})"
    return (version, "patches/pin.toml [nccl]") if version else ("", "patches/pin.toml has no [nccl]")


def result(text: str) -> dict:
    """The last result line of a probe's output ({} when there is none)."""
    lines = [ln for ln in (text or "").splitlines() if ln.startswith(MARK)]
    try:
        return json.loads(lines[-1][len(MARK) :]) if lines else {}
    except ValueError:
        return {"measured": False, "why": f"unreadable result line: {lines[-1][:120]}"}


def unmeasured(why: str, text: str = "", **extra) -> str:
    """`text` with a result line saying why nothing was measured."""
    line = MARK + json.dumps({"measured": False, **extra, "why": why}) + "\n"
    return (text if text.endswith("\n") or not text else text + "\n") + line


def watch(argv: list[str], timeout: float, what: str = "", container: str = "") -> str:
    """Run a probe's process (in its own process group) with a watchdog: its output, ending in a result line; when
    it runs past `timeout` the group is killed (and its `container` removed: a killed docker client leaves it
    running) and the result says hung; the same on Ctrl-C or SIGTERM, which then goes on up. `what` is said first."""
    if what:
        say(f"doctor: {what}; at most {timeout:.0f} s")
    try:
        p = proc.spawn(argv, stdout=proc.PIPE, stderr=proc.STDOUT, text=True, start_new_session=True)
    except OSError as e:
        return unmeasured(f"{argv[0]} could not run: {e}")
    try:
        out, _ = p.communicate(timeout=timeout)
    except (proc.TimeoutExpired, KeyboardInterrupt) as e:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        if container:
            proc.run(["docker", "rm", "-f", container], timeout=120)
        if isinstance(e, KeyboardInterrupt):
            raise
        out, _ = p.communicate()
        return unmeasured(f"no answer within {timeout:.0f} s (the probe was killed)", out or "", hung=True)
    if not result(out):
        last = (out or "").strip().splitlines()[-1:] or ["no output"]
        return unmeasured(f"the probe exited {p.returncode} without a result: {last[0][:300]}", out or "")
    return out


def source(key: str, world: int, timeout: float, home: str | Path | None = None) -> str:
    """`python -c` code that runs probe `key` with this package found at `home` (None: $EAGLE_HOME, the image's)."""
    where = repr(str(home)) if home else "os.environ['EAGLE_HOME']"
    return (
        f"import os, sys; sys.path.insert(0, {where}); from scripts.host.nccl import run; "
        f"run({key!r}, {int(world)}, {float(timeout)})"
    )


def failure(got: ranks.Ranks) -> dict:
    """A probe's result keys for ranks that brought back no result: why, and where they hung."""
    hung = {"hung": True, "phase": got.phase} if got.hung and not got.errors else {}
    return {"measured": False, **hung, "why": got.why()}


def _gpus(world: int, what: str, need: int = 2) -> tuple[dict, int]:
    """(what torch says, the GPUs to use): the first `world` (0: all) CUDA GPUs; a result saying why when too few."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - no torch, or a broken one
        return {"measured": False, "why": f"torch does not import ({type(e).__name__}: {e})"}, 0
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    r = {"torch": torch.__version__, "gpus": n}
    if n < need:
        why = f"torch {torch.__version__} sees {n} CUDA GPU(s), and the {what} needs {need}"
        return r | {"measured": False, "why": why}, 0
    return r, min(world, n) if world > 0 else n


def _time_us(fn, iters: int) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return round(start.elapsed_time(end) * 1000 / iters, 1)


def _transport_rank(rank: int, world: int, port: int, phase) -> dict:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    phase("bring-up")
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=torch.device("cuda", rank)
    )
    try:
        phase("all-reduce")
        x = torch.full((ROWS, HIDDEN), float(rank + 1), dtype=torch.bfloat16, device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        want, y = world * (world + 1) / 2, torch.zeros_like(x)
        us = _time_us(lambda: dist.all_reduce(y), ITERS)
        dist.barrier()
        return {
            "sum_ok": bool((x == want).all().item()),
            "sum": float(x[0, 0].item()),
            "sum_expected": want,
            "allreduce_us": us,
            "bytes": x.numel() * x.element_size(),
        }
    finally:
        dist.destroy_process_group()


def nccl_transport(world: int = 0, timeout: float = TIMEOUTS["nccl-transport"]) -> dict:
    r, n = _gpus(world, "all-reduce")
    if not n:
        return r
    r["debug_overridden"] = {k: os.environ[k] for k in DEBUG if os.environ.get(k, DEBUG[k]) != DEBUG[k]}
    os.environ.update(DEBUG)
    os.environ.pop("NCCL_DEBUG_FILE", None)  # NCCL's lines must reach stdout
    r.update(world=n, nccl_env={k: v for k, v in sorted(os.environ.items()) if k[:5] == "NCCL_" and k not in DEBUG})
    got = ranks.run(_transport_rank, n, timeout, stall=STALL)
    return {**r, "measured": True, **got.results[0]} if got.ok else {**r, **failure(got)}


CHANNEL_RE = re.compile(
    r"NCCL INFO Channel (\d+)(?:/(\d+))? : (\d+)\[(\w+)\] -> (\d+)\[(\w+)\] "
    r"(?:\[(send|receive)\] )?via (\S+(?: pointer)?)"
)


def transport_links(text: str) -> tuple[str, list[dict]]:
    """(NCCL's version, one link per connection: {src, dst (NVML device or rank), pair, via, kind}) from NCCL's INFO
    lines (src/transport/p2p.cc, shm.cc, net.cc formats: "Channel %02d[/%d] : rank[dev] -> rank[dev] [send] via X")."""
    version = next((m.group(1) for m in re.finditer(r"NCCL INFO NCCL version (\S+)", text or "")), "")
    links, seen = [], set()
    name = lambda rank, dev: f"GPU{dev}" if dev.isdigit() else f"rank {rank}"  # older NCCL printed a bus id
    for m in CHANNEL_RE.finditer(text or ""):
        ch, conn, sr, sd, dr, dd, side, via = m.groups()
        if (ch, conn, sr, dr, side) not in seen:
            seen.add((ch, conn, sr, dr, side))
            kind = via.split("/")[0]
            kind = kind if kind in ("P2P", "SHM", "NET") else "other"
            ends = {"src": int(sd) if sd.isdigit() else None, "dst": int(dd) if dd.isdigit() else None}
            links.append(ends | {"pair": f"{name(sr, sd)}->{name(dr, dd)}", "via": via, "kind": kind})
    return version, links


def transport_summary(r: dict, text: str) -> dict:
    """The transport probe as plain data (doctor --json facts.nccl_transport; the receipt's environment)."""
    version, links = transport_links(text)
    out = {k: r[k] for k in TRANSPORT_KEYS if k in r} | {"links": dict(collections.Counter(x["kind"] for x in links))}
    return out | ({"nccl": version} if version else {})


def _smoke_rank(rank: int, world: int, port: int, phase, device: str, tune_dir: str) -> dict:
    os.environ.setdefault("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "1")  # this rank's; a user's 0 or 1 wins
    os.environ.setdefault("FLASHINFER_AUTOTUNE_DIR", tune_dir)  # its tactics stay out of the server's cache
    import torch
    from sglang.srt.distributed import parallel_state as ps
    from sglang.test.test_utils import publish_build_topology

    if device == "cuda":
        torch.cuda.set_device(rank)
    phase("bring-up")
    ps.init_distributed_environment(
        world_size=world,
        rank=rank,
        distributed_init_method=f"tcp://127.0.0.1:{port}",
        local_rank=rank,
        backend="nccl" if device == "cuda" else "gloo",
    )
    publish_build_topology(tp_size=world, world_rank=rank, device=device)
    ps.set_custom_all_reduce(False)  # it comes first at TP2; PCIe-only TP >= 4, where PCIe IPC is on, has none
    ps.initialize_model_parallel()
    try:
        tp = ps.get_tp_group()
        comm = getattr(tp, "pcie_ipc_comm", None)  # None too in an unpatched sglang
        if comm is None or comm.disabled:
            return {
                "engaged": False,
                "why": f"SGLang built no PCIe-IPC all-reduce for its tp group of {world} "
                f"{device} rank(s) (FlashInfer's kernels serve 2, 4 or 8 CUDA GPUs)",
            }
        phase("workspace")  # built and autotuned as the model runner's warmup does; may JIT-compile FlashInfer
        comm.prepare(hidden=HIDDEN, max_rows=max(SMOKE_ROWS))
        calls, real = [0], comm.pcie_ipc_all_reduce
        comm.pcie_ipc_all_reduce = lambda inp: (calls.__setitem__(0, calls[0] + 1), real(inp))[1]
        out: dict = {"engaged": True, "bad": 0, "us": {}}
        want = world * (world + 1) // 2
        for rows in SMOKE_ROWS:
            phase(f"iterate {rows}x{HIDDEN}")
            xs = [
                torch.full((rows, HIDDEN), float((rank + 1) * k), dtype=torch.bfloat16, device=device)
                for k in (1, 2, 3, 4)
            ]
            bad = (tp.all_reduce(xs[0]) != want).sum()
            if not calls[0]:  # every rank decides alike: same shape, same workspace
                return {"engaged": False, "why": f"SGLang's tp group did not route {rows}x{HIDDEN} bf16 to PCIe IPC"}
            for i in range(1, SMOKE_ITERS):
                bad += (tp.all_reduce(xs[i % 4]) != want * (i % 4 + 1)).sum()
            out["bad"] += int(bad.item())
            out["us"][str(rows)] = (
                _time_us(functools.partial(tp.all_reduce, xs[0]), TIMED) if device == "cuda" else None
            )
        phase("done")
        return out
    finally:
        with contextlib.suppress(Exception):
            ps.destroy_model_parallel()
            ps.destroy_distributed_environment()


def pcie_ipc_smoke(
    world: int = 0, timeout: float = TIMEOUTS["pcie-ipc-smoke"], device: str = "cuda", rank_fn=_smoke_rank
) -> dict:
    """The smoke (see the module docstring); device "cpu" brings the group up over gloo (the CPU tests)."""
    r, n = _gpus(world, "PCIe-IPC smoke", need=1 if world == 1 else 2) if device == "cuda" else ({}, max(world, 1))
    if not n:
        return r
    with tempfile.TemporaryDirectory(prefix="eagle-tune-") as tune:
        got = ranks.run(rank_fn, n, timeout, device, tune, stall=STALL)
    r["world"], each = n, got.results
    if not got.ok:
        return r | failure(got)
    if not all(x.get("engaged") for x in each):
        why = next(x["why"] for x in each if not x.get("engaged"))
        return r | {"measured": False, "engaged": False, "why": why}
    wrong = {str(i): x["bad"] for i, x in enumerate(each) if x["bad"]}
    measured = {"measured": True, "engaged": True, "rows": list(SMOKE_ROWS), "iters": SMOKE_ITERS}
    return r | measured | {"sum_ok": not wrong, "wrong": wrong, "us": each[0]["us"]}


def peer_bandwidth(
    world: int = 0, timeout: float = TIMEOUTS["peer-bandwidth"], size: int = 64 << 20, seconds: float = 2.0
) -> dict:
    r, n = _gpus(world, "peer-write probe")
    if not n:
        return r
    import torch

    src = [torch.ones(size, dtype=torch.uint8, device=i) for i in range(n)]
    dst = [torch.empty(size, dtype=torch.uint8, device=i) for i in range(n)]
    streams = [torch.cuda.Stream(device=i) for i in range(n)]

    def run(shift: int, iters: int) -> float:
        t0 = time.perf_counter()
        for _ in range(iters):
            for i in range(n):
                with torch.cuda.device(i), torch.cuda.stream(streams[i]):
                    dst[(i + shift) % n].copy_(src[i], non_blocking=True)
        for i in range(n):
            torch.cuda.synchronize(i)
        return time.perf_counter() - t0

    rounds = []
    for shift in range(1, n):
        iters = max(2, min(200, int(seconds / (n - 1) / max(run(shift, 1), 1e-4))))
        rounds.append({"shift": shift, "gbps": round(size * iters / run(shift, iters) / 1e9, 1)})
    return {**r, "measured": True, "gpus": n, "rounds": rounds, "min_gbps": min(x["gbps"] for x in rounds)}


def run(key: str, world: int = 0, timeout: float | None = None) -> None:
    """What the child process runs (source()): probe `key` on the first `world` GPUs (0: all), then its result line."""
    fn = {"nccl-transport": nccl_transport, "pcie-ipc-smoke": pcie_ipc_smoke, "peer-bandwidth": peer_bandwidth}[key]
    print(MARK + json.dumps(fn(world, timeout or TIMEOUTS[key])), flush=True)
