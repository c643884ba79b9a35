"""test-serve's request fuzzer: a seeded corpus of random and adversarial requests over /generate, /v1/completions
and /v1/chat/completions, and concurrent bursts that mix valid greedy, sampled and extreme requests in one batch.

Pure Python, no server: tests/gpu/serve/test_fuzz.py sends the corpus to the servers, tests/requests/test_fields.py
through the real HTTP app on CPU. A case is a valid request with one to three fields replaced, by a value of the
field's range (tests/_request_fields.py) or a generic mutation; a fixed set adds what is wrong with the request as a
whole. The oracle: never 5xx, hang or down, whoever's fault the request is."""

import dataclasses
import json
import random

import _request_fields as rf

GENERATE, COMPLETIONS, CHAT = "/generate", "/v1/completions", "/v1/chat/completions"
SEED, BUDGET = 20261204, 400  # test-serve's corpus per server
MAX_NEW = 8  # tokens per fuzzed request: the corpus is about the entry, not long decodes
HUGE = (2**31, 2**63, 2**64, -(2**63) - 1, 10**30)
NONFINITE = (float("nan"), float("inf"), float("-inf"))
WRONG = (None, True, False, "x", "", [], [None], {}, {"a": 1}, -1, 0, 1, 0.5, -0.5, 1e-45, 1e308)  # types, edges
GENERIC = (*WRONG, *HUGE, *NONFINITE, "a" * 70_000)


@dataclasses.dataclass
class Case:
    name: str  # what it tries, e.g. "/generate sampling_params.temperature=1e-45"
    path: str
    body: object  # a JSON value, or bytes sent as they are
    content_type: str = "application/json"
    abort: bool = False  # a stream closed after its first chunk

    def wire(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        return json.dumps(self.body, allow_nan=True).encode()  # NaN / Infinity: not JSON, sent anyway

    def record(self) -> dict:
        text = self.wire().decode(errors="replace")
        return {**vars(self), "body": text if len(text) <= 300 else text[:300] + "..."}


def valid(path: str, model: str, prompt: list[int], **sampling) -> dict:
    """A small valid request of the endpoint: greedy unless sampling says otherwise."""
    sampling = {"temperature": 0, **sampling}
    if path == GENERATE:
        return {"input_ids": prompt, "sampling_params": {"max_new_tokens": MAX_NEW, "ignore_eos": True, **sampling}}
    body = {"model": model, "max_tokens": MAX_NEW, "ignore_eos": True, **sampling}
    if path == COMPLETIONS:
        return {**body, "prompt": prompt}
    return {**body, "messages": [{"role": "user", "content": " ".join(f"w{t}" for t in prompt[:8])}]}


def put(body: dict, field: str, value) -> None:
    """Set a possibly dotted field (sampling_params.top_k)."""
    *parents, leaf = field.split(".")
    for p in parents:
        if not isinstance(body.get(p), dict):
            body[p] = {}
        body = body[p]
    body[leaf] = value


def _value(rng: random.Random, spec: rf.Field, vocab: int):
    pool = [*spec.good, *spec.bad, *spec.later]
    return rf.resolve(rng.choice(pool), vocab) if pool and rng.random() < 0.6 else rng.choice(GENERIC)


def fixed(model: str, prompt: list[int]) -> list[Case]:
    """What is wrong with a request as a whole, once each."""
    g = valid(GENERATE, model, prompt)
    c = valid(COMPLETIONS, model, prompt)
    cases = [
        Case("invalid JSON", GENERATE, b'{"input_ids": [5, 6'),
        Case("invalid JSON (completions)", COMPLETIONS, b'{"model": "m", "prompt": [5'),
        Case("empty body", GENERATE, b""),
        Case("a JSON array", COMPLETIONS, b"[1, 2, 3]"),
        Case("a JSON string", CHAT, b'"hello"'),
        Case("deep nesting", GENERATE, b'{"input_ids": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
        Case("text/plain", GENERATE, g, content_type="text/plain"),
        Case("form content type", COMPLETIONS, c, content_type="application/x-www-form-urlencoded"),
        Case("no content type", CHAT, valid(CHAT, model, prompt), content_type=""),
        Case("unknown field", GENERATE, {**g, "no_such_field": 1}),
        Case("unknown field (completions)", COMPLETIONS, {**c, "no_such_field": 1}),
        Case("empty prompt", GENERATE, {**g, "input_ids": []}),
        Case("empty text", GENERATE, {"text": "", "sampling_params": g["sampling_params"]}),
        Case("oversized prompt", GENERATE, {**g, "input_ids": prompt * (100_000 // len(prompt))}),
        Case("oversized text", GENERATE, {"text": "w5 " * 100_000, "sampling_params": g["sampling_params"]}),
        Case("oversized completion prompt", COMPLETIONS, {**c, "prompt": "w6 " * 100_000}),
        Case("no prompt", GENERATE, {"sampling_params": g["sampling_params"]}),
    ]
    for path in (GENERATE, COMPLETIONS, CHAT):
        body = valid(path, model, prompt)
        put(body, "sampling_params.max_new_tokens" if path == GENERATE else "max_tokens", 64)
        cases.append(Case(f"stream aborted after its first chunk ({path})", path, {**body, "stream": True}, abort=True))
    return cases


def corpus(seed: int, budget: int, model: str, prompt: list[int], vocab: int) -> list[Case]:
    """`budget` cases: the fixed ones, then random ones from the field tables, each one to three fields changed."""
    rng = random.Random(seed)
    cases = fixed(model, prompt)
    tables = {GENERATE: rf.GENERATE_FIELDS, COMPLETIONS: rf.COMPLETIONS_FIELDS, CHAT: rf.CHAT_FIELDS}
    while len(cases) < budget:
        path = rng.choice(list(tables))
        body = valid(path, model, prompt)
        changed = []
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            field, spec = rng.choice(sorted(tables[path].items()))
            value = _value(rng, spec, vocab)
            put(body, field, value)
            changed.append(f"{field}={short(value)}")
        cases.append(Case(f"{path} " + " ".join(changed), path, body))
    return cases[:budget]


def bursts(seed: int, count: int, size: int, model: str, prompt: list[int]) -> list[list[Case]]:
    """`count` bursts of `size` concurrent requests: valid greedy ones, sampled ones, and ones at the accepted
    extremes of the sampling ranges (rf.EXTREMES), shuffled into one batch; each burst also sends two requests
    with one id."""
    rng = random.Random(seed)
    out = []
    for b in range(count):
        cases = []
        for _ in range(size):
            path = rng.choice((GENERATE, COMPLETIONS))
            kind = rng.choice(("greedy", "sampled", "extreme", "extreme"))
            sampling = {"temperature": 0.8, "top_p": 0.95} if kind == "sampled" else {}
            body = valid(path, model, prompt, **sampling)
            name = kind
            if kind == "extreme":
                for _ in range(rng.choice((1, 2, 3))):
                    field, value = rng.choice(rf.EXTREMES[path])
                    put(body, field, value)
                    name += f" {field}={short(value)}"
            cases.append(Case(f"burst {b}: {path} {name}", path, body))
        twin = valid(GENERATE, model, prompt)
        twin["rid"] = f"fuzz-burst-{seed}-{b}"
        cases += [Case(f"burst {b}: duplicate rid {k}", GENERATE, dict(twin)) for k in (1, 2)]
        rng.shuffle(cases)
        out.append(cases)
    return out


def short(value) -> str:
    """The value as a short JSON text (a table value's V as written there)."""
    if isinstance(value, dict):
        value = {repr(k) if isinstance(k, rf.Vocab) else k: v for k, v in value.items()}
    text = json.dumps(value, allow_nan=True, default=repr)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} chars)"


def classify(status: int | None, error: str = "") -> str:
    """2xx, 4xx, 5xx, hang (no answer in time) or down (no connection), from an HTTP status or the error."""
    if status is None:
        return "hang" if "timed out" in error.lower() or "timeout" in error.lower() else "down"
    return f"{status // 100}xx"
