"""No request can take the server down: each malformed or out-of-range request below gets a 4xx, the server stays
healthy, and its greedy output afterwards is what it was (the target's chain). On a speculative server and on one
without speculation, each its own (bad-spec, bad-nospec): a request that kills one leaves every other phase alone.
The malformed ones come first; a token id outside [0, vocab) is last (SGLang 0.5.23 dies on one in a prompt)."""

from __future__ import annotations

import pytest

import _servers as sv
from tiny_models import greedy_chain, load_chain

PHASE = "bad-requests"
OOV = 999_999  # a token id outside the tiny vocabulary (and Kimi-K2.5's)
DROP, MODEL = object(), "<served model>"


def completion(**kw) -> dict:
    body = {"model": MODEL, "prompt": [5, 6], "max_tokens": 4, **kw}
    return {k: v for k, v in body.items() if v is not DROP}


def generate(ids=(5, 6), **kw) -> dict:
    return {"input_ids": list(ids), "sampling_params": {"max_new_tokens": 4}, **kw}


BAD = [  # (id, path, body)
    ("invalid-json", "/v1/completions", b'{"model": "m", "prompt": [5'),
    ("missing-prompt", "/v1/completions", completion(prompt=DROP)),
    ("wrong-type", "/v1/completions", completion(max_tokens="four")),
    ("negative-max-tokens", "/v1/completions", completion(max_tokens=-1)),
    ("negative-temperature", "/v1/completions", completion(temperature=-0.5)),
    ("top-p-above-1", "/v1/completions", completion(top_p=1.5)),
    ("n-0", "/v1/completions", completion(n=0)),
    # a model name SGLang does not serve is answered (the name is informational), a LoRA adapter without LoRA is not
    ("adapter-without-lora", "/v1/completions", completion(model="tiny:no-such-adapter")),
    ("top-logprobs-huge", "/generate", generate(return_logprob=True, top_logprobs_num=10**9)),
    ("top-k-beyond-int32", "/generate", generate(sampling_params={"max_new_tokens": 4, "top_k": 2**31})),
    ("logit-bias-not-float32", "/generate", generate(sampling_params={"max_new_tokens": 4, "logit_bias": {"5": 1e39}})),
    ("huge-max-tokens", "/v1/completions", completion(max_tokens=10**9)),
    ("empty-prompt", "/v1/completions", completion(prompt="")),
    ("logit-bias-key-oov-completions", "/v1/completions", completion(logit_bias={str(OOV): 5})),
    ("logit-bias-key-oov-generate", "/generate", generate(sampling_params={"max_new_tokens": 4,
                                                                           "logit_bias": {str(OOV): 5.0}})),
    ("stop-token-id-oov-generate", "/generate", generate(sampling_params={"max_new_tokens": 4,
                                                                          "stop_token_ids": [OOV]})),
    ("stop-token-id-oov-completions", "/v1/completions", completion(stop_token_ids=[OOV])),
    ("token-ids-logprob-oov", "/generate", generate(return_logprob=True, token_ids_logprob=[OOV])),
    ("prompt-id-oov-generate", "/generate", generate((5, OOV))),
    ("prompt-id-negative-generate", "/generate", generate((5, -1))),
    ("prompt-id-oov-generate-batch", "/generate", generate(([5, 6], [7, OOV]))),
    ("prompt-id-oov-completions", "/v1/completions", completion(prompt=[5, OOV])),
    ("prompt-id-oov-completions-batch", "/v1/completions", completion(prompt=[[5, 6], [7, OOV]])),
]


@pytest.mark.parametrize("where", ["bad-spec", "bad-nospec"])
@pytest.mark.parametrize("name, path, body", BAD, ids=[b[0] for b in BAD])
def test_a_bad_request_gets_a_4xx_and_the_server_stays_healthy(server, where, name, path, body, record_property):
    s = server(where)
    if isinstance(body, dict) and body.get("model") == MODEL:
        body = {**body, "model": s.model}
    try:
        r = s.call("POST", path, body, timeout=30)
    except Exception as e:  # noqa: BLE001 - said as the failure
        pytest.fail(f"{where}: {path} {name} got no answer ({type(e).__name__}); healthy: {s.healthy()}")
    record_property("detail", f"{r.status_code}: {r.text[:200]}")
    assert 400 <= r.status_code < 500, f"{where}: {name} answered {r.status_code}: {r.text[:300]}"
    assert s.healthy(), f"{where} is down after {name}"


@pytest.mark.parametrize("where", ["bad-spec", "bad-nospec"])
def test_greedy_output_afterwards_is_unchanged(server, tiny_models, where):
    prompt = sv.prompts()[1]
    got = server(where).generate(prompt, 64)["output_ids"]
    assert got == greedy_chain(load_chain(tiny_models / "llama"), prompt, 64)
