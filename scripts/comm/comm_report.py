"""The one reader of bench-comm results (bench/results/bench-comm_*.json, a receipt's raw/bench-comm.json): the
record lookups the receipt and `make docs` (the cost model) read, and the summary whose rows `make bench-comm`
prints as tables and draws as plots."""

from pathlib import Path

from ..lib.kimi import CHAIN, HIDDEN, LAYERS
from ..lib.progress import say
from ..lib.table import md_table, num


def records(result: dict, **match) -> list[dict]:
    """The records of a run whose fields equal `match`."""
    return [r for r in result["records"] if all(r.get(k) == v for k, v in match.items())]


def record(result: dict, **match) -> dict | None:
    """The first such record, or None."""
    found = records(result, **match)
    return found[0] if found else None


def floor_us(rows: int, world: int, gbps: float | None) -> float | None:
    """Bandwidth floor of one ring/two-shot all-reduce: 2(n-1)/n x bytes per rank over the peer bandwidth."""
    if not gbps:
        return None
    return 2 * (world - 1) / world * rows * HIDDEN * 2 / (gbps * 1e9) * 1e6


def _is_bad(r: dict) -> bool:
    # one reduction must match the fp32 reference to bf16 rounding; after a 61-layer forward two correct
    # implementations (bf16 NCCL sums vs fp32-accumulating kernels) drift apart by a few percent
    kind, err = r.get("kind"), r.get("max_rel_err") or 0
    bad = {
        "fused_check": not r.get("ok"),
        "allreduce": err > 0.02,
        "allreduce_check": err > 0.02,
        "verify_forward_check": err > 0.15,
        "pdl_race": bool(r.get("bad_trials") and r.get("trigger_at_end")),
    }
    return bool(r.get("nan")) or bad.get(kind, False)


def correctness(recs: list[dict]) -> dict:
    problems = [{k: r.get(k) for k in ("variant", "kind", "impl", "rows", "mode")} for r in recs if _is_bad(r)]
    return {"ok": not problems, "problems": problems}


def allreduce_rows(recs: list[dict], world: int, gbps: float | None) -> list[dict]:
    """Per-call all-reduce, graph-replayed, with the ratio to the bandwidth floor and to default NCCL."""
    rows, nccl_graph = [], {}
    for r in recs:
        if r.get("kind") == "allreduce" and r.get("mode") == "graph":
            f = floor_us(r["rows"], world, gbps)
            row = {k: r[k] for k in ("variant", "impl", "rows", "us_per_call")}
            rows.append(row | {"floor_us": f, "x_floor": r["us_per_call"] / f if f else None})
            if r["impl"] == "nccl" and r["variant"] == "default":
                nccl_graph[r["rows"]] = r["us_per_call"]
    for row in rows:
        base = nccl_graph.get(row["rows"])
        row["x_nccl_default"] = row["us_per_call"] / base if base else None
    return rows


def forward_rows(vf: dict) -> list[dict]:
    out = []
    for variant, impl, rows in sorted({k[:3] for k in vf}):
        graph, eager = vf.get((variant, impl, rows, "graph")), vf.get((variant, impl, rows, "eager"))
        times = {"graph_ms": graph / 1e3 if graph else None, "eager_ms": eager / 1e3 if eager else None}
        speedup = eager / graph if eager and graph else None
        out.append({"variant": variant, "impl": impl, "rows": rows} | times | {"graph_speedup": speedup})
    return out


def measured(recs: list[dict], kind: str | None, key: str) -> list[int]:
    """The distinct values of `key` in the records of `kind` (what was measured, whatever the defaults say)."""
    return sorted({r[key] for r in recs if (kind is None or r.get("kind") == kind) and r.get(key) is not None})


def _shape(values: list[int] | None, fallback: int, unit: str) -> str:
    vals = values or [fallback]
    return f"{'/'.join(map(str, vals))} {unit}"


def summarize(result: dict) -> dict:
    recs = result["records"]
    bw = [r["gbps"] for r in recs if r.get("kind") == "p2p_bw"]
    gbps = min(bw) if bw else None
    vf = {
        (r["variant"], r["impl"], r["rows"], r["mode"]): r["us"]
        for r in recs
        if r.get("kind") == "verify_forward" and "us" in r
    }
    fused = [
        {k: r.get(k) for k in ("variant", "impl", "rows", "mode", "us_per_call")}
        for r in recs
        if r.get("kind") == "fused" and r.get("mode") in ("graph", "eager")
    ]
    return {
        "peer_gbps_min": gbps,
        "allreduce": allreduce_rows(recs, result["meta"]["world"], gbps),
        "fused": fused,
        "verify_forward": forward_rows(vf),
        "correctness": correctness(recs),
        "layers": measured(recs, "verify_forward", "layers") or measured([result["meta"]], None, "layers"),
        "chain": measured(recs, "allreduce", "chain"),
    }


def _f(x, d=1) -> str:
    return num(x, d, none="-")


def table(summary: dict) -> str:
    """The summary as markdown tables (the plot draws the same rows); layer and chain counts are the measured ones."""
    ar = sorted(summary["allreduce"], key=lambda r: (r["rows"], r["impl"], r["variant"]))
    rows = [
        f"{r['variant']} | {r['impl']} | {r['rows']} | {_f(r['us_per_call'])} | {_f(r['floor_us'])} | "
        f"{_f(r['x_floor'], 2)} | {_f(r['x_nccl_default'], 2)}"
        for r in ar
    ]
    chain = _shape(summary.get("chain"), CHAIN, "calls")
    lines = [
        "",
        f"All-reduce per call, graph-replayed chain of {chain} (us):",
        "",
        md_table("variant | impl | rows | us/call | floor | x floor | x nccl", rows, "llrrrrr"),
    ]
    by: dict = {}
    for r in summary["fused"]:
        by.setdefault((r["rows"], r["impl"]), {})[r["mode"]] = r["us_per_call"]
    if by:
        fused = [[impl, rows, _f(m.get("eager")), _f(m.get("graph"))] for (rows, impl), m in sorted(by.items())]
        lines += [
            "",
            "Fused all-reduce + residual + RMSNorm vs NCCL + add-RMSNorm (us per call):",
            "",
            md_table("impl | rows | eager | graph", fused, "lrrr"),
        ]
    forward = [
        f"{r['variant']} | {r['impl']} | {r['rows']} | {_f(r['eager_ms'], 2)} | {_f(r['graph_ms'], 2)} | "
        f"{_f(r['graph_speedup'], 2)}"
        for r in summary["verify_forward"]
    ]
    lines += [
        "",
        f"Verify-shaped forward, {_shape(summary.get('layers'), LAYERS, 'layers')} (ms):",
        "",
        md_table("variant | impl | rows | eager | graph | speedup", forward, "llrrrr"),
        "",
    ]
    lines.append(f"Peer bandwidth (min over pairs): {_f(summary['peer_gbps_min'])} GB/s")
    c = summary["correctness"]
    said = "all reductions match the fp32 reference"
    if not c["ok"]:
        said = f"PROBLEMS in {len(c['problems'])} record(s): {c['problems'][:5]}"
    return "\n".join(lines + [f"Correctness: {said}"])


def _plot_allreduce(ax, s: dict, world: int) -> None:
    series: dict[str, list] = {}
    for r in s["allreduce"]:
        series.setdefault(f"{r['impl']} / {r['variant']}", []).append((r["rows"], r["us_per_call"]))
    for name, pts in sorted(series.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    if s["peer_gbps_min"]:
        rows = sorted({r["rows"] for r in s["allreduce"]})
        ax.plot(rows, [floor_us(n, world, s["peer_gbps_min"]) for n in rows], "k--", label="bandwidth floor")
    ylabel = "us per all-reduce (graph chain)"
    ax.set(xscale="log", yscale="log", xlabel=f"rows x {HIDDEN} bf16", ylabel=ylabel, title="All-reduce per call")
    finish_axes(ax, bool(series))


def _plot_forward(ax, s: dict) -> None:
    vf = [r for r in s["verify_forward"] if r["variant"] == "default"]
    impls = sorted({r["impl"] for r in vf})
    rows = sorted({r["rows"] for r in vf})
    w = 0.8 / (2 * max(len(impls), 1))
    for i, impl in enumerate(impls):
        by = {r["rows"]: r for r in vf if r["impl"] == impl}
        for j, mode in enumerate(("eager_ms", "graph_ms")):
            xs = [k + (2 * i + j) * w for k in range(len(rows))]
            ax.bar(xs, [by.get(n, {}).get(mode) or 0 for n in rows], w, label=f"{impl} {mode[:-3]}")
    ax.set_xticks([k + 0.4 - w / 2 for k in range(len(rows))], [str(n) for n in rows])
    title = f"verify-shaped forward, {_shape(s.get('layers'), LAYERS, 'layers')}"
    ax.set(xlabel="rows (batch x draft tokens)", ylabel="ms", title=title)
    finish_axes(ax, bool(vf))


def finish_axes(ax, has_data: bool) -> None:
    """Plain numbers on log axes (3, 10, 30, not 3x10^0), the legend beside the data (never over it), and a
    "no data" note on a panel that has none."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
        if scale == "log":
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
    if not has_data:
        ax.text(0.5, 0.5, "no data in this result", transform=ax.transAxes, ha="center", va="center", color="grey")
        return
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def plot(result: dict, png: Path) -> bool:
    """Per-call all-reduce latency vs rows (graph-replayed) and the verify forward eager vs graph; False if
    matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("matplotlib is not installed: no plot (pip install matplotlib)")
        return False
    m = result["meta"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(16, 4.8))
    _plot_allreduce(left, result["summary"], m["world"])
    _plot_forward(right, result["summary"])
    fig.suptitle(
        f"bench-comm: {m.get('world')}x {m.get('gpu_name')}, run from git {m.get('git_rev')} (the checkout "
        f"that ran), {m.get('utc')}"
    )
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True
