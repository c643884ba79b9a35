"""A real client: the OpenAI Python SDK against a speculative server (llama-client) and its reference without
speculation (llama-nospec). Every greedy result is the same, token for token (a tiny-model token is one word,
"w<id>"), and where the chain says what it must be, it is that."""

import pytest

import _servers as sv
from tiny_models import greedy_chain, load_chain

SERVERS = ("llama-client", "llama-nospec")
PROMPT, N = sv.prompts(seed=7, lens=(16,))[0], 32
GRAMMAR = "(w1[0-9]*)+"  # tokens whose word starts with "w1": about half the chain's next tokens are refused


@pytest.fixture(scope="module")
def ask(server):
    """ask(**completion args) -> (speculative, reference) responses of the same request."""
    import openai

    urls = [server(n).url + "/v1" for n in SERVERS]
    clients = [openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=300) for url in urls]
    models = [c.models.list().data[0].id for c in clients]

    def both(**kw):
        request = dict(prompt=PROMPT, max_tokens=N, temperature=0, **kw)
        return [c.completions.create(model=m, **request) for c, m in zip(clients, models)]

    return both


@pytest.fixture(scope="module")
def chain(tiny_models) -> list[str]:
    return [f"w{t}" for t in greedy_chain(load_chain(tiny_models / "llama"), PROMPT, N)]


def words(response) -> list[str]:
    return response.choices[0].text.split()


def test_a_completion_follows_the_chain(ask, chain):
    spec, ref = ask()
    assert words(spec) == words(ref) == chain


def test_a_streamed_completion_is_the_same_text(ask, chain):
    spec, ref = ask(stream=True)
    assert ["".join(c.choices[0].text for c in s if c.choices).split() for s in (spec, ref)] == [chain, chain]


def test_logprobs_are_the_references(ask, chain, record_property):
    spec, ref = (r.choices[0].logprobs for r in ask(logprobs=3))
    diff = max(abs(a - b) for a, b in zip(spec.token_logprobs, ref.token_logprobs))
    record_property("detail", f"chosen-token logprobs differ by up to {diff:.4f}")
    assert [t.strip() for t in spec.tokens] == [t.strip() for t in ref.tokens] == chain and diff < 0.05
    assert all(len(t) == 3 for t in spec.top_logprobs + ref.top_logprobs)


def test_logit_bias_moves_the_first_token_on_both(ask, chain):
    spec, ref = ask(logit_bias={chain[0][1:]: -100})
    assert words(spec) == words(ref) and words(spec)[0] != chain[0]


def test_a_stop_string_ends_both_where_it_appears(ask, chain, record_property):
    k = next(i for i in range(3, N) if chain[i] not in " ".join(chain[:i]))
    spec, ref = ask(stop=[chain[k]])
    record_property("detail", f"stop {chain[k]!r} (token {k})")
    assert words(spec) == words(ref) == chain[:k] and spec.choices[0].finish_reason == "stop"


def test_a_grammar_constrained_completion_is_the_same_and_obeys_the_grammar(ask, chain, record_property):
    spec, ref = ask(extra_body={"regex": GRAMMAR})
    got = words(spec)
    record_property("detail", f"{sum(a != b for a, b in zip(got, chain))} of {len(got)} tokens differ from the chain")
    assert got == words(ref) and got and all(w.startswith("w1") for w in got)
    assert got != chain[: len(got)], "the grammar refused nothing: it was not applied"
