"""Results of `make bench`: the summary per scenario x variant, its markdown tables and the plot of the same rows,
the baseline file and the comparison with it; publish() writes them all beside a results file.

A results file is JSONL: bench_serving's own record plus an "eagle" object (scripts/bench/bench.py). Per run: the
client's medians (TTFT, ITL, TPOT), its output throughput, the server's decode tok/s and the accept length; per
scenario x variant the median over repeats with min-max. A baseline holds those medians; a run regresses when a
tok/s median falls more than the allowed percentage below it, or the accept length more than the allowed amount.
"""

import dataclasses
import json
import statistics
import sys
from pathlib import Path

from ..box.results import iso, write_json
from ..lib.errors import UserError
from ..lib.progress import say
from ..lib.repo import REPO_ROOT
from ..lib.table import md_table, num

BASELINES_DIR = REPO_ROOT / "bench" / "baselines"
BASELINE_SCHEMA = "eagle-bench-baseline/1"
DEFAULT_THRESHOLDS = {"tok_s_drop_pct": 5.0, "accept_length_drop": 0.05}
METRICS = ("decode_tok_s", "output_tok_s", "ttft_ms", "itl_ms", "tpot_ms", "accept_length")
BASELINE_METRICS = ("decode_tok_s", "output_tok_s", "accept_length")
RANDOM = ("random", "random-ids")  # bench_serving's datasets of random tokens: no prompt set
LABELS = {
    "decode_tok_s": "decode tok/s",
    "output_tok_s": "output tok/s",
    "ttft_ms": "TTFT ms",
    "itl_ms": "ITL ms",
    "tpot_ms": "TPOT ms",
    "accept_length": "accept length",
}


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
            raise UserError(f'{path}:{i} has no "eagle" object: not a scripts.bench results file')
        out.append(rec)
    return out


def _f(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def run_metrics(rec: dict) -> dict[str, float | None]:
    e = rec.get("eagle", {})
    return {
        "decode_tok_s": _f(e.get("decode_tok_s")),
        "output_tok_s": _f(rec.get("output_throughput")),
        "ttft_ms": _f(rec.get("median_ttft_ms")),
        "itl_ms": _f(rec.get("median_itl_ms")),
        "tpot_ms": _f(rec.get("median_tpot_ms")),
        "accept_length": _f(rec.get("accept_length")) or _f(e.get("accept_length_metrics")),
    }


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
        rows.append(
            Row(
                scenario=sc,
                variant=var,
                letter=es[0].get("letter", "?"),
                n=len(recs),
                patchsets=sorted({str(e.get("patchset", "unknown")) for e in es}),
                stats={m: stat([x[m] for x in per]) for m in METRICS},
                eager=sum(int(v.get("eager", 0)) for v in vs) + pw if vs else None,
                eager_reasons=reasons,
                scenario_spec=es[0].get("scenario_spec") or {},
                graph=sum(int(v.get("graph", 0)) for v in vs) if vs else None,
                piecewise=pw,
                setting=spec.get("setting") or {},
                speculative=spec.get("speculative"),
            )
        )
    return sorted(rows, key=lambda row: (order.index(row.scenario), row.letter, row.variant))


def make_baseline(rows: list[Row], meta: dict, thresholds: dict) -> dict:
    entries = []
    for r in rows:
        medians = {m: round(s.median, 4) if (s := r.stats.get(m)) else None for m in BASELINE_METRICS}
        entries.append(
            {"scenario": r.scenario, "variant": r.variant, "patchset": ",".join(r.patchsets), "n": r.n, **medians}
        )
    head = {"schema": BASELINE_SCHEMA, "box": meta.get("box"), "git_rev": meta.get("git_rev")}
    return head | {"source": meta.get("stem"), "thresholds": thresholds, "entries": entries, "created_at": iso()}


def load_baseline(path: Path) -> dict:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(
            f"baseline {path}: {e}; write one with --write-baseline {path} (bench/baselines/README.md)"
        ) from e
    entries = d.get("entries") if isinstance(d, dict) else None
    keyed = all(isinstance(e, dict) and "scenario" in e and "variant" in e for e in entries or [None])
    if not isinstance(d, dict) or d.get("schema") != BASELINE_SCHEMA or not keyed:
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
        return (
            f"{self.scenario} / {self.variant}: {LABELS[self.metric]} {num(self.current, small=True)} vs "
            f"baseline {num(self.baseline, small=True)} ({self.change}, limit {self.limit})"
        )


def compare(rows: list[Row], baseline: dict, th: dict) -> list[BaselineCheck]:
    by_key, out = {(r.scenario, r.variant): r for r in rows}, []
    pct, drop = th["tok_s_drop_pct"], th["accept_length_drop"]
    for e in baseline["entries"]:
        row = by_key.get((e["scenario"], e["variant"]))
        for m in (m for m in BASELINE_METRICS if _f(e.get(m)) is not None):
            base, s = _f(e[m]), row.stats.get(m) if row else None
            floor = base - drop - 1e-12 if m == "accept_length" else base * (1.0 - pct / 100.0)
            status = "not run" if row is None else "not measured" if s is None else "ok"
            if s is not None and s.median < floor:
                status = "REGRESSION"
            limit = f"-{drop:g}" if m == "accept_length" else f"-{pct:g}%"
            out.append(BaselineCheck(e["scenario"], e["variant"], m, base, s.median if s else None, limit, status))
    return out


def _cell(s: Stat | None, nd: int = 1) -> str:
    if s is None:
        return "–"
    m = num(s.median, nd, small=True)
    return m if len(s.values) == 1 else f"{m} ({num(s.min, nd, small=True)}–{num(s.max, nd, small=True)})"


def hit_cell(r: Row) -> str:
    return "–" if r.hit_rate is None else f"{100 * r.hit_rate:.1f}%"


def _row(r: Row, ref: Row) -> str:
    a, b, st = r.stats.get(r.main), ref.stats.get(r.main), r.stats
    vs = "–"
    if a and b and b.median:
        vs = f"{a.median / b.median:.2f}×" + (" (output)" if r.main != "decode_tok_s" else "")
    off = "–" if r.eager is None else (f"**{r.eager}** ⚠" if r.eager else "0")
    return (
        f"{r.letter} | {r.variant} | `{'/'.join(r.patchsets)}` | {r.n} | {_cell(st['decode_tok_s'])} | {vs} | "
        f"{_cell(st['output_tok_s'])} | {_cell(st['ttft_ms'])} | {_cell(st['itl_ms'], 2)} | "
        f"{_cell(st['tpot_ms'], 2)} | {_cell(st['accept_length'], 3)} | {hit_cell(r)} | {off}"
    )


CELLS = (
    "- cells: median over repeats (min–max). decode tok/s: the server's own rate (sglang:gen_throughput, median "
    "of its decode-stats windows during the measured phase); output tok/s, TTFT, ITL, TPOT: bench_serving; accept "
    "length: bench_serving's, else the server's counters; verify graph: share of target verify forwards replayed "
    "by their CUDA graph; off-graph verify: the others, eager or piecewise (– without counters)."
)


def markdown(
    rows: list[Row], meta: dict, checks: list[BaselineCheck] | None = None, baseline_path: str | None = None
) -> str:
    patchsets: dict[str, set] = {}
    for r in rows:
        patchsets.setdefault(r.variant, set()).update(r.patchsets)
    runs = f"- box: `{meta.get('box')}` · git: `{meta.get('git_rev')}` · runs: {meta.get('runs')}"
    if meta.get("failed"):
        runs += f" (failed: {meta['failed']})"
    if meta.get("started_at"):
        runs += f" · {meta.get('started_at')} → {meta.get('finished_at')}"
    shown = ", ".join(f"{v} `{'/'.join(sorted(p))}`" for v, p in patchsets.items())
    out = [f"# Bench results {meta.get('stem', '')}", "", runs, f"- patch sets: {shown}", CELLS, ""]
    for sc in dict.fromkeys(r.scenario for r in rows):
        out += scenario_markdown([r for r in rows if r.scenario == sc])
    out += accept_markdown(rows)
    flagged = [r for r in rows if r.eager]
    if flagged:
        out += ["## ⚠ Verify forwards off their CUDA graph", ""]
    for r in flagged:
        reasons = ", ".join(f"{k}: {n}" for k, n in sorted(r.eager_reasons.items())) or "no reason given"
        piecewise = f", {r.piecewise} piecewise" if r.piecewise else ""
        out.append(
            f"- {r.scenario} / {r.variant}: {r.eager} verify forwards ran off their CUDA graph "
            f"({r.eager - r.piecewise} eager{piecewise}; {reasons})"
        )
    out += [""] + sweep_markdown(rows)
    if checks is not None:
        bad = sum(c.status == "REGRESSION" for c in checks)
        cells = []
        for c in checks:
            status = f"**{c.status}**" if c.status == "REGRESSION" else c.status
            cells.append(
                f"{c.scenario} | {c.variant} | {LABELS[c.metric]} | {num(c.baseline, 2, small=True)} | "
                f"{num(c.current, 2, small=True)} | {c.change} | {c.limit} | {status}"
            )
        table = md_table("scenario | variant | metric | baseline | now | change | limit | status", cells, "lllrrrrl")
        said = f"**{bad} regression(s)**" if bad else "No regression."
        out += [f"## Baseline comparison ({baseline_path})", "", said, "", table, ""]
    return "\n".join(out)


def accept_by_set(rows: list[Row]) -> dict[str, dict[str, Stat]]:
    """Accept length per variant and prompt set: a scenario reading prompts (docker/prompts/), not random ids."""
    out: dict[str, dict[str, Stat]] = {}
    for r in rows:
        if (al := r.stats.get("accept_length")) and r.scenario_spec.get("dataset_name") not in (None, *RANDOM):
            out.setdefault(r.variant, {})[r.scenario] = al
    return out


def accept_markdown(rows: list[Row]) -> list[str]:
    by = accept_by_set(rows)
    sets = list(dict.fromkeys(s for x in by.values() for s in x))
    table = md_table(f"variant | {' | '.join(sets)}", [[v, *(_cell(x.get(s), 3) for s in sets)] for v, x in by.items()])
    return ["## Accept length per prompt set", "", table, ""] if by else []


def scenario_markdown(srows: list[Row]) -> list[str]:
    """One scenario's table: every variant against the first."""
    spec, first = srows[0].scenario_spec, srows[0].letter
    title = f"## {srows[0].scenario}"
    if spec:
        title += (
            f" (concurrency {spec.get('max_concurrency')}, {spec.get('num_prompts')} prompts, in "
            f"{spec.get('input_len')} / out {spec.get('output_len')} tokens)"
        )
    header = (
        f" | variant | patch set | n | decode tok/s | vs {first} | output tok/s | TTFT ms | ITL ms | TPOT ms | accept "
        "length | verify graph | off-graph verify"
    )
    return [title, "", md_table(header, [_row(r, srows[0]) for r in srows], "lllrrrrrrrrrr"), ""]


@dataclasses.dataclass(frozen=True)
class Judging:
    """What judges a report: the baseline to compare with (--baseline [FILE]) and the one to write (--write-baseline
    [FILE]), each None when not asked and "" for bench/baselines/<box>.json; the allowed drops (None: the baseline's,
    else the defaults); whether a verify forward off its CUDA graph fails the run (--fail-on-eager)."""

    baseline: str | None = None
    write_baseline: str | None = None
    max_tok_s_drop: float | None = None
    max_accept_drop: float | None = None
    fail_on_eager: bool = False


def baseline_path(given: str | None, box: str) -> Path | None:
    if given is None:
        return None
    return Path(given) if given else BASELINES_DIR / f"{box}.json"


def publish(records: list[dict], stem: Path, meta: dict, judging: Judging) -> bool:
    """The .md and .png beside the results (stem), the baseline comparison and writing. True when the run fails its
    judging: a regression, or (fail_on_eager) a verify forward off its CUDA graph."""
    base, write = (baseline_path(f, meta.get("box")) for f in (judging.baseline, judging.write_baseline))
    rows = summarize(records)
    baseline = load_baseline(base) if base else None
    th = thresholds(baseline, judging.max_tok_s_drop, judging.max_accept_drop)
    checks = compare(rows, baseline, th) if baseline else None
    stem.with_suffix(".md").write_text(markdown(rows, meta, checks, str(base)))
    drawn = plot(rows, stem.with_suffix(".png"), title=stem.name)
    no_plot = " (no plot: no matplotlib here; make bench uses .venv's python, make setup)"
    say(f"report: {stem.with_suffix('.md')}" + (f" and {stem.with_suffix('.png')}" if drawn else no_plot))
    for r in (r for r in rows if r.eager):
        reasons = ", ".join(f"{k}: {n}" for k, n in sorted(r.eager_reasons.items()))
        say(f"⚠ {r.scenario} / {r.variant}: {r.eager} verify forward(s) off their CUDA graph: {reasons}")
    bad = [c for c in checks or [] if c.status == "REGRESSION"]
    for c in bad:
        print(f"REGRESSION against {base}: {c.line()}", file=sys.stderr)
    if checks is not None and not bad:
        say(f"no regression against {base} ({sum(c.status == 'ok' for c in checks)} checks)")
    if write:
        medians = make_baseline(rows, meta, th)
        write_json(write, medians)
        say(f"baseline written: {write}")
    return bool(bad) or judging.fail_on_eager and any(r.eager for r in rows)


def rebuild(path: Path, judging: Judging, box: str | None = None) -> bool:
    """--report: the report of a results file made again, and judged (box: the records' unless given)."""
    records = load_results(path)
    if not records:
        raise UserError(f"{path} holds no runs")
    first, last = records[0]["eagle"], records[-1]["eagle"]
    meta = {"stem": path.stem, "box": box or first.get("box"), "git_rev": first.get("git_rev"), "runs": len(records)}
    meta |= {"started_at": first.get("started_at"), "finished_at": last.get("finished_at")}
    return publish(records, path.with_suffix(""), meta, judging)


# -------------------------------------------------------------------------------------------------------------
# the sweep: AL, decode tok/s and verify graph hit rate per setting, and the fit of its cycles


@dataclasses.dataclass(frozen=True)
class Point:
    """One sweep setting at one scenario: medians over its repeats; group: drafter (draft weights)."""

    name: str
    group: str
    steps: int
    draft_tokens: int
    accept_length: float
    decode_tok_s: float
    hit_rate: float | None

    @property
    def cycle_ms(self) -> float:
        return 1000.0 * self.accept_length / self.decode_tok_s


def sweep_points(rows: list[Row], scenario: str) -> tuple[list[Point], float | None]:
    """The measured sweep points of one scenario, and t1 (ms) from its reference run without speculation."""
    points = []
    for r in rows:
        s, al, tps = r.setting, r.stats.get("accept_length"), r.stats.get("decode_tok_s")
        if r.scenario == scenario and s and al and tps and tps.median > 0:
            group = f"{s['drafter']} ({s['draft_quantization']})"
            points.append(Point(r.variant, group, s["steps"], s["draft_tokens"], al.median, tps.median, r.hit_rate))
    refs = [
        r.stats["decode_tok_s"].median
        for r in rows
        if r.scenario == scenario and r.speculative is False and r.stats.get("decode_tok_s")
    ]
    return points, (1000.0 / max(refs) if refs else None)


def fit(points: list[Point], t1: float | None) -> tuple[dict | None, str]:
    """Least squares of cycle = t1 + per_token x (draft tokens - 1) + per_step[group] x steps over the measured
    cycles (t1 fitted too when no run without speculation gave it); (None, why) when the points cannot say."""
    groups, free = sorted({p.group for p in points}), t1 is None
    n = int(free) + 1 + len(groups)
    if len(points) < n + 1:
        return None, f"{len(points)} point(s) for {n} unknowns: the sweep needs more points"
    import numpy as np

    design = np.array(
        [[1.0] * free + [p.draft_tokens - 1.0] + [float(p.steps) * (g == p.group) for g in groups] for p in points]
    )
    cycles = np.array([p.cycle_ms - (0.0 if free else t1) for p in points])
    solved, _, rank, _ = np.linalg.lstsq(design, cycles, rcond=None)
    if rank < n:
        return None, (
            "the points cannot separate the verify cost per token from the draft cost per step (chain "
            "points only: draft tokens - 1 = steps); add tree points (topk > 1)"
        )
    x = [float(v) for v in solved]
    t1 = x.pop(0) if free else t1
    return {
        "t1": t1,
        "source": "fitted (no reference run without speculation)" if free else "measured by the reference run",
        "per_token": x[0],
        "per_step": dict(zip(groups, x[1:])),
    }, ""


def model_cycle(f: dict, p: Point) -> float:
    return f["t1"] + f["per_token"] * (p.draft_tokens - 1) + f["per_step"][p.group] * p.steps


def verdict(points: list[Point], f: dict) -> list[str]:
    """The fit, the predicted against the measured optimum, and the points the model misses most."""
    tok = lambda p: 1000.0 * p.accept_length / model_cycle(f, p)  # noqa: E731
    pr, me = max(points, key=tok), max(points, key=lambda p: p.decode_tok_s)
    steps = ", ".join(f"{g} {v:.2f} ms" for g, v in f["per_step"].items())
    agree = "The sweep agrees with the model."
    if pr.name != me.name:
        below = 100 * (1 - pr.decode_tok_s / me.decode_tok_s)
        agree = (
            f"The sweep does NOT agree with the model (the predicted point measured {below:.1f}% below the best): "
            "the linear costs miss something at one of them (look at its verify graph hit rate)."
        )
    out = [
        f"Cost model over {len(points)} point(s): cycle = {f['t1']:.2f} ms (t1, {f['source']}) + "
        f"{f['per_token']:.3f} ms per verified token beyond the first + per draft step: {steps}.",
        f"Predicted optimum: {pr.name} ({tok(pr):.1f} tok/s predicted, {pr.decode_tok_s:.1f} measured). "
        f"Measured optimum: {me.name} ({me.decode_tok_s:.1f} tok/s). {agree}",
    ]
    misses = sorted(((p, p.decode_tok_s / tok(p) - 1.0) for p in points), key=lambda x: -abs(x[1]))[:3]
    worst = []
    for p, d in misses:
        if abs(d) > 0.02:
            graph = f" (verify graph {100 * p.hit_rate:.0f}%)" if p.hit_rate is not None else ""
            worst.append(f"{p.name} {100 * d:+.1f}%{graph}")
    return out + (["Largest misses (measured vs predicted tok/s): " + ", ".join(worst)] if worst else [])


SWEEP_HEADER = (
    "drafter | draft weights | steps/topk/tokens | accept length | decode tok/s | verify graph | cycle ms | model "
    "cycle ms"
)


def sweep_markdown(rows: list[Row]) -> list[str]:
    L: list[str] = []
    for sc in dict.fromkeys(r.scenario for r in rows if r.setting):
        points, t1 = sweep_points(rows, sc)
        f, why = fit(points, t1)
        table = []
        for r in sorted((r for r in rows if r.scenario == sc and r.setting), key=lambda r: r.variant):
            s, p = r.setting, next((p for p in points if p.name == r.variant), None)
            cycle, model = f"{p.cycle_ms:.1f}" if p else "–", f"{model_cycle(f, p):.1f}" if f and p else "–"
            table.append(
                f"{s['drafter']} | {s['draft_quantization']} | {s['steps']}/{s['topk']}/{s['draft_tokens']} | "
                f"{_cell(r.stats['accept_length'], 3)} | {_cell(r.stats['decode_tok_s'])} | {hit_cell(r)} | "
                f"{cycle} | {model}"
            )
        title = f"## Sweep: drafters and speculative settings ({sc})"
        L += [title, "", md_table(SWEEP_HEADER, table, "lllrrrrr"), ""]
        L += (verdict(points, f) if f else [f"No cost-model verdict: {why}."]) + [""]
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
    size = (max(4.0, 1.2 + 0.9 * len(variants)) * len(scenarios), 3.2 * len(metrics))
    fig, axes = plt.subplots(len(metrics), len(scenarios), squeeze=False, figsize=size)
    for (i, m), (j, sc) in ((im, js) for im in enumerate(metrics) for js in enumerate(scenarios)):
        ax = axes[i][j]
        for k, r in enumerate(next((r for r in rows if r.scenario == sc and r.variant == v), None) for v in variants):
            if s := (r.stats.get(m) if r else None):
                ax.bar(k, s.median, color=plt.get_cmap("tab10")(k % 10), alpha=0.55, width=0.7)
                ax.errorbar(k, s.median, yerr=[[s.median - s.min], [s.max - s.median]], color="black", capsize=4)
                spread = [k + (x - (len(s.values) - 1) / 2) * 0.12 for x in range(len(s.values))]
                ax.scatter(spread, s.values, color="black", s=12, zorder=3)
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
