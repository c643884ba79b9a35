"""make test-serve's checks over what the servers returned: the recorded lent-H200 run, and the same records with
one promise broken at a time (each must fail, naming what it saw)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from scripts.host import serve_checks as sc, serve_plan as plan
from scripts.host.tiny_models import greedy_chain, load_chain

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

RECORDED = ROOT / "bench" / "results" / "test-serve_H200_x1_20261201.json"


@pytest.fixture(scope="module")
def recorded() -> dict:
    """Phase records of the committed H200 run, each with its server's log (the .log beside it)."""
    doc = json.loads(RECORDED.read_text())
    logs = re.split(r"^===== ([\w-]+): .*$", RECORDED.with_suffix(".log").read_text(), flags=re.M)[1:]
    recs = copy.deepcopy(doc["phases"])
    for name, text in zip(logs[::2], logs[1::2]):
        recs[name]["log"] = text
    return recs


@pytest.fixture(scope="module")
def chains(tiny_models) -> dict:
    """What each reference phase must return: the chain's continuation of every prompt (models made here, seed 0,
    the same bytes as on the device)."""
    return {p.name: [greedy_chain(load_chain(tiny_models / p.pair), q, plan.MAX_NEW) for q in plan.prompts()]
            for p in plan.PHASES if p.drafter is None}


def failed(recs: dict, chains: dict) -> list[tuple[str, str]]:
    return [(c.phase, c.name) for c in sc.evaluate(recs, chains) if not c.ok]


def test_the_recorded_h200_run_passes_every_check_again(recorded, chains):
    found = sc.evaluate(recorded, chains)
    doc = json.loads(RECORDED.read_text())
    assert [c.as_dict() for c in found] == doc["checks"] and doc["failed"] == 0 and len(found) == doc["passed"]


def broken(recorded, phase, edit):
    recs = copy.deepcopy(recorded)
    edit(recs[phase])
    return recs


def bump(rec, stage, outcome, n=3, reason="batch_above_max_bs"):
    c = rec["spec"]["spec_cuda_graph"][stage]
    c[outcome] += n
    c["fallback_reasons"][reason] = c["fallback_reasons"].get(reason, 0) + n


@pytest.mark.parametrize("phase, edit, expect", [
    ("llama-graph", lambda r: bump(r, "target_verify", "eager"), "target_verify on its CUDA graph"),
    ("kimi-mla", lambda r: bump(r, "draft_extend", "piecewise"), "draft_extend on its CUDA graph"),
    ("llama-graph", lambda r: r["spec"].update(avg_spec_accept_length=3.9), "accept length = 4"),
    ("llama-reject", lambda r: r["spec"].update(avg_spec_accept_length=1.7), "accept length < 1.5"),
    ("kimi-graph", lambda r: r["outputs"]["conc"][2].__setitem__(77, 5), "greedy output (conc) = kimi-nospec"),
    ("llama-nospec", lambda r: r["outputs"]["seq"][0].__setitem__(0, 5), "greedy output (seq) = the target's chain"),
    ("llama-cap", lambda r: r.update(log=r["log"].replace("is capped from", "was")), "the cap is announced"),
    ("llama-cap", lambda r: r.update(max_running_requests=16), "the server runs at most 8 requests"),
    ("llama-eager", lambda r: r.update(log=r["log"].replace("decode CUDA graphs disabled", "x")), "eager verify"),
    ("llama-eager", lambda r: bump(r, "target_verify", "eager", reason="other"), "counted with reason no_graph"),
    ("llama-graph", lambda r: r["metric"].pop(), "sglang:spec_cuda_graph_forwards_total = /server_info"),
    ("kimi-graph", lambda r: r.update(stop={"clean": True, "port_free": False}), "stopped cleanly"),
    ("llama-eager", lambda r: r.update(timing=[4000.0, 3800.0, 3900.0]), "verify graph >= 2x eager"),
    # the draft decode graph's capture once counted as eager forwards (found on the lent H200)
    ("llama-graph", lambda r: r["spec"]["spec_collectives"].update(
        draft_decode_eager={"calls": {}, "bytes": {}, "forwards": 24}), "spec_collectives records draft_decode only"),
    ("llama-eager", lambda r: r["spec"]["spec_collectives"].pop("target_verify_eager"),
     "spec_collectives records target_verify_eager only"),
])
def test_a_broken_promise_fails_its_check(recorded, chains, phase, edit, expect):
    """The check of the promise fails (an edited counter also parts /server_info from /metrics; a reference that
    left its chain also parts the phases compared with it)."""
    bad = failed(broken(recorded, phase, edit), chains)
    assert any(expect in name for _, name in bad), bad
    assert all(p in (phase, "timing") or phase.endswith("nospec") for p, _ in bad), bad


def test_a_server_that_never_answered_fails_and_skips_its_phase_checks(recorded, chains):
    recs = broken(recorded, "kimi-mla", lambda r: r.update(ready_s=None, error="exited (1) while starting"))
    assert failed(recs, chains) == [("kimi-mla", "server up and answered")]


def test_the_metric_is_read_with_prometheus_parser_for_rank_0_only():
    text = "\n".join([
        "# HELP sglang:spec_cuda_graph_forwards_total Speculative forwards by stage, outcome and reason",
        "# TYPE sglang:spec_cuda_graph_forwards_total counter",
        'sglang:spec_cuda_graph_forwards_total{outcome="eager",reason="no_graph_runner",stage="target_verify",'
        'tp_rank="0"} 330.0',
        'sglang:spec_cuda_graph_forwards_total{outcome="eager",reason="no_graph_runner",stage="target_verify",'
        'tp_rank="1"} 330.0',
        'sglang:spec_cuda_graph_forwards_total{outcome="graph",reason="",stage="draft_extend",tp_rank="0"} 2.0',
        'sglang:num_running_reqs{tp_rank="0"} 1.0', ""])
    samples = sc.metric_samples(text)
    assert len(samples) == 2
    assert sc.counts_from_metric(samples) == {
        "target_verify": {"graph": 0, "piecewise": 0, "eager": 330, "fallback_reasons": {"no_graph_runner": 330}},
        "draft_extend": {"graph": 2, "piecewise": 0, "eager": 0, "fallback_reasons": {}}}
