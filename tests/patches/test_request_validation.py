"""One request never takes the server down: what would index a device tensor out of range is a 400 first.

A prompt token id outside [0, vocab) reaches the embedding's index_select (a device-side assert: the scheduler dies
and every later request is refused); stop_token_ids, top_logprobs_num, top_k, pooling positions, a client-set
lora_id, JSON positional_embed_overrides and ragged input_embeds reach other device indexing or crash the scheduler.
Each request goes through the real entry points (the HTTP app, Engine.async_generate) to a real TokenizerManager on
CPU, the scheduler stood in (tests/_app.py)."""

import asyncio
import re

import pytest

from _app import OOV, VOCAB
from _sgl import bare

GEN, CMPL, CHAT = "/generate", "/v1/completions", "/v1/chat/completions"
OOV_MSG = f"out-of-vocabulary token id {OOV}; valid range is [0, {VOCAB})"
MSG = [{"role": "user", "content": "w1"}]
IN_VOCAB = f"an integer in [0, {VOCAB}]"
NO_MM = "This model takes no image, video or audio input"


def gen(**kw):  # /generate of one prompt token
    return GEN, {"input_ids": [5], **kw}


def sp(**sampling):  # /generate with these sampling_params
    return gen(sampling_params=sampling)


def cmpl(**kw):
    return CMPL, {"model": "m", "prompt": [5], **kw}


def chat(**kw):
    return CHAT, {"model": "m", "messages": MSG, "input_ids": [5], **kw}


BAD = {  # name: ((path, JSON body), what the 400 must say)
    "generate-oov": (gen(input_ids=[5, OOV]), OOV_MSG),
    "generate-negative": (gen(input_ids=[5, -1]), f"token id -1; valid range is [0, {VOCAB})"),
    "generate-batch-oov": (gen(input_ids=[[5, 6], [7, OOV]]), OOV_MSG),
    "generate-batch-empty": (gen(input_ids=[[5], []]), "prompt is empty"),
    "generate-empty-text": ((GEN, {"text": ""}), "prompt is empty"),
    "generate-n2-oov": (gen(input_ids=[5, OOV], sampling_params={"n": 2}), OOV_MSG),
    "completions-oov": (cmpl(prompt=[5, OOV], max_tokens=1), OOV_MSG),
    "completions-batch-oov": (cmpl(prompt=[[5], [OOV]], max_tokens=1), OOV_MSG),
    "completions-stream-oov": (cmpl(prompt=[5, OOV], max_tokens=1, stream=True), OOV_MSG),
    "chat-input-ids-oov": (chat(input_ids=[5, OOV], max_tokens=1), OOV_MSG),
    "stop-token-ids": (sp(stop_token_ids=[OOV], min_new_tokens=1), f"stop_token_ids contains {OOV_MSG}"),
    "completions-stop-token-ids": (cmpl(stop_token_ids=[-2]), "stop_token_ids contains out-of-vocabulary token id -2"),
    "top-logprobs-num": (gen(return_logprob=True, top_logprobs_num=10**9), f"top_logprobs_num must be {IN_VOCAB}"),
    "completions-logprobs": (cmpl(logprobs=VOCAB + 1), f"top_logprobs_num must be {IN_VOCAB}"),
    "chat-top-logprobs": (chat(logprobs=True, top_logprobs=10**6), "top_logprobs_num must be an integer"),
    "top-k-int32": (sp(top_k=2**31), "top_k must be -1 (disable) or at"),
    # added to float32 logits, 1e39 would be inf there, and sampling from inf logits returns any id
    "logit-bias-beyond-float32": (
        sp(logit_bias={"5": 1e39}),
        "logit_bias values must be finite float32 numbers, got 1e+39 for token 5",
    ),
    "logit-bias-key": (cmpl(logit_bias={"w5": 1.0}), "logit_bias keys must be token ids, got 'w5'"),
    "pool-positions": (
        gen(input_ids=[5, 6], token_indices_to_pool=[9], sampling_params={"max_new_tokens": 0}),
        "token_indices_to_pool contains position 9; valid range is [0, 2)",
    ),
    "delimiter-positions": (
        gen(input_ids=[5, 6], multi_item_delimiter_indices=[-1]),
        "multi_item_delimiter_indices contains position -1",
    ),
    "n-zero": (chat(n=0), "n must be an integer in [1, 16384], got 0"),
    "client-lora-id": (gen(lora_id="0"), "lora_id is assigned by the server"),
    # a model without a multimodal processor drops such data and passes the ids on unchecked: refused instead
    "generate-oov-empty-image": (gen(input_ids=[5, OOV], image_data=""), NO_MM),
    "generate-oov-image": (gen(input_ids=[5, OOV], image_data="not-an-image"), NO_MM),
    "generate-video": (gen(video_data="v"), NO_MM),
    "generate-audio-list": (gen(input_ids=[5, OOV], audio_data=["a"]), NO_MM),
    # a negative start slices the prompt from its end while the scheduler counts from its start: an assert there
    "logprob-start-negative": (
        gen(input_ids=[5, 6, 7, 8, 9, 10, 11], return_logprob=True, logprob_start_len=-5),
        "logprob_start_len must be -1 (output tokens only)",
    ),
    # the request is copied n times before SamplingParams.verify: OverflowError / MemoryError / TypeError there.
    # The upper bound is held at 16385 (the unpatched tree copies the request that many times, not 10**7).
    "n-beyond-int64": (sp(n=2**63), "n must be an integer in [1, 16384]"),
    "n-null": (sp(n=None, max_new_tokens=0), None),
    "n-above-the-bound": (cmpl(n=16385), "n must be an integer in [1, 16384]"),
    "temperature-beyond-float32": (sp(temperature=1e39), "temperature must be a non-negative finite float32 number"),
    "repetition-penalty-tiny": (sp(repetition_penalty=1e-40), "repetition_penalty must be in [1e-06, 2]"),
    "stop-regex-invalid": (sp(stop_regex="("), "stop_regex '(' is not a valid regular expression"),
    "stop-regex-repeat-overflow": (sp(stop_regex="a{99999999999}"), "is not a valid regular expression"),
    "stop-string-long": (cmpl(stop=["w1 " * 400]), "stop string is 1200 bytes, over the 1024-byte limit"),
    "session-params-unknown-key": (gen(session_params={"foo": 1}), "session_params must be an object with keys among"),
    "json-embed-overrides": (
        gen(positional_embed_overrides={"embeds": [[1.0]], "positions": [0]}),
        "positional_embed_overrides must be a PositionalEmbeds",
    ),
}


def _error(resp) -> str:
    body = resp.json()
    err = body.get("error", body)
    return err.get("message", "") if isinstance(err, dict) else str(body.get("message", err))


@pytest.mark.parametrize("name", BAD)
def test_bad_request_is_a_400_naming_the_value_and_never_reaches_the_scheduler(server, name):
    (path, body), message = BAD[name]
    resp = server.client().post(path, json=body)
    if message is None:  # a value meaning the default: accepted
        assert resp.status_code == 200 and server.sent, (resp.status_code, resp.text[:500])
        return
    assert resp.status_code == 400, (resp.status_code, resp.text[:500])
    assert message in _error(resp), resp.text[:500]
    assert not server.sent or name.startswith("generate-batch"), server.sent  # a batch's good head may go first


@pytest.mark.parametrize("embeds", [[[0.0] * 7168, [0.0] * 3], [[0.0] * 3]], ids=["ragged", "narrow"])
def test_input_embeds_of_the_wrong_shape_are_a_400(server, monkeypatch, embeds):
    """Under --disable-radix-cache a request may carry input_embeds, which the scheduler stacks into one tensor."""
    from types import SimpleNamespace

    from sglang.srt.managers import tokenizer_manager as tm_module

    monkeypatch.setattr(tm_module, "get_memory", lambda: SimpleNamespace(disable_radix_cache=True))
    resp = server.client().post(GEN, json={"input_embeds": embeds})
    assert resp.status_code == 400, resp.text[:300]
    assert "input_embeds must be a non-empty list of rows of 7168 floats" in _error(resp)
    assert not server.sent


@pytest.mark.parametrize(
    "path, body",
    [
        ("/encode", {"input_ids": [5, OOV]}),
        ("/v1/embeddings", {"model": "m", "input": [5, OOV]}),
        ("/v1/embeddings", {"model": "m", "input": [[5], [OOV]]}),
    ],
    ids=["encode", "embeddings", "embeddings-batch"],
)
def test_embedding_path_rejects_out_of_vocabulary_ids(embedding_server, path, body):
    resp = embedding_server.client().post(path, json=body)
    assert resp.status_code == 400 and OOV_MSG in _error(resp), resp.text[:500]
    assert all(OOV not in req.input_ids for req in embedding_server.sent)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(input_ids=[5, OOV]), OOV_MSG),
        (dict(input_ids=[[5], [OOV]]), OOV_MSG),
        (dict(input_ids=[5], sampling_params={"logit_bias": {"5": float("nan")}}), "finite float32 numbers, got nan"),
        (dict(input_ids=[5, OOV], image_data=""), NO_MM),
    ],
    ids=["single", "batch", "logit-bias-nan", "image-data"],
)
def test_engine_api_raises_value_error(server, kwargs, message):
    from sglang.srt.entrypoints.engine import Engine

    engine = bare(Engine, tokenizer_manager=server.tm)  # no scheduler subprocess
    with pytest.raises(ValueError, match=re.escape(message)):
        asyncio.run(engine.async_generate(**kwargs))
    sent = [list(req.input_ids) for req in server.sent]
    assert sent == [] or (sent == [[5]] and isinstance(kwargs["input_ids"][0], list)), sent  # a batch's head


GOOD = {  # name: (the embedding server?, (path, body)); single requests' fields: tests/requests/test_fields.py
    "generate-batch": (False, gen(input_ids=[[5], [VOCAB - 1]], return_logprob=True, top_logprobs_num=20)),
    "encode": (True, ("/encode", {"input_ids": [5, VOCAB - 1]})),
    "embeddings-batch": (True, ("/v1/embeddings", {"model": "m", "input": [[5], [VOCAB - 1]]})),
}


@pytest.mark.unchanged
@pytest.mark.parametrize("name", GOOD)
def test_good_request_reaches_the_scheduler(request, name):
    """Batches and the embedding paths: in-range ids up to the vocabulary's last pass unchanged."""
    embedding, (path, body) = GOOD[name]
    server = request.getfixturevalue("embedding_server" if embedding else "server")
    resp = server.client().post(path, json=body)
    assert resp.status_code == 200, resp.text[:500]
    assert server.sent and all(max(req.input_ids) < VOCAB for req in server.sent)
