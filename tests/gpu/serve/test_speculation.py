"""What the series promises a speculative server (EAGLE-3 or DFlash), each phase over one workload: 3 fixed prompts x
128 greedy tokens one after another and all at once (and a burst above the captured batch size where the phase
raises --max-running-requests), then /server_info and /metrics; the log lines are the patched SGLang's own."""

import concurrent.futures as cf
import re
import statistics
import time

import pytest

import _servers as sv
from tiny_models import greedy_chain, load_chain

MAX_NEW, BURST, TIMED_TOKENS = 128, 64, 256
SPEC = [n for n, p in sv.PHASES.items() if p.reference]
NOSPEC = sorted({sv.PHASES[n].reference for n in SPEC})
EAGER = [n for n in SPEC if sv.PHASES[n].flags == sv.EAGER_FLAGS]
ON_GRAPH = [n for n in SPEC if n not in EAGER]
CAPPED = [n for n, p in sv.PHASES.items() if p.flags == sv.CAP_FLAGS]
ACCEPT = {"draft-pi": sv.DRAFT_TOKENS, "draft-mla": sv.DRAFT_TOKENS, "dflash-first": 2}  # as built; else < 1.5
EAGER_START = "runs with the target's decode CUDA graphs disabled (--disable-decode-cuda-graph)"
EAGER_FORWARD = re.compile(r"Speculative (\w+) forward \(bs=\d+\) ran eagerly, not on its CUDA graph, reason=(\w+)")


def workload(s: sv.Server) -> None:
    prompts = sv.prompts()
    seq = [s.generate(p, MAX_NEW) for p in prompts]
    with cf.ThreadPoolExecutor(len(prompts)) as ex:
        conc = list(ex.map(lambda p: s.generate(p, MAX_NEW), prompts))
    s.report["outputs"] = {"seq": [r["output_ids"] for r in seq], "conc": [r["output_ids"] for r in conc]}
    s.report["meta"] = [{k: r["meta_info"].get(k) for k in ("completion_tokens", "spec_accept_length")} for r in seq]
    if s.phase.name in CAPPED:
        with cf.ThreadPoolExecutor(sv.CAP) as ex:
            burst = list(ex.map(lambda i: s.generate(prompts[i % 3], BURST), range(sv.CAP)))
        s.report["burst"] = {"requests": sv.CAP, "completed": sum(len(r["output_ids"]) == BURST for r in burst)}
    s.snapshot()


@pytest.fixture(scope="module")
def served(server):
    """served(phase) -> what its server reported after its workload (every phase's at once, on first use)."""
    errors = {}

    def run(name):
        try:
            workload(server(name))
        except Exception as e:  # noqa: BLE001 - the phase's tests fail with it
            errors[name] = f"{name}'s workload failed: {type(e).__name__}: {e}"

    with cf.ThreadPoolExecutor(len(SPEC) + len(NOSPEC)) as ex:
        list(ex.map(run, SPEC + NOSPEC))

    def get(name):
        assert name not in errors, errors[name]
        return server(name).report

    return get


def stage(r: dict, name: str) -> dict:
    return (r["spec"].get("spec_cuda_graph") or {}).get(name) or {}


def nonzero(counts: dict) -> dict:
    return {st: {k: v for k, v in c.items() if v} for st, c in counts.items() if any(c.values())}


@pytest.mark.parametrize("phase", list(sv.PHASES))
def test_the_server_starts_and_answers(server, phase, record_property):
    record_property("detail", f"ready in {server(phase).report['ready_s']} s")


@pytest.mark.parametrize("phase", NOSPEC)
def test_greedy_output_follows_the_targets_chain(served, tiny_models, phase):
    chain = load_chain(tiny_models / sv.PHASES[phase].pair)
    want = [greedy_chain(chain, p, MAX_NEW) for p in sv.prompts()]
    assert served(phase)["outputs"] == {"seq": want, "conc": want}


@pytest.mark.parametrize("phase", SPEC)
def test_greedy_output_equals_the_reference_token_for_token(served, phase):
    got, want = served(phase)["outputs"], served(sv.PHASES[phase].reference)["outputs"]
    for step in ("seq", "conc"):
        for i, (a, b) in enumerate(zip(got[step], want[step])):
            k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
            assert a == b, f"{step}: prompt {i} first differs at token {k} ({len(a)} vs {len(b)} tokens)"


@pytest.mark.parametrize("phase", ON_GRAPH)
def test_every_speculative_stage_runs_on_its_cuda_graph(served, phase, record_property):
    r = served(phase)
    record_property("detail", str({st: stage(r, st) for st in sv.PHASES[phase].stages}))
    for st in sv.PHASES[phase].stages:
        c = stage(r, st)
        assert c.get("graph", 0) > 0 and not c.get("eager") and not c.get("piecewise"), f"{st}: {c}"


@pytest.mark.parametrize("phase", SPEC)
def test_the_metric_counts_equal_server_info(served, phase):
    r = served(phase)
    info, metric = nonzero(r["spec"].get("spec_cuda_graph") or {}), nonzero(r["metric"] or {})
    assert info and info == metric, f"/server_info {info}, sglang:cuda_graph_passes_total {metric}"


@pytest.mark.parametrize("phase", SPEC)
def test_accept_length_is_the_drafters(served, phase, record_property):
    r = served(phase)
    avg, per = r["spec"].get("avg_spec_accept_length"), [m["spec_accept_length"] for m in r["meta"]]
    record_property("detail", f"avg_spec_accept_length {avg}, per request {per}")
    want = ACCEPT.get(sv.PHASES[phase].drafter)
    if want is None:
        assert avg is not None and avg < 1.5, "a drafter that is almost never right"
    else:
        assert all(abs(x - want) < 0.01 for x in [avg, *per]), f"accept length {want}, as the drafter is built"


@pytest.mark.parametrize("phase", SPEC)
def test_spec_collectives_records_the_graphs_or_the_eager_forwards(served, phase):
    r, eager = served(phase), phase in EAGER
    got = r["spec"].get("spec_collectives") or {}
    for st in sv.PHASES[phase].stages:
        key, other = (f"{st}_eager", st) if eager else (st, f"{st}_eager")
        n = (got.get(key) or {}).get("forwards" if eager else "graphs", 0)
        assert n > 0 and other not in got, f"{key}: {got.get(key)}, {other}: {got.get(other)}"
        assert not eager or n == stage(r, st).get("eager"), f"{key} {n} forwards, spec_cuda_graph {stage(r, st)}"


@pytest.mark.parametrize("phase", CAPPED)
def test_max_running_requests_above_the_captured_batches_is_capped_at_start(served, server, phase):
    r, text = served(phase), f"max_running_requests is capped from {sv.CAP} to {sv.CAPTURED_MAX}"
    assert text in server(phase).log.read_text(), f"no log line says {text!r}"
    assert r["max_running_requests"] == sv.CAPTURED_MAX and r["burst"]["completed"] == sv.CAP, r["burst"]


@pytest.mark.parametrize("phase", EAGER)
def test_without_decode_graphs_every_stage_is_eager_counted_and_announced(served, server, phase):
    r, log, stages = served(phase), server(phase).log.read_text(), sv.PHASES[phase].stages
    for c in (stage(r, st) for st in stages):
        assert c.get("eager", 0) > 0 and not c.get("graph"), c
        assert c.get("fallback_reasons") == {"no_graph_runner": c["eager"]}, c
    assert EAGER_START in log, "the eager verify is not announced at start"
    assert {(st, "no_graph_runner") for st in stages} <= set(EAGER_FORWARD.findall(log)), "first eager forward unlogged"


def test_the_verify_graph_is_at_least_twice_as_fast_as_eager(served, server, record_property):
    """bs-1 tok/s, alternating rounds (graph, eager; eager, graph; ...), the other servers idle."""
    pair = [server("llama-graph"), server("llama-eager")]
    for r in range(3):
        for s in pair if r % 2 == 0 else pair[::-1]:
            t0 = time.monotonic()
            n = s.generate(sv.prompts()[0], TIMED_TOKENS)["meta_info"]["completion_tokens"]
            s.report.setdefault("timing", []).append(round(n / (time.monotonic() - t0), 1))
    graph, eager = (statistics.median(s.report["timing"]) for s in pair)
    record_property("detail", f"median {graph:.0f} vs {eager:.0f} tok/s = {graph / eager:.2f}x")
    assert graph >= 2 * eager
