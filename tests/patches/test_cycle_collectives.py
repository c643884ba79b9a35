"""Collectives of the speculative cycle: counted per stage when asked, none on NCCL at decode sizes, and the greedy
verify that gathers each vocab shard's argmax.

- Counting: distributed/collective_stats.py records, with SGLANG_RECORD_SPEC_COLLECTIVES=1, what a forward issues
  inside a recorded pass; GroupCoordinator notes each collective with the backend it took.
- Routing (one process): the real GroupCoordinator methods and PcieIpcCommunicator, prepared as BaseRunner prepares
  it for the shipped Kimi profile, FlashInfer's two workspace classes and NCCL's communicator stood in.
- Two CPU ranks over gloo (_gloo.py): the all-gather's bytes and broadcast sources, and the deferred verify from
  EAGLEWorkerV2.verify through the real eagle_sample.
- The Kimi-K2.5 TP8 table (bench/inputs/collectives_kimi_tp8.toml, which the cost model reads): every site of every
  stage, routed through the real code with the profile's workspaces, takes no NCCL call.
"""

from __future__ import annotations

import contextlib
import logging
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import _gloo

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "bench" / "inputs" / "collectives_kimi_tp8.toml"
HIDDEN = 7168
PROFILE_ROWS = 64  # the shipped profile's widest verify: 16 requests x 4 draft tokens
KIMI_VOCAB_SHARD = 163840 // 8


class Workspace:
    """Stands in for FlashInfer's PCIe-IPC all-reduce and all-gather workspaces (they need GPUs): built with the
    max_numel SGLang asks for, admitting what FlashInfer admits by size (2-D, of the workspace dtype)."""

    built: list = []

    def __init__(self, group=None, max_numel=0, dtype=torch.bfloat16, **kw):
        self.max_numel, self.dtype, self.kw, self.tuned = max_numel, dtype, kw, []
        Workspace.built.append(self)

    def supports(self, t):
        return t.dtype is self.dtype and t.dim() == 2 and 0 < t.numel() <= self.max_numel

    def tune(self, hiddens, **kw):
        self.tuned.append(list(hiddens))
        return {(h, b): "config" for h in hiddens for b in self.kw.get("tune_batches", ())}

    def rebind_stream(self):
        pass

    def all_reduce(self, t):
        return t

    def all_gather(self, inp, out):
        return out

    def destroy(self):
        pass


class Nccl:
    """NCCL's communicator (pynccl) stand-in: what reaches it is what would be an NCCL call."""

    disabled = False

    def __init__(self):
        self.calls = []

    def change_state(self, enable=True):
        return contextlib.nullcontext()

    def all_gather(self, output, inp):
        self.calls.append("all_gather")

    def broadcast(self, t, src):
        self.calls.append("broadcast")

    def outplace_all_reduce(self, t):
        self.calls.append("all_reduce")
        return t

    def all_reduce(self, t):
        self.calls.append("all_reduce")


def pcie_ipc(world=8, max_rows=PROFILE_ROWS, gather_width=KIMI_VOCAB_SHARD):
    """The real PcieIpcCommunicator of a TP group on one PCIe node, prepared as BaseRunner prepares it."""
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import PcieIpcCommunicator

    comm = PcieIpcCommunicator.__new__(PcieIpcCommunicator)
    vars(comm).update(
        disabled=False,
        max_numel=0,
        _workspace=None,
        _bound_stream=None,
        _cpu_group=None,
        _max_rows=None,
        _group=None,
        _device=torch.device("meta"),
        _world_size=world,
        _workspace_cls=Workspace,
        _build_failed=False,
        _tune=lambda hidden: None,
    )
    comm.prepare(hidden=HIDDEN, max_rows=max_rows, gather_width=gather_width)
    return comm


@pytest.fixture
def no_gpu(monkeypatch):
    import flashinfer.comm as fi_comm

    monkeypatch.setattr(fi_comm, "PcieIpcAllGatherWorkspace", Workspace, raising=False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    Workspace.built = []


@pytest.fixture
def tp8(monkeypatch, no_gpu):
    """A TP8 GroupCoordinator on one PCIe node: the real methods, the real PcieIpcCommunicator prepared for the
    profile (64 rows of hidden 7168 for the all-reduce, 64 rows of the 20480-wide Kimi vocab shard for the
    all-gather), NCCL's communicator stood in."""
    from sglang.srt.distributed import parallel_state as ps

    g = ps.GroupCoordinator.__new__(ps.GroupCoordinator)
    g.world_size, g.rank_in_group, g.unique_name = 8, 0, "tp:collectives-test"
    g.hpu_communicator = g.xpu_communicator = None
    g.ca_comm = g.qr_comm = g.pymscclpp_comm = g.torch_symm_mem_comm = None
    g.pynccl_comm = Nccl()
    g.device_group = g.cpu_group = None
    g.is_symmetric_memory_enabled = lambda: False
    g.debug_check_symmetric_mempool = lambda *a, **k: None
    g._fi_workspace_hint = None
    g.pcie_ipc_comm = pcie_ipc()
    monkeypatch.setitem(ps._groups, g.unique_name, lambda: g)
    # The registered ops' bodies: on meta tensors the op dispatch would run their fake implementations
    monkeypatch.setattr(
        ps,
        "outplace_all_reduce",
        lambda t, group_name, outplace_all_reduce_method: ps._groups[group_name]()._all_reduce_out_place(
            t, outplace_all_reduce_method
        ),
    )
    monkeypatch.setattr(
        ps, "inplace_all_reduce", lambda t, group_name: ps._groups[group_name]()._all_reduce_in_place(t)
    )
    monkeypatch.setattr(
        ps,
        "reg_all_gather_into_tensor",
        lambda out, inp, group_name: ps._groups[group_name]()._all_gather_into_tensor(out, inp),
    )
    monkeypatch.setenv("SGLANG_RECORD_SPEC_COLLECTIVES", "1")
    return g


def meta(*shape, dtype=torch.bfloat16):
    """A reduction's input: meta, so that GroupCoordinator takes its GPU path."""
    return torch.empty(shape, dtype=dtype, device="meta")


def gather(g, rows, width, dtype=torch.bfloat16):
    """An all-gather of real (CPU) tensors: the PCIe-IPC route checks where they lie."""
    g.all_gather_into_tensor(torch.empty((8 * rows, width), dtype=dtype), torch.zeros((rows, width), dtype=dtype))


def recorded(stage, run):
    from sglang.srt.distributed import collective_stats

    collective_stats.reset()
    with collective_stats.recording(stage):
        run()
    return collective_stats.snapshot().get(stage)


def test_collectives_counted_by_op_and_backend(tp8):
    """One recorded forward: each collective is noted with the backend the real code picked."""

    def forward():
        tp8.all_reduce(meta(8, HIDDEN))  # a decode-sized reduction: PCIe IPC
        tp8.all_reduce(meta(2048, HIDDEN))  # prefill-sized: NCCL
        gather(tp8, 64, KIMI_VOCAB_SHARD)
        tp8.broadcast(torch.zeros(12, dtype=torch.int32))

    got = recorded("target_verify", forward)
    assert got["calls"] == {
        "all_reduce": {"nccl": 1, "pcie_ipc": 1},
        "all_gather": {"pcie_ipc": 1},
        "broadcast": {"pcie_ipc": 1},
    }
    assert got["graphs"] == 1 and got["bytes"]["all_gather"] == 64 * KIMI_VOCAB_SHARD * 2
    assert tp8.pynccl_comm.calls == ["all_reduce"]


def test_collectives_recorded_only_when_asked(tp8, monkeypatch):
    """Without SGLANG_RECORD_SPEC_COLLECTIVES=1 nothing is recorded and /server_info has no spec_collectives."""
    from sglang.srt.managers.scheduler_components.internal_state import SchedulerInternalStateController
    from sglang.srt.model_executor.runner.spec_graph_stats import SpecGraphStats
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    scheduler = SimpleNamespace(
        spec_algorithm=SpeculativeAlgorithm.EAGLE3,
        draft_worker=None,
        metrics_reporter=SimpleNamespace(spec_total_num_accept_tokens=3, spec_total_num_forward_ct=1),
        tp_worker=SimpleNamespace(model_runner=SimpleNamespace(spec_graph_stats=SpecGraphStats())),
    )
    for value, listed in (("1", True), ("0", False)):
        monkeypatch.setenv("SGLANG_RECORD_SPEC_COLLECTIVES", value)
        got = recorded("target_verify", lambda: tp8.all_reduce(meta(8, HIDDEN)))
        assert (got is not None) is listed
        state = {}
        SchedulerInternalStateController(scheduler, record_step_time=False)._add_speculative(state)
        assert ("spec_collectives" in state) is listed and "spec_cuda_graph" in state


@pytest.mark.parametrize(
    "rows, dtype, width, want",
    [
        (64, torch.bfloat16, KIMI_VOCAB_SHARD, "pcie_ipc"),  # the widest verify's logits shard
        (65, torch.bfloat16, KIMI_VOCAB_SHARD, "nccl"),  # wider: NCCL keeps it
        (64, torch.float32, 4, "pcie_ipc"),  # the greedy verify's (max, index, 0, 0) rows
        (1, torch.int32, 3, "nccl"),  # 12 bytes: not whole 16-byte packs
    ],
)
def test_decode_sized_all_gathers_take_pcie_ipc(tp8, rows, dtype, width, want):
    got = recorded("draft_decode", lambda: gather(tp8, rows, width, dtype))
    assert got["calls"] == {"all_gather": {want: 1}}


def test_an_in_place_all_gather_falls_back_to_nccl(tp8):
    """FlashInfer refuses an output that overlaps the input; NCCL gathers in place. The same gather out of place
    takes PCIe IPC."""
    out = torch.empty((8 * 64, 4), dtype=torch.float32)
    got = recorded(
        "target_verify",
        lambda: (tp8.all_gather_into_tensor(out, torch.zeros((64, 4))), tp8.all_gather_into_tensor(out, out[:64])),
    )
    assert got["calls"] == {"all_gather": {"pcie_ipc": 1, "nccl": 1}}


def test_the_all_gather_is_tuned_with_the_all_reduce_and_says_when_it_is_not_built(no_gpu, caplog):
    """prepare() tunes the all-gather for the rows it serves (the logits shard, and one 16-byte pack per row); with
    CUDA graphs off (no captured rows) it builds no all-gather and says so once."""
    comm = pcie_ipc()
    gather_ws = comm._gather_workspace
    assert gather_ws.tuned == [[KIMI_VOCAB_SHARD, 8]] and gather_ws.kw["tune_batches"] == (1, 2, 4, 8, 16, 32, 64)
    with caplog.at_level(logging.INFO):
        assert pcie_ipc(max_rows=None)._gather_workspace is None
    assert [r.getMessage() for r in caplog.records if "all-gather not built" in r.getMessage()] == [
        "FlashInfer PCIe-IPC all-gather not built: no captured decode graphs to size it (CUDA graphs off); "
        "all-gathers and broadcasts stay on NCCL."
    ]


@pytest.mark.parametrize("world", [2, 4, 8])
def test_the_all_gather_memory_vote_sizes_the_layouts_of_its_world(monkeypatch, world):
    """A rank without the memory for the all-gather votes no at every world size. FlashInfer's size function (JIT
    code, stood in by its argument check and arithmetic) refuses the copy-engine layout below 8 ranks."""
    from flashinfer.comm.pcie_ipc_collectives import _ag_rs_module

    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import PcieIpcCommunicator

    def size(world_size, max_numel, elem, blocks, copy_engine):
        if copy_engine and world_size != 8:
            raise RuntimeError("CopyEngine storage requires world_size 8")
        return max_numel * elem * (2 if copy_engine else 1)

    monkeypatch.setattr(
        _ag_rs_module, "get_pcie_ipc_ag_rs_module", lambda: SimpleNamespace(all_gather_workspace_size=size)
    )
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (0, 96 << 30))
    comm = PcieIpcCommunicator.__new__(PcieIpcCommunicator)
    vars(comm).update(_world_size=world, _device=torch.device("meta"))
    ok, why = comm._can_allocate(64 * KIMI_VOCAB_SHARD, gather=True)
    assert not ok and f"{64 * KIMI_VOCAB_SHARD * 2 * (2 if world == 8 else 1)} needed" in why


def test_pcie_ipc_all_gather_bytes_and_broadcast_sources_on_two_ranks():
    """Two CPU ranks: int32, fp32 (NaN, -0.0, inf), bf16 and uint8 gathers bit-exact and rank-major; broadcast from
    rank 0 and from rank 1; the sampled verify's three tensors in one packed broadcast; all on PCIe IPC (7 calls),
    and an in-place gather correct on the group's own gather."""
    for r in _gloo.run("gather_semantics", timeout=400):
        assert r.pop("pcie_ipc_calls") == 7 and r.pop("in_place_on_pcie_ipc") is False
        assert all(r.values()), r


def test_the_greedy_verify_from_shards_through_eagle_worker_verify():
    """Two CPU ranks, EAGLEWorkerV2.verify to eagle_sample (vocab 250, padded to 256): the greedy batch takes the
    argmax from the shards (eagle_sample reads no logits), the logit-bias batch the full gather; both give the
    target's tokens of the undeferred logits on both ranks, a tie across shards to the lowest id."""
    for r in _gloo.run("verify_wiring", timeout=400, vocab=250):
        assert r["deferred"] and r["reference"][0] == 3 and r["reference"][1] == 248
        assert r["greedy"] == {"tokens": r["reference"], "logits": None}
        assert r["logit_bias"] == {"tokens": r["reference"], "logits": [12, 250]}


def test_the_greedy_verify_needs_only_the_argmax_when_nothing_reads_the_logits(monkeypatch):
    from sglang.srt.speculative import eagle_worker_common as ewc

    def batch(**kw):
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
        info.update({k: v for k, v in kw.items() if k in info})
        return SimpleNamespace(
            has_grammar=kw.get("has_grammar", False),
            return_logprob=kw.get("return_logprob", False),
            sampling_info=None if kw.get("no_info") else SimpleNamespace(**info),
        )

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


def _target(model):
    return SimpleNamespace(model_runner=SimpleNamespace(model=model))


@pytest.fixture
def kimi():
    """Kimi-K2.5 + EAGLE-3 at TP8 on a faked SM120, published as the scheduler publishes it."""
    from sglang.srt import runtime_context as rc

    from _sgl import server_args

    with rc.use_context(rc.create_context(server_args(12), role="scheduler")):
        yield


def test_a_target_that_post_processes_its_logits_keeps_the_full_gather(kimi):
    """Gemma-4 unified fills eoi/eoa by global id into next_token_logits after its logits processor: the verify must
    not hand it a vocab shard (the id is out of range of a shard, or the wrong token in it), so neither EAGLE nor
    DFlash defers its gather. A target that does not (DeepSeek-V3 / Kimi-K2.5) defers."""
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
        assert (defer_target_verify_gather(_target(model)) is model.logits_processor) is defers, cls
        assert model.logits_processor.defer_verify_gather is defers
        model.logits_processor.defer_verify_gather = False
        dflash = DFlashWorkerV2.__new__(DFlashWorkerV2)
        dflash._target_worker = _target(model)
        assert (dflash._defer_target_verify_gather() is not None) is defers, cls


@pytest.mark.parametrize(
    "module, worker, draft",
    [
        ("standalone_worker_v2", "StandaloneWorkerV2", "StandaloneDraftWorker"),
        ("frozen_kv_mtp_worker_v2", "FrozenKVMTPWorkerV2", "FrozenKVMTPDraftWorker"),
    ],
)
def test_workers_without_the_deferral_verify(kimi, monkeypatch, module, worker, draft):
    """STANDALONE and Frozen-KV MTP build their own state instead of calling EAGLEWorkerV2.__init__ and inherit its
    verify(): their real __init__ (the draft worker and the GPU streams stood in), then verify() reaches
    run_eagle_verify, undeferred."""
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


def test_kimi_tp8_cycle_has_no_nccl_call(tp8):
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
                        tp8.all_reduce(meta(*shape, dtype=dtype))
                    elif site["op"] == "all_gather":
                        gather(tp8, shape[0], shape[1], dtype)
                    else:
                        tp8.broadcast(torch.zeros(shape, dtype=dtype))

            got = recorded(stage, run)
            for op, backends in got["calls"].items():
                assert set(backends) == {"pcie_ipc"}, (stage, site, backends)
                key = (stage, op, site.get("when", "always"))
                totals[key] = totals.get(key, 0) + backends["pcie_ipc"]
    assert tp8.pynccl_comm.calls == []
    for mode in ("greedy", "sampling"):
        for stage, counts in table["per_forward"][mode].items():
            got = {
                op: sum(v for (s, o, w), v in totals.items() if s == stage and o == op and w in ("always", mode))
                for op in counts
            }
            assert got == counts, (mode, stage)
