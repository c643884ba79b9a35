"""Every fixed-width EAGLE verify batch replays a CUDA graph, every speculative fallback is counted (graph runners,
ModelRunner.forward, the EAGLE draft stages, /server_info, Prometheus), the captured batch sizes cover every batch the
scheduler can form (resolved ServerArgs on a faked SM120 box), and an eager verify is announced at startup."""

import contextlib
import logging
from types import SimpleNamespace

import pytest
import torch

import _graphs as g
from _graphs import MAX_BS
from _sgl import bare, published, resolved, sm120_args

U = pytest.mark.unchanged
WIDTH = 4  # num_draft_tokens for steps=3, topk=1
PADDING_OFF = dict(disable_padding=True, backend=SimpleNamespace(can_run=lambda fb, key: key.size in (1, 2, 4, 8)))
CASES = {  # name: (runner overrides, batch kwargs, expected reason or None for graph replay)
    "bs_at_max": ({}, dict(bs=MAX_BS), None),
    "batch_above_max_bs": ({}, dict(bs=MAX_BS + 1), "batch_above_max_bs"),
    "width_mismatch": ({}, dict(width=1), "width_mismatch"),
    "replace_embeds": ({}, dict(replace_embeds=torch.zeros(1, 8)), "replace_embeds"),
    "mlp_sync": (dict(require_mlp_sync=True), dict(can_run_decode_cuda_graph=False), "mlp_sync"),
    "mlp_sync_ok": (dict(require_mlp_sync=True), dict(), None),
    "ragged_verify": (dict(ragged_verify_mode=True), dict(), "ragged_verify"),
    "tbo": (dict(enable_two_batch_overlap=True), dict(can_run_tbo=False), "tbo"),
    "bs_not_captured": (PADDING_OFF, dict(bs=3), "bs_not_captured"),
    "exact_bs_captured": (PADDING_OFF, dict(bs=4), None),
}


DRAFT_CASES = {
    "ok": ({}, {}, None),
    "batch_above_max_bs": ({}, dict(bs=MAX_BS + 1), "batch_above_max_bs"),
    "width_mismatch": ({}, dict(width=3), "width_mismatch"),
    "mlp_sync": (dict(require_mlp_sync=True), dict(can_run_decode_cuda_graph=False), "mlp_sync"),
}
STAGE_CASES = [("target_verify", c) for c in CASES] + [
    (s, c) for s in ("draft_decode", "draft_extend") for c in DRAFT_CASES
]


def _draft_runner(stage="draft_decode", **overrides):
    """An EAGLE draft-decode (topk 1) or draft-extend graph runner captured at bs 1..MAX_BS (no __init__, no GPU)."""
    from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner as Decode
    from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import EAGLEDraftExtendCudaGraphRunner as Extend

    cls, width = (Decode, 1) if stage == "draft_decode" else (Extend, WIDTH)
    attrs = dict(captured_req_width=width, require_mlp_tp_gather=False, disable_padding=False, require_mlp_sync=False)
    return bare(cls, **(attrs | dict(max_bs=MAX_BS) | overrides))


# The graph/eager decision is upstream's (unchanged); the patch names the reason.
@pytest.mark.parametrize("what", [pytest.param("decision", marks=U), "reason"])
@pytest.mark.parametrize("stage, case", STAGE_CASES)
def test_graph_fallback_reason(stage, case, what):
    if stage == "target_verify":
        runner_kw, batch_kw, reason = CASES[case]
        r, fb = g.runner(**runner_kw), g.verify_batch(**batch_kw)
    else:
        runner_kw, batch_kw, reason = DRAFT_CASES[case]
        if stage == "draft_extend":  # captured at num_draft_tokens rows per request
            batch_kw = {**batch_kw, "width": 1 if "width" in batch_kw else WIDTH}
        batch_kw = {"width": 1, **batch_kw}
        r, fb = _draft_runner(stage, **runner_kw), g.verify_batch(**batch_kw)
    if what == "decision":
        assert bool(r.can_run_graph(fb)) is (reason is None)
    else:
        assert r.graph_fallback_reason(fb) == reason and r.can_run_graph(fb) is (reason is None)


# Counters: SpecGraphStats, ModelRunner.forward, the EAGLE draft stages, /server_info, Prometheus


def test_spec_graph_stats_count_outcomes_and_warn_once_per_stage_and_reason(caplog):
    from sglang.srt.model_executor.runner.eager_runner import EagerRunner

    stats, r = g.stats(), g.runner()
    forwards = [(r, dict(bs=bs)) for bs in (4, MAX_BS, MAX_BS + 8, MAX_BS + 1)]
    forwards += [(r, dict(width=1)), (None, {}), (bare(EagerRunner), {}), (r, dict(bs=1))]
    with caplog.at_level(logging.WARNING):
        for runner, batch_kw in forwards:
            fb = g.verify_batch(**batch_kw)
            can = bool(runner is not None and runner.can_run_graph(fb))
            stats.record_forward("target_verify", runner, fb, "graph" if can else "eager")
        stats.record_forward("target_verify", r, g.verify_batch(bs=MAX_BS + 2), "piecewise")
        stats.record_forward("draft_decode", None, g.verify_batch(bs=2), "eager")
        stats.record_forward("draft_extend", r, g.verify_batch(bs=2), "eager", "dsa_topk_seed")
    assert g.speculative_state(stats)["spec_cuda_graph"] == {  # GET /server_info's, read by make bench
        "target_verify": g.graph(3, piecewise=1, eager=5, batch_above_max_bs=3, width_mismatch=1, no_graph_runner=2),
        "draft_decode": g.graph(eager=1, no_graph_runner=1),
        "draft_extend": g.graph(eager=1, dsa_topk_seed=1),
    }
    unexported = sorted(stats.pop_unexported())  # the Prometheus counter's increments
    assert unexported == [
        ("draft_decode", "eager", "no_graph_runner", 1),
        ("draft_extend", "eager", "dsa_topk_seed", 1),
        ("target_verify", "eager", "batch_above_max_bs", 2),
        ("target_verify", "eager", "no_graph_runner", 2),
        ("target_verify", "eager", "width_mismatch", 1),
        ("target_verify", "graph", "", 3),
        ("target_verify", "piecewise", "batch_above_max_bs", 1),
    ]
    assert stats.pop_unexported() == []
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    fallbacks = {(stage, reason) for stage, outcome, reason, _ in unexported if outcome == "eager"}
    assert len(warned) == len(fallbacks) == 5, warned  # one warning per stage and reason
    for stage, reason in fallbacks:
        assert sum(f"Speculative {stage} forward" in m and f"reason={reason}" in m for m in warned) == 1, warned


def test_spec_graph_forward_counts_each_verify_and_records_eager_collectives(kimi, collectives, monkeypatch):
    """Each TARGET_VERIFY forward counts once by how it ran (also when an elastic-EP fault re-runs it); an eager one
    records its collectives as `<stage>_eager`, a replay none (its capture did); issue 22 item 1."""
    from sglang.srt.model_executor import model_runner as mr_mod
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    def eager(fb, pp_proxy_tensors=None):  # one reduction of the batch's rows
        g.reduce(fb.input_ids.numel())
        return "eager"

    mr = g.model_runner(g.runner(), eager=eager)
    outs = [g.forward(mr, g.verify_batch(bs=bs)) for bs in (2, MAX_BS + 1, MAX_BS)]
    assert [o.logits_output for o in outs] == [o.graph_outcome for o in outs] == ["graph", "eager", "graph"]
    decode = g.verify_batch(bs=2, forward_mode=ForwardMode.DECODE, spec_info=None)
    assert g.forward(mr, decode).logits_output == "graph"
    assert mr.spec_graph_stats.to_dict()["target_verify"] == g.graph(2, eager=1, batch_above_max_bs=1)

    no_graphs = g.model_runner(None, eager=eager)
    assert g.forward(no_graphs, g.verify_batch(bs=1)).logits_output == "eager"  # narrower than the widest recorded
    assert g.forward(no_graphs, decode).logits_output == "eager"  # a plain eager decode
    assert no_graphs.spec_graph_stats.to_dict()["target_verify"] == g.graph(eager=1, no_graph_runner=1)
    assert collectives.snapshot() == {"target_verify_eager": g.reduced(1, (MAX_BS + 1) * WIDTH, forwards=2)}

    elastic = g.model_runner(g.runner())
    elastic.enable_elastic_ep = True
    monkeypatch.setattr(mr_mod, "maybe_rebalance_after_rank_fault", lambda eplb_manager: True)
    g.forward(elastic, g.verify_batch(bs=2))
    assert elastic.spec_graph_stats.to_dict()["target_verify"] == g.graph(1)

    piecewise = g.model_runner(g.runner(), piecewise=True)
    assert g.forward(piecewise, g.verify_batch(bs=MAX_BS + 1)).logits_output == "piecewise"
    assert piecewise.spec_graph_stats.to_dict()["target_verify"] == g.graph(piecewise=1, batch_above_max_bs=1)

    draft_graphs = g.model_runner(g.runner(), is_draft_worker=True)
    g.forward(draft_graphs, g.verify_batch())
    assert draft_graphs.spec_graph_stats.to_dict()["target_verify"] == g.graph()

    draft = g.model_runner(None, is_draft_worker=True, eager=eager)
    g.forward(draft, g.verify_batch(bs=2, forward_mode=ForwardMode.DRAFT_EXTEND_V2))
    with collectives.recording("draft_decode"):  # as FullCudaGraphBackend captures the draft decode graph
        g.forward(draft, g.verify_batch(bs=2, width=1, forward_mode=ForwardMode.DECODE))
        g.forward(draft, g.verify_batch(bs=2, width=1, forward_mode=ForwardMode.DRAFT_EXTEND_V2))
    got = collectives.snapshot()
    assert got.pop("draft_extend_eager") == g.reduced(1, 2 * WIDTH, forwards=1)
    assert got.pop("draft_decode") == g.reduced(2, 2 * 2, graphs=1)
    assert list(got) == ["target_verify_eager"]


class _Stop(Exception):
    pass


def test_spec_graph_eagle_draft_stages_counted(monkeypatch, collectives):
    """The real EagleDraftWorker of a 3-step chain (forwards, replays and verify input stubbed) counts its draft
    decode and each draft extend: graph, or eager with the runner's reason."""
    from sglang.srt.speculative import eagle_worker_v2 as ew

    def draft_forward(fb):  # each of the 2 draft decode steps reduces the batch's rows once
        g.reduce(fb.batch_size)
        g.reduce(fb.batch_size)
        return None, None, None, None

    graph_runner, extend_runner, stats = _draft_runner(), _draft_runner("draft_extend"), g.stats()
    graph_runner.execute = lambda fb: (None, None, None, None)
    extend_runner.execute = lambda fb, select_index: (_ for _ in ()).throw(_Stop())
    monkeypatch.setattr(ew, "build_eagle_verify_input", lambda *a, **k: SimpleNamespace())
    w = bare(
        ew.EagleDraftWorker,
        req_to_token_pool=None,
        cuda_graph_runner=graph_runner,
        cuda_graph_runner_for_draft_extend=extend_runner,
        draft_runner=SimpleNamespace(canary_manager=None, forward=lambda fb: (_ for _ in ()).throw(_Stop())),
        topk=1,
        speculative_num_steps=3,
        speculative_num_draft_tokens=WIDTH,
        target_worker=SimpleNamespace(model_runner=SimpleNamespace(spec_graph_stats=stats, kv_index_translator=None)),
        seed_dsa_topk_from_draft_extend=False,
        tree_mask_mode=None,
        device="cpu",
        draft_attn_backend=SimpleNamespace(init_forward_metadata=lambda fb: None),
        draft_forward=draft_forward,
        plan_stream=None,
        plan_stream_ctx=contextlib.nullcontext(),
    )
    for bs in (4, MAX_BS + 1):
        fb = g.verify_batch(bs=bs, width=1, mark_forward_metadata_ready=lambda: None)
        monkeypatch.setattr(
            ew, "prepare_for_draft", lambda *a, fb=fb, **k: (fb, w.cuda_graph_runner.can_run_graph(fb), None)
        )
        w.draft(SimpleNamespace(spec_info=SimpleNamespace(dsa_topk_indices=None)))
    # the eager one's collectives, both steps as one forward (issue 22 item 1)
    assert collectives.snapshot() == {"draft_decode_eager": g.reduced(2, 2 * (MAX_BS + 1), forwards=1)}
    for bs in (4, MAX_BS + 1):
        fb = g.verify_batch(bs=bs)
        monkeypatch.setattr(ew, "prepare_for_draft_extend", lambda *a, fb=fb, **k: fb)
        result = SimpleNamespace(
            prepared_draft_extend_inputs=(None, None, None),
            logits_output=SimpleNamespace(hidden_states=None),
            accept_lens=torch.ones(bs, dtype=torch.int32),
        )
        with pytest.raises(_Stop):
            w._draft_extend_for_decode(SimpleNamespace(seq_lens=torch.ones(bs)), result)
    counted = stats.to_dict()
    assert counted["draft_decode"] == counted["draft_extend"] == g.graph(1, eager=1, batch_above_max_bs=1)


def test_spec_graph_counts_in_prometheus_metrics(kimi):
    import functools

    import prometheus_client
    from prometheus_client import CollectorRegistry, generate_latest

    from sglang.srt.managers.scheduler_components.metrics_reporter import SchedulerMetricsReporter
    from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector

    registry = CollectorRegistry()  # not the process-wide one: other tests may build collectors too

    class Collector(SchedulerMetricsCollector):  # SGLang's own DI hooks (_StatLoggerDIMixin)
        _counter_cls = functools.partial(prometheus_client.Counter, registry=registry)
        _gauge_cls = functools.partial(prometheus_client.Gauge, registry=registry)
        _histogram_cls = functools.partial(prometheus_client.Histogram, registry=registry)
        _summary_cls = functools.partial(prometheus_client.Summary, registry=registry)

    collector = Collector(labels={"model_name": "kimi", "tp_rank": 0, "moe_ep_rank": 0}, server_args=kimi)
    stats = g.stats()
    reporter = bare(
        SchedulerMetricsReporter,
        scheduler=g.scheduler(stats),
        metrics_collector=collector,
        current_scheduler_metrics_enabled=True,
        is_stats_logging_rank=False,
        enable_mfu_metrics=False,
        scheduler_status_logger=None,
        forward_ct_decode=1,
        decode_log_interval=40,
    )
    batch = SimpleNamespace(dp_cooperation_info=None)
    verify, above = ("target_verify", "graph", ""), ("target_verify", "eager", "batch_above_max_bs")
    steps = [[verify, verify, above, ("draft_decode", "graph", "")], [verify], []]
    for step in steps:
        for stage, outcome, reason in step:
            stats.record(stage, outcome, reason)
        reporter.report_decode_stats(True, running_batch=batch, num_generated_tokens=len(step))

    collector.increment_decode_cuda_graph_pass(True)  # upstream's per-batch count keeps its modes
    collector.increment_prefill_cuda_graph_pass(False)
    samples = {
        (s.labels["mode"], s.labels["stage"], s.labels["outcome"], s.labels["reason"]): s.value
        for metric in registry.collect()
        if metric.name == "sglang:cuda_graph_passes"
        for s in metric.samples
        if s.name.endswith("_total")
    }
    assert samples == {
        ("target_verify_cuda_graph", "target_verify", "graph", ""): 3.0,
        ("target_verify_none", "target_verify", "eager", "batch_above_max_bs"): 1.0,
        ("draft_decode_cuda_graph", "draft_decode", "graph", ""): 1.0,
        ("decode_cuda_graph", "decode", "graph", ""): 1.0,
        ("prefill_none", "prefill", "eager", ""): 1.0,
    }
    assert "spec_cuda_graph_forwards" not in generate_latest(registry).decode()


# Capture sizes cover every batch the scheduler can form (resolved ServerArgs, faked SM120)


@pytest.mark.parametrize(
    "kw, running",
    [
        pytest.param({}, 48, marks=U, id="defaults"),
        pytest.param(dict(max_running_requests=1024), 512, id="many-requests"),
        pytest.param(dict(cuda_graph_max_bs_decode=32), 32, id="small-graph"),
    ],
)
def test_verify_capture_sizes_cover_the_running_requests(kw, running):
    """The defaults, --max-running-requests above the default decode graph max (512 on a 96 GB GPU at TP8),
    --cuda-graph-max-bs-decode below the speculative default of 48: every batch a DP worker forms has a graph."""
    sa = sm120_args(**kw)
    assert resolved(sa, "attention_backend") == "triton"  # SM120 MLA default
    assert resolved(sa, "speculative_num_draft_tokens") == WIDTH and resolved(sa, "max_running_requests") == running
    per_worker, capture_bs = g.captured_bs(sa, WIDTH)
    assert max(capture_bs) >= per_worker, (per_worker, capture_bs[-5:])


def test_verify_running_requests_capped_to_the_largest_captured_graph(monkeypatch, caplog):
    """Two-batch overlap with --cuda-graph-max-bs-decode 15 captures even sizes only, so init_cuda_graphs lowers
    max_running_requests to 14: every batch the scheduler can form replays a verify graph."""
    from sglang.srt.model_executor import model_runner as mr_mod
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    sa = sm120_args(enable_two_batch_overlap=True, cuda_graph_max_bs_decode=15)
    assert resolved(sa, "max_running_requests") == 15  # the resolution-time bound: the configured max_bs
    pool_size, capture_bs = g.captured_bs(sa, WIDTH)
    graph_runner = g.runner(max_bs=max(capture_bs), capture_bs=capture_bs)
    captured = SimpleNamespace(
        eager_runner=None,
        prefill=SimpleNamespace(runner=None),
        decode=SimpleNamespace(runner=graph_runner),
        memory_usage={},
        time_usage={},
    )
    monkeypatch.setattr(mr_mod, "capture_cuda_graphs", lambda **kw: captured)
    monkeypatch.setattr(mr_mod, "prebuild_deepep_v2_buffer", lambda model: None)
    mr = bare(
        mr_mod.ModelRunner,
        is_draft_worker=False,
        spec_algorithm=SpeculativeAlgorithm.EAGLE3,
        max_running_requests=pool_size,
        memory_pool_config=SimpleNamespace(max_running_requests=pool_size),
        model=None,
    )
    with published(sa), caplog.at_level(logging.WARNING):
        mr.init_cuda_graphs()
    assert (mr.max_running_requests, mr.memory_pool_config.max_running_requests) == (14, 14) == (max(capture_bs),) * 2
    assert all(graph_runner.graph_fallback_reason(g.verify_batch(bs=bs)) is None for bs in range(1, 15))
    assert any("capped from 15 to 14" in m for m in caplog.messages)


def test_verify_cap_covers_the_draft_graphs(monkeypatch, caplog):
    """TP8, DP attention 2, --cuda-graph-max-bs-decode 15: token counts divide by attn_tp_size (4), so the draft
    graphs (1 row a request) keep only 4, 8, 12 and the cap follows them. XPU-style platform: no CUDA-only imports."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture
    from sglang.srt.speculative import eagle_worker_v2 as ew
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    sa = sm120_args(enable_dp_attention=True, dp_size=2, cuda_graph_max_bs_decode=15, max_running_requests=64)
    pool_size, target_bs = g.captured_bs(sa, WIDTH)
    pool, runner_of = SimpleNamespace(size=pool_size), {}

    def uncaptured(cls):
        class Runner(cls):
            def __init__(self, worker):  # the sizing line of the real __init__; no graphs
                self.capture_bs, _ = get_batch_sizes_to_capture(worker.draft_runner)
                runner_of[cls.__name__] = self

        return Runner

    monkeypatch.setattr(ew, "EAGLEDraftCudaGraphRunner", uncaptured(ew.EAGLEDraftCudaGraphRunner))
    monkeypatch.setattr(ew, "EAGLEDraftExtendCudaGraphRunner", uncaptured(ew.EAGLEDraftExtendCudaGraphRunner))
    for flag, value in (("_is_cpu", False), ("_is_cuda", False), ("_is_xpu", True), ("_is_hip", False)):
        monkeypatch.setattr(ew, flag, value)
    monkeypatch.setattr(ew, "get_available_gpu_memory", lambda device, gpu_id: 80.0)
    target = bare(
        ModelRunner,
        is_draft_worker=False,
        spec_algorithm=SpeculativeAlgorithm.EAGLE3,
        max_running_requests=pool.size,
        memory_pool_config=None,
        decode_cuda_graph_runner=SimpleNamespace(capture_bs=target_bs),
    )
    with published(sa):
        target._cap_running_requests_to_verify_graphs()
        assert target.max_running_requests == 15  # the target's own graphs cover 15
        w = bare(
            ew.EagleDraftWorker,
            target_worker=SimpleNamespace(model_runner=target, device="xpu"),
            speculative_num_steps=3,
            speculative_num_draft_tokens=WIDTH,
            topk=1,
            speculative_algorithm=SpeculativeAlgorithm.EAGLE3,
            draft_runner=SimpleNamespace(req_to_token_pool=pool, server_args=sa),
            draft_extend_attn_backend=bare(TritonAttnBackend),
            device="xpu",
            gpu_id=0,
            _specialized_graph_memory_usage={},
            _specialized_graph_time_usage={},
        )
        with caplog.at_level(logging.WARNING):
            w._capture_cuda_graphs()
    assert runner_of["EAGLEDraftCudaGraphRunner"].capture_bs == [4, 8, 12]
    assert runner_of["EAGLEDraftExtendCudaGraphRunner"].capture_bs == [4, 8, 12]
    assert target.max_running_requests == 12
    for draft, algorithm in ((True, SpeculativeAlgorithm.EAGLE3), (False, SpeculativeAlgorithm.NONE)):  # never capped
        other = bare(
            ModelRunner,
            is_draft_worker=draft,
            spec_algorithm=algorithm,
            max_running_requests=48,
            memory_pool_config=None,
            decode_cuda_graph_runner=target.decode_cuda_graph_runner,
        )
        other._cap_running_requests_to_verify_graphs()
        assert other.max_running_requests == 48
    assert any("capped from 15 to 12" in m and "draft_decode" in m for m in caplog.messages)


# Eager verify said at startup: decode CUDA graphs off, compact ragged verify without ragged graphs


@pytest.mark.parametrize(
    "flag, spec",
    [
        ("disable_cuda_graph", True),
        ("disable_decode_cuda_graph", True),
        pytest.param("disable_cuda_graph", False, marks=U),
    ],
)
def test_verify_warns_at_startup_without_decode_cuda_graph(flag, spec, caplog):
    """Speculation with the decode graphs off starts (upstream's test kit runs EAGLE-3 so), with one warning naming
    the cause, the cost and where the eager verifies are counted; a server without speculation gets none."""
    with caplog.at_level(logging.WARNING):
        sa = sm120_args(spec=spec, **{flag: True})
    assert resolved(sa, "cuda_graph_config").decode.backend == "disabled"
    assert resolved(sa, "speculative_algorithm") == ("EAGLE3" if spec else None)
    warned = [m for m in caplog.messages if "Speculative decoding" in m]
    assert len(warned) == spec
    assert all("--" + flag.replace("_", "-") in m and "spec_cuda_graph" in m and "no_graph_runner" in m for m in warned)


@pytest.mark.parametrize(
    "module, backend",
    [("triton", "TritonAttnBackend"), pytest.param("flashinfer_mla", "FlashInferMLAAttnBackend", marks=U)],
)
def test_verify_compact_ragged_verify_without_ragged_graphs_warns(kimi, monkeypatch, caplog, module, backend):
    """SGLANG_RAGGED_VERIFY_MODE=compact on a backend without ragged verify graphs (triton) verifies eagerly: the
    real DecodeCudaGraphRunner.__init__ says so before the backend's graph buffers (which it lacks) stop it."""
    import importlib
    from unittest import mock

    from sglang.srt.model_executor.runner import base_runner
    from sglang.srt.model_executor.runner import decode_cuda_graph_runner as dcgr
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    monkeypatch.setattr(dcgr, "ragged_verify_compact_graphs_enabled", lambda algo: True)
    cls = getattr(importlib.import_module(f"sglang.srt.layers.attention.{module}_backend"), backend)
    mr = mock.MagicMock()
    mr.configure_mock(
        spec_algorithm=SpeculativeAlgorithm.EAGLE3,
        is_draft_worker=False,
        lora_manager=None,
        server_args=kimi,
        attn_backend=bare(cls, dllm_attention=None),
        device="cpu",
        **{
            "model_config.is_encoder_decoder": False,
            "model_config.hf_config": SimpleNamespace(),
            "ngram_embedding_manager.enabled": False,
            "req_to_token_pool.size": 48,
            "decode_num_tokens_per_req.return_value": WIDTH,
            "decode_graph_gather_requirements.return_value": (False, False),
        },
    )
    monkeypatch.setattr(dcgr, "create_dsv41_candidate_graph_variants", lambda *a: None)
    monkeypatch.setattr(base_runner, "TboCudaGraphRunnerPlugin", lambda: None)  # allocates on the GPU
    with caplog.at_level(logging.WARNING), pytest.raises(AttributeError):
        dcgr.DecodeCudaGraphRunner(mr)
    warned = [m for m in caplog.messages if "SGLANG_RAGGED_VERIFY_MODE" in m]
    assert len(warned) == (1 if module == "triton" else 0), warned
    assert all(backend in m and "SGLANG_RAGGED_VERIFY_MODE=static" in m for m in warned)
