"""What `make test-serve` asserts, read from what each phase's server returned (scripts/host/serve_tier.py collects).

A phase record holds: the greedy outputs ("outputs": {"seq": [...], "conc": [...]}, token ids), the per-request
meta_info kept ("meta"), /server_info's internal_states[0] keys starting with "spec_" as SGLang returns them plus
avg_spec_accept_length ("spec"), the max_running_requests the server runs with, the samples of
sglang:spec_cuda_graph_forwards_total ("metric": [labels, value] of tensor-parallel rank 0), the server log, timings
("timing": bs-1 tok/s of each timed round), how it stopped ("stop"). Every check is a `Check`; the tier passes when
none failed. The expected texts are the patched SGLang's own messages (patches/ spec-*).
"""

from __future__ import annotations

import dataclasses
import re
import statistics

from .serve_plan import BY_NAME, CAP_REQUESTS, TIMED, Phase, captured_max

GRAPH_METRIC = "sglang:spec_cuda_graph_forwards_total"
STAGES = ("target_verify", "draft_decode", "draft_extend")
OUTCOMES = ("graph", "piecewise", "eager")
DRAFT_TOKENS = 4  # the tiny EAGLE-3 profile's speculative-num-draft-tokens: accept length when all are accepted
MIN_GRAPH_SPEEDUP = 2.0
EAGER_START = "runs with the target's decode CUDA graphs disabled (--disable-decode-cuda-graph)"
EAGER_FORWARD = re.compile(r"Speculative (\w+) forward \(bs=\d+\) ran eagerly, not on its CUDA graph, "
                           r"reason=(\w+)")


@dataclasses.dataclass
class Check:
    phase: str
    name: str
    ok: bool
    detail: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def metric_samples(text: str) -> list[list]:
    """[labels, value] of every GRAPH_METRIC sample of tensor-parallel rank 0 in a /metrics text (Prometheus'
    own parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    return [[dict(s.labels), s.value] for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == GRAPH_METRIC and s.labels.get("tp_rank", "0") == "0"]


def counts_from_metric(samples: list[list]) -> dict:
    """{stage: {graph, piecewise, eager, fallback_reasons}} from the metric samples, in spec_cuda_graph's shape."""
    out: dict = {}
    for labels, value in samples:
        c = out.setdefault(labels.get("stage", "?"), {**{o: 0 for o in OUTCOMES}, "fallback_reasons": {}})
        outcome = labels.get("outcome", "?")
        c[outcome] = c.get(outcome, 0) + int(value)
        if outcome != "graph":
            reasons = c["fallback_reasons"]
            reasons[labels.get("reason", "")] = reasons.get(labels.get("reason", ""), 0) + int(value)
    return out


def _nonzero(counts: dict) -> dict:
    """The counts without stages and outcomes that are all zero (the two sources list different zeros)."""
    out = {}
    for stage, c in counts.items():
        kept = {o: c.get(o, 0) for o in OUTCOMES if c.get(o, 0)}
        if c.get("fallback_reasons"):
            kept["fallback_reasons"] = dict(c["fallback_reasons"])
        if kept:
            out[stage] = kept
    return out


def graph_counts(rec: dict) -> dict:
    return rec.get("spec", {}).get("spec_cuda_graph") or {}


def _stage(rec: dict, stage: str) -> dict:
    return graph_counts(rec).get(stage) or {o: 0 for o in OUTCOMES}


def check_on_graph(p: Phase, rec: dict) -> list[Check]:
    out = []
    for stage in STAGES:
        c = _stage(rec, stage)
        ok = c.get("graph", 0) > 0 and not c.get("eager") and not c.get("piecewise")
        out.append(Check(p.name, f"{stage} on its CUDA graph", ok,
                         f"graph {c.get('graph', 0)}, piecewise {c.get('piecewise', 0)}, eager {c.get('eager', 0)}"
                         + (f", reasons {c.get('fallback_reasons')}" if c.get("fallback_reasons") else "")))
    return out


def check_metric_agrees(p: Phase, rec: dict) -> Check:
    info, metric = _nonzero(graph_counts(rec)), _nonzero(counts_from_metric(rec.get("metric") or []))
    return Check(p.name, f"{GRAPH_METRIC} = /server_info spec_cuda_graph", bool(info) and info == metric,
                 f"server_info {info}, metric {metric}")


def check_accept_length(p: Phase, rec: dict, all_accepted: bool) -> Check:
    avg = rec.get("spec", {}).get("avg_spec_accept_length")
    per = [m.get("spec_accept_length") for m in rec.get("meta") or []]
    if all_accepted:
        ok = avg is not None and abs(avg - DRAFT_TOKENS) < 0.01 and all(
            x is not None and abs(x - DRAFT_TOKENS) < 0.01 for x in per)
        name = f"accept length = {DRAFT_TOKENS} (every draft token accepted)"
    else:
        ok = avg is not None and avg < 1.5
        name = "accept length < 1.5 (a drafter that is almost never right)"
    return Check(p.name, name, ok, f"avg_spec_accept_length {avg}, per request {per}")


def check_same_output(p: Phase, rec: dict, want: dict | list, against: str) -> list[Check]:
    """Greedy ids of one at a time ("seq") and of all at once ("conc") equal `want` (a reference's outputs, or
    the chain's continuation of each prompt)."""
    out = []
    for step in ("seq", "conc"):
        got = (rec.get("outputs") or {}).get(step)
        exp = want.get(step) if isinstance(want, dict) else want
        diff = [i for i, (a, b) in enumerate(zip(got or [], exp or [])) if a != b]
        ok = bool(got) and bool(exp) and len(got) == len(exp) and not diff
        first = ""
        if diff:
            a, b = got[diff[0]], exp[diff[0]]
            k = next((j for j, (x, y) in enumerate(zip(a or [], b or [])) if x != y), None)
            first = f"; prompt {diff[0]} first differs at token {k}"
        out.append(Check(p.name, f"greedy output ({step}) = {against}", ok,
                         f"{len(got or [])} prompts x {len((got or [[]])[0] or [])} tokens{first}"))
    return out


def check_log(p: Phase, rec: dict, text: str, name: str) -> Check:
    lines = [ln.strip() for ln in (rec.get("log") or "").splitlines() if text in ln]
    return Check(p.name, name, bool(lines), lines[0][-300:] if lines else f"no log line contains {text!r}")


def check_eager_counted(p: Phase, rec: dict) -> list[Check]:
    c = _stage(rec, "target_verify")
    reasons = c.get("fallback_reasons") or {}
    counted = Check(p.name, "target_verify eager, counted with reason no_graph_runner",
                    c.get("eager", 0) > 0 and not c.get("graph") and reasons == {"no_graph_runner": c.get("eager")},
                    f"graph {c.get('graph', 0)}, eager {c.get('eager', 0)}, reasons {reasons}")
    warned = sorted({m.groups() for m in EAGER_FORWARD.finditer(rec.get("log") or "")})
    said = Check(p.name, "the first eager target_verify forward is logged with its reason",
                 ("target_verify", "no_graph_runner") in warned, f"logged (stage, reason): {warned}")
    return [counted, said]


def check_collectives_recorded(p: Phase, rec: dict, eager: bool) -> list[Check]:
    """/server_info spec_collectives: per stage the graphs' capture record, or with decode graphs off the eager
    forwards' record (as many forwards as spec_cuda_graph counts eager), never the other one."""
    got, out = rec.get("spec", {}).get("spec_collectives") or {}, []
    for stage in STAGES:
        key, other = (f"{stage}_eager", stage) if eager else (stage, f"{stage}_eager")
        r = got.get(key) or {}
        n = r.get("forwards" if eager else "graphs", 0)
        ok = n > 0 and other not in got and (not eager or n == _stage(rec, stage).get("eager"))
        out.append(Check(p.name, f"spec_collectives records {key} only", ok, f"{key} {r or None}, {other} "
                         f"{got.get(other)}" + (f", spec_cuda_graph eager {_stage(rec, stage).get('eager')}"
                                                if eager else "")))
    return out


def check_cap(p: Phase, rec: dict) -> list[Check]:
    top = captured_max()
    text = f"max_running_requests is capped from {CAP_REQUESTS} to {top}"
    applied = rec.get("max_running_requests")
    return [check_log(p, rec, text, "the cap is announced at start"),
            Check(p.name, f"the server runs at most {top} requests (the largest captured batch)", applied == top,
                  f"/server_info max_running_requests {applied}"),
            Check(p.name, f"a burst of {CAP_REQUESTS} requests completes", (rec.get("burst") or {}).get(
                "completed") == CAP_REQUESTS, f"{rec.get('burst')}")]


def check_speedup(recs: dict) -> list[Check]:
    graph, eager = (recs.get(n, {}).get("timing") or [] for n in TIMED)
    if not graph or not eager:
        return [Check("timing", "verify on the graph vs eager", False, f"not timed: {TIMED} {graph} {eager}")]
    ratio = statistics.median(graph) / statistics.median(eager)
    return [Check("timing", f"bs-1 tok/s with the verify graph >= {MIN_GRAPH_SPEEDUP:g}x eager", ratio >=
                  MIN_GRAPH_SPEEDUP, f"median {statistics.median(graph):.0f} vs {statistics.median(eager):.0f} tok/s "
                                     f"= {ratio:.2f}x (rounds: graph {graph}, eager {eager}; accept length 4 both)")]


def phase_checks(p: Phase, rec: dict, recs: dict, chains: dict) -> list[Check]:
    """Every check of one phase (its server answered)."""
    if p.drafter is None:
        want = chains.get(p.name)
        return check_same_output(p, rec, want, "the target's chain") if want else []
    out = check_same_output(p, rec, (recs.get(p.reference) or {}).get("outputs") or {}, f"{p.reference} (lossless)")
    out.append(check_metric_agrees(p, rec))
    if "--disable-decode-cuda-graph" in p.flags:
        out.append(check_log(p, rec, EAGER_START, "eager verify announced at start"))
        return out + check_eager_counted(p, rec) + check_collectives_recorded(p, rec, True) + \
            [check_accept_length(p, rec, True)]
    out += check_on_graph(p, rec) + check_collectives_recorded(p, rec, False)
    out.append(check_accept_length(p, rec, p.drafter != "draft-random"))
    if "--max-running-requests" in p.flags:
        out += check_cap(p, rec)
    return out


def check_stop(p: Phase, rec: dict) -> Check:
    s = rec.get("stop") or {}
    return Check(p.name, "stopped cleanly: no process left, port free", bool(s.get("clean")) and bool(
        s.get("port_free")), f"{s}")


def evaluate(recs: dict, chains: dict) -> list[Check]:
    """All checks over the phase records (name -> record); chains: reference phase -> expected outputs."""
    out: list[Check] = []
    for name, rec in recs.items():
        p = BY_NAME[name]
        ready = rec.get("ready_s") is not None and not rec.get("error")
        out.append(Check(name, "server up and answered", ready, rec.get("error") or f"ready in {rec.get('ready_s')} s"))
        if ready:
            try:
                out += phase_checks(p, rec, recs, chains)
            except Exception as e:  # noqa: BLE001 - a record of an unexpected shape fails its phase, not the tier
                out.append(Check(name, "its checks could be evaluated", False, f"{type(e).__name__}: {e}"))
        out.append(check_stop(p, rec))
    if all(n in recs for n in TIMED):
        out += check_speedup(recs)
    return out
