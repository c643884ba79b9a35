"""Issue 4: every fixed-width EAGLE verify batch replays a CUDA graph, and every fallback is counted.

Drives the real SGLang code of the tree under test:
- DecodeCudaGraphRunner.can_run_graph / graph_fallback_reason on TARGET_VERIFY batches (runner built without
  __init__, SimpleNamespace forward batches),
- ModelRunner._forward_raw counting each target-verify forward (ModelRunner built without __init__; only the
  graph replay and the eager model forward themselves are stubbed),
- the /server_info readback (SchedulerInternalStateController) and the Prometheus counter fed by
  SchedulerMetricsReporter.report_decode_stats,
- resolved ServerArgs for Kimi-K2.5 + EAGLE-3 (topk 1, 4 draft tokens, TP8) on a faked SM120 box with 96 GB GPUs:
  the captured decode/verify batch sizes cover every batch the scheduler can form, and speculative decoding with
  decode CUDA graphs off is refused unless SGLANG_SPEC_ALLOW_EAGER_VERIFY is set.
"""

from __future__ import annotations

import contextlib
import logging
from types import SimpleNamespace
from unittest import mock

import pytest

from _sgl import resolved, server_args

# RTX PRO 6000 Blackwell (96 GB) as nvidia-smi reports it, in MiB.
RTX_PRO_6000_MIB = 97887
WIDTH = 4  # num_draft_tokens for steps=3, topk=1
MAX_BS = 48


@contextlib.contextmanager
def _gpu_memory(mib: int = RTX_PRO_6000_MIB):
    """ServerArgs sizes its CUDA graph defaults from the GPU's memory; there is no GPU here."""
    from sglang.srt.arg_groups import memory_hook

    with mock.patch.object(memory_hook, "get_device_memory_capacity", lambda device=None: mib):
        yield


def _sm120_args(**kw):
    with _gpu_memory():
        return server_args(12, **kw)


def _runner(**overrides):
    """A target-verify DecodeCudaGraphRunner captured at bs 1..MAX_BS, width WIDTH (no __init__, no GPU)."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    r = DecodeCudaGraphRunner.__new__(DecodeCudaGraphRunner)
    attrs = dict(ragged_verify_mode=False, captured_req_width=WIDTH, require_mlp_tp_gather=False,
                 enable_pdmux=False, disable_padding=False, max_bs=MAX_BS, require_mlp_sync=False,
                 is_encoder_decoder=False, enable_two_batch_overlap=False, record_nolora_graph=False,
                 attention_graph_variants=None,
                 model_runner=SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.EAGLE3))
    attrs.update(overrides)
    for k, v in attrs.items():
        setattr(r, k, v)
    return r


def _verify_batch(bs: int = 8, width: int = WIDTH, **overrides):
    import torch

    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    fb = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, batch_size=bs,
                         spec_info=SimpleNamespace(num_tokens_per_req=width, ragged_verify_layout=None),
                         input_ids=torch.zeros(bs * width, dtype=torch.long), replace_embeds=None,
                         can_run_decode_cuda_graph=True, can_run_tbo=True, lora_ids=None, encoder_lens=None,
                         global_num_tokens_cpu=None, moe_num_token_non_padded=None)
    for k, v in overrides.items():
        setattr(fb, k, v)
    return fb


def _cases():
    import torch

    return {
        # name: (runner overrides, batch kwargs, expected reason or None for graph replay)
        "bs1": ({}, dict(bs=1), None),
        "bs_at_max": ({}, dict(bs=MAX_BS), None),
        "batch_above_max_bs": ({}, dict(bs=MAX_BS + 1), "batch_above_max_bs"),
        "width_mismatch": ({}, dict(width=1), "width_mismatch"),
        "replace_embeds": ({}, dict(replace_embeds=torch.zeros(1, 8)), "replace_embeds"),
        "mlp_sync": (dict(require_mlp_sync=True), dict(can_run_decode_cuda_graph=False), "mlp_sync"),
        "mlp_sync_ok": (dict(require_mlp_sync=True), dict(), None),
        "ragged_verify": (dict(ragged_verify_mode=True), dict(), "ragged_verify"),
        "tbo": (dict(enable_two_batch_overlap=True), dict(can_run_tbo=False), "tbo"),
        "bs_not_captured": (dict(disable_padding=True,
                                 backend=SimpleNamespace(can_run=lambda fb, key: key.size in (1, 2, 4, 8))),
                            dict(bs=3), "bs_not_captured"),
        "exact_bs_captured": (dict(disable_padding=True,
                                   backend=SimpleNamespace(can_run=lambda fb, key: key.size in (1, 2, 4, 8))),
                              dict(bs=4), None),
    }


CASES = ["bs1", "bs_at_max", "batch_above_max_bs", "width_mismatch", "replace_embeds", "mlp_sync", "mlp_sync_ok",
         "ragged_verify", "tbo", "bs_not_captured", "exact_bs_captured"]


# ---------------------------------------------------------------------------------------------------------------
# can_run_graph decisions
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.unchanged
@pytest.mark.parametrize("case", CASES)
def test_verify_can_run_graph_decision_unchanged(case):
    """The graph/eager decision itself is upstream's; the patch only names the reason."""
    runner_kw, batch_kw, reason = _cases()[case]
    assert bool(_runner(**runner_kw).can_run_graph(_verify_batch(**batch_kw))) is (reason is None)


@pytest.mark.parametrize("case", CASES)
def test_verify_graph_fallback_reason(case):
    runner_kw, batch_kw, reason = _cases()[case]
    r, fb = _runner(**runner_kw), _verify_batch(**batch_kw)
    assert r.graph_fallback_reason(fb) == reason
    assert r.can_run_graph(fb) is (reason is None)


@pytest.mark.unchanged
def test_verify_batches_never_carry_replace_embeds(monkeypatch):
    """Route closed upstream already: replace_embeds only comes from positional_embed_overrides (the scoring API)
    in prepare_for_extend, and a speculative decode step clears it before the spec worker builds the verify
    batch. Kimi-K2.5's multimodal wrapper merges image features inside its forward, never via replace_embeds."""
    import torch

    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.speculative import spec_utils
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    handed = []
    monkeypatch.setattr(spec_utils, "spec_prepare_for_decode",
                        lambda b: handed.append((b.replace_embeds, b.replace_positions, b.input_embeds)))
    batch = SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.EAGLE3, forward_mode=None,
                            replace_embeds=torch.zeros(2, 8), replace_positions=torch.tensor([0, 1]),
                            input_embeds=torch.zeros(2, 8), attn_cp_metadata=None)
    ScheduleBatch.prepare_for_decode(batch)
    assert handed == [(None, None, None)]


# ---------------------------------------------------------------------------------------------------------------
# Counters: SpecVerifyGraphStats, ModelRunner._forward_raw, /server_info, Prometheus
# ---------------------------------------------------------------------------------------------------------------

def _eager_runner():
    from sglang.srt.model_executor.runner.eager_runner import EagerRunner

    return EagerRunner.__new__(EagerRunner)


def test_verify_stats_count_outcomes_and_warn_once_per_reason(caplog):
    from sglang.srt.model_executor.runner.verify_graph_stats import SpecVerifyGraphStats

    stats, r = SpecVerifyGraphStats(), _runner()
    forwards = [(r, _verify_batch(bs=4)), (r, _verify_batch(bs=MAX_BS)), (r, _verify_batch(bs=MAX_BS + 8)),
                (r, _verify_batch(bs=MAX_BS + 1)), (r, _verify_batch(width=1)), (None, _verify_batch()),
                (_eager_runner(), _verify_batch()), (r, _verify_batch(bs=1))]
    with caplog.at_level(logging.WARNING):
        for runner, fb in forwards:
            stats.record_forward(runner, fb, bool(runner is not None and runner.can_run_graph(fb)))
    assert stats.to_dict() == {"graph": 3, "eager": 5, "eager_reasons": {
        "batch_above_max_bs": 2, "width_mismatch": 1, "no_graph_runner": 2}}
    warned = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(warned) == 3, warned
    for reason in ("batch_above_max_bs", "width_mismatch", "no_graph_runner"):
        assert sum(f"reason={reason}" in m for m in warned) == 1, warned
    assert sorted(stats.pop_unexported()) == [("eager", "batch_above_max_bs", 2), ("eager", "no_graph_runner", 2),
                                              ("eager", "width_mismatch", 1), ("graph", "", 3)]
    assert stats.pop_unexported() == []


@pytest.fixture(scope="module")
def kimi_sm120():
    """Kimi-K2.5 + EAGLE-3 chain (steps 3, topk 1, 4 draft tokens) at TP8 on faked SM120 / 96 GB, defaults."""
    return _sm120_args()


@pytest.fixture()
def published(kimi_sm120):
    from sglang.srt import runtime_context as rc

    with rc.use_context(rc.create_context(kimi_sm120, role="scheduler")):
        yield kimi_sm120


def test_verify_forward_raw_counts_every_target_verify_forward(published):
    """The real ModelRunner._forward_raw dispatch records each TARGET_VERIFY forward, draft runners record none."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.runner.verify_graph_stats import SpecVerifyGraphStats

    def model_runner(decode_runner, is_draft_worker=False):
        mr = ModelRunner.__new__(ModelRunner)
        if decode_runner is not None:  # the replay itself needs a GPU
            decode_runner.execute = lambda fb, pp_proxy_tensors=None: "graph"
        vars(mr).update(
            model=SimpleNamespace(shared_experts_config=None), attn_backend=None, device="cuda",
            decode_cuda_graph_runner=decode_runner, prefill_cuda_graph_runner=None, hisparse_coordinator=None,
            is_draft_worker=is_draft_worker, pp_group=SimpleNamespace(is_last_rank=True),
            spec_verify_graph_stats=SpecVerifyGraphStats(),
            # the eager model forward itself needs a GPU
            eager_runner=SimpleNamespace(execute=lambda fb, pp_proxy_tensors=None: "eager"),
            _prepare_eager_forward_batch=lambda fb: None,
            _maybe_execute_deferred_mamba_cow_and_clear=lambda fb: None)
        return mr

    mr = model_runner(_runner())
    outs = [mr._forward_raw(fb, None) for fb in (_verify_batch(bs=2), _verify_batch(bs=MAX_BS + 1),
                                                 _verify_batch(bs=MAX_BS))]
    assert [o.logits_output for o in outs] == ["graph", "eager", "graph"]
    assert [o.can_run_graph for o in outs] == [True, False, True]
    decode = _verify_batch(bs=2, forward_mode=ForwardMode.DECODE, spec_info=None)
    assert mr._forward_raw(decode, None).logits_output == "graph"
    assert mr.spec_verify_graph_stats.to_dict() == {"graph": 2, "eager": 1,
                                                    "eager_reasons": {"batch_above_max_bs": 1}}

    no_graphs = model_runner(None)
    assert no_graphs._forward_raw(_verify_batch(), None).logits_output == "eager"
    assert no_graphs.spec_verify_graph_stats.to_dict()["eager_reasons"] == {"no_graph_runner": 1}

    draft = model_runner(_runner(), is_draft_worker=True)
    draft._forward_raw(_verify_batch(), None)
    assert draft.spec_verify_graph_stats.to_dict()["graph"] == 0


def _scheduler_with(stats):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return SimpleNamespace(
        spec_algorithm=SpeculativeAlgorithm.EAGLE3, draft_worker=None,
        tp_worker=SimpleNamespace(model_runner=SimpleNamespace(spec_verify_graph_stats=stats)),
        metrics_reporter=SimpleNamespace(spec_total_num_accept_tokens=30, spec_total_num_forward_ct=10))


def test_verify_counts_in_server_info():
    """GET /server_info returns internal_states[0] from get_internal_state; bench_serving reads it."""
    from sglang.srt.managers.scheduler_components.internal_state import SchedulerInternalStateController
    from sglang.srt.model_executor.runner.verify_graph_stats import SpecVerifyGraphStats

    stats = SpecVerifyGraphStats()
    for reason in (None, None, "batch_above_max_bs", "mlp_sync", "batch_above_max_bs"):
        stats.record(reason)
    state = {}
    SchedulerInternalStateController(_scheduler_with(stats), record_step_time=False)._add_speculative(state)
    assert state["avg_spec_accept_length"] == 3.0
    assert state["spec_verify_cuda_graph"] == {"graph": 2, "eager": 3, "eager_reasons": {
        "batch_above_max_bs": 2, "mlp_sync": 1}}


def test_verify_counts_in_prometheus_metrics(published):
    import functools

    import prometheus_client
    from prometheus_client import CollectorRegistry, generate_latest

    from sglang.srt.managers.scheduler_components.metrics_reporter import SchedulerMetricsReporter
    from sglang.srt.model_executor.runner.verify_graph_stats import SpecVerifyGraphStats
    from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector

    registry = CollectorRegistry()  # not the process-wide one: other tests may build collectors too

    class Collector(SchedulerMetricsCollector):  # SGLang's own DI hooks (_StatLoggerDIMixin)
        _counter_cls = functools.partial(prometheus_client.Counter, registry=registry)
        _gauge_cls = functools.partial(prometheus_client.Gauge, registry=registry)
        _histogram_cls = functools.partial(prometheus_client.Histogram, registry=registry)
        _summary_cls = functools.partial(prometheus_client.Summary, registry=registry)

    collector = Collector(labels={"model_name": "kimi", "tp_rank": 0, "moe_ep_rank": 0}, server_args=published)
    stats = SpecVerifyGraphStats()
    reporter = SchedulerMetricsReporter.__new__(SchedulerMetricsReporter)
    vars(reporter).update(scheduler=_scheduler_with(stats), metrics_collector=collector,
                          current_scheduler_metrics_enabled=True, is_stats_logging_rank=False,
                          enable_mfu_metrics=False, scheduler_status_logger=None,
                          forward_ct_decode=1, decode_log_interval=40)
    batch = SimpleNamespace(dp_cooperation_info=None)
    for step in ([None, None, "batch_above_max_bs"], [None], []):
        for reason in step:
            stats.record(reason)
        reporter.report_decode_stats(True, running_batch=batch, num_generated_tokens=len(step))

    samples = {(s.labels["outcome"], s.labels["reason"]): s.value
               for metric in registry.collect() if metric.name == "sglang:spec_verify_forwards"
               for s in metric.samples if s.name.endswith("_total")}
    assert samples == {("graph", ""): 3.0, ("eager", "batch_above_max_bs"): 1.0}
    assert "sglang:spec_verify_forwards_total{" in generate_latest(registry).decode()


# ---------------------------------------------------------------------------------------------------------------
# Capture sizes cover every batch the scheduler can form (resolved ServerArgs, faked SM120)
# ---------------------------------------------------------------------------------------------------------------

def _captured_bs(sa):
    """The verify graph's capture list as DecodeCudaGraphRunner builds it, for a pool of max_running_requests."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture

    per_worker = resolved(sa, "max_running_requests") // max(1, resolved(sa, "attn_dp_size") or 1)
    with rc.use_context(rc.create_context(sa, role="scheduler")):
        pool = SimpleNamespace(size=per_worker + 1)  # pool_configurator: max_running_requests + 1 slots
        capture_bs, _ = get_batch_sizes_to_capture(SimpleNamespace(req_to_token_pool=pool, server_args=sa), WIDTH)
    return per_worker, capture_bs


def _assert_covered(sa):
    assert resolved(sa, "attention_backend") == "triton"  # SM120 MLA default
    assert resolved(sa, "speculative_num_draft_tokens") == WIDTH
    per_worker, capture_bs = _captured_bs(sa)
    assert max(capture_bs) >= per_worker, (per_worker, capture_bs[-5:])


@pytest.mark.unchanged
def test_verify_capture_sizes_cover_default_running_requests(kimi_sm120):
    assert resolved(kimi_sm120, "max_running_requests") == 48
    _assert_covered(kimi_sm120)


@pytest.fixture(scope="module")
def kimi_sm120_many_requests():
    return _sm120_args(max_running_requests=1024)


@pytest.fixture(scope="module")
def kimi_sm120_small_graph():
    return _sm120_args(cuda_graph_max_bs_decode=32)


def test_verify_capture_sizes_cover_running_requests_above_default_max_bs(kimi_sm120_many_requests):
    """--max-running-requests above the default decode graph max (512 on a 96 GB GPU at TP8)."""
    _assert_covered(kimi_sm120_many_requests)
    assert resolved(kimi_sm120_many_requests, "max_running_requests") == 512


def test_verify_capture_sizes_cover_running_requests_with_small_graph_max_bs(kimi_sm120_small_graph):
    """--cuda-graph-max-bs-decode below the speculative default of 48 running requests."""
    _assert_covered(kimi_sm120_small_graph)
    assert resolved(kimi_sm120_small_graph, "max_running_requests") == 32


# ---------------------------------------------------------------------------------------------------------------
# Startup refusal: speculative decoding with the target's decode CUDA graphs off
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["disable_cuda_graph", "disable_decode_cuda_graph"])
def test_verify_refuses_spec_without_decode_cuda_graph(flag, monkeypatch):
    monkeypatch.delenv("SGLANG_SPEC_ALLOW_EAGER_VERIFY", raising=False)
    with pytest.raises(ValueError) as err:
        _sm120_args(**{flag: True})
    msg = str(err.value)
    assert "--" + flag.replace("_", "-") in msg
    assert "SGLANG_SPEC_ALLOW_EAGER_VERIFY=1" in msg
    assert "Speculative decoding" in msg


def test_verify_allows_eager_verify_when_opted_in(monkeypatch, caplog):
    monkeypatch.setenv("SGLANG_SPEC_ALLOW_EAGER_VERIFY", "1")
    with caplog.at_level(logging.WARNING):
        sa = _sm120_args(disable_decode_cuda_graph=True)
    assert resolved(sa, "cuda_graph_config").decode.backend == "disabled"
    assert resolved(sa, "speculative_algorithm") == "EAGLE3"
    assert any("SGLANG_SPEC_ALLOW_EAGER_VERIFY" in r.getMessage() for r in caplog.records)


@pytest.mark.unchanged
def test_verify_refusal_leaves_non_speculative_servers_alone(monkeypatch):
    monkeypatch.delenv("SGLANG_SPEC_ALLOW_EAGER_VERIFY", raising=False)
    sa = _sm120_args(spec=False, disable_cuda_graph=True)
    assert resolved(sa, "cuda_graph_config").decode.backend == "disabled"
