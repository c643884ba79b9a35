"""The cost model of a speculative setting: what it costs before anything is measured (the prior), and the same
costs fitted to a sweep's measurements with its predicted optimum.

The prior (Prior, prior()): one cycle of steps/topk/draft tokens at batch 1 runs 1 target verify, 1 draft extend
and steps - 1 draft decode forwards, each with the collectives per forward of its stage in the Kimi TP8 table
(bench/inputs/collectives_kimi_tp8.toml, which tests/patches/test_cycle_collectives.py routes through the patched
SGLang: all on PCIe IPC, none on NCCL), each call at PCIe IPC's per-call latency (bench/inputs/cost-model.toml
[per_call] -> a [[setting]] row), plus the memory each forward must read:

    verify_ms(w) = (non_routed_gb + routed_gb_per_expert * E * (1 - (1 - k / E)^w)) / bandwidth   (w = draft tokens)
    draft_ms     = draft_gb / tp / bandwidth per draft forward                                       ([memory])

so each extra verified token costs the routed experts it newly reaches (~1.4 GB, ~0.75 ms per GPU at w = 4): a
wider verify is not free. AL of a chain comes from the per-position acceptance of [acceptance]; tree points
(topk > 1) have no prior AL. It is a floor (no launch gaps, no KV reads, uniform routing): its tok/s are upper
bounds, its ratios between settings are the point.

The fitted model: one speculative cycle serves one stream AL tokens (accept length) in

    cycle_ms = t1 + verify_ms_per_token * (draft_tokens - 1) + draft_ms_per_step[drafter, quantization] * steps

t1: one forward of the target with one token per stream, measured by the reference run without speculation
(1000 / its decode tok/s at the same concurrency: a decode step is a verify of one token); fitted with the rest
when the sweep has no reference. verify_ms_per_token: what each further verified token adds to the verify
forward; draft_ms_per_step: one draft step of that drafter. Both are least-squares fits over the measured cycle
times (1000 * AL / decode tok/s) of every point, so they are measured, not assumed. Chain points alone (draft
tokens = steps + 1) cannot tell the two apart; tree points (topk > 1) can.

The model then predicts every point's tok/s from its measured AL (AL / model cycle) and picks the optimum; the
report says whether the measured optimum is the same point, and which points the model misses most (a verify
off its CUDA graph costs more than the linear model allows: see the hit rate).
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

from ..lib.errors import UserError
from ..lib.repo import PROFILES_DIR, REPO_ROOT, SHIPPED_PROFILE

COLLECTIVES = REPO_ROOT / "bench" / "inputs" / "collectives_kimi_tp8.toml"
PROFILE = PROFILES_DIR / f"{SHIPPED_PROFILE}.toml"  # the cycle that table counts
STAGES = ("target_verify", "draft_decode", "draft_extend")
BACKEND = "pcie_ipc"  # where the series routes every collective of that cycle
OPS = ("all_reduce", "all_gather", "broadcast")


@dataclasses.dataclass(frozen=True)
class Measured:
    """One sweep point at one scenario: the setting and what the runs measured (medians over repeats)."""

    name: str
    drafter: str
    quant: str
    steps: int
    topk: int
    draft_tokens: int
    accept_length: float
    decode_tok_s: float
    hit_rate: float | None = None

    @property
    def group(self) -> str:
        return f"{self.drafter} ({self.quant})"

    @property
    def cycle_ms(self) -> float:
        return 1000.0 * self.accept_length / self.decode_tok_s


@dataclasses.dataclass
class Fit:
    t1_ms: float
    t1_source: str
    verify_ms_per_token: float
    draft_ms_per_step: dict[str, float]
    points: list[Measured]

    def cycle_ms(self, p: Measured) -> float:
        return self.t1_ms + self.verify_ms_per_token * (p.draft_tokens - 1) + self.draft_ms_per_step[p.group] * p.steps

    def tok_s(self, p: Measured) -> float:
        return 1000.0 * p.accept_length / self.cycle_ms(p)


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """x with a x = b (Gaussian elimination, partial pivoting); None when a is singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        piv = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[piv][c]) < 1e-9 * max(1.0, max(abs(x) for row in m for x in row[:n])):
            return None
        m[c], m[piv] = m[piv], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    return [m[i][n] / m[i][i] for i in range(n)]


def fit(points: list[Measured], t1_ms: float | None = None) -> tuple[Fit | None, str]:
    """Least squares of the cycle times; (None, why) when the points cannot determine the model."""
    groups = sorted({p.group for p in points})
    free_t1 = t1_ms is None
    cols = (["t1"] if free_t1 else []) + ["verify"] + groups
    if len(points) < len(cols) + 1:
        return None, f"{len(points)} point(s) for {len(cols)} unknowns: the sweep needs more points"

    def row(p: Measured) -> list[float]:
        return ([1.0] if free_t1 else []) + [p.draft_tokens - 1.0] + [float(p.steps) if g == p.group else 0.0
                                                                      for g in groups]

    rows = [row(p) for p in points]
    ys = [p.cycle_ms - (0.0 if free_t1 else t1_ms) for p in points]
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(len(cols))] for i in range(len(cols))]
    aty = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(len(cols))]
    x = _solve(ata, aty)
    if x is None:
        return None, ("the points cannot separate the verify cost per token from the draft cost per step (chain "
                      "points only: draft tokens - 1 = steps); add tree points (topk > 1)")
    t1 = x.pop(0) if free_t1 else t1_ms
    source = "fitted (no reference run without speculation)" if free_t1 else "measured by the reference run"
    return Fit(t1, source, x[0], dict(zip(groups, x[1:])), points), ""


@dataclasses.dataclass
class Verdict:
    fit: Fit
    predicted: Measured
    measured: Measured
    agrees: bool
    worst: list[tuple[Measured, float]]  # points the model misses most: (point, measured / predicted tok/s - 1)

    def lines(self) -> list[str]:
        f = self.fit
        draft = ", ".join(f"{g} {v:.2f} ms" for g, v in f.draft_ms_per_step.items())
        gap = 100 * (1 - self.predicted.decode_tok_s / self.measured.decode_tok_s)
        out = [f"Cost model over {len(f.points)} point(s): cycle = {f.t1_ms:.2f} ms (t1, {f.t1_source}) + "
               f"{f.verify_ms_per_token:.3f} ms per verified token beyond the first + per draft step: {draft}.",
               f"Predicted optimum: {self.predicted.name} ({f.tok_s(self.predicted):.1f} tok/s predicted, "
               f"{self.predicted.decode_tok_s:.1f} measured). Measured optimum: {self.measured.name} "
               f"({self.measured.decode_tok_s:.1f} tok/s). "
               + ("The sweep agrees with the model." if self.agrees else
                  f"The sweep does NOT agree with the model (the predicted point measured {gap:.1f}% below the "
                  f"best): the linear costs miss something at one of them (look at its verify graph hit rate).")]
        if self.worst:
            out.append("Largest misses (measured vs predicted tok/s): " + ", ".join(
                f"{p.name} {100 * d:+.1f}%" + (f" (verify graph {100 * p.hit_rate:.0f}%)" if p.hit_rate is not None
                                               else "") for p, d in self.worst))
        return out


def verdict(points: list[Measured], t1_ms: float | None = None) -> tuple[Verdict | None, str]:
    """Fit, predict every point, compare the predicted and the measured optimum."""
    f, why = fit(points, t1_ms)
    if f is None:
        return None, why
    predicted = max(points, key=f.tok_s)
    measured = max(points, key=lambda p: p.decode_tok_s)
    misses = sorted(((p, p.decode_tok_s / f.tok_s(p) - 1.0) for p in points), key=lambda x: -abs(x[1]))
    return Verdict(f, predicted, measured, predicted.name == measured.name, [m for m in misses[:3] if
                                                                               abs(m[1]) > 0.02]), ""


# ---------------------------------------------------------------------------------------------------------------
# the prior: collective counts per stage and a memory floor per verify width


def load_cycle(path: Path = COLLECTIVES, profile: Path = PROFILE, mode: str = "greedy") -> dict:
    """The collectives table's counts for one kind of batch (greedy, sampling), per forward of each stage:
    {"tp", "steps", "mode", "stages": {stage: {op: calls per forward}}}. The table counts a cycle of the shipped
    profile (its draft_decode entry covers the steps - 1 draft forwards of one graph): the profile gives the steps
    and the TP size."""
    where = Path(path).name
    try:
        raw, prof = tomllib.loads(Path(path).read_text()), tomllib.loads(Path(profile).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise UserError(f"{e}: the cost model reads bench/inputs/collectives_kimi_tp8.toml and the profile it "
                        f"describes, docker/profiles/kimi-k25-eagle3-tp8.toml") from e
    args = prof.get("args", {})
    steps, tp = args.get("speculative-num-steps"), args.get("tp-size")
    if not (isinstance(steps, int) and steps >= 2 and isinstance(tp, int)):
        raise UserError(f"{Path(profile).name}: needs tp-size and speculative-num-steps >= 2 under [args] (the "
                        f"cycle {where} counts)")
    counts = raw.get("per_forward", {}).get(mode)
    missing = [st for st in STAGES if st not in (counts or {})]
    if missing:
        raise UserError(f"{where}: no [per_forward.{mode}] {missing[0]} = {{ op = count, ... }} (stages: "
                        f"{', '.join(STAGES)}; kinds of batch: {', '.join(raw.get('per_forward', {})) or 'none'})")
    out: dict = {}
    for stage in STAGES:
        bad = [f"{op} = {n!r}" for op, n in counts[stage].items() if op not in OPS or not isinstance(n, int) or n < 0]
        forwards = steps - 1 if stage == "draft_decode" else 1
        bad += [f"{op} = {n} (not a multiple of its {forwards} forwards)" for op, n in counts[stage].items()
                if isinstance(n, int) and n % forwards]
        if bad:
            raise UserError(f"{where}: [per_forward.{mode}] {stage}: {', '.join(bad)}: operations are "
                            f"{', '.join(OPS)}, counts whole numbers >= 0")
        out[stage] = {op: n // forwards for op, n in counts[stage].items()}
    return {"tp": tp, "steps": steps, "mode": mode, "stages": out}


@dataclasses.dataclass(frozen=True)
class Prior:
    """The model of one cycle before measurement, at one per-call latency (us): every call of the table is on PCIe
    IPC (tests/patches/test_cycle_collectives.py routes each through the real code)."""

    stages: dict  # stage -> op -> calls per forward
    tp: int
    per_call_us: float
    memory: dict  # bench/inputs/cost-model.toml [memory]
    acceptance: tuple[float, ...]

    def calls(self, stage: str) -> int:
        return sum(self.stages[stage].values())

    def cycle_calls(self, steps: int) -> dict[str, int]:
        """Calls of one cycle by operation: 1 verify + 1 draft extend + (steps - 1) draft decode forwards."""
        out: dict[str, int] = {}
        for stage, times in (("target_verify", 1), ("draft_extend", 1), ("draft_decode", steps - 1)):
            for op, n in self.stages[stage].items():
                out[op] = out.get(op, 0) + n * times
        return out

    def calls_ms(self, n: int) -> float:
        return n * self.per_call_us / 1000

    def verify_gb(self, width: int) -> float:
        m = self.memory
        distinct = m["experts"] * (1 - (1 - m["experts_per_token"] / m["experts"]) ** width)
        return m["non_routed_gb"] + m["routed_gb_per_expert"] * distinct

    def verify_ms(self, width: int) -> float:
        """Memory floor plus the verify's collectives: one target forward of `width` tokens."""
        return self.verify_gb(width) / self.memory["bandwidth_tb_s"] + self.calls_ms(self.calls("target_verify"))

    def draft_ms(self, steps: int) -> float:
        per_forward = self.memory["draft_gb"] / self.tp / self.memory["bandwidth_tb_s"]
        calls = self.calls("draft_extend") + (steps - 1) * self.calls("draft_decode")
        return steps * per_forward + self.calls_ms(calls)

    def cycle_ms(self, steps: int, draft_tokens: int) -> float:
        return self.verify_ms(draft_tokens) + self.draft_ms(steps)

    def accept_length(self, steps: int, topk: int) -> float | None:
        """AL of a chain from the per-position acceptance; None for a tree or beyond the known positions."""
        if topk != 1 or steps > len(self.acceptance):
            return None
        return 1.0 + sum(self.acceptance[:steps])


def prior(inputs: dict, cycle: dict, bound: str = "low") -> Prior:
    """The prior from bench/inputs/cost-model.toml (`inputs`) and load_cycle(), every call at the low or high end of
    the PCIe-IPC per-call latency ([per_call] pcie_ipc names its [[setting]] row)."""
    rows = {s["key"]: s for s in inputs.get("setting", [])}
    key = inputs.get("per_call", {}).get(BACKEND)
    if key not in rows:
        raise UserError(f"cost-model.toml: no per-call latency for the {BACKEND} collectives of {COLLECTIVES.name}: "
                        f"add {BACKEND} = \"<a [[setting]] key>\" to [per_call]")
    return Prior(cycle["stages"], cycle["tp"], rows[key][bound], inputs["memory"],
                 tuple(inputs["acceptance"]["per_position"]))
