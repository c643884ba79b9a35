"""No request can take the server down: each malformed or out-of-range request below gets a 4xx, the server stays
healthy, and its greedy output afterwards is what it was (the target's chain). On an EAGLE-3, a DFlash and a server
without speculation, each its own (sv.BAD_PHASES): a request that kills one leaves every other phase alone.
The malformed ones come first; a token id outside [0, vocab) is last (SGLang 0.5.23 dies on one in a prompt)."""

import pytest

import _servers as sv
from tiny_models import greedy_chain, load_chain

OOV = 999_999  # a token id outside the tiny vocabulary (and Kimi-K2.5's)
DROP, MODEL = object(), "<served model>"


def completion(**kw) -> dict:
    body = {"model": MODEL, "prompt": [5, 6], "max_tokens": 4, **kw}
    return {k: v for k, v in body.items() if v is not DROP}


def generate(ids=(5, 6), **kw) -> dict:
    return {"input_ids": list(ids), "sampling_params": {"max_new_tokens": 4}, **kw}


def sampling(**params) -> dict:
    return generate(sampling_params={"max_new_tokens": 4, **params})


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
    ("top-k-beyond-int32", "/generate", sampling(top_k=2**31)),
    ("logit-bias-not-float32", "/generate", sampling(logit_bias={"5": 1e39})),
    ("huge-max-tokens", "/v1/completions", completion(max_tokens=10**9)),
    ("empty-prompt", "/v1/completions", completion(prompt="")),
    ("logit-bias-key-oov-completions", "/v1/completions", completion(logit_bias={str(OOV): 5})),
    ("logit-bias-key-oov-generate", "/generate", sampling(logit_bias={str(OOV): 5.0})),
    ("stop-token-id-oov-generate", "/generate", sampling(stop_token_ids=[OOV])),
    ("stop-token-id-oov-completions", "/v1/completions", completion(stop_token_ids=[OOV])),
    ("token-ids-logprob-oov", "/generate", generate(return_logprob=True, token_ids_logprob=[OOV])),
    # the fuzzer's finds (patches: the validation patch, constrained: ... is the request's 400), kept as regressions
    ("logprob-start-negative", "/generate", generate(range(5, 15), return_logprob=True, logprob_start_len=-5)),
    ("n-beyond-int64", "/generate", sampling(n=2**63)),
    ("n-huge-completions", "/v1/completions", completion(n=10**7)),
    ("temperature-beyond-float32", "/generate", sampling(temperature=1e39)),
    ("repetition-penalty-tiny", "/generate", sampling(temperature=1.0, top_k=50, repetition_penalty=1e-40)),
    ("stop-regex-invalid", "/generate", sampling(stop_regex="(")),
    ("grammar-no-token-starts", "/generate", sampling(regex="z+")),
    ("grammar-dead-end-greedy", "/generate", sampling(regex="w5z")),
    ("grammar-dead-end-sampled", "/generate", sampling(regex="w5z", temperature=0.8, top_p=0.9)),
    ("session-params-unknown-key", "/generate", generate(session_params={"foo": 1})),
    ("rid-a-list", "/generate", generate(rid=[])),
    ("http-worker-ipc", "/generate", generate(http_worker_ipc="ipc:///tmp/elsewhere")),
    ("chat-body-a-string", "/v1/chat/completions", b'"hello"'),
    ("prompt-id-oov-generate", "/generate", generate((5, OOV))),
    ("prompt-id-negative-generate", "/generate", generate((5, -1))),
    ("prompt-id-oov-generate-batch", "/generate", generate(([5, 6], [7, OOV]))),
    ("prompt-id-oov-completions", "/v1/completions", completion(prompt=[5, OOV])),
    ("prompt-id-oov-completions-batch", "/v1/completions", completion(prompt=[[5, 6], [7, OOV]])),
]


@pytest.mark.parametrize("where", sv.BAD_PHASES)
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


# accepted values that once made a row's probabilities non-finite: each alone, then with a greedy request beside it
EXTREME = {
    "bias-max-over-half": {"temperature": 0.5, "top_p": 0.9, "logit_bias": {"5": 3.4e38}},
    "bias-over-tiny-temperature": {"temperature": 1e-5, "logit_bias": {"5": 3.5e33}},
    "every-token-banned": {"temperature": 0.5, "top_k": 20, "logit_bias": {str(i): -3.4e38 for i in range(2048)}},
    "temperature-float32-max": {"temperature": 3.4e38, "top_p": 0.9, "min_new_tokens": 2},
}


@pytest.mark.parametrize("where", sv.BAD_PHASES)
@pytest.mark.parametrize("name", EXTREME)
def test_an_extreme_sampled_request_beside_a_greedy_one_completes(server, where, name, record_property):
    """In one batch with a greedy request (greedy is top_k 1: the whole batch takes the top-k/top-p sampler)."""
    import concurrent.futures as cf

    s = server(where)
    bodies = [
        generate(range(5, 25), sampling_params={"max_new_tokens": 8, **EXTREME[name]}),
        generate(range(5, 25), sampling_params={"max_new_tokens": 8, "temperature": 0}),
    ]
    with cf.ThreadPoolExecutor(2) as ex:
        answers = list(ex.map(lambda b: s.call("POST", "/generate", b, timeout=60), bodies))
    record_property(
        "detail", str([(r.status_code, r.json().get("output_ids") if r.ok else r.text[:100]) for r in answers])
    )
    assert [r.status_code for r in answers] == [200, 200] and s.healthy(), [r.text[:200] for r in answers]
    if name.startswith("bias-"):  # the biased token wins every step
        assert set(answers[0].json()["output_ids"]) == {5}, answers[0].json()["output_ids"]


@pytest.mark.parametrize("where", sv.BAD_PHASES)
def test_greedy_output_afterwards_is_unchanged(server, tiny_models, where):
    prompt = sv.prompts()[1]
    got = server(where).generate(prompt, 64)["output_ids"]
    assert got == greedy_chain(load_chain(tiny_models / "llama"), prompt, 64)
