"""A grammar the model's vocabulary cannot satisfy is the client's 400, not the server's 500.

xgrammar compiles such a grammar and then masks every token, the stop tokens too: the sampler picks a masked token,
the matcher refuses it, and SGLang 0.5.23 answers 500 "Grammar accept_token failed". The real XGrammarGrammarBackend
over a word-level tokenizer (w0, w1, ...: no token holds a "z" or a "q"), the scheduler's real grammar steps."""

from http import HTTPStatus
from types import SimpleNamespace

import pytest

from _sgl import FIXTURES, published, server_args

W5 = 8  # the id of the word "w5"


@pytest.fixture(scope="module")
def backend():
    from transformers import AutoTokenizer

    from sglang.srt.constrained.base_grammar_backend import create_grammar_backend

    tokenizer = AutoTokenizer.from_pretrained(str(FIXTURES / "bench" / "tokenizer"))
    sa = server_args(12, tp=1, spec=False, grammar_backend="xgrammar")
    with published(sa):
        yield create_grammar_backend(sa, tokenizer, len(tokenizer), eos_token_ids={2})


def request(grammar):
    return SimpleNamespace(rid="r1", grammar=grammar, to_finish=None, finished=lambda: False)


def accept(req, tokens: list[int]):
    """The scheduler's grammar step over sampled or verified tokens (a prefill's first token, then decodes)."""
    from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor

    SchedulerBatchResultProcessor._apply_prefill_grammar(None, req=req, next_token_id=tokens[0])
    if len(tokens) > 1 and req.to_finish is None:
        SchedulerBatchResultProcessor._accept_grammar_tokens(None, req, tokens[1:])
    return req.to_finish


@pytest.mark.parametrize(
    "kind, value", [("regex", "z+"), ("regex", "(zz|qq)w5"), ("ebnf", 'root ::= "q"'), ("json", '{"enum": ["zz"]}')]
)
def test_a_grammar_no_token_can_start_is_refused_when_compiled(backend, kind, value):
    """Refused at compile time (the scheduler answers 400 "Failed to compile <kind> grammar: ...")."""
    from sglang.srt.constrained.base_grammar_backend import InvalidGrammarObject

    grammar = getattr(backend, f"dispatch_{kind}")(value)
    assert isinstance(grammar, InvalidGrammarObject), grammar
    assert "allows no token of this model's vocabulary" in grammar.error_message


@pytest.mark.parametrize("tokens", [[W5, 9], [9]], ids=["dead-end-after-w5", "masked-first-token"])
def test_a_token_the_grammar_masked_ends_the_request_with_a_400(backend, tokens):
    """After "w5" no token continues "w5q": the sampler can only pick a masked token; the client's 400 says why."""
    finish = accept(request(backend.dispatch_regex("w5q")), tokens)
    assert finish.status_code == HTTPStatus.BAD_REQUEST, finish.message
    assert "constraints leave no token to generate" in finish.message


@pytest.mark.unchanged
def test_an_allowed_token_is_accepted_and_a_backend_that_cannot_tell_keeps_the_500(backend):
    from sglang.srt.constrained.base_grammar_backend import BaseGrammarObject

    assert accept(request(backend.dispatch_regex("w5 ?w5")), [W5, W5]) is None

    class Refusing(BaseGrammarObject):
        def accept_token(self, token):
            raise ValueError(f"Tokens not accepted: {token}")

    finish = accept(request(Refusing()), [W5])
    assert finish.status_code == HTTPStatus.INTERNAL_SERVER_ERROR and "accept_token failed" in finish.message
