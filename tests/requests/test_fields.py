"""The table of request fields and their ranges (tests/_request_fields.py) and the fuzzer's corpus (tests/_fuzz.py)
against the real HTTP app of the tree under test on CPU (tests/_app.py): every field of the request classes has a
range, every value taken reaches the scheduler, every value refused is a 4xx that never reaches it, and no request
of the corpus gets a 5xx or escapes the app as an exception (on the unpatched tree several do)."""

import dataclasses
import json

import pytest

import _fuzz
import _request_fields as rf
from _app import VOCAB

pytestmark = pytest.mark.usefixtures("sglang_tree")
TABLES = {_fuzz.GENERATE: rf.GENERATE_FIELDS, _fuzz.COMPLETIONS: rf.COMPLETIONS_FIELDS, _fuzz.CHAT: rf.CHAT_FIELDS}


def request_classes():
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    generate = [f.name for f in dataclasses.fields(GenerateReqInput)]
    generate += [f"sampling_params.{f}" for f in SamplingParams.__struct_fields__]
    return {
        _fuzz.GENERATE: generate,
        _fuzz.COMPLETIONS: list(CompletionRequest.model_fields),
        _fuzz.CHAT: list(ChatCompletionRequest.model_fields),
    }


@pytest.mark.unchanged
def test_every_field_of_the_request_classes_has_a_range():
    for path, fields in request_classes().items():
        missing, stale = set(fields) - set(TABLES[path]), set(TABLES[path]) - set(fields)
        assert not missing, f"{path}: fields without a range in tests/_request_fields.py: {sorted(missing)}"
        assert not stale, f"{path}: the table names fields the request has no more: {sorted(stale)}"


def cases(kind: str) -> list:
    return [
        pytest.param(path, field, value, id=f"{path} {field}={_fuzz.short(value)}")
        for path, table in TABLES.items()
        for field, spec in table.items()
        for value in getattr(spec, kind)
    ]


def send(server, path: str, field: str, value):
    """The field set to the value in a small valid request (with what the field needs beside it)."""
    body, spec = _fuzz.valid(path, "m", [5, 6]), TABLES[path][field]
    prefix = field.rpartition(".")[0]
    for k, v in spec.with_.items():
        _fuzz.put(body, f"{prefix}.{k}" if prefix else k, v)
    _fuzz.put(body, field, rf.resolve(value, VOCAB))
    server.sent.clear()
    return server.client().post(path, content=json.dumps(body), headers={"content-type": "application/json"})


@pytest.mark.unchanged
@pytest.mark.parametrize("path, field, value", cases("good") + cases("later"))
def test_a_value_in_range_reaches_the_scheduler(server, path, field, value):
    r = send(server, path, field, value)
    assert r.status_code == 200 and server.sent, (r.status_code, r.text[:300])


@pytest.mark.parametrize("path, field, value", cases("bad"))
def test_a_value_out_of_range_is_a_4xx_at_the_entry(server, path, field, value):
    r = send(server, path, field, value)
    assert 400 <= r.status_code < 500 and not server.sent, (r.status_code, r.text[:300])


def test_the_fuzz_corpus_gets_no_5xx(server):
    """400 seeded cases (test-serve's seed): every answer is a 2xx or a 4xx."""
    answers = {}
    for case in _fuzz.corpus(seed=_fuzz.SEED, budget=400, model="m", prompt=[5, 6, 7, 8], vocab=VOCAB):
        if case.abort:
            continue  # streams are read whole here
        headers = {"content-type": case.content_type} if case.content_type else {}
        try:
            status = server.client().post(case.path, content=case.wire(), headers=headers).status_code
        except Exception as e:  # noqa: BLE001 - an exception out of the app is a 500 to the client
            status = f"{type(e).__name__}: {e}"[:200]
        answers[case.name] = status
    bad = {n: s for n, s in answers.items() if not (isinstance(s, int) and s < 500)}
    assert not bad, f"{len(bad)} of {len(answers)}: {dict(list(bad.items())[:10])}"
