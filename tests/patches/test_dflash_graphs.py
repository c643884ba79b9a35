"""DFlash's draft block under the series' graph guarantees: on its CUDA graph at every batch the scheduler forms,
counted by outcome and reason like EAGLE's draft stages, capped to its graph, its collectives recorded by name.

DFlash drafts a whole block in one draft forward, on the draft runner's DecodeCudaGraphRunner captured in verify
mode (8 rows a request for z-lab/Kimi-K2.5-DFlash). Drives the real DFlashWorkerV2.forward_batch_generation (up to
the draft head; the draft model's forward stood in by the runner's own graph decision), DFlashWorkerV2.init_cuda_graphs
(the draft worker's capture stood in), the graph runners' decisions and ModelRunner.forward (tests/patches/_graphs.py).
"""

from __future__ import annotations

import contextlib
import logging
from types import SimpleNamespace

import pytest
import torch

import _graphs as g
from _sgl import published, resolved

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
    """DFlashWorkerV2.forward_batch_generation of a decode batch of bs requests up to the draft block's head, the
    draft model's forward stood in: a graph replay where `draft_graph` (None: no graph runner) takes the batch; the
    target runner's counters are `stats`."""
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
    worker = dw.DFlashWorkerV2.__new__(dw.DFlashWorkerV2)
    vars(worker).update(
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


def test_the_dflash_draft_block_is_counted_by_outcome_and_reason(kimi_dflash, monkeypatch, caplog):
    """Each decode step's draft block is counted as stage draft_block on the target runner's counters (/server_info
    spec_cuda_graph, sglang:cuda_graph_passes_total{stage="draft_block"}): on its graph, eager above the captured
    batches, eager without a graph runner (--disable-cuda-graph), the first of each warned about."""
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
    assert state["spec_cuda_graph"]["draft_block"] == g.graph(1, eager=2, batch_above_max_bs=1, no_graph_runner=1)
    warned = [r.getMessage() for r in caplog.records if "Speculative draft_block forward" in r.getMessage()]
    assert len(warned) == 2 and "reason=batch_above_max_bs" in warned[0] and "reason=no_graph_runner" in warned[1]


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
    """48 running requests and a draft block graph captured up to batch 8 (the real DFlashWorkerV2.init_cuda_graphs,
    the draft worker's capture stood in): capped to 8 and said so, else a batch above 8 would draft every block
    eagerly; without a draft graph (--disable-cuda-graph) nothing to cap to."""
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.speculative import dflash_worker_v2 as dw

    monkeypatch.setattr(dw, "draft_pp_context", contextlib.nullcontext)
    target = ModelRunner.__new__(ModelRunner)
    target.max_running_requests, target.memory_pool_config = 48, None
    draft_graph = SimpleNamespace(capture_bs=captured) if captured else None
    worker = dw.DFlashWorkerV2.__new__(dw.DFlashWorkerV2)
    vars(worker).update(
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
    assert [r.getMessage() for r in caplog.records if "capped" in r.getMessage()] == (
        [
            f"max_running_requests is capped from 48 to 8, the largest captured draft_block batch size (capture list "
            f"{captured}), so that no draft_block batch runs eagerly."
        ]
        if captured
        else []
    )


def test_the_draft_blocks_collectives_are_recorded_as_draft_block(kimi_dflash, monkeypatch):
    """SGLANG_RECORD_SPEC_COLLECTIVES=1: the draft block graph's capture is recorded as draft_block (its runner's
    collective_stage; the target's verify graph keeps target_verify) and an eager draft block's forward, through
    the real ModelRunner.forward of the draft runner, as draft_block_eager, counted in forwards."""
    from sglang.srt.distributed import collective_stats

    assert g.runner(width=BLOCK, algorithm="DFLASH", is_draft_worker=True).collective_stage == "draft_block"
    assert g.runner(width=BLOCK, algorithm="DFLASH").collective_stage == "target_verify"
    monkeypatch.setenv("SGLANG_RECORD_SPEC_COLLECTIVES", "1")
    collective_stats.reset()
    draft = g.model_runner(None, is_draft_worker=True)
    draft.eager_runner.execute = lambda fb, pp_proxy_tensors=None: collective_stats.note(
        "all_reduce", "pcie_ipc", torch.empty(fb.input_ids.numel(), 8, dtype=torch.bfloat16)
    )
    with published(kimi_dflash):
        g.forward(draft, g.verify_batch(bs=2, width=BLOCK))
    assert collective_stats.snapshot() == {
        "draft_block_eager": {
            "calls": {"all_reduce": {"pcie_ipc": 1}},
            "bytes": {"all_reduce": 2 * BLOCK * 8 * 2},
            "forwards": 1,
        }
    }
    collective_stats.reset()
