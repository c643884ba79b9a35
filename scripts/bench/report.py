"""Results of `make bench`: the summary per scenario x variant, its markdown tables and the plot of the same rows,
the baseline file and the comparison with it.

A results file is JSONL: bench_serving's own record plus an "eagle" object (scripts/bench/bench.py). Per run: the
client's medians (TTFT, ITL, TPOT), its output throughput, the server's decode tok/s and the accept length; per
scenario x variant the median over repeats with min-max. A baseline holds those medians; a run regresses when a
tok/s median falls more than the allowed percentage below it, or the accept length more than the allowed amount.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import statistics
from pathlib import Path

from ..lib.errors import UserError
from ..lib.table import md_table
from . import spec_model
from .numbers import num

BASELINE_SCHEMA = "eagle-bench-baseline/1"
DEFAULT_THRESHOLDS = {"tok_s_drop_pct": 5.0, "accept_length_drop": 0.05}
SPREAD_WARN_PCT = 7.0  # run-to-run drift reported for this box class (up to ~7%); more means: rerun
METRICS = ("decode_tok_s", "output_tok_s", "ttft_ms", "itl_ms", "tpot_ms", "accept_length")
BASELINE_METRICS = ("decode_tok_s", "output_tok_s", "accept_length")
LABELS = {"decode_tok_s": "decode tok/s", "output_tok_s": "output tok/s", "ttft_ms": "TTFT ms",
          "itl_ms": "ITL ms", "tpot_ms": "TPOT ms", "accept_length": "accept length"}


def load_results(path: Path) -> list[dict]:
    if not path.is_file():
        raise UserError(f"{path} does not exist")
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise UserError(f"{path}:{i} is not JSON: {e}") from e
        if not isinstance(rec, dict) or not isinstance(rec.get("eagle"), dict):
            raise UserError(f"{path}:{i} has no \"eagle\" object: not a scripts.bench results file")
        out.append(rec)
    return out


def _f(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def run_metrics(rec: dict) -> dict[str, float | None]:
    e = rec.get("eagle", {})
    return {"decode_tok_s": _f(e.get("decode_tok_s")), "output_tok_s": _f(rec.get("output_throughput")),
            "ttft_ms": _f(rec.get("median_ttft_ms")), "itl_ms": _f(rec.get("median_itl_ms")),
            "tpot_ms": _f(rec.get("median_tpot_ms")),
            "accept_length": _f(rec.get("accept_length")) or _f(e.get("accept_length_metrics"))}


@dataclasses.dataclass
class Stat:
    median: float
    min: float
    max: float
    values: list[float]


def stat(values: list[float | None]) -> Stat | None:
    vals = [v for v in values if v is not None]
    return Stat(statistics.median(vals), min(vals), max(vals), vals) if vals else None


@dataclasses.dataclass
class Row:
    scenario: str
    variant: str
    letter: str
    n: int
    patchsets: list[str]
    stats: dict[str, Stat | None]
    eager: int | None  # verify forwards off their CUDA graph (eager or piecewise), all repeats; None: no counters
    eager_reasons: dict[str, int]  # the fallback reasons of those forwards
    scenario_spec: dict
    graph: int | None = None  # verify forwards replayed by their CUDA graph
    piecewise: int = 0  # of `eager`, the ones the piecewise graph took
    setting: dict = dataclasses.field(default_factory=dict)  # a sweep point's drafter and settings
    speculative: bool | None = None

    @property
    def hit_rate(self) -> float | None:
        """Share of verify forwards replayed by their CUDA graph (None without counters or forwards)."""
        total = (self.graph or 0) + (self.eager or 0)
        return self.graph / total if self.graph is not None and total else None

    @property
    def main(self) -> str:
        """The tok/s metric the table and plot lead with: the server's decode rate when measured."""
        return "decode_tok_s" if self.stats.get("decode_tok_s") else "output_tok_s"

    @property
    def spread_pct(self) -> float | None:
        s = self.stats.get(self.main)
        return 100.0 * (s.max - s.min) / s.median if s and len(s.values) > 1 and s.median else None


def summarize(records: list[dict]) -> list[Row]:
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((r["eagle"].get("scenario", "?"), r["eagle"].get("variant", "?")), []).append(r)
    order = list(dict.fromkeys(r["eagle"].get("scenario", "?") for r in records))
    rows = []
    for (sc, var), recs in groups.items():
        es = [r["eagle"] for r in sorted(recs, key=lambda r: r["eagle"].get("position", 0))]
        vs = [e["verify"] for e in es if isinstance(e.get("verify"), dict)]
        reasons: dict[str, int] = {}
        for v in vs:  # fallback_reasons; eager_reasons in records of earlier versions
            for k, n in (v.get("fallback_reasons") or v.get("eager_reasons") or {}).items():
                reasons[k] = reasons.get(k, 0) + int(n)
        pw = sum(int(v.get("piecewise", 0)) for v in vs)
        per = [run_metrics(r) for r in recs]
        spec = es[0].get("variant_spec") or {}
        rows.append(Row(sc, var, es[0].get("letter", "?"), len(recs),
                        sorted({str(e.get("patchset", "unknown")) for e in es}),
                        {m: stat([x[m] for x in per]) for m in METRICS},
                        sum(int(v.get("eager", 0)) for v in vs) + pw if vs else None, reasons,
                        es[0].get("scenario_spec") or {}, sum(int(v.get("graph", 0)) for v in vs) if vs else None,
                        pw, spec.get("setting") or {}, spec.get("speculative")))
    return sorted(rows, key=lambda row: (order.index(row.scenario), row.letter, row.variant))


def make_baseline(rows: list[Row], meta: dict, thresholds: dict) -> dict:
    entries = [{"scenario": r.scenario, "variant": r.variant, "patchset": ",".join(r.patchsets), "n": r.n,
                **{m: round(s.median, 4) if (s := r.stats.get(m)) else None for m in BASELINE_METRICS}} for r in rows]
    return {"schema": BASELINE_SCHEMA, "box": meta.get("box"), "git_rev": meta.get("git_rev"),
            "source": meta.get("stem"), "thresholds": thresholds, "entries": entries,
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def load_baseline(path: Path) -> dict:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"baseline {path}: {e}; write one with --write-baseline {path} "
                        f"(bench/baselines/README.md)") from e
    if not isinstance(d, dict) or d.get("schema") != BASELINE_SCHEMA or not all(
            isinstance(e, dict) and "scenario" in e and "variant" in e for e in d.get("entries") or [None]):
        raise UserError(f"baseline {path} is not a {BASELINE_SCHEMA} file (bench/baselines/README.md)")
    return d


def thresholds(baseline: dict | None, tok_s_drop_pct: float | None, accept_drop: float | None) -> dict:
    """The command line's, else the baseline's, else the defaults."""
    t = {**DEFAULT_THRESHOLDS, **((baseline or {}).get("thresholds") or {})}
    given = {"tok_s_drop_pct": tok_s_drop_pct, "accept_length_drop": accept_drop}
    return {k: float(given[k] if given[k] is not None else t[k]) for k in DEFAULT_THRESHOLDS}


@dataclasses.dataclass
class BaselineCheck:
    scenario: str
    variant: str
    metric: str
    baseline: float | None
    current: float | None
    limit: str
    status: str  # ok | REGRESSION | not measured | not run

    @property
    def change(self) -> str:
        if self.baseline is None or self.current is None or not self.baseline:
            return ""
        if self.metric == "accept_length":
            return f"{self.current - self.baseline:+.3f}"
        return f"{100.0 * (self.current - self.baseline) / self.baseline:+.1f}%"

    def line(self) -> str:
        return (f"{self.scenario} / {self.variant}: {LABELS[self.metric]} {num(self.current, small=True)} vs "
                f"baseline {num(self.baseline, small=True)} ({self.change}, limit {self.limit})")


def compare(rows: list[Row], baseline: dict, th: dict) -> list[BaselineCheck]:
    by_key, out = {(r.scenario, r.variant): r for r in rows}, []
    pct, drop = th["tok_s_drop_pct"], th["accept_length_drop"]
    for e in baseline["entries"]:
        row = by_key.get((e["scenario"], e["variant"]))
        for m in (m for m in BASELINE_METRICS if _f(e.get(m)) is not None):
            base, s = _f(e[m]), row.stats.get(m) if row else None
            floor = base - drop - 1e-12 if m == "accept_length" else base * (1.0 - pct / 100.0)
            status = "not run" if row is None else "not measured" if s is None else (
                "REGRESSION" if s.median < floor else "ok")
            out.append(BaselineCheck(e["scenario"], e["variant"], m, base, s.median if s else None,
                                     f"-{drop:g}" if m == "accept_length" else f"-{pct:g}%", status))
    return out


def _cell(s: Stat | None, nd: int = 1) -> str:
    if s is None:
        return "–"
    m = num(s.median, nd, small=True)
    return m if len(s.values) == 1 else f"{m} ({num(s.min, nd, small=True)}–{num(s.max, nd, small=True)})"


def hit_cell(r: Row) -> str:
    return "–" if r.hit_rate is None else f"{100 * r.hit_rate:.1f}%"


def _row(r: Row, ref: Row) -> list:
    a, b = r.stats.get(r.main), ref.stats.get(r.main)
    vs = f"{a.median / b.median:.2f}×" + (" (output)" if r.main != "decode_tok_s" else "") if a and b and b.median \
        else "–"
    sp = r.spread_pct
    return [r.letter, r.variant, f"`{'/'.join(r.patchsets)}`", r.n, _cell(r.stats["decode_tok_s"]), vs,
            _cell(r.stats["output_tok_s"]), _cell(r.stats["ttft_ms"]), _cell(r.stats["itl_ms"], 2),
            _cell(r.stats["tpot_ms"], 2), _cell(r.stats["accept_length"], 3), hit_cell(r),
            "–" if r.eager is None else (f"**{r.eager}** ⚠" if r.eager else "0"),
            "–" if sp is None else f"{sp:.1f}%" + (" ⚠" if sp > SPREAD_WARN_PCT else "")]


def markdown(rows: list[Row], meta: dict, checks: list[BaselineCheck] | None = None,
             baseline_path: str | None = None) -> str:
    patchsets: dict[str, set] = {}
    for r in rows:
        patchsets.setdefault(r.variant, set()).update(r.patchsets)
    L = [f"# Bench results {meta.get('stem', '')}", "",
         f"- box: `{meta.get('box')}` · git: `{meta.get('git_rev')}` · runs: {meta.get('runs')}"
         + (f" (failed: {meta['failed']})" if meta.get("failed") else "")
         + (f" · {meta.get('started_at')} → {meta.get('finished_at')}" if meta.get("started_at") else ""),
         "- patch sets: " + ", ".join(f"{v} `{'/'.join(sorted(p))}`" for v, p in patchsets.items()),
         "- cells: median over repeats (min–max). decode tok/s: the server's own rate (sglang:gen_throughput, median "
         "of its decode-stats windows during the measured phase); output tok/s, TTFT, ITL, TPOT: bench_serving; "
         "accept length: bench_serving's, else the server's counters; verify graph: share of target verify forwards "
         "replayed by their CUDA graph; off-graph verify: the others, eager or piecewise (– without counters).", ""]
    for sc in dict.fromkeys(r.scenario for r in rows):
        srows = [r for r in rows if r.scenario == sc]
        spec = srows[0].scenario_spec
        L += [f"## {sc}" + (f" (concurrency {spec.get('max_concurrency')}, {spec.get('num_prompts')} prompts, in "
                            f"{spec.get('input_len')} / out {spec.get('output_len')} tokens)" if spec else ""), "",
              md_table(["", "variant", "patch set", "n", "decode tok/s", f"vs {srows[0].letter}", "output tok/s",
                        "TTFT ms", "ITL ms", "TPOT ms", "accept length", "verify graph", "off-graph verify",
                        "spread"], [_row(r, srows[0]) for r in srows], "lllrrrrrrrrrrr"), ""]
    flagged = [r for r in rows if r.eager]
    L += ["## ⚠ Verify forwards off their CUDA graph", ""] * bool(flagged) + [
        f"- {r.scenario} / {r.variant}: {r.eager} verify forwards ran off their CUDA graph ({r.eager - r.piecewise} "
        f"eager" + (f", {r.piecewise} piecewise" if r.piecewise else "") + "; " + (", ".join(
            f"{k}: {n}" for k, n in sorted(r.eager_reasons.items())) or "no reason given") + ")" for r in flagged]
    noisy = [r for r in rows if (r.spread_pct or 0) > SPREAD_WARN_PCT]
    L += ["", f"## ⚠ Spread above {SPREAD_WARN_PCT:g}%", ""] * bool(noisy) + [
        f"- {r.scenario} / {r.variant}: repeats spread {r.spread_pct:.1f}% ({LABELS[r.main]}); more than this box "
        f"class drifts, so rerun before trusting a difference" for r in noisy]
    L += [""] + sweep_markdown(rows)
    if checks is not None:
        bad = sum(c.status == "REGRESSION" for c in checks)
        L += [f"## Baseline comparison ({baseline_path})", "", f"**{bad} regression(s)**" if bad else "No regression.",
              "", md_table(["scenario", "variant", "metric", "baseline", "now", "change", "limit", "status"], [
                  [c.scenario, c.variant, LABELS[c.metric], num(c.baseline, 2, small=True),
                   num(c.current, 2, small=True), c.change, c.limit,
                   f"**{c.status}**" if c.status == "REGRESSION" else c.status] for c in checks], "lllrrrrl"), ""]
    return "\n".join(L)


# -------------------------------------------------------------------------------------------------------------
# the sweep: AL, decode tok/s and verify graph hit rate per setting, and the cost model's verdict


def sweep_points(rows: list[Row], scenario: str) -> tuple[list[spec_model.Measured], float | None]:
    """The measured sweep points of one scenario, and t1 (ms) from its reference run without speculation."""
    points = []
    for r in rows:
        s, al, tps = r.setting, r.stats.get("accept_length"), r.stats.get("decode_tok_s")
        if r.scenario == scenario and s and al and tps and tps.median > 0:
            points.append(spec_model.Measured(r.variant, s["drafter"], s["draft_quantization"], s["steps"], s["topk"],
                                              s["draft_tokens"], al.median, tps.median, r.hit_rate))
    refs = [r.stats["decode_tok_s"].median for r in rows if r.scenario == scenario and r.speculative is False
            and r.stats.get("decode_tok_s")]
    return points, (1000.0 / max(refs) if refs else None)


def sweep_markdown(rows: list[Row]) -> list[str]:
    L: list[str] = []
    for sc in dict.fromkeys(r.scenario for r in rows if r.setting):
        points, t1 = sweep_points(rows, sc)
        v, why = spec_model.verdict(points, t1)
        table = []
        for r in sorted((r for r in rows if r.scenario == sc and r.setting), key=lambda r: r.variant):
            s, p = r.setting, next((p for p in points if p.name == r.variant), None)
            table.append([s["drafter"], s["draft_quantization"], f"{s['steps']}/{s['topk']}/{s['draft_tokens']}",
                          _cell(r.stats["accept_length"], 3), _cell(r.stats["decode_tok_s"]), hit_cell(r),
                          f"{p.cycle_ms:.1f}" if p else "–", f"{v.fit.cycle_ms(p):.1f}" if v and p else "–"])
        L += [f"## Sweep: drafters and speculative settings ({sc})", "", md_table(
            ["drafter", "draft weights", "steps/topk/tokens", "accept length", "decode tok/s", "verify graph",
             "cycle ms", "model cycle ms"], table, "lllrrrrr"), ""]
        L += (v.lines() if v else [f"No cost-model verdict: {why}."]) + [""]
    return L


# -------------------------------------------------------------------------------------------------------------
# plot


def plot(rows: list[Row], path: Path, title: str = "") -> bool:
    """The rows the tables print: one column per scenario, one panel per metric measured (decode tok/s, output
    tok/s, accept length); bars the median over repeats, dots the repeats. False (no file) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    scenarios = list(dict.fromkeys(r.scenario for r in rows))
    metrics = [m for m in BASELINE_METRICS if any(r.stats.get(m) for r in rows)] or ["output_tok_s"]
    variants = list(dict.fromkeys(r.variant for r in sorted(rows, key=lambda r: r.letter)))
    fig, axes = plt.subplots(len(metrics), len(scenarios), squeeze=False, figsize=(
        max(4.0, 1.2 + 0.9 * len(variants)) * len(scenarios), 3.2 * len(metrics)))
    for (i, m), (j, sc) in ((im, js) for im in enumerate(metrics) for js in enumerate(scenarios)):
        ax = axes[i][j]
        for k, r in enumerate(next((r for r in rows if r.scenario == sc and r.variant == v), None) for v in variants):
            if s := (r.stats.get(m) if r else None):
                ax.bar(k, s.median, color=plt.get_cmap("tab10")(k % 10), alpha=0.55, width=0.7)
                ax.errorbar(k, s.median, yerr=[[s.median - s.min], [s.max - s.median]], color="black", capsize=4)
                ax.scatter([k + (x - (len(s.values) - 1) / 2) * 0.12 for x in range(len(s.values))], s.values,
                           color="black", s=12, zorder=3)
                if r.eager:
                    ax.annotate("eager!", (k, s.median), ha="center", va="bottom", color="red", fontsize=8)
        ax.set_xticks(range(len(variants)), variants, rotation=20, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.set(title=sc if i == 0 else "", ylabel=LABELS[m] if j == 0 else "")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
