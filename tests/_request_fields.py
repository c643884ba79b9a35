"""Every field a client can send to /generate, /v1/completions and /v1/chat/completions, and its range: the values a
server takes, those it refuses at the entry (a 4xx; the scheduler never sees them) and those the scheduler refuses
later (a 4xx from the running server). tests/requests/test_fields.py holds the table against the real HTTP app on
CPU (a field upstream adds fails there until its range is written here); the fuzzer (tests/_fuzz.py) draws from it.

The ranges are the patched tree's: the validation patch refuses what would crash the scheduler or answer 5xx; the
rest is upstream's. V stands for the vocabulary's size (163840 on tests/_app.py, 2048 on test-serve's tiny models):
`resolve(value, vocab)` fills it in."""

import dataclasses

F32_MAX = 3.4028234663852886e38


@dataclasses.dataclass(frozen=True)
class Vocab:
    """The model's vocabulary size (plus an offset) in a value, filled in by `resolve`."""

    offset: int = 0

    def __add__(self, k: int) -> "Vocab":
        return Vocab(self.offset + k)

    def __sub__(self, k: int) -> "Vocab":
        return Vocab(self.offset - k)

    def __repr__(self) -> str:
        return f"V{self.offset:+d}" if self.offset else "V"


V = Vocab()


@dataclasses.dataclass(frozen=True)
class Field:
    good: tuple = ()  # taken (200)
    bad: tuple = ()  # refused at the entry (4xx), never reaching the scheduler
    later: tuple = ()  # reach the scheduler, which refuses them (a 4xx from a running server)
    with_: dict = dataclasses.field(default_factory=dict)  # what else the request must carry
    why: str = ""  # where the range comes from, when not the type alone


def flag(**kw) -> Field:
    return Field(good=(True, False), bad=("maybe", [1], {}), **kw)


def obj(good=({},), **kw) -> Field:
    return Field(good=good, bad=("x", 5, [1]), **kw)


def ints(lo, hi, bad=(), **kw) -> Field:
    return Field(good=(lo, hi), bad=("x", 1.5, *bad), **kw)


HUGE = 2**63  # beyond int64
PD = "prefill-decode disaggregation's routing; unused on one server"
MM = "multimodal only: taken and unused on a text model"
SCHED = "the scheduler's own bound (a 400 abort)"

SAMPLING = {  # /generate's sampling_params (SamplingParams), with their OpenAI names where they differ
    "max_new_tokens": ints(0, 16, bad=(-1, HUGE), why="<= context - prompt (400 above)"),
    "stop": Field(good=("w1", ["w1", "w2"], []), bad=(5, [5], "w1 " * 400), why="32 strings of <= 1024 bytes"),
    "stop_token_ids": Field(good=([0], [V - 1], []), bad=([V], [-1], ["x"], 5), why="ids in the vocabulary"),
    "stop_regex": Field(good=("w1+", []), bad=("(", "a{99999999999}", 5, "a" * 300), why="<= 256 bytes, compiles"),
    "temperature": Field(good=(0, 0.7, 1e-5, 100.0, F32_MAX), bad=(-0.5, 1e39, "x"), why="[0, float32 max]"),
    "top_p": Field(good=(1.0, 0.5, 1e-9), bad=(0, 1.5, -1, "x")),
    "top_k": Field(
        good=(-1, 1, 20, 2**31 - 1),
        bad=(0, -2, 2**31, "x"),
        with_={"temperature": 0.7},
        why="-1 or [1, int32 max] (a greedy request takes top_k 1 whatever it sent)",
    ),
    "min_p": Field(good=(0, 0.5, 1.0), bad=(-0.1, 1.5, "x")),
    "frequency_penalty": Field(good=(-2.0, 0, 2.0), bad=(-2.1, 2.5, "x")),
    "presence_penalty": Field(good=(-2.0, 0, 2.0), bad=(-2.1, 2.5, "x")),
    "repetition_penalty": Field(good=(1e-6, 1.0, 2.0), bad=(0, 1e-40, 2.5, -1, "x"), why="[1e-6, 2]: float32"),
    "min_new_tokens": Field(good=(0, 4), bad=(-1, 17, "x"), with_={"max_new_tokens": 16}, why="<= max_new_tokens"),
    "n": Field(good=(1, 2, None), bad=(0, -1, HUGE, 16385, "x"), why="[1, 16384]: the request is copied n times"),
    "beam_width": Field(good=(None, 1), bad=(0, "x"), later=(2, HUGE), why="beams refused with speculation"),
    "json_schema": Field(good=('{"type": "string"}',), bad=(5,), later=("x", '{"enum": ["zz"]}')),
    "regex": Field(good=("(w1[0-9]*)+",), bad=(5,), later=("(", "z+"), why="compiled by the scheduler"),
    "ebnf": Field(good=('root ::= "w1"',), bad=(5,), later=("x", 'root ::= "q"')),
    "structural_tag": Field(good=(None,), bad=(5,), later=("x",)),
    "ignore_eos": flag(),
    "skip_special_tokens": flag(),
    "spaces_between_special_tokens": flag(),
    "no_stop_trim": flag(),
    "stream_interval": ints(1, 8),
    "logit_bias": Field(
        good=({"5": 2.0}, {"5": -F32_MAX}, {"5": F32_MAX}, {}),
        bad=({"5": 1e39}, {V: 1.0}, {"w5": 1.0}, {"-1": 1.0}, "x"),
        why="keys in the vocabulary, finite float32 values",
    ),
    "sampling_seed": Field(good=(0, 2**63 - 1, -(2**63)), bad=(HUGE, "x")),
    "custom_params": Field(good=(None, {"a": 1}, 5, "x"), why="passed to custom logit processors (off by default)"),
    "watermark": Field(good=(None,), bad=(5, "x", {"a": 1}), why="off on this server"),
    # internal fields of SamplingParams: the typed decoding of /generate refuses them
    **{
        k: Field(bad=("x", 5, [1], {}), why="internal")
        for k in "stop_strs stop_regex_strs stop_str_max_len stop_regex_max_len is_normalized ebnf_full_assistant".split()
    },
}

GENERATE_FIELDS = {  # GenerateReqInput
    "rid": Field(good=("fuzz-rid-1", None), bad=([], 5, ["a"]), why="one string per request"),
    "session_id": Field(good=("x", None), bad=(5, [1])),
    "text": Field(good=("w1 w2",), bad=(5, {}), why="the prompt when input_ids is absent"),
    "input_ids": Field(good=([5], [0, V - 1]), bad=([V], [-1], [], [1.5], "x", None), why="ids in the vocabulary"),
    "input_embeds": Field(
        good=(None, [[0.0]]),
        bad=("x",),
        why="beside input_ids dropped; alone it needs --disable-radix-cache and hidden-wide rows",
    ),
    "image_data": Field(good=(None,), bad=("", "x", [""], 5), why="a text model has no multimodal processor"),
    "video_data": Field(good=(None,), bad=("v", ["v"], 5)),
    "audio_data": Field(good=(None,), bad=("a", ["a"], 5)),
    "mm_hashes": Field(good=(None, []), bad=(5, "x"), why=MM),
    "mm_content_hashes": Field(good=(None, []), bad=(5, "x"), why=MM),
    "use_audio_in_video": flag(why=MM),
    "video_config": obj(why=MM),
    "images_config": obj(why=MM),
    "mm_processor_kwargs": obj(why=MM),
    "max_dynamic_patch": ints(1, 12, why=MM),
    "min_dynamic_patch": ints(1, 12, why=MM),
    "image_max_dynamic_patch": ints(1, 12, why=MM),
    "video_max_dynamic_patch": ints(1, 12, why=MM),
    "modalities": Field(good=(None, []), bad=(5, "x")),
    "need_wait_for_mm_inputs": flag(why=PD),
    "num_items_assigned": Field(good=(None, {}), bad=("x", 5), why=PD),
    "encoder_urls": Field(good=(None, []), bad=(5, "x"), why=PD),
    "sampling_params": Field(good=({}, None), bad=([], "x", 5), why="an object, or one per prompt"),
    "watermark": Field(good=(None,), bad=(5, "x", {"a": 1}), why="off on this server"),
    "return_logprob": flag(),
    "logprob_start_len": Field(
        good=(-1, 0, 1),
        bad=(-2, -5, "x"),
        later=(10**6,),
        with_={"return_logprob": True},
        why="-1 (output only) or a prompt position; beyond the prompt: " + SCHED,
    ),
    "top_logprobs_num": Field(good=(0, 5, V), bad=(-1, V + 1, "x"), with_={"return_logprob": True}, why="[0, vocab]"),
    "token_ids_logprob": Field(good=([5], [V - 1], []), bad=([V], [-1], "x"), with_={"return_logprob": True}),
    "return_sampling_mask": flag(),
    "sampling_logprobs_mode": Field(good=(None,), bad=(5, "x")),
    "return_text_in_logprobs": flag(),
    "return_flat_raw_top_logprobs": flag(),
    "return_flat_raw_output_top_logprobs": flag(),
    "return_flat_raw_top_logprobs_b64": Field(
        good=(False,), bad=("x", [1], True), why="needs return_flat_raw_top_logprobs"
    ),
    "stream": flag(),
    "log_metrics": flag(),
    "return_hidden_states": Field(good=(False, []), bad=(True, "x"), why="off on this server"),
    "return_routed_experts": flag(),
    "routed_experts_start_len": ints(0, 1, bad=(None,), later=(-1,), why=SCHED),
    "return_indexer_topk": flag(),
    "session_params": Field(
        good=(None,),
        bad=({"foo": 1}, [1], "x"),
        later=({"id": "no-such-session"},),
        why="keys of SessionParams; an unknown session: " + SCHED,
    ),
    "lora_path": Field(good=(None, []), bad=("adapter", 5), why="no LoRA on this server"),
    "lora_id": Field(good=(None, []), bad=("0", 5), why="assigned by the server from lora_path"),
    "custom_logit_processor": Field(good=(None, []), bad=("x", 5), why="off by default"),
    "positional_embed_overrides": Field(
        good=(None,), bad=({"embeds": [[1.0]], "positions": [0]}, "x", 5), why="the Engine API's only"
    ),
    "bootstrap_host": Field(good=(None, "x", []), bad=(5,), why=PD),
    "bootstrap_port": Field(good=(None, 1, []), bad=("x",), why=PD),
    "bootstrap_room": Field(good=(None, 0, []), bad=("x",), why=PD),
    "bootstrap_pair_key": Field(good=(None, "x"), bad=(5,), why=PD),
    "decode_tp_size": Field(good=(None, 1), bad=("x",), why=PD),
    "routed_dp_rank": Field(good=(None, 0), bad=(1, -1, "x"), why="a data-parallel rank of this server"),
    "data_parallel_rank": Field(good=(None, 0), bad=(1, -1, "x"), why="a data-parallel rank of this server"),
    "disagg_prefill_dp_rank": Field(good=(None, 0), bad=("x",), why=PD),
    "routing_key": Field(good=(None, "x"), bad=(5,)),
    "conversation_id": Field(good=(None, "x"), bad=(5,)),
    "http_worker_ipc": Field(good=(None,), bad=("ipc:///tmp/x", 5), why="set by the server"),
    "background": flag(),
    "require_reasoning": flag(),
    "max_thinking_tokens": Field(good=(None,), bad=("x", [1])),
    "priority": Field(good=(None, 0, -1, 2**63 - 1), bad=(HUGE, "x"), why="int64"),
    "extra_key": Field(good=(None, "x"), bad=(5,)),
    "no_logs": flag(),
    "custom_labels": obj(good=({}, None)),
    "return_bytes": flag(),
    "return_entropy": flag(),
    "return_prompt_token_ids": flag(),
    "external_trace_header": obj(good=({}, None)),
    "received_time": Field(good=(None, 0, 1.5), bad=("x", [1]), why="overwritten by the server"),
    "multi_item_delimiter_indices": Field(good=(None, [0]), bad=([9], [-1], "x"), why="prompt positions"),
    "token_indices_to_pool": Field(good=(None, [0]), bad=([9], [-1], "x"), why="prompt positions"),
    "cache_salt": Field(good=(None, "x"), bad=(5,)),
    "kv_hints": obj(good=({}, None)),
    **{f"sampling_params.{k}": v for k, v in SAMPLING.items()},
}

# sampling_params fields the OpenAI requests carry at their top level under the same name and range
AS_SAMPLING = (
    "frequency_penalty presence_penalty repetition_penalty temperature top_p top_k min_p logit_bias stop"
    " stop_token_ids stop_regex regex ebnf ignore_eos skip_special_tokens no_stop_trim"
).split()

OPENAI = {  # fields /v1/completions and /v1/chat/completions share
    "model": Field(good=("<served model>",), bad=(None, 5), why="any name (informational), a LoRA adapter refused"),
    **{k: SAMPLING[k] for k in AS_SAMPLING},
    "min_tokens": Field(good=(0, 4), bad=(-1, 17, "x"), with_={"max_tokens": 16}),
    "n": Field(good=(1, 2), bad=(0, 10**7, "x")),
    "seed": Field(good=(None, 0, -1), bad=(HUGE, "x")),
    "stream": flag(),
    "stream_options": obj(good=(None, {}, {"include_usage": True})),
    "user": Field(good=(None, "x"), bad=(5,)),
    "response_format": Field(good=(None, {"type": "text"}), bad=(True, "x", 5, {"type": "nope"})),
    "return_hidden_states": Field(good=(False,), bad=(True, "x")),
    "return_routed_experts": flag(),
    "routed_experts_start_len": ints(0, 1, later=(-1,), why=SCHED),
    "return_cached_tokens_details": flag(),
    "return_spec_tokens_details": flag(),
    "return_token_ids": flag(),
    "lora_path": Field(good=(None,), bad=("adapter", 5), why="no LoRA on this server"),
    "session_id": Field(good=(None, "x"), bad=(5,)),
    "session_params": Field(
        good=(None, {"foo": 1}),
        bad=("x",),
        later=({"id": "no-such-session"},),
        why="unknown keys dropped by the OpenAI layer",
    ),
    "custom_params": obj(good=(None, {}, {"a": 1})),
    "custom_logit_processor": Field(good=(None,), bad=("x", 5), why="off by default"),
    "watermark": Field(good=(None,), bad=(5, "x")),
    "images_config": obj(good=(None, {}), why=MM),
    "mm_processor_kwargs": obj(good=(None, {}), why=MM),
    "data_parallel_rank": Field(good=(None, 0), bad=(1, -1, "x")),
    "routed_dp_rank": Field(good=(None, 0), bad=(1, -1, "x")),
    "disagg_prefill_dp_rank": Field(good=(None, 0), bad=("x",), why=PD),
    "bootstrap_host": Field(good=(None, "x"), bad=(5,), why=PD),
    "bootstrap_port": Field(good=(None, 1), bad=("x",), why=PD),
    "bootstrap_room": Field(good=(None, 0), bad=("x",), why=PD),
    "extra_key": Field(good=(None, "x"), bad=(5,)),
    "cache_salt": Field(good=(None, "x"), bad=(5,)),
    "priority": Field(good=(None, 0, -1), bad=(HUGE, "x")),
}

COMPLETIONS_FIELDS = {  # CompletionRequest
    **OPENAI,
    "prompt": Field(good=("w1 w2", [5, V - 1], [[5], [6]]), bad=([V], [[5], [-1]], "", None, 5.5)),
    "max_tokens": Field(good=(1, 16), bad=(-1, 0, None, HUGE, "x")),
    "rid": Field(good=(None, "fuzz-completions-rid"), bad=([], 5)),
    "best_of": Field(good=(None, 1), bad=("x",), why="taken and unused"),
    "echo": flag(),
    "logprobs": Field(good=(None, 0, 5, V), bad=(-1, V + 1, "x"), why="top logprobs per token: [0, vocab]"),
    "suffix": Field(good=(None, "x"), bad=(5,)),
    "json_schema": SAMPLING["json_schema"],
    "response_format": Field(good=(None,), bad=(True, "x", 5)),
    "custom_labels": obj(good=(None, {})),
}

CHAT_FIELDS = {  # ChatCompletionRequest
    **OPENAI,
    "messages": Field(good=([{"role": "user", "content": "w1"}],), bad=([], None, "x", [{"role": "nope"}])),
    "input_ids": Field(good=(None, [5], [V - 1]), bad=([V], [-1], "x")),
    "max_tokens": Field(good=(None, 0, 1, 16), bad=(-1, HUGE, "x")),
    "rid": Field(good=(None, "fuzz-chat-rid"), bad=([], 5)),
    "logprobs": flag(),
    "top_logprobs": Field(good=(None, 0, 5), bad=(-1, V + 1, "x"), with_={"logprobs": True}),
    "max_completion_tokens": Field(good=(None, 1, 16), bad=(-1, HUGE, "x")),
    "tools": Field(good=(None, []), bad=("x", 5, [{"type": "nope"}])),
    "tool_choice": Field(good=(None, "none", "auto"), bad=(5, "nope")),
    "parallel_tool_calls": flag(),
    "return_prompt_token_ids": flag(),
    "return_meta_info": flag(),
    "return_input_ids_in_sglext": flag(),
    "return_output_ids_in_sglext": flag(),
    "return_sampling_mask": Field(good=(False,), bad=("x", [1])),
    "sampling_logprobs_mode": Field(good=(None,), bad=(5, "x")),
    "return_flat_raw_output_top_logprobs": Field(good=(False,), bad=("x", [1])),
    "return_flat_raw_top_logprobs_b64": flag(),
    "reasoning_effort": Field(good=(None, "low", "high"), bad=(5, "x")),
    "thinking": Field(good=(None, True, {"type": "enabled"}), why="passed to the chat template"),
    "task": Field(good=(None,), bad=(5, "x")),
    "continue_final_message": flag(),
    "separate_reasoning": flag(),
    "stream_reasoning": flag(),
    "chat_template_kwargs": obj(good=(None, {}, {"a": 1})),
    "max_dynamic_patch": ints(1, 12, why=MM),
    "min_dynamic_patch": ints(1, 12, why=MM),
    "use_audio_in_video": flag(why=MM),
    "video_config": obj(good=(None, {}), why=MM),
}

# Accepted values at the ends of the sampling ranges: the fuzzer's bursts mix them with greedy and sampled requests
# in one batch (a row at such an end once made a whole batch's probabilities non-finite).
_EXTREME_SAMPLING = {
    "temperature": (1e-5, 100.0, F32_MAX),
    "top_p": (1e-9,),
    "top_k": (1,),
    "min_p": (1.0, 0.99),
    "repetition_penalty": (1e-6, 2.0),
    "frequency_penalty": (2.0,),
    "presence_penalty": (-2.0,),
    "logit_bias": ({"5": F32_MAX}, {"5": -F32_MAX}, {str(i): -F32_MAX for i in range(4, 64)}),
    "n": (3,),
    "stop_token_ids": ([5, 6, 7],),
    "stop": (["w5", "w6"],),
    "regex": ("(w1[0-9]*)+",),
    "sampling_seed": (2**63 - 1,),
}
_EXTREME = [(k, v) for k, values in _EXTREME_SAMPLING.items() for v in values]
EXTREMES = {
    "/generate": [(f"sampling_params.{k}", v) for k, v in _EXTREME]
    + [("sampling_params.min_new_tokens", 8), ("return_logprob", True), ("top_logprobs_num", 20)],
    "/v1/completions": [(k, v) for k, v in _EXTREME if k != "sampling_seed"] + [("logprobs", 5), ("seed", 7)],
}


def resolve(value, vocab: int):
    """The value with every V (the vocabulary size, V - 1, V + 1) filled in; dictionary keys as strings."""
    if isinstance(value, Vocab):
        return vocab + value.offset
    if isinstance(value, list):
        return [resolve(v, vocab) for v in value]
    if isinstance(value, dict):
        return {str(resolve(k, vocab)) if isinstance(k, Vocab) else k: resolve(v, vocab) for k, v in value.items()}
    return value
