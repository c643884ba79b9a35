"""One rank per process, with one watchdog: the doctor's GPU probes, bench-comm and the test tiers spawn their ranks
here.

    got = run(fn, world, timeout, *args, env={...})   # fn(rank, world, port, phase, *args) -> a JSON-able result
    got.ok, got.results (one per rank), got.errors (rank -> traceback), got.hung, got.why(), got.explain()

Each rank is a fresh process (multiprocessing "spawn": no CUDA state is inherited) that applies `env`, runs fn and
writes its result or its traceback to its own file, then leaves with os._exit (a peer that died cannot hold it in
process-group teardown). phase(name) says where the rank is. The collectives under test spin on their peers without
a timeout of their own, so the parent stops the group (every rank still running is killed, and named in `hung`):
- `grace` seconds after a rank failed (its peers would wait for it forever);
- `stall` seconds after the group last changed phase while a rank is in an "iterate ..." phase (a few hundred
  collectives take milliseconds);
- at `timeout` seconds in all.
"""

import dataclasses
import json
import os
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class Ranks:
    """What a group of ranks brought back."""

    name: str
    results: list  # per rank: fn's result, or None
    errors: dict[int, str]  # rank -> its traceback, or why it left no result
    hung: list[int]  # ranks still running when the group was stopped (killed)
    phase: str  # where the ranks were at the end: "ranks 0,1: iterate 8x7168; rank 2: workspace"
    seconds: float
    limit: float = 0.0  # the limit that stopped a hung group

    @property
    def ok(self) -> bool:
        return not self.errors and not self.hung and all(r is not None for r in self.results)

    def why(self) -> str:
        """One line: the first failure, or the hang and where it hung."""
        if self.errors:
            rank, text = min(self.errors.items())
            return f"a rank failed: rank {rank}: {(text.strip().splitlines() or ['?'])[-1]}"
        if self.hung:
            return f"no progress within {self.limit:.0f} s ({self.phase}); the ranks were killed"
        return ""

    def explain(self) -> str:
        lines = [f"{self.name} on {len(self.results)} ranks, {self.seconds:.0f} s:"]
        if self.hung:
            lines.append(f"  ranks {self.hung} still running after {self.limit:.0f} s (killed): a hang ({self.phase})")
        for rank, tb in sorted(self.errors.items()):
            lines.append(f"  rank {rank} failed:\n    " + tb.strip().replace("\n", "\n    ")[-3000:])
        return "\n".join(lines)


def _rank(fn, rank: int, world: int, port: int, tmp: str, env: dict, args: tuple) -> None:
    def phase(name: str) -> None:
        Path(tmp, f"{rank}.phase").write_text(name)

    os.environ.update(env)
    try:
        doc = {"result": fn(rank, world, port, phase, *args)}
    except BaseException:  # noqa: BLE001 - everything a rank hits is the evidence; the parent stops its peers
        doc = {"error": traceback.format_exc()}
    Path(tmp, f"{rank}.json").write_text(json.dumps(doc, default=str))
    # rank 0 holds the group's rendezvous store (torch.distributed's TCPStore on `port`): leaving first would cut off
    # a peer still setting its groups up ("Broken pipe"), so it waits for every peer's result or error (the parent
    # stops the group on a hang)
    while rank == 0 and not all(Path(tmp, f"{r}.json").exists() for r in range(world)):
        time.sleep(0.05)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _doc(tmp: str, rank: int) -> dict | None:
    try:
        return json.loads(Path(tmp, f"{rank}.json").read_text())
    except (OSError, ValueError):  # not written yet, or cut short by a kill
        return None


def _phases(tmp: str, world: int) -> str:
    by: dict[str, list[int]] = {}
    for r in range(world):
        p = Path(tmp, f"{r}.phase")
        by.setdefault(p.read_text() if p.exists() else "starting", []).append(r)
    return "; ".join(f"rank{'s' if len(v) > 1 else ''} {','.join(map(str, v))}: {k}" for k, v in by.items())


def _watch(procs: list, tmp: str, timeout: float, stall: float, grace: float) -> tuple[str, float]:
    """Wait until every rank has left, or the group must be stopped; (its phases, the limit that stopped it)."""
    t0 = since = time.monotonic()
    seen, failed_at = "", None
    while any(p.is_alive() for p in procs):
        time.sleep(0.2)
        now, phases = time.monotonic(), _phases(tmp, len(procs))
        if phases != seen:
            seen, since = phases, now
        docs = [_doc(tmp, r) for r in range(len(procs))]
        raised = any("error" in d for d in docs if d)
        vanished = any(d is None and p.exitcode is not None for d, p in zip(docs, procs))
        if (raised or vanished) and failed_at is None:
            failed_at = now
        if failed_at and now - failed_at > grace:
            return seen, grace
        if "iterate" in phases and now - since > stall:
            return seen, stall
        if now - t0 > timeout:
            return seen, timeout
    return seen, 0.0


def run(
    fn, world: int, timeout: float, *args, env: dict | None = None, stall: float = 60.0, grace: float = 5.0
) -> Ranks:
    """fn(rank, world, port, phase, *args) on `world` spawned ranks (fn: a module-level function); see the module."""
    import multiprocessing

    ctx, t0 = multiprocessing.get_context("spawn"), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="eagle-ranks-") as tmp:
        port = free_port()
        procs = [ctx.Process(target=_rank, args=(fn, r, world, port, tmp, env or {}, args)) for r in range(world)]
        for p in procs:
            p.start()
        try:
            phase, limit = _watch(procs, tmp, timeout, stall, grace)
        finally:  # also on Ctrl-C: no rank outlives its parent
            hung = [r for r, p in enumerate(procs) if p.is_alive()]
            for p in procs:
                p.kill()
                p.join(5)
        docs = [_doc(tmp, r) for r in range(world)]
    errors = {r: d["error"] for r, d in enumerate(docs) if d and "error" in d}
    errors |= {
        r: f"rank {r} exited (code {procs[r].exitcode}) without a result"
        for r, d in enumerate(docs)
        if d is None and r not in hung
    }
    results = [d["result"] if d and "result" in d else None for d in docs]
    return Ranks(getattr(fn, "__name__", "ranks"), results, errors, hung, phase, time.monotonic() - t0, limit)
