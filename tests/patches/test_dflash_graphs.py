"""DFlash's draft block under the series' graph guarantees: on its CUDA graph at every batch the scheduler forms,
counted by outcome and reason like EAGLE's draft stages, capped to its graph, its collectives recorded by name. The
draft block runs on the draft runner's DecodeCudaGraphRunner in verify mode (8 rows a request)."""

import contextlib
import logging
from types import SimpleNamespace

import pytest
import torch

import _graphs as g
from _sgl import bare, published, resolved

BLOCK = 8


@pytest.mark.unchanged
def test_the_dflash_verify_and_draft_block_replay_graphs_at_every_batch(kimi_dflash):
    """Every batch the scheduler can form (1..48 requests) replays the target's verify graph and the draft block's
    graph, both captured at 8 rows a request, with the spec inputs DFlash builds."""
    from sglang.srt.speculative.draft_worker_common import make_draft_block_spec_info

    assert resolved(kimi_dflash, "speculative_num_draft_tokens") == BLOCK
    pool, capture_bs = g.captured_bs(kimi_dflash, BLOCK)
    assert max(capture_bs) >= resolved(kimi_dflash, "max_running_requests") == pool == 48
    spec_info = make_draft_block_spec_info(draft_token_num=BLOCK, device="cpu")
    for draft in (False, True):
        r = g.runner(width=BLOCK, algorithm="DFLASH", is_draft_worker=draft, max_bs=max(capture_bs))
        assert all(r.can_run_graph(g.verify_batch(bs, BLOCK, spec_info=spec_info)) for bs in range(1, pool + 1))


class _Stop(Exception):
    """Raised where the step goes past the draft block (its head reads the draft's output)."""


class _Past:
    def __getattr__(self, name):
        raise _Stop


def draft_step(monkeypatch, draft_graph, bs, stats):
    """DFlashWorkerV2.forward_batch_generation of a decode batch of bs requests up to the draft block's head, the draft
    forward stood in: a graph replay where `draft_graph` (None: no graph runner) takes the batch."""
    from sglang.srt.speculative import dflash_worker_v2 as dw
    from sglang.srt.speculative.draft_worker_common import make_draft_block_spec_info, make_draft_input_v2

    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)
    monkeypatch.setattr(dw, "draft_tp_context", lambda layout: contextlib.nullcontext())
    monkeypatch.setattr(dw, "assign_extend_cache_locs_func", lambda **kw: torch.zeros(bs * BLOCK, dtype=torch.int64))

    def draft_forward(fb):
        replayed = draft_graph is not None and draft_graph.can_run_graph(fb)
        return SimpleNamespace(
            logits_output=_Past(), can_run_graph=replayed, graph_outcome="graph" if replayed else "eager"
        )

    target = SimpleNamespace(
        spec_graph_stats=stats,
        req_to_token_pool=SimpleNamespace(req_to_token=None),
        model=SimpleNamespace(
            lm_head=SimpleNamespace(weight=None), get_input_embeddings=lambda: lambda ids: torch.zeros(*ids.shape, 8)
        ),
        kv_index_translator=SimpleNamespace(plan=lambda **kw: SimpleNamespace(bind=lambda *a: None)),
    )
    worker = bare(
        dw.DFlashWorkerV2,
        _target_worker=SimpleNamespace(model_runner=target),
        model_runner=target,
        device="cpu",
        block_size=BLOCK,
        selector=None,
        lilicorr=None,
        _is_domino=False,
        _draft_sampler=_Past(),
        draft_model=None,
        _full_embed_gpu=None,
        _noise_embed_scale=1.0,
        _mask_token_id=5,
        _use_triton_prepare_block=False,
        _draft_block_ids_buf=None,
        use_compact_draft_cache=False,
        _block_pos_offsets=torch.arange(BLOCK),
        draft_parallel_layout=None,
        _draft_block_spec_info=make_draft_block_spec_info(draft_token_num=BLOCK, device="cpu"),
        draft_model_runner=SimpleNamespace(
            forward=draft_forward, decode_cuda_graph_runner=draft_graph, kv_index_translator=None
        ),
    )
    ones = torch.ones(bs, dtype=torch.int64)
    batch = SimpleNamespace(
        sampling_info=None,
        forward_mode=SimpleNamespace(is_extend=lambda: False, is_idle=lambda: False),
        is_extend_in_batch=False,
        spec_info=make_draft_input_v2(bonus_tokens=ones, new_seq_lens=ones),
        seq_lens=ones,
        seq_lens_cpu=ones,
        req_pool_indices=ones - 1,
        can_run_decode_cuda_graph=True,
    )
    with pytest.raises(_Stop):
        worker.forward_batch_generation(batch)


def test_the_dflash_draft_block_is_counted_and_its_collectives_recorded(kimi_dflash, monkeypatch, caplog, collectives):
    """Each step's draft block is counted as stage draft_block (/server_info spec_cuda_graph, the Prometheus counter):
    on its graph, eager above the captured batches or without a graph runner, the first of each warned about."""
    draft_graph, stats = g.runner(width=BLOCK, algorithm="DFLASH", is_draft_worker=True), g.stats()
    with published(kimi_dflash), caplog.at_level(logging.WARNING):
        for graph, bs in ((draft_graph, 4), (draft_graph, 49), (None, 4)):
            draft_step(monkeypatch, graph, bs, stats)
    assert sorted(stats.pop_unexported()) == [
        ("draft_block", "eager", "batch_above_max_bs", 1),
        ("draft_block", "eager", "no_graph_runner", 1),
        ("draft_block", "graph", "", 1),
    ]  # the metric's stage, outcome, reason
    state = g.speculative_state(stats, "DFLASH")
    assert state["spec_cuda_graph"] == {  # no EAGLE draft stage: nothing recorded one, so none reads as 0 fallbacks
        "target_verify": g.graph(),
        "draft_block": g.graph(1, eager=2, batch_above_max_bs=1, no_graph_runner=1),
    }
    warned = [m for m in caplog.messages if "Speculative draft_block forward" in m]
    assert len(warned) == 2 and "reason=batch_above_max_bs" in warned[0] and "reason=no_graph_runner" in warned[1]
    # its collectives: the graph's capture as draft_block (the target's stays target_verify), an eager one's forward
    assert draft_graph.collective_stage == "draft_block"
    assert g.runner(width=BLOCK, algorithm="DFLASH").collective_stage == "target_verify"
    draft = g.model_runner(None, is_draft_worker=True)
    draft.eager_runner.execute = lambda fb, pp_proxy_tensors=None: g.reduce(fb.input_ids.numel())
    with published(kimi_dflash):
        g.forward(draft, g.verify_batch(bs=2, width=BLOCK))
    assert collectives.snapshot() == {"draft_block_eager": g.reduced(1, 2 * BLOCK, forwards=1)}


@pytest.mark.parametrize(
    "captured, want",
    [
        pytest.param([1, 2, 4, 8], 8, id="graph"),
        pytest.param(None, 48, id="no-draft-graph", marks=pytest.mark.unchanged),
    ],
)
def test_max_running_requests_is_capped_to_the_draft_blocks_captured_batches(
    kimi_dflash, monkeypatch, caplog, captured, want
):
    """48 running requests, a draft block graph captured up to batch 8 (the real DFlashWorkerV2.init_cuda_graphs): capped
    to 8 and said so, else a batch above 8 drafts every block eagerly; without a draft graph, nothing to cap to."""
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.speculative import dflash_worker_v2 as dw

    monkeypatch.setattr(dw, "draft_pp_context", contextlib.nullcontext)
    target = bare(ModelRunner, max_running_requests=48, memory_pool_config=None)
    draft_graph = SimpleNamespace(capture_bs=captured) if captured else None
    worker = bare(
        dw.DFlashWorkerV2,
        draft_parallel_layout=None,
        _target_tp_rank=0,
        _maybe_build_draft_sampler=lambda: None,
        selector=None,
        _target_worker=SimpleNamespace(model_runner=target),
        _draft_worker=SimpleNamespace(init_cuda_graphs=lambda capture_decode_cuda_graph: None),
        draft_model_runner=SimpleNamespace(capture_tail_hooks=[], decode_cuda_graph_runner=draft_graph),
    )
    with published(kimi_dflash), caplog.at_level(logging.WARNING):
        monkeypatch.setattr(dw, "draft_tp_context", lambda layout: contextlib.nullcontext())
        worker.init_cuda_graphs()
    assert target.max_running_requests == want
    said = [m for m in caplog.messages if "capped" in m]
    assert len(said) == bool(captured) and all("capped from 48 to 8" in m and "draft_block" in m for m in said)
