"""The request fuzzer (tests/_fuzz.py) against the bad-request phases' servers (EAGLE-3, DFlash, none), after their
bad requests: a seeded corpus of random and adversarial requests one after another, then concurrent bursts mixing
valid greedy, sampled and extreme-but-accepted requests in one batch. Every answer's class (2xx, 4xx, 5xx, hang,
down) goes into the phase's report; it fails on a dead server, a hang, any 5xx (a client's fault is a 4xx, a valid
request a 2xx), or greedy output afterwards other than the target's chain."""

import collections
import concurrent.futures as cf
import time

import pytest

import _fuzz
import _servers as sv
from tiny_models import VOCAB, greedy_chain, load_chain

WHERE = sv.BAD_PHASES
TIMEOUT_S = 60  # per request: a tiny model answers any of them in well under a second
BURSTS, BURST_SIZE = 12, 16


def send(s: sv.Server, case: _fuzz.Case) -> dict:
    """One case's answer: its class, status, time and (for a 5xx or an error) what came back."""
    import requests

    headers = {"Content-Type": case.content_type} if case.content_type else {}
    t0, status, error = time.monotonic(), None, ""
    try:
        with requests.post(
            s.url + case.path, data=case.wire(), headers=headers, timeout=TIMEOUT_S, stream=case.abort
        ) as r:
            status = r.status_code
            if case.abort:
                next(r.iter_content(64), None)  # the first chunk, then the connection is closed
            elif status >= 500:
                error = r.text[:300]
    except Exception as e:  # noqa: BLE001 - classed as hang or down
        error = f"{type(e).__name__}: {e}"[:300]
    answer = {"class": _fuzz.classify(status, error), "status": status, "ms": round(1e3 * (time.monotonic() - t0))}
    return {**answer, "error": error} if error else answer


def fuzz(s: sv.Server) -> dict:
    prompt = sv.prompts()[0]
    cases = _fuzz.corpus(_fuzz.SEED, _fuzz.BUDGET, s.model, prompt, VOCAB)
    seq = []
    for i, case in enumerate(cases):
        seq.append({**case.record(), **send(s, case)})
        if seq[-1]["class"] == "down" or (i % 50 == 49 and not s.healthy()):
            break  # the server is gone: the rest would only say so again
    bursts = []
    if s.healthy():
        for burst in _fuzz.bursts(_fuzz.SEED, BURSTS, BURST_SIZE, s.model, prompt):
            with cf.ThreadPoolExecutor(len(burst)) as ex:
                bursts += [{**c.record(), **a} for c, a in zip(burst, ex.map(lambda c: send(s, c), burst), strict=True)]
            if not s.healthy():
                break
    classes = collections.Counter(a["class"] for a in seq + bursts)
    return {
        "seed": _fuzz.SEED,
        "budget": _fuzz.BUDGET,
        "bursts": BURSTS,
        "burst_size": BURST_SIZE,
        "classes": dict(classes),
        "sequential": seq,
        "burst": bursts,
        "healthy_after": s.healthy(),
    }


@pytest.fixture(scope="module")
def fuzzed(server):
    """fuzzed(phase) -> its fuzz report (every bad-* server fuzzed at once, on first use)."""
    servers = {n: server(n) for n in WHERE}
    with cf.ThreadPoolExecutor(len(servers)) as ex:
        for name, report in zip(servers, ex.map(fuzz, servers.values()), strict=True):
            servers[name].report["fuzz"] = report
    return lambda name: servers[name].report["fuzz"]


@pytest.mark.parametrize("phase", WHERE)
@pytest.mark.parametrize("part", ["sequential", "burst"])
def test_no_request_gets_a_5xx_hangs_or_takes_the_server_down(fuzzed, phase, part, record_property):
    r = fuzzed(phase)
    record_property("detail", f"seed {r['seed']}: {len(r[part])} requests, classes {r['classes']}")
    sent = {"sequential": r["budget"], "burst": r["bursts"] * (r["burst_size"] + 2)}[part]
    bad = [
        f"{a['name']}: {a['class']} {a.get('status')} {a.get('error', '')[:120]}"
        for a in r[part]
        if a["class"] not in ("2xx", "4xx")
    ]
    assert len(r[part]) == sent and not bad, f"{len(bad)} failed: {bad[:8]}"


@pytest.mark.parametrize("phase", WHERE)
def test_after_the_fuzz_the_server_answers_and_greedy_output_is_the_chain(fuzzed, server, tiny_models, phase):
    assert fuzzed(phase)["healthy_after"], f"{phase} is down after the fuzz"
    prompt = sv.prompts()[1]
    pair = sv.PHASES[phase].pair
    assert server(phase).generate(prompt, 64)["output_ids"] == greedy_chain(load_chain(tiny_models / pair), prompt, 64)
