"""`make docs`: regenerate the cost-model tables of eagle-fast-verify.md from committed files.

  python -m scripts.bench.cost_model [--write | --check] [--doc eagle-fast-verify.md] [--receipt R ..]
  python -m scripts.bench.cost_model --sweep RESULTS.jsonl    the sweep's verdict: the speculative-setting cost
        model (scripts/bench/spec_model.py) fitted to a `make bench --sweep` results file, its predicted optimum
        and whether the measured one agrees

Inputs: bench/inputs/cost-model.toml (the seed box's numbers and published per-call latencies, each with its
source) and bench/results/bench-comm_H200_x2_*.json (our H200 x2 proxy runs). The tables go between the
`<!-- cost-model:NAME -->` / `<!-- /cost-model:NAME -->` markers of the document, so every number there comes from
a file. `--check` fails if the document is out of date.

Box receipts (`make report` on the box: a directory or its .tar.gz, given with --receipt, by default every
bench/receipts/*.tar.gz) fill the box section: the box's measured per-call latencies at the C1 verify width put
into the same model (its compute and draft terms from the seed, the accept length measured by the receipt's
`make bench` where it has one), next to the tok/s the box served, and the recommendations the receipt stored
(with the thresholds of the day it was made; they are not recomputed here).

Model of one speculative cycle on the box: draft + verify, verify = compute + 122 x per-call all-reduce latency,
with the draft time and the non-communication compute taken from the seed measurement (both assumed unchanged by
these patches; CUDA graphs would shrink them too, so the estimate is conservative). tok/s = AL / cycle; the
break-even accept length is the AL at which speculation matches the no-speculation baseline.
The `settings` table is the speculative-setting model's prior (scripts/bench/spec_model.py) for every setting of
bench/sweep.toml: per-cycle collectives from bench/inputs/collectives_kimi_tp8.toml at their backend's per-call
latency, the verify's compute from the memory floor per verify width and the draft's per forward ([memory]), the
chain AL from [acceptance]; model output, labelled so in the document.
--write prints, per table, whether it changed and by how many lines (and writes nothing when none did), and draws
both model tables' tok/s ranges into bench/results/cost-model.png (beside --doc when another document is named),
which the document shows; --check compares the tables only.
Exit status: 0 printed, written or current; 1 --check found the document out of date; 2 an input is missing.
"""

from __future__ import annotations

import argparse
import difflib
import json
import statistics
from pathlib import Path

from ..lib.cli import run
from ..lib.errors import UserError
from ..lib.progress import say
from ..lib.repo import REPO_ROOT
from ..lib.tomlfile import load_toml
from . import receipt_data as rd
from . import report as rep
from . import spec_model, sweep
from .comm_report import record
from ..lib.kimi import CHAIN, LAYERS
from .numbers import spread

INPUTS = REPO_ROOT / "bench" / "inputs" / "cost-model.toml"
RESULTS = REPO_ROOT / "bench" / "results"
DOC = REPO_ROOT / "eagle-fast-verify.md"


def load_runs(pattern: str = "bench-comm_H200_x2_*.json") -> list[dict]:
    runs = [json.loads(p.read_text()) | {"_file": p.name} for p in sorted(RESULTS.glob(pattern))]
    if not runs:
        raise UserError(f"no {pattern} under {RESULTS}: run make bench-comm on a GPU box first")
    return runs


def _vals(runs, fn) -> list[float]:
    out = []
    for r in runs:
        try:
            v = fn(r)
        except (TypeError, KeyError, ZeroDivisionError):
            v = None
        if v is not None:
            out.append(v)
    return out


def ar_us(run, variant="default", impl="nccl", rows=8, mode="graph"):
    return record(run, kind="allreduce", variant=variant, impl=impl, rows=rows, mode=mode)["us_per_call"]


def fused_us(run, impl, rows=8, mode="graph"):
    return record(run, kind="fused", impl=impl, rows=rows, mode=mode)["us_per_call"]


def vf_us(run, variant="default", impl="nccl", rows=8, mode="graph"):
    return record(run, kind="verify_forward", variant=variant, impl=impl, rows=rows, mode=mode)["us"]


def _has_impl(run: dict, prefix: str) -> bool:
    return any(str(r.get("impl", "")).startswith(prefix) for r in run["records"])


def h200_table(runs: list[dict]) -> str:
    """Ratios measured side by side in each run (median and range over the runs) of the runs that called
    FlashInfer's kernels directly (bench-comm before its rows went through SGLang)."""
    runs = [r for r in runs if _has_impl(r, "fi_")]
    n = len(runs)
    rows = [
        (f"Verify-shaped forward ({LAYERS} layers, 8 rows), NCCL: eager / graph-replayed", "x",
         _vals(runs, lambda r: vf_us(r, mode="eager") / vf_us(r))),
        ("Same, 4 rows (batch 1)", "x", _vals(runs, lambda r: vf_us(r, rows=4, mode="eager") / vf_us(r, rows=4))),
        ("NCCL + eager forward / fused trtllm + graph (8 rows; issue bar >= 3x)", "x",
         _vals(runs, lambda r: vf_us(r, mode="eager") / vf_us(r, impl="fi_trtllm_fused"))),
        ("Graph-replayed forward: fused trtllm / NCCL (8 rows)", "x",
         _vals(runs, lambda r: vf_us(r, impl="fi_trtllm_fused") / vf_us(r))),
        ("Graph-replayed forward: PCIe IPC / NCCL (8 rows)", "x",
         _vals(runs, lambda r: vf_us(r, impl="fi_pcie_ipc") / vf_us(r))),
        (f"Per call, graph chain of {CHAIN}, 8 rows: NCCL default", " us", _vals(runs, lambda r: ar_us(r))),
        ("  NCCL_PROTO=Simple / default", "x", _vals(runs, lambda r: ar_us(r, "SIMPLE") / ar_us(r))),
        ("  NCCL_PROTO=LL / default", "x", _vals(runs, lambda r: ar_us(r, "LL") / ar_us(r))),
        ("  NCCL_PROTO=LL128 / default", "x", _vals(runs, lambda r: ar_us(r, "LL128") / ar_us(r))),
        ("  PCIe defaults patch (its _PCIE_NCCL_DEFAULTS) / default", "x",
         _vals(runs, lambda r: ar_us(r, "pcie_defaults") / ar_us(r))),
        ("  NCCL_P2P_DISABLE=1 / default (host-staged, a rough PCIe stand-in)", "x",
         _vals(runs, lambda r: ar_us(r, "p2p_off") / ar_us(r))),
        ("  FlashInfer PCIe IPC / NCCL default", "x",
         _vals(runs, lambda r: ar_us(r, impl="fi_pcie_ipc") / ar_us(r))),
        ("Fused AR+residual+RMSNorm per call, graph, 8 rows", " us",
         _vals(runs, lambda r: fused_us(r, "fi_trtllm_fused"))),
        ("  NCCL AR + FlashInfer fused add-RMSNorm, same", " us",
         _vals(runs, lambda r: fused_us(r, "nccl+fi_add_rmsnorm"))),
        ("  cost of trigger_completion_at_end=True (completion at kernel end), per call", " us",
         _vals(runs, lambda r: fused_us(r, "fi_trtllm_fused") - fused_us(r, "fi_trtllm_fused_early_trigger"))),
        ("  same, median over 4-64 rows", " us",
         _vals(runs, lambda r: statistics.median(
             fused_us(r, "fi_trtllm_fused", rows=n) - fused_us(r, "fi_trtllm_fused_early_trigger", rows=n)
             for n in (4, 8, 16, 32, 64)))),
        (f"  graph chain of {CHAIN} x (fused + consumer), 4-16 rows: completion at end on / off", "x",
         [x["graph_us"] / record(r, kind="pdl_race", rows=x["rows"], trigger_at_end=False)["graph_us"]
          for r in runs for x in r["records"] if x.get("kind") == "pdl_race" and x["trigger_at_end"]]),
        ("PDL race check: bad trials with trigger_completion_at_end=False (of trials x row counts)", "",
         _vals(runs, lambda r: sum(x["bad_trials"] for x in r["records"]
                                   if x.get("kind") == "pdl_race" and not x["trigger_at_end"]))),
        ("Peer copy bandwidth, min over GPU pairs", " GB/s", _vals(runs, lambda r: r["summary"]["peer_gbps_min"])),
    ]
    lines = [f"| H200 x2 proxy, {n} run(s): {', '.join(r['_file'] for r in runs)} | value |", "|---|---|"]
    for name, unit, vals in rows:
        digits = 0 if unit.strip() == "" and vals and float(vals[0]).is_integer() else 2
        lines.append(f"| {name} | {spread(vals, digits, unit)} |")
    return "\n".join(lines)


def _route_us(run, path, rows=8):
    return record(run, kind="allreduce", impl=f"sglang_tp_{path}", rows=rows, mode="graph")["us_per_call"]


def sglang_table(runs: list[dict]) -> str:
    """The same quantities through the patched SGLang's own code (bench-comm's SGLang rows: tp.all_reduce per
    route, the registered fused op, the verify-shaped forward over them), each ratio taken inside one run, and
    next to them the medians of the earlier runs that called FlashInfer directly."""
    new = [r for r in runs if _has_impl(r, "sglang_")]
    old = [r for r in runs if _has_impl(r, "fi_")]
    if not new:
        return "No bench-comm run with SGLang rows under bench/results yet."

    def med(vals):
        return statistics.median(vals) if vals else None

    def old_med(fn):
        v = med(_vals(old, fn))
        return "-" if v is None else f"{v:.2f}"

    rows = [
        ("Per call, graph chain of 122, 1 row: tp.all_reduce -> PCIe IPC (seed policy)", " us",
         _vals(new, lambda r: _route_us(r, "default", 1)), old_med(lambda r: ar_us(r, impl="fi_pcie_ipc", rows=1))),
        ("  8 rows: tp.all_reduce -> PCIe IPC", " us", _vals(new, lambda r: _route_us(r, "default")),
         old_med(lambda r: ar_us(r, impl="fi_pcie_ipc"))),
        ("  64 rows: tp.all_reduce -> PCIe IPC", " us", _vals(new, lambda r: _route_us(r, "default", 64)),
         old_med(lambda r: ar_us(r, impl="fi_pcie_ipc", rows=64))),
        ("  8 rows: tp.all_reduce -> FlashInfer allreduce-only", " us", _vals(new, lambda r: _route_us(r, "flashinfer")),
         "-"),
        ("  8 rows: tp.all_reduce -> pynccl", " us", _vals(new, lambda r: _route_us(r, "nccl")), "-"),
        ("  8 rows: raw NCCL (torch.distributed), same processes", " us", _vals(new, lambda r: ar_us(r)),
         old_med(lambda r: ar_us(r))),
        ("  8 rows: PCIe IPC / raw NCCL", "x", _vals(new, lambda r: _route_us(r, "default") / ar_us(r)),
         old_med(lambda r: ar_us(r, impl="fi_pcie_ipc") / ar_us(r))),
        ("Fused op (SGLang's flashinfer_allreduce_residual_rmsnorm), per call, graph, 8 rows", " us",
         _vals(new, lambda r: fused_us(r, "sglang_fused_op")), old_med(lambda r: fused_us(r, "fi_trtllm_fused"))),
        ("  tp.all_reduce (pynccl) + FlashInfer fused add-RMSNorm, same", " us",
         _vals(new, lambda r: fused_us(r, "sglang_unfused_nccl")), old_med(lambda r: fused_us(r, "nccl+fi_add_rmsnorm"))),
        ("  fused / unfused over NCCL", "x",
         _vals(new, lambda r: fused_us(r, "sglang_fused_op") / fused_us(r, "sglang_unfused_nccl")),
         old_med(lambda r: fused_us(r, "fi_trtllm_fused") / fused_us(r, "nccl+fi_add_rmsnorm"))),
        (f"Verify-shaped forward ({LAYERS} layers, 8 rows, graph): raw NCCL", " ms",
         _vals(new, lambda r: vf_us(r) / 1e3), old_med(lambda r: vf_us(r) / 1e3)),
        ("  over the fused op / raw NCCL", "x", _vals(new, lambda r: vf_us(r, impl="sglang_fused_op") / vf_us(r)),
         old_med(lambda r: vf_us(r, impl="fi_trtllm_fused") / vf_us(r))),
        ("  over tp.all_reduce (PCIe IPC) / raw NCCL", "x", _vals(new, lambda r: vf_us(r, impl="sglang_tp") / vf_us(r)),
         old_med(lambda r: vf_us(r, impl="fi_pcie_ipc") / vf_us(r))),
        ("PDL race, fused op + PDL consumer: bad trials with the op's default (all rows x trials)", "",
         _vals(new, lambda r: sum(x["bad_trials"] for x in r["records"]
                                  if x.get("kind") == "pdl_race" and x["trigger_at_end"])), "-"),
    ]
    lines = [f"| H200 x2 proxy through SGLang, {len(new)} run(s): {', '.join(r['_file'] for r in new)} | value | "
             f"FlashInfer called directly, median of {len(old)} earlier run(s) |", "|---|---|---|"]
    for name, unit, vals, before in rows:
        digits = 0 if unit.strip() == "" and vals and float(vals[0]).is_integer() else 2
        lines.append(f"| {name} | {spread(vals, digits, unit)} | {before} |")
    return "\n".join(lines)


def box_table(inp: dict) -> str:
    box = inp["box"]
    n = box["allreduces"]
    compute_ms = box["verify_ms"] - box["verify_allreduce_ms"]
    draft_ms = 1000 * box["accept_length"] / box["eagle_tok_s"] - box["verify_ms"]
    base_ms = 1000 / box["baseline_tok_s"]
    al = box["accept_length"]
    lines = [f"Model inputs (seed box): verify compute {compute_ms:.1f} ms, draft {draft_ms:.2f} ms per cycle, "
             f"no-speculation {box['baseline_tok_s']:.0f} tok/s ({base_ms:.1f} ms/token), AL {al:.1f}, "
             f"{n} all-reduces per verify; peers reach {box['peer_eagle_tok_s'][0]:.0f}-"
             f"{box['peer_eagle_tok_s'][1]:.0f} tok/s at the same AL.", "",
             "| setting | per all-reduce (us) | 122 x all-reduce (ms) | verify (ms) | tok/s at AL 2.0 | break-even AL | source |",
             "|---|---|---|---|---|---|---|"]
    for s in inp["setting"]:
        def cyc(us):
            return draft_ms + compute_ms + n * us / 1000

        lo, hi = s["low"], s["high"]
        ar = f"{lo:.0f}" if lo == hi else f"{lo:.1f}-{hi:.1f}"
        tot = f"{n * lo / 1000:.2f}" if lo == hi else f"{n * lo / 1000:.2f}-{n * hi / 1000:.2f}"
        ver = f"{compute_ms + n * lo / 1000:.1f}" if lo == hi else \
            f"{compute_ms + n * lo / 1000:.1f}-{compute_ms + n * hi / 1000:.1f}"
        tps = f"{1000 * al / cyc(lo):.0f}" if lo == hi else f"{1000 * al / cyc(hi):.0f}-{1000 * al / cyc(lo):.0f}"
        be = f"{cyc(lo) / base_ms:.2f}" if lo == hi else f"{cyc(lo) / base_ms:.2f}-{cyc(hi) / base_ms:.2f}"
        lines.append(f"| {s['name']} | {ar} | {tot} | {ver} | {tps} | {be} | {s['source']} |")
    return "\n".join(lines)


def _model(inp: dict) -> tuple[float, float, float]:
    """(verify compute ms, draft ms per cycle, no-speculation ms per token) from the seed box's numbers."""
    box = inp["box"]
    compute_ms = box["verify_ms"] - box["verify_allreduce_ms"]
    return compute_ms, 1000 * box["accept_length"] / box["eagle_tok_s"] - box["verify_ms"], 1000 / box["baseline_tok_s"]


def receipt_table(inp: dict, data: dict, name: str) -> str:
    """One receipt: measured per-call latencies refitted into the cycle model, measured serving, recommendations."""
    compute_ms, draft_ms, _ = _model(inp)
    n = inp["box"]["allreduces"]
    recs = data["receipt"]["recommendations"]  # as the receipt stored them, with the thresholds of its day
    spec = [r for r in recs if r["default"].startswith("EAGLE-3")][0]
    best = spec["measured"].get("speculative") if spec["verdict"] != "inconclusive" else None
    al = best["accept_length"] if best and best.get("accept_length") else inp["box"]["accept_length"]
    env = data["receipt"].get("environment", {})
    cls = rd.box_class(data)
    reasons = rd.proxy_reasons(cls)
    proxy = (f"**A proxy, not the box** ({'; '.join(reasons)}): its numbers stand in for the box's, the "
             f"verdicts on the box's defaults are inconclusive. ") if reasons else ""
    lines = [f"{proxy}Receipt `{name}` (box {env.get('box')}: {rd.describe_box(cls)}; "
             f"{data['receipt'].get('created')}, patch set {env.get('patchset')}): AL {al:.2f} "
             f"({'measured' if best else 'seed'}).", "",
             f"| path, {rd.VERIFY_ROWS_C1} rows (C1 verify), graph chain | per call (us) | {n} x (ms) | "
             f"modelled verify (ms) | modelled tok/s |", "|---|---|---|---|---|"]
    bc = data.get("bench_comm")
    for label, us in (rd.per_call_latencies(bc) if bc else {}).items():
        verify = compute_ms + n * us / 1000
        lines.append(f"| {label} | {us:.1f} | {n * us / 1000:.2f} | {verify:.1f} | "
                     f"{1000 * al / (draft_ms + verify):.0f} |")
    if not bc:
        lines.append("| (no bench-comm in this receipt) | - | - | - | - |")
    if best:
        lines += ["", f"Served (make bench, {spec['measured']['scenario']}): {spec['why']}."]
    lines += ["", "| default of the series | verdict | measured | setting |", "|---|---|---|---|"]
    for r in recs:
        lines.append(f"| {r['default']} | {r['verdict']} | {r['why']} | {r['setting'] or '-'} |")
    return "\n".join(lines)


def box_measured(inp: dict, receipts: list[Path]) -> str:
    blocks = []
    for path in receipts:
        why = ""
        try:
            d, tmp = rd.open_receipt(path)
        except UserError as e:
            d, tmp, why = None, None, str(e)
        try:
            data = rd.load(d) if d else None
            parts = data["receipt"].get("parts", {}) if data else {}
            if data and not any(r.get("ok") for p, r in parts.items() if rd.measures(p)):
                why = ("no part measured anything ("
                       + ", ".join(f"{p}: {r.get('status')}" for p, r in parts.items()) + ")")
            elif data:
                blocks.append(receipt_table(inp, data, Path(path).name))
        except (UserError, ValueError, KeyError, TypeError, AttributeError) as e:  # a damaged receipt: name it
            why = str(e) if isinstance(e, UserError) else f"a damaged file in it ({type(e).__name__}: {e})"
        finally:
            if tmp is not None:
                tmp.cleanup()
        if why:
            say(f"skipping receipt {Path(path).name}: {why}")
    if not blocks:
        return ("No box receipt ingested yet: run `make report` on the box, then `make docs RECEIPT=<the .tar.gz>` "
                "(or commit it under bench/receipts/).")
    return "\n\n".join(blocks)


def _span(lo: float, hi: float, digits: int) -> str:
    a, b = f"{min(lo, hi):.{digits}f}", f"{max(lo, hi):.{digits}f}"
    return a if a == b else f"{a}-{b}"


def _sampling_extra() -> str:
    """What a sampling batch's cycle issues beyond a greedy one's (the verify's packed broadcast)."""
    greedy, sampling = spec_model.load_cycle(mode="greedy"), spec_model.load_cycle(mode="sampling")
    more = {op: sum(sampling["stages"][st].get(op, 0) - greedy["stages"][st].get(op, 0) for st in spec_model.STAGES)
            for op in spec_model.OPS}
    return ", ".join(f"{n} {op.replace('_', '-')}" for op, n in more.items() if n) or "nothing"


def settings_table(inp: dict, cycle: dict | None = None) -> str:
    """The prior of scripts/bench/spec_model.py for the settings of bench/sweep.toml (model output): per cycle the
    verify's memory floor, the collectives, the draft, and tok/s at the assumed chain AL, at the low and high
    per-call latency of PCIe IPC."""
    cycle = cycle or spec_model.load_cycle()
    lo, hi = spec_model.prior(inp, cycle, "low"), spec_model.prior(inp, cycle, "high")
    settings = sorted({p.setting for p in sweep.load().points}, key=lambda x: (x.topk, x.steps, x.draft_tokens))
    base = (1000 / lo.verify_ms(1), 1000 / hi.verify_ms(1))
    lines = [f"Model output, not a measurement: `scripts/bench/spec_model.py`'s prior for the settings of "
             f"`bench/sweep.toml`, batch 1, {cycle['mode']} batches. Collectives per forward of each stage from "
             f"`bench/inputs/{spec_model.COLLECTIVES.name}` (TP{cycle['tp']}; every one on PCIe IPC, none on NCCL), "
             f"{_span(lo.per_call_us, hi.per_call_us, 1)} us per call; verify and draft compute from the memory "
             f"floor of `bench/inputs/cost-model.toml` [memory] ({inp['memory']['bandwidth_tb_s']} TB/s); chain AL "
             f"from [acceptance] ({inp['acceptance']['source']}). A floor: the tok/s are upper bounds, the ratio to "
             f"no speculation is what to compare. No speculation: {_span(lo.verify_ms(1), hi.verify_ms(1), 2)} ms "
             f"per token ({lo.verify_gb(1):.1f} GB per GPU), {_span(*base, 0)} tok/s. A sampling batch adds "
             f"{_sampling_extra()} per cycle.", "",
             "| steps/topk/draft tokens | verify GB per GPU | verify ms (floor + collectives) | collectives per cycle "
             "| draft ms | cycle ms | AL (assumed) | tok/s (model) | x no speculation |",
             "|---|---|---|---|---|---|---|---|---|"]
    best = max((x for x in settings if lo.accept_length(x.steps, x.topk)),
               key=lambda x: lo.accept_length(x.steps, x.topk) / lo.cycle_ms(x.steps, x.draft_tokens), default=None)
    for x in settings:
        al = lo.accept_length(x.steps, x.topk)
        cyc = (lo.cycle_ms(x.steps, x.draft_tokens), hi.cycle_ms(x.steps, x.draft_tokens))
        tps = (1000 * al / cyc[0], 1000 * al / cyc[1]) if al else None
        calls = lo.cycle_calls(x.steps)
        per = ", ".join(f"{calls[op]} {op.replace('_', '-')}" for op in spec_model.OPS if calls.get(op))
        lines.append(f"| {x.label}{' (model optimum)' if x == best else ''} | {lo.verify_gb(x.draft_tokens):.1f} | "
                     f"{_span(lo.verify_ms(x.draft_tokens), hi.verify_ms(x.draft_tokens), 2)} | {per} | "
                     f"{_span(lo.draft_ms(x.steps), hi.draft_ms(x.steps), 2)} | {_span(*cyc, 2)} | "
                     f"{f'{al:.2f}' if al else 'tree: measured only'} | {_span(*tps, 0) if tps else '-'} | "
                     f"{_span(tps[0] / base[0], tps[1] / base[1], 2) if tps else '-'} |")
    return "\n".join(lines)


def _ranges(table: str, column: str) -> list[tuple[str, float, float]]:
    """(row label, low, high) of a numeric column ("186-196" or "155") of one rendered table; rows without a number
    (a tree's "-") are left out. The plot reads the tables as the document prints them: one computation."""
    lines = [ln for ln in table.splitlines() if ln.startswith("|")]
    if len(lines) < 3 or column not in lines[0]:
        return []
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    col, out = head.index(column), []
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        nums = cells[col].split("-")
        try:
            lo, hi = float(nums[0]), float(nums[-1])
        except ValueError:
            continue
        out.append((cells[0], lo, hi))
    return out


def plot(blocks: dict[str, str], inp: dict, png: Path) -> bool:
    """The model's tok/s per all-reduce backend (table box) and per speculative setting (table settings), ranges
    as bars, with the goal and the measured no-speculation baseline; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = [("box", "tok/s at AL 2.0", "per-call all-reduce latency of each backend, seed box's other terms"),
              ("settings", "tok/s (model)", "speculative settings of bench/sweep.toml, memory floor + collectives")]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, (name, column, what) in zip(axes, panels):
        rows = _ranges(blocks.get(name, ""), column)
        labels = [r[0] if len(r[0]) <= 44 else r[0][:42] + ".." for r in rows]
        ax.barh(labels, [r[2] - r[1] or 1 for r in rows], left=[r[1] for r in rows], color="tab:blue",
                label="model range (low-high per-call latency)")
        ax.axvline(inp["box"]["baseline_tok_s"], color="grey", linestyle=":", label="no speculation, measured (seed)")
        goal = rd.THRESHOLDS["goal_tok_s"]
        ax.axvline(goal, color="red", linestyle="--", label=f"goal with EAGLE-3 ({goal:.0f})")
        ax.invert_yaxis()
        ax.set_xlim(left=0)
        ax.set(xlabel=column, title=f"Model output, not a measurement:\n{what}")
        ax.title.set_fontsize(9)
        ax.tick_params(axis="y", labelsize=7)
        if not rows:
            ax.text(0.5, 0.5, "no data in this table", transform=ax.transAxes, ha="center", color="grey")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=3, fontsize=8)  # below both panels, over no bar
    fig.suptitle("Kimi-K2.5 TP8 on 8x RTX PRO 6000 (PCIe only): make docs' cost model (eagle-fast-verify.md)",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return True


def render(inp: dict, runs: list[dict], receipts: list[Path] | None = None) -> dict[str, str]:
    return {"box": box_table(inp), "settings": settings_table(inp), "h200": h200_table(runs),
            "h200-sglang": sglang_table(runs), "box-measured": box_measured(inp, receipts or [])}


def splice(doc: str, blocks: dict[str, str]) -> str:
    for name, body in blocks.items():
        start, end = f"<!-- cost-model:{name} -->", f"<!-- /cost-model:{name} -->"
        if start not in doc or end not in doc:
            raise UserError(f"{DOC.name} lacks the markers {start} ... {end}")
        head, rest = doc.split(start, 1)
        _, tail = rest.split(end, 1)
        doc = f"{head}{start}\n{body}\n{end}{tail}"
    return doc


def block(doc: str, name: str) -> str | None:
    """The text between the markers of table `name`, None without them."""
    start, end = f"<!-- cost-model:{name} -->", f"<!-- /cost-model:{name} -->"
    if start not in doc or end not in doc:
        return None
    return doc.split(start, 1)[1].split(end, 1)[0].strip("\n")


def changes(old: str, new: str, names: list[str]) -> list[str]:
    """One line per table: unchanged, or how many of its lines the new text changes (and its new size)."""
    out = []
    for name in names:
        before, after = (block(old, name) or "").splitlines(), (block(new, name) or "").splitlines()
        if before == after:
            out.append(f"table {name}: unchanged ({len(after)} lines)")
            continue
        diff = [d for d in difflib.ndiff(before, after) if d[:1] in "+-"]
        added, removed = sum(d[0] == "+" for d in diff), sum(d[0] == "-" for d in diff)
        out.append(f"table {name}: rewritten, {added} line(s) new, {removed} line(s) gone ({len(after)} lines now)")
    return out


def sweep_prediction(results: Path) -> str:
    """The sweep tables and the cost model's verdict per scenario of a make bench --sweep results file."""
    rows = rep.summarize(rep.load_results(results))
    lines = rep.sweep_markdown(rows)
    if not lines:
        raise UserError(f"{results} holds no sweep points (run make bench-sweep, or bench --sweep)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts.bench.cost_model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="rewrite the tables in eagle-fast-verify.md")
    g.add_argument("--check", action="store_true", help="fail if eagle-fast-verify.md is out of date")
    ap.add_argument("--doc", type=Path, default=DOC)
    ap.add_argument("--receipt", type=Path, action="append", metavar="R",
                    help="a box receipt (make report's directory or .tar.gz; default: bench/receipts/*.tar.gz)")
    ap.add_argument("--sweep", type=Path, metavar="RESULTS.jsonl", help="print the sweep verdict of a results file")
    a = ap.parse_args(argv)
    if a.sweep:
        print(sweep_prediction(a.sweep))
        return 0
    inp = load_toml(INPUTS)
    receipts = a.receipt if a.receipt is not None else sorted((REPO_ROOT / "bench" / "receipts").glob("*.tar.gz"))
    if receipts:
        print("box receipts: " + ", ".join(str(r) for r in receipts))
    blocks = render(inp, load_runs(), receipts)
    if not (a.write or a.check):
        for body in blocks.values():
            print(body + "\n")
        return 0
    old = a.doc.read_text()
    new = splice(old, blocks)
    report = changes(old, new, list(blocks))
    if a.check:
        if new != old:
            print(f"{a.doc} is out of date with bench/: run make docs\n  " + "\n  ".join(report))
            return 1
        return 0
    if new != old:
        a.doc.write_text(new)
    png = RESULTS / "cost-model.png" if a.doc.resolve() == DOC.resolve() else a.doc.with_name("cost-model.png")
    report.append(f"plot {png.name}: " + ("drawn" if plot(blocks, inp, png) else "not drawn (no matplotlib)"))
    print(f"{a.doc}: {'wrote the cost-model tables' if new != old else 'up to date, nothing written'}\n  "
          + "\n  ".join(report))
    return 0


if __name__ == "__main__":
    run(main)
