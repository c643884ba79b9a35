"""SGLang's CUDA graph runners and ModelRunner without their constructors (no GPU here), replays and eager forwards
stubbed; forward batches as SimpleNamespaces carrying what the runners read."""

from types import SimpleNamespace

import torch

from _sgl import bare, published, resolved

MAX_BS = 48


def runner(width=4, algorithm="EAGLE3", is_draft_worker=False, **attrs):
    """A DecodeCudaGraphRunner captured in TARGET_VERIFY mode at bs 1..MAX_BS with `width` rows per request: the
    target's verify graph, or (is_draft_worker) DFlash's draft block graph."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    defaults = dict(
        ragged_verify_mode=False,
        captured_req_width=width,
        require_mlp_tp_gather=False,
        enable_pdmux=False,
        disable_padding=False,
        max_bs=MAX_BS,
        require_mlp_sync=False,
        is_encoder_decoder=False,
        enable_two_batch_overlap=False,
        record_nolora_graph=False,
        attention_graph_variants=None,
        capture_forward_mode=ForwardMode.TARGET_VERIFY,
        model_runner=SimpleNamespace(spec_algorithm=SpeculativeAlgorithm[algorithm], is_draft_worker=is_draft_worker),
    )
    return bare(DecodeCudaGraphRunner, **(defaults | attrs))


def verify_batch(bs=8, width=4, **overrides):
    """A TARGET_VERIFY forward batch of bs requests, `width` rows each (what EAGLE's draft runners read too)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    defaults = dict(
        forward_mode=ForwardMode.TARGET_VERIFY,
        batch_size=bs,
        spec_info=SimpleNamespace(num_tokens_per_req=width, ragged_verify_layout=None),
        input_ids=torch.zeros(bs * width, dtype=torch.long),
        replace_embeds=None,
        can_run_decode_cuda_graph=True,
        can_run_tbo=True,
        lora_ids=None,
        encoder_lens=None,
        global_num_tokens_cpu=None,
        moe_num_token_non_padded=None,
        seq_lens=torch.ones(bs),
        can_run_dp_draft_cuda_graph=True,
        sampling_info=None,
    )
    return SimpleNamespace(**(defaults | overrides))


def greedy_sampling(**kw):
    """A greedy batch's SamplingBatchInfo, nothing reading or changing its logits (kw: what differs)."""
    info = dict(
        is_all_greedy=True,
        has_custom_logit_processor=False,
        acc_additive_penalties=None,
        acc_scaling_penalties=None,
        logit_bias=None,
        penalizer_orchestrator=None,
        has_watermark_candidates=False,
        sampling_mask_batch_indices=None,
    )
    return SimpleNamespace(**{**info, **kw})


def stats():
    from sglang.srt.model_executor.runner.spec_graph_stats import SpecGraphStats

    return SpecGraphStats()


def graph(n=0, piecewise=0, eager=0, **reasons):
    """A stage's entry of /server_info spec_cuda_graph."""
    return {"graph": n, "piecewise": piecewise, "eager": eager, "fallback_reasons": reasons}


def reduce(n):
    """What GroupCoordinator notes of a PCIe-IPC all-reduce of n rows of 8 bf16 (16 bytes a row)."""
    from sglang.srt.distributed import collective_stats

    collective_stats.note("all_reduce", "pcie_ipc", torch.empty(n, 8, dtype=torch.bfloat16))


def reduced(calls, rows, **count):
    """A stage's entry of /server_info spec_collectives: `calls` all-reduces of `rows` rows in all (reduce), in
    forwards=n (eager) or graphs=n (captured)."""
    return {"calls": {"all_reduce": {"pcie_ipc": calls}}, "bytes": {"all_reduce": 16 * rows}, **count}


def scheduler(stats, algorithm="EAGLE3"):
    """The scheduler as /server_info's and /metrics' speculative readers see it (3 tokens accepted a step)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    target = SimpleNamespace(model_runner=SimpleNamespace(spec_graph_stats=stats))
    accepted = SimpleNamespace(spec_total_num_accept_tokens=30, spec_total_num_forward_ct=10)
    return SimpleNamespace(
        spec_algorithm=SpeculativeAlgorithm[algorithm], draft_worker=None, tp_worker=target, metrics_reporter=accepted
    )


def speculative_state(stats, algorithm="EAGLE3") -> dict:
    """The speculative state of GET /server_info's internal_states[0], as get_internal_state fills it."""
    from sglang.srt.managers.scheduler_components.internal_state import SchedulerInternalStateController

    state = {}
    SchedulerInternalStateController(scheduler(stats, algorithm), record_step_time=False)._add_speculative(state)
    return state


def model_runner(decode_runner, is_draft_worker=False, piecewise=False, eager=None):
    """A ModelRunner (no __init__) whose graph replays and eager forwards (`eager`) are stubbed (they need a GPU); the
    dispatch in forward/_forward_raw is the real code."""
    from sglang.srt.model_executor.model_runner import ModelRunner

    if decode_runner is not None:
        decode_runner.execute = lambda fb, pp_proxy_tensors=None: "graph"
    prefill = None
    if piecewise:
        prefill = SimpleNamespace(can_run_graph=lambda fb: True, execute=lambda fb, **kw: "piecewise")
    return bare(
        ModelRunner,
        model=SimpleNamespace(shared_experts_config=None),
        attn_backend=None,
        device="cuda",
        decode_cuda_graph_runner=decode_runner,
        prefill_cuda_graph_runner=prefill,
        hisparse_coordinator=None,
        is_draft_worker=is_draft_worker,
        pp_group=SimpleNamespace(is_last_rank=True),
        spec_graph_stats=stats(),
        forward_pass_id=0,
        msprobe_debugger=None,
        canary_manager=None,
        enable_elastic_ep=False,
        eplb_manager=None,
        device_timer=None,
        eager_runner=SimpleNamespace(execute=eager or (lambda fb, pp_proxy_tensors=None: "eager")),
        _prepare_eager_forward_batch=lambda fb: None,
        _extend_forward_kwargs=lambda fb, pp: {},
        _maybe_execute_deferred_mamba_cow_and_clear=lambda fb: None,
    )


def forward(mr, fb):
    fb.apply_deprecated_skip_attn_backend_init = lambda skip: None
    fb.token_indices_to_pool = None
    return mr.forward(fb)


def captured_bs(sa, width):
    """(request pool size, capture list) of a decode graph of `width` rows per request, as DecodeCudaGraphRunner
    builds it for the request pool KVCacheConfigurator sizes (max_running_requests per DP worker, a large KV pool)."""
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture

    cfgr = KVCacheConfigurator.__new__(KVCacheConfigurator)  # __slots__: set one by one
    cfgr.model_config = SimpleNamespace(context_len=262144)
    cfgr.attn_dp_size = max(1, resolved(sa, "attn_dp_size") or 1)
    cfgr.mambaish_config = None
    with published(sa):
        pool = SimpleNamespace(size=cfgr.resolve_max_num_reqs(token_capacity=10**8))
        capture_bs, _ = get_batch_sizes_to_capture(SimpleNamespace(req_to_token_pool=pool, server_args=sa), width)
    return pool.size, capture_bs
