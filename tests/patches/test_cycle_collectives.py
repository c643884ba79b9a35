"""Collectives of the speculative cycle: counted per stage when asked, none on NCCL at decode sizes (EAGLE-3 and
DFlash), and the verify and draft heads that gather each vocab shard's argmax (their values on two ranks: _gloo.py)."""

import logging
import tomllib
from types import SimpleNamespace

import pytest
import torch

import _gloo
from _graphs import greedy_sampling, speculative_state, stats
from _pcie import KIMI_VOCAB_SHARD, REPO, communicator, prepared, rows, widest_decode_rows
from _sgl import bare, published

TABLE = REPO / "bench" / "inputs" / "collectives_kimi_tp8.toml"
PROFILE_ROWS = 64  # the shipped profile's widest verify: 16 requests x 4 draft tokens
BLOCK = 8  # DFlash's block (z-lab/Kimi-K2.5-DFlash), 7 drafted positions per request


@pytest.fixture
def tp(tp8):
    """The TP8 group, PCIe IPC prepared for the shipped profile's 64-row verify (all-reduce and vocab-shard gather)."""
    tp8.pcie_ipc_comm = prepared(PROFILE_ROWS, gather_width=KIMI_VOCAB_SHARD)
    return tp8


def gather(g, n, width, dtype=torch.bfloat16):
    """An all-gather of real (CPU) tensors: the PCIe-IPC route checks where they lie."""
    g.all_gather_into_tensor(torch.empty((8 * n, width), dtype=dtype), torch.zeros((n, width), dtype=dtype))


def recorded(stage, run):
    from sglang.srt.distributed import collective_stats

    collective_stats.reset()
    with collective_stats.recording(stage):
        run()
    return collective_stats.snapshot().get(stage)


def test_collectives_counted_by_op_and_backend(tp, monkeypatch):
    """One recorded forward: each collective is noted with the backend the real code picked, and /server_info lists
    them; without SGLANG_RECORD_SPEC_COLLECTIVES=1 nothing is recorded or listed."""

    def forward():
        tp.all_reduce(rows(8))  # a decode-sized reduction: PCIe IPC
        tp.all_reduce(rows(2048))  # prefill-sized: NCCL
        gather(tp, 64, KIMI_VOCAB_SHARD)  # the widest verify's logits shard: PCIe IPC
        gather(tp, 65, KIMI_VOCAB_SHARD)  # wider: NCCL
        gather(tp, 64, 4, torch.float32)  # the greedy verify's (max, index, 0, 0) rows: PCIe IPC
        gather(tp, 1, 3, torch.int32)  # 12 bytes, not whole 16-byte packs: NCCL
        tp.broadcast(torch.zeros(12, dtype=torch.int32))

    got = recorded("target_verify", forward)
    assert got["calls"] == {
        "all_reduce": {"nccl": 1, "pcie_ipc": 1},
        "all_gather": {"nccl": 2, "pcie_ipc": 2},
        "broadcast": {"pcie_ipc": 1},
    }
    assert got["graphs"] == 1 and got["bytes"]["all_gather"] == 129 * KIMI_VOCAB_SHARD * 2 + 64 * 16 + 12
    assert tp.pynccl_comm.calls == ["all_reduce", "all_gather", "all_gather"]
    assert "spec_collectives" in speculative_state(stats())
    monkeypatch.setenv("SGLANG_RECORD_SPEC_COLLECTIVES", "0")
    assert recorded("target_verify", lambda: tp.all_reduce(rows(8))) is None
    state = speculative_state(stats())
    assert "spec_collectives" not in state and "spec_cuda_graph" in state


def test_the_all_gather_is_tuned_with_the_all_reduce_and_says_when_it_is_not_built(no_gpu, caplog):
    """prepare() tunes the all-gather for the rows it serves (the logits shard, and one 16-byte pack per row); with
    CUDA graphs off (no captured rows) it builds no all-gather and says so once."""
    gather_ws = prepared(PROFILE_ROWS, gather_width=KIMI_VOCAB_SHARD)._gather_workspace
    assert gather_ws.tuned == [[KIMI_VOCAB_SHARD, 8]] and gather_ws.kw["tune_batches"] == (1, 2, 4, 8, 16, 32, 64)
    with caplog.at_level(logging.INFO):
        assert prepared(None, gather_width=KIMI_VOCAB_SHARD)._gather_workspace is None
    assert [m for m in caplog.messages if "all-gather not built" in m] == [
        "FlashInfer PCIe-IPC all-gather not built: no captured decode graphs to size it (CUDA graphs off); "
        "all-gathers and broadcasts stay on NCCL."
    ]


@pytest.mark.parametrize("world", [2, 4, 8])
def test_the_all_gather_memory_vote_sizes_the_layouts_of_its_world(monkeypatch, world):
    """A rank without the memory for the all-gather votes no at every world size. FlashInfer's size function (JIT
    code, stood in by its argument check and arithmetic) refuses the copy-engine layout below 8 ranks."""
    from flashinfer.comm.pcie_ipc_collectives import _ag_rs_module

    def size(world_size, max_numel, elem, blocks, copy_engine):
        if copy_engine and world_size != 8:
            raise RuntimeError("CopyEngine storage requires world_size 8")
        return max_numel * elem * (2 if copy_engine else 1)

    monkeypatch.setattr(
        _ag_rs_module, "get_pcie_ipc_ag_rs_module", lambda: SimpleNamespace(all_gather_workspace_size=size)
    )
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (0, 96 << 30))
    ok, why = communicator(world)._can_allocate(64 * KIMI_VOCAB_SHARD, gather=True)
    assert not ok and f"{64 * KIMI_VOCAB_SHARD * 2 * (2 if world == 8 else 1)} needed" in why


def test_pcie_ipc_all_gather_bytes_and_broadcast_sources_on_two_ranks():
    """Gathers bit-exact and rank-major in every dtype (NaN, -0.0, inf too), broadcasts from either rank, the sampled
    verify's packed broadcast: 7 PCIe-IPC calls; an in-place gather (FlashInfer refuses it) right on the group's."""
    for r in _gloo.run("gather_semantics", timeout=400):
        assert r.pop("pcie_ipc_calls") == 7 and r.pop("in_place_on_pcie_ipc") is False
        assert all(r.values()), r


def test_the_greedy_verify_from_shards_through_eagle_worker_verify():
    """A greedy batch reads the shards' argmax (no logits), a logit-bias batch the full gather: both give the undeferred
    logits' tokens on both ranks (vocab 250 padded to 256), a tie across shards to the lowest id."""
    for r in _gloo.run("verify_wiring", timeout=400, vocab=250):
        assert r["deferred"] and r["reference"][0] == 3 and r["reference"][1] == 248
        assert r["greedy"] == {"tokens": r["reference"], "logits": None}
        assert r["logit_bias"] == {"tokens": r["reference"], "logits": [12, 250]}


def test_the_greedy_verify_needs_only_the_argmax_when_nothing_reads_the_logits(monkeypatch):
    from sglang.srt.speculative import eagle_worker_common as ewc

    def batch(has_grammar=False, return_logprob=False, no_info=False, **kw):
        info = None if no_info else greedy_sampling(**kw)
        return SimpleNamespace(has_grammar=has_grammar, return_logprob=return_logprob, sampling_info=info)

    assert ewc._verify_needs_only_argmax(batch())
    assert ewc._verify_needs_only_argmax(batch(penalizer_orchestrator=SimpleNamespace(is_required=False)))
    for kw in (
        {"is_all_greedy": False},
        {"has_grammar": True},
        {"return_logprob": True},
        {"logit_bias": 1},
        {"acc_additive_penalties": 1},
        {"acc_scaling_penalties": 1},
        {"has_watermark_candidates": True},
        {"penalizer_orchestrator": SimpleNamespace(is_required=True)},
        {"has_custom_logit_processor": True},
        {"sampling_mask_batch_indices": torch.tensor([0])},
        {"no_info": True},
    ):
        assert not ewc._verify_needs_only_argmax(batch(**kw)), kw
    monkeypatch.setattr(ewc, "SIMULATE_ACC_LEN", 2.5)
    assert not ewc._verify_needs_only_argmax(batch())


def test_a_target_that_post_processes_its_logits_keeps_the_full_gather(kimi):
    """Gemma-4 unified writes eoi/eoa by global id into its logits after the processor, which a vocab shard cannot
    take: neither EAGLE nor DFlash defers its gather there; DeepSeek-V3 / Kimi-K2.5 does."""
    from sglang.srt.layers.logits_processor import LogitsProcessor
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM
    from sglang.srt.models.gemma4_unified import Gemma4UnifiedForConditionalGeneration as Gemma4Unified
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
    from sglang.srt.speculative.eagle_worker_common import defer_target_verify_gather

    for cls, defers in ((Gemma4Unified, False), (DeepseekV3ForCausalLM, True)):
        model = cls.__new__(cls)  # the models' and the processor's weights and groups need GPUs: only the modules
        torch.nn.Module.__init__(model)
        model.logits_processor = LogitsProcessor.__new__(LogitsProcessor)
        torch.nn.Module.__init__(model.logits_processor)
        model.logits_processor.defer_verify_gather = False
        target = SimpleNamespace(model_runner=SimpleNamespace(model=model))
        assert (defer_target_verify_gather(target) is model.logits_processor) is defers, cls
        assert model.logits_processor.defer_verify_gather is defers
        model.logits_processor.defer_verify_gather = False
        dflash = bare(DFlashWorkerV2, _target_worker=target)
        assert (dflash._defer_target_verify_gather() is not None) is defers, cls


@pytest.mark.parametrize(
    "module, worker, draft",
    [
        ("standalone_worker_v2", "StandaloneWorkerV2", "StandaloneDraftWorker"),
        ("frozen_kv_mtp_worker_v2", "FrozenKVMTPWorkerV2", "FrozenKVMTPDraftWorker"),
    ],
)
def test_workers_without_the_deferral_verify(kimi, monkeypatch, module, worker, draft):
    """STANDALONE and Frozen-KV MTP inherit EAGLEWorkerV2.verify without its __init__: from their real __init__,
    verify() reaches run_eagle_verify undeferred."""
    import importlib

    from sglang.srt.speculative import eagle_worker_v2

    mod = importlib.import_module(f"sglang.srt.speculative.{module}")
    draft_worker = SimpleNamespace(
        draft_runner=SimpleNamespace(model_config=SimpleNamespace(vocab_size=163840)),
        draft_worker=SimpleNamespace(tokenizer=None),
        alloc_memory_pool=lambda **kw: None,
    )
    monkeypatch.setattr(mod, draft, lambda *a, **k: draft_worker)
    monkeypatch.setattr(mod, "get_device", lambda: SimpleNamespace(device="cpu"), raising=False)
    calls = []
    monkeypatch.setattr(eagle_worker_v2, "run_eagle_verify", lambda batch, **kw: calls.append(kw) or "verified")
    target = SimpleNamespace(
        model_runner=SimpleNamespace(model_config=SimpleNamespace(vocab_size=163840)),
        tokenizer=None,
        get_memory_pool=lambda: ("req_to_token", "kv_allocator"),
    )
    w = getattr(mod, worker)(server_args=None, gpu_id=0, nccl_port=0, target_worker=target)
    if worker == "StandaloneWorkerV2":
        w.alloc_memory_pool(req_to_token_pool="req_to_token", token_to_kv_pool_allocator="kv_allocator")
    assert w.verify(SimpleNamespace()) == "verified"
    assert calls[0]["target_logits_processor"] is None and calls[0]["req_to_token_pool"] == "req_to_token"


def test_kimi_tp8_cycle_has_no_nccl_call(tp):
    """Every collective site of the Kimi-K2.5 TP8 speculative cycle (the table the cost model reads), at the
    profile's widest batch, routed through the real code: all on PCIe IPC, for greedy and for sampling batches."""
    table = tomllib.loads(TABLE.read_text())
    totals = {}
    for stage, sites in table["stages"].items():
        for site in sites:
            if site.get("when", "always") not in ("always", "greedy", "sampling"):
                pytest.fail(f"{TABLE}: unknown 'when' {site['when']}")
            shape, dtype = site["shape"], getattr(torch, site["dtype"])

            def run(site=site, shape=shape, dtype=dtype):
                for _ in range(site["count"]):
                    if site["op"] == "all_reduce":
                        tp.all_reduce(rows(shape[0], dtype, shape[1]))
                    elif site["op"] == "all_gather":
                        gather(tp, shape[0], shape[1], dtype)
                    else:
                        tp.broadcast(torch.zeros(shape, dtype=dtype))

            got = recorded(stage, run)
            for op, backends in got["calls"].items():
                assert set(backends) == {"pcie_ipc"}, (stage, site, backends)
                key = (stage, op, site.get("when", "always"))
                totals[key] = totals.get(key, 0) + backends["pcie_ipc"]
    assert tp.pynccl_comm.calls == []
    for mode in ("greedy", "sampling"):
        for stage, counts in table["per_forward"][mode].items():
            got = {
                op: sum(v for (s, o, w), v in totals.items() if s == stage and o == op and w in ("always", mode))
                for op in counts
            }
            assert got == counts, (mode, stage)


# DFlash: the draft block's head (in its graph or eager), the verify's argmax and the accept, at every batch size


def test_the_dflash_cycle_has_no_nccl_call_at_any_captured_batch(kimi_dflash, tp8, monkeypatch):
    """Every collective of a Kimi-K2.5 TP8 DFlash step at every captured batch (8 to 384 rows), the real code with PCIe
    IPC prepared and timed fastest: reductions, the draft head's gather (graph and eager), the verify's shard argmax
    and logits gather, the accept's broadcasts, each packed in whole 16-byte rows as the PCIe-IPC all-gather needs."""
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import PcieIpcCommunicator
    from sglang.srt.layers import logits_processor as lp
    from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture
    from sglang.srt.speculative import dflash_worker_v2 as dw
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_tp_sync import SpecTpSync

    with published(kimi_dflash):
        max_rows = widest_decode_rows(kimi_dflash, spec=SpeculativeAlgorithm.DFLASH)
        pool = SimpleNamespace(req_to_token_pool=SimpleNamespace(size=48), server_args=kimi_dflash)
        capture_bs, _ = get_batch_sizes_to_capture(pool, BLOCK)
    assert max_rows == BLOCK * max(capture_bs) == BLOCK * 48
    monkeypatch.setattr(
        PcieIpcCommunicator,
        "_time_backends",
        lambda self, tp, hidden, rows, backends: [[1.0] + [10.0] * (len(backends) - 1) for _ in rows],
    )
    comm = tp8.pcie_ipc_comm = prepared(max_rows, gather_width=KIMI_VOCAB_SHARD, coordinator=tp8)
    for module in (dw, lp):
        monkeypatch.setattr(module, "get_parallel", lambda: SimpleNamespace(tp_group=tp8))
    processor = bare(lp.LogitsProcessor, vocab_size=163840, final_logit_softcapping=None)
    shard = SimpleNamespace(
        org_vocab_start_index=0,
        num_org_elements=256,
        num_org_elements_padded=256,
        num_added_elements=0,
        added_vocab_start_index=0,
    )
    head = SimpleNamespace(weight=torch.zeros(256, 64, dtype=torch.bfloat16), shard_indices=shard)
    sampler = dw._DflashDraftSampler(
        weight=head.weight, block_size=BLOCK, num_org=256, org_vocab_start=0, max_bs=max(capture_bs), tp_group=tp8
    )
    monkeypatch.setattr(dw, "is_dflash_sampling_verify_available", lambda: True)

    def correct_drafts_and_bonus(candidates, **kw):
        return torch.zeros(len(candidates), dtype=torch.int32), torch.zeros(len(candidates), dtype=torch.int64)

    monkeypatch.setattr(dw, "compute_dflash_sampling_correct_drafts_and_bonus", correct_drafts_and_bonus)
    worker = bare(
        dw.DFlashWorkerV2,
        _draft_greedy_local_max_buf=None,
        _draft_greedy_local_arg_buf=None,
        _draft_greedy_local_cap=0,
        _selector_sample=None,
        _tp_sync=SpecTpSync(tp8),
        block_size=BLOCK,
        _use_triton_accept_bonus=False,
    )
    sampled = dict(
        sampling_info=SimpleNamespace(is_all_greedy=False),
        draft_input=SimpleNamespace(max_top_k=None, uniform_top_k_value=None),
    )
    for bs in capture_bs:
        n = BLOCK * bs

        def step(n=n, bs=bs):
            tp8.all_reduce(rows(n))
            sampler(torch.zeros(n, 64, dtype=torch.bfloat16))
            hidden = torch.zeros(n - bs, 64, dtype=torch.bfloat16)
            worker._greedy_sample_from_vocab_parallel_head(hidden_states=hidden, lm_head=head)
            processor.deferred_argmax(torch.zeros(n, KIMI_VOCAB_SHARD, dtype=torch.bfloat16))
            gather(tp8, n, KIMI_VOCAB_SHARD)  # finish_deferred_gather's, as all_gather issues it on a GPU
            block = dict(candidates=torch.zeros(bs, BLOCK, dtype=torch.int64), prefix_lens=torch.zeros(bs), bs=bs)
            greedy = dict(sampling_info=None, draft_input=None, target_predict=torch.zeros(n, dtype=torch.int64))
            for accept in (greedy, sampled):
                worker._accept_block(**block, next_token_logits=None, **accept)

        calls = recorded("draft_block", step)["calls"]  # the eager head gathers per 256 rows
        assert {op: set(b) for op, b in calls.items()} == {op: {"pcie_ipc"} for op in calls} and len(calls) == 3, bs
        assert comm.backend_for(rows(n)) == "pcie_ipc", n
    assert tp8.pynccl_comm.calls == []


def test_the_dflash_heads_and_accept_keep_their_values_on_two_ranks():
    """The draft graph's head and the eager one give the full vocabulary's argmax on both ranks (a tie across shards
    to the lower id); the packed accept broadcast leaves rank 0's accept lengths and bonus tokens on both."""
    for r in _gloo.run("dflash_packing", timeout=400):
        assert r["sampler"] == r["reference"] == r["eager"] and r["reference"][0] == 3, r
        assert r["accept"] == {"accept_len": [2, 0, 7], "bonus": [2**40 + 5, 17, 250]}, r
