"""The cost model of a speculative setting, fitted to a sweep's measurements, and its predicted optimum.

One speculative cycle serves one stream AL tokens (accept length) in

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
