"""Results of `make bench`: summary per scenario x variant, markdown table, PNG plot, baseline file and comparison.

A results file is JSONL; each line is bench_serving's own record plus an "eagle" object (see scripts/bench/bench.py).
Per run the client's medians are used (median_ttft_ms, median_itl_ms, median_tpot_ms), the output throughput, the
server's decode tok/s and the accept length; per scenario x variant the table gives the median over repeats with
min-max. The baseline holds those medians; a run regresses when a tok/s median falls more than the allowed
percentage below it, or the accept length more than the allowed amount.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import statistics
from pathlib import Path

from ..lib.errors import UserError
from . import spec_model
from .numbers import num

BASELINE_SCHEMA = "eagle-bench-baseline/1"
DEFAULT_TOK_S_DROP_PCT = 5.0
DEFAULT_ACCEPT_DROP = 0.05
SPREAD_WARN_PCT = 7.0  # run-to-run drift reported for this box class (up to ~7%); more means: rerun
TOK_S_METRICS = ("decode_tok_s", "output_tok_s")
METRICS = ("decode_tok_s", "output_tok_s", "ttft_ms", "itl_ms", "tpot_ms", "accept_length")
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


def _as_float(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def run_metrics(rec: dict) -> dict[str, float | None]:
    e = rec.get("eagle", {})
    al = _as_float(rec.get("accept_length")) or _as_float(e.get("accept_length_metrics"))
    return {"decode_tok_s": _as_float(e.get("decode_tok_s")),
            "output_tok_s": _as_float(rec.get("output_throughput")),
            "ttft_ms": _as_float(rec.get("median_ttft_ms")), "itl_ms": _as_float(rec.get("median_itl_ms")),
            "tpot_ms": _as_float(rec.get("median_tpot_ms")), "accept_length": al}


@dataclasses.dataclass
class Stat:
    median: float
    min: float
    max: float
    values: list[float]


def stat(values: list[float | None]) -> Stat | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return Stat(statistics.median(vals), min(vals), max(vals), vals)


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
    graph: int | None = None  # verify forwards replayed by the decode CUDA graph
    piecewise: int = 0  # ... of `eager`, the ones the piecewise prefill graph took
    setting: dict = dataclasses.field(default_factory=dict)  # a sweep point's drafter and settings
    speculative: bool | None = None

    @property
    def hit_rate(self) -> float | None:
        """Share of verify forwards replayed by their CUDA graph (None without counters or forwards)."""
        if self.graph is None or self.eager is None or not self.graph + self.eager:
            return None
        return self.graph / (self.graph + self.eager)

    @property
    def main(self) -> str:
        """The tok/s metric the table and plot lead with: the server's decode rate when measured."""
        return "decode_tok_s" if self.stats.get("decode_tok_s") else "output_tok_s"

    @property
    def spread_pct(self) -> float | None:
        s = self.stats.get(self.main)
        if s is None or len(s.values) < 2 or not s.median:
            return None
        return 100.0 * (s.max - s.min) / s.median


def verify_totals(verifies: list) -> tuple[int | None, int | None, int, dict[str, int]]:
    """(graph, off-graph, piecewise, fallback reasons) of the target verify over runs; Nones without counters.
    Reads the run records of this harness (fallback_reasons) and of its earlier versions (eager_reasons)."""
    vs = [v for v in verifies if isinstance(v, dict)]
    if not vs:
        return None, None, 0, {}
    reasons: dict[str, int] = {}
    for v in vs:
        for k, n in (v.get("fallback_reasons") or v.get("eager_reasons") or {}).items():
            reasons[k] = reasons.get(k, 0) + int(n)
    pw = sum(int(v.get("piecewise", 0)) for v in vs)
    return (sum(int(v.get("graph", 0)) for v in vs), sum(int(v.get("eager", 0)) for v in vs) + pw, pw, reasons)


def summarize(records: list[dict]) -> list[Row]:
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        e = r["eagle"]
        groups.setdefault((e.get("scenario", "?"), e.get("variant", "?")), []).append(r)
    scen_order = list(dict.fromkeys(r["eagle"].get("scenario", "?") for r in records))
    rows = []
    for (sc, var), recs in groups.items():
        recs = sorted(recs, key=lambda r: (r["eagle"].get("position", 0)))
        per = [run_metrics(r) for r in recs]
        g, off, pw, reasons = verify_totals([r["eagle"].get("verify") for r in recs])
        spec = recs[0]["eagle"].get("variant_spec") or {}
        rows.append(Row(sc, var, recs[0]["eagle"].get("letter", "?"), len(recs),
                        sorted({str(r["eagle"].get("patchset", "unknown")) for r in recs}),
                        {m: stat([p[m] for p in per]) for m in METRICS}, off, reasons,
                        recs[0]["eagle"].get("scenario_spec") or {}, g, pw, spec.get("setting") or {},
                        spec.get("speculative")))
    rows.sort(key=lambda row: (scen_order.index(row.scenario), row.letter, row.variant))
    return rows


# -------------------------------------------------------------------------------------------------------------
# baseline


def make_baseline(rows: list[Row], meta: dict, thresholds: dict) -> dict:
    entries = []
    for r in rows:
        e = {"scenario": r.scenario, "variant": r.variant, "patchset": ",".join(r.patchsets), "n": r.n}
        for m in ("decode_tok_s", "output_tok_s", "accept_length"):
            s = r.stats.get(m)
            e[m] = round(s.median, 4) if s else None
        entries.append(e)
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return {"schema": BASELINE_SCHEMA, "box": meta.get("box"), "git_rev": meta.get("git_rev"),
            "source": meta.get("source"), "created_at": created, "thresholds": thresholds, "entries": entries}


def load_baseline(path: Path) -> dict:
    if not path.is_file():
        raise UserError(f"baseline {path} does not exist; write one with --write-baseline {path} "
                        f"(see bench/baselines/README.md)")
    try:
        d = json.loads(path.read_text())
    except ValueError as e:
        raise UserError(f"baseline {path} is not JSON: {e}") from e
    if not isinstance(d, dict) or d.get("schema") != BASELINE_SCHEMA or not isinstance(d.get("entries"), list):
        raise UserError(f"baseline {path} is not a {BASELINE_SCHEMA} file (see bench/baselines/README.md)")
    for i, e in enumerate(d["entries"]):
        if not isinstance(e, dict) or "scenario" not in e or "variant" not in e:
            raise UserError(f"baseline {path}: entry #{i + 1} needs scenario and variant")
    return d


def thresholds(baseline: dict | None, tok_s_drop_pct: float | None, accept_drop: float | None) -> dict:
    t = dict((baseline or {}).get("thresholds") or {})
    return {"tok_s_drop_pct": float(tok_s_drop_pct if tok_s_drop_pct is not None
                                    else t.get("tok_s_drop_pct", DEFAULT_TOK_S_DROP_PCT)),
            "accept_length_drop": float(accept_drop if accept_drop is not None
                                        else t.get("accept_length_drop", DEFAULT_ACCEPT_DROP))}


@dataclasses.dataclass
class Check:
    scenario: str
    variant: str
    metric: str
    baseline: float | None
    current: float | None
    limit: str
    status: str  # ok | REGRESSION | not measured | not run

    @property
    def change(self) -> str:
        if self.baseline is None or self.current is None:
            return ""
        if self.metric == "accept_length":
            return f"{self.current - self.baseline:+.3f}"
        return f"{100.0 * (self.current - self.baseline) / self.baseline:+.1f}%" if self.baseline else ""

    def line(self) -> str:
        return (f"{self.scenario} / {self.variant}: {LABELS[self.metric]} {num(self.current, small=True)} vs "
                f"baseline {num(self.baseline, small=True)} ({self.change}, limit {self.limit})")


def compare(rows: list[Row], baseline: dict, th: dict) -> list[Check]:
    by_key = {(r.scenario, r.variant): r for r in rows}
    out = []
    pct, drop = th["tok_s_drop_pct"], th["accept_length_drop"]
    for e in baseline["entries"]:
        row = by_key.get((e["scenario"], e["variant"]))
        for m in ("decode_tok_s", "output_tok_s", "accept_length"):
            base = _as_float(e.get(m))
            if base is None:
                continue
            limit = f"-{drop:g}" if m == "accept_length" else f"-{pct:g}%"
            if row is None:
                out.append(Check(e["scenario"], e["variant"], m, base, None, limit, "not run"))
                continue
            s = row.stats.get(m)
            cur = s.median if s else None
            if cur is None:
                status = "not measured"
            elif m == "accept_length":
                status = "REGRESSION" if cur < base - drop - 1e-12 else "ok"
            else:
                status = "REGRESSION" if cur < base * (1.0 - pct / 100.0) else "ok"
            out.append(Check(e["scenario"], e["variant"], m, base, cur, limit, status))
    return out


# -------------------------------------------------------------------------------------------------------------
# markdown


def _cell(s: Stat | None, nd: int = 1) -> str:
    if s is None:
        return "–"
    if len(s.values) == 1:
        return num(s.median, nd, small=True)
    return f"{num(s.median, nd, small=True)} ({num(s.min, nd, small=True)}–{num(s.max, nd, small=True)})"


def hit_cell(r: Row) -> str:
    return "–" if r.hit_rate is None else f"{100 * r.hit_rate:.1f}%"


def markdown(rows: list[Row], meta: dict, checks: list[Check] | None = None, baseline_path: str | None = None) -> str:
    L = [f"# Bench results {meta.get('stem', '')}", ""]
    L.append(f"- box: `{meta.get('box')}` · git: `{meta.get('git_rev')}` · runs: {meta.get('runs')}"
             + (f" (failed: {meta['failed']})" if meta.get("failed") else "")
             + (f" · {meta.get('started_at')} → {meta.get('finished_at')}" if meta.get("started_at") else ""))
    ps = {}
    for r in rows:
        ps.setdefault(r.variant, set()).update(r.patchsets)
    L.append("- patch sets: " + ", ".join(f"{v} `{'/'.join(sorted(p))}`" for v, p in ps.items()))
    L.append("- cells: median over repeats (min–max). decode tok/s: the server's own rate (sglang:gen_throughput, "
             "median of its decode-stats windows during the measured phase); output tok/s, TTFT, ITL, TPOT: "
             "bench_serving (per-run medians); accept length: /server_info after the run; verify graph: share of "
             "target verify forwards replayed by their CUDA graph; off-graph verify: the others, eager or "
             "piecewise (sglang:spec_cuda_graph_forwards_total; – where the server has no counters).")
    L.append("")
    scenarios = list(dict.fromkeys(r.scenario for r in rows))
    for sc in scenarios:
        srows = [r for r in rows if r.scenario == sc]
        spec = srows[0].scenario_spec
        desc = (f" (concurrency {spec.get('max_concurrency')}, {spec.get('num_prompts')} prompts, "
                f"in {spec.get('input_len')} / out {spec.get('output_len')} tokens)") if spec else ""
        L += [f"## {sc}{desc}", ""]
        ref = srows[0]
        L.append("| | variant | patch set | n | decode tok/s | vs " + ref.letter + " | output tok/s | TTFT ms | "
                 "ITL ms | TPOT ms | accept length | verify graph | off-graph verify | spread |")
        L.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in srows:
            m = r.main
            a, b = r.stats.get(m), ref.stats.get(m)
            vs = f"{a.median / b.median:.2f}×" if a and b and b.median else "–"
            if m != "decode_tok_s" and vs != "–":
                vs += " (output)"
            eager = "–" if r.eager is None else (f"**{r.eager}** ⚠" if r.eager else "0")
            sp = r.spread_pct
            spread = "–" if sp is None else (f"{sp:.1f}% ⚠" if sp > SPREAD_WARN_PCT else f"{sp:.1f}%")
            L.append(f"| {r.letter} | {r.variant} | `{'/'.join(r.patchsets)}` | {r.n} | "
                     f"{_cell(r.stats['decode_tok_s'])} | {vs} | {_cell(r.stats['output_tok_s'])} | "
                     f"{_cell(r.stats['ttft_ms'])} | {_cell(r.stats['itl_ms'], 2)} | {_cell(r.stats['tpot_ms'], 2)} | "
                     f"{_cell(r.stats['accept_length'], 3)} | {hit_cell(r)} | {eager} | {spread} |")
        L.append("")
    flagged = [r for r in rows if r.eager]
    if flagged:
        L += ["## ⚠ Verify forwards off their CUDA graph", ""]
        for r in flagged:
            why = ", ".join(f"{k}: {n}" for k, n in sorted(r.eager_reasons.items())) or "no reason given"
            how = f"{r.eager - r.piecewise} eager" + (f", {r.piecewise} piecewise" if r.piecewise else "")
            L.append(f"- {r.scenario} / {r.variant}: {r.eager} verify forwards ran off their CUDA graph ({how}; "
                     f"{why})")
        L.append("")
    noisy = [r for r in rows if (r.spread_pct or 0) > SPREAD_WARN_PCT]
    if noisy:
        L += ["## ⚠ Spread above " + f"{SPREAD_WARN_PCT:g}%", ""]
        L += [f"- {r.scenario} / {r.variant}: repeats spread {r.spread_pct:.1f}% ({LABELS[r.main]}); "
              "more than this box class drifts, so rerun before trusting a difference" for r in noisy]
        L.append("")
    L += sweep_markdown(rows)
    if checks is not None:
        bad = [c for c in checks if c.status == "REGRESSION"]
        L += [f"## Baseline comparison ({baseline_path})", "",
              f"**{len(bad)} regression(s)**" if bad else "No regression.", "",
              "| scenario | variant | metric | baseline | now | change | limit | status |",
              "|---|---|---|---:|---:|---:|---:|---|"]
        for c in checks:
            st = f"**{c.status}**" if c.status == "REGRESSION" else c.status
            L.append(f"| {c.scenario} | {c.variant} | {LABELS[c.metric]} | {num(c.baseline, 2, small=True)} | "
                     f"{num(c.current, 2, small=True)} | {c.change} | {c.limit} | {st} |")
        L.append("")
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
        L += [f"## Sweep: drafters and speculative settings ({sc})", "",
              "| drafter | draft weights | steps/topk/tokens | accept length | decode tok/s | verify graph | "
              "cycle ms | model cycle ms |", "|---|---|---|---:|---:|---:|---:|---:|"]
        v, why = spec_model.verdict(points, t1)
        for r in sorted((r for r in rows if r.scenario == sc and r.setting), key=lambda r: r.variant):
            s = r.setting
            p = next((p for p in points if p.name == r.variant), None)
            model = f"{v.fit.cycle_ms(p):.1f}" if v and p else "–"
            L.append(f"| {s['drafter']} | {s['draft_quantization']} | {s['steps']}/{s['topk']}/{s['draft_tokens']} "
                     f"| {_cell(r.stats['accept_length'], 3)} | {_cell(r.stats['decode_tok_s'])} | {hit_cell(r)} | "
                     f"{f'{p.cycle_ms:.1f}' if p else '–'} | {model} |")
        L += [""] + (v.lines() if v else [f"No cost-model verdict: {why}."]) + [""]
    return L


# -------------------------------------------------------------------------------------------------------------
# plot


def plot(rows: list[Row], path: Path, title: str = "") -> bool:
    """One column per scenario; rows: decode tok/s, output tok/s, accept length (where measured). Bars are the
    median over repeats, dots the repeats. False (and no file) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    scenarios = list(dict.fromkeys(r.scenario for r in rows))
    metrics = [m for m in ("decode_tok_s", "output_tok_s", "accept_length") if any(r.stats.get(m) for r in rows)]
    if not scenarios or not metrics:
        metrics = metrics or ["output_tok_s"]
    variants = list(dict.fromkeys(r.variant for r in sorted(rows, key=lambda r: r.letter)))
    colors = plt.get_cmap("tab10")
    fig, axes = plt.subplots(len(metrics), max(1, len(scenarios)), squeeze=False,
                             figsize=(max(4.0, 1.2 + 0.9 * len(variants)) * max(1, len(scenarios)), 3.2 * len(metrics)))
    for j, sc in enumerate(scenarios):
        for i, m in enumerate(metrics):
            ax = axes[i][j]
            for k, v in enumerate(variants):
                r = next((r for r in rows if r.scenario == sc and r.variant == v), None)
                s = r.stats.get(m) if r else None
                if s is None:
                    continue
                c = colors(k % 10)
                ax.bar(k, s.median, color=c, alpha=0.55, width=0.7)
                ax.errorbar(k, s.median, yerr=[[s.median - s.min], [s.max - s.median]], color="black",
                            capsize=4, lw=1)
                xs = [k + (idx - (len(s.values) - 1) / 2) * 0.12 for idx in range(len(s.values))]
                ax.scatter(xs, s.values, color="black", s=12, zorder=3)
                if r.eager:
                    ax.annotate("eager!", (k, s.median), ha="center", va="bottom", color="red", fontsize=8)
            ax.set_xticks(range(len(variants)))
            ax.set_xticklabels(variants, rotation=20, ha="right", fontsize=8)
            ax.grid(axis="y", alpha=0.3)
            if i == 0:
                ax.set_title(sc)
            if j == 0:
                ax.set_ylabel(LABELS[m])
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
