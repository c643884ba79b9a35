"""Collectives of the speculative cycle: counted per stage, and none of them on NCCL at decode sizes.

- Counting: distributed/collective_stats.py records what a forward issues inside a recorded pass (the graph
  backend records each graph's capture); GroupCoordinator notes each collective with the backend it took.
- Routing: decode-sized all-gathers (the logits' vocab shards, the greedy verify's per-shard argmax pairs) and
  broadcasts (the sampled verify's packed results) go to FlashInfer's PCIe-IPC all-gather where the PCIe-IPC
  communicator is built; wider ones keep NCCL. The real GroupCoordinator methods and the real PcieIpcCommunicator
  (prepared as BaseRunner prepares it for the shipped Kimi profile), with FlashInfer's two workspace classes and
  NCCL's communicator stood in (no GPUs here).
- The greedy verify: the real LogitsProcessor on two CPU ranks over gloo returns its vocab shard when the
  speculative worker defers the gather, and the argmax from the shards equals the argmax of the full logits.
- The Kimi-K2.5 TP8 table (bench/inputs/collectives_kimi_tp8.toml, which the cost model reads): every site of
  every stage, routed through the real code with the profile's workspaces, takes no NCCL call.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from _sgl import server_args

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from _harness import run_ranks  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "bench" / "inputs" / "collectives_kimi_tp8.toml"
HIDDEN = 7168
PROFILE_ROWS = 64  # the shipped profile's widest verify: 16 requests x 4 draft tokens
KIMI_VOCAB_SHARD = 163840 // 8


class Workspace:
    """Stands in for FlashInfer's PCIe-IPC all-reduce and all-gather workspaces (they need GPUs): sized with the
    max_numel SGLang asks for, admitting what FlashInfer admits by size (16-byte packs of the workspace dtype)."""

    def __init__(self, group=None, max_numel=0, dtype=torch.bfloat16, **kw):
        self.max_numel, self.dtype = max_numel, dtype

    def supports(self, t):
        return t.dtype is self.dtype and t.dim() == 2 and 0 < t.numel() <= self.max_numel

    def rebind_stream(self):
        pass

    def all_reduce(self, t):
        return t

    def all_gather(self, inp, out):
        return out


class Nccl:
    """NCCL's communicator (pynccl) stand-in: what reaches it is what would be an NCCL call."""

    disabled = False

    def __init__(self):
        self.calls = []

    def change_state(self, enable=True):
        import contextlib

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


@pytest.fixture
def tp8(monkeypatch):
    """A TP8 GroupCoordinator on one PCIe node: the real methods, the real PcieIpcCommunicator prepared for the
    profile (64 rows of hidden 7168 for the all-reduce, 64 rows of the 20480-wide Kimi vocab shard for the
    all-gather), NCCL's communicator stood in."""
    import flashinfer.comm as fi_comm

    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import PcieIpcCommunicator

    monkeypatch.setattr(fi_comm, "PcieIpcAllGatherWorkspace", Workspace, raising=False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: None)
    comm = PcieIpcCommunicator.__new__(PcieIpcCommunicator)
    vars(comm).update(disabled=False, max_numel=0, _workspace=None, _bound_stream=None, _cpu_group=None,
                      _max_rows=None, _group=None, _device=torch.device("meta"), _world_size=8,
                      _workspace_cls=Workspace, _build_failed=False, _tune=lambda hidden: None)
    comm.prepare(hidden=HIDDEN, max_rows=PROFILE_ROWS, gather_width=KIMI_VOCAB_SHARD)
    g = ps.GroupCoordinator.__new__(ps.GroupCoordinator)
    g.world_size, g.rank_in_group, g.unique_name = 8, 0, "tp:collectives-test"
    g.hpu_communicator = g.xpu_communicator = None
    g.ca_comm = g.qr_comm = g.pymscclpp_comm = g.torch_symm_mem_comm = None
    g.pynccl_comm = Nccl()
    g.device_group = g.cpu_group = None
    g.is_symmetric_memory_enabled = lambda: False
    g.debug_check_symmetric_mempool = lambda *a, **k: None
    g._fi_workspace_hint = None
    g.pcie_ipc_comm = comm
    monkeypatch.setitem(ps._groups, g.unique_name, lambda: g)
    # The registered ops' bodies: on meta tensors the op dispatch would run their fake implementations
    monkeypatch.setattr(ps, "outplace_all_reduce", lambda t, group_name, outplace_all_reduce_method:
                        ps._groups[group_name]()._all_reduce_out_place(t, outplace_all_reduce_method))
    monkeypatch.setattr(ps, "inplace_all_reduce",
                        lambda t, group_name: ps._groups[group_name]()._all_reduce_in_place(t))
    monkeypatch.setattr(ps, "reg_all_gather_into_tensor",
                        lambda out, inp, group_name: ps._groups[group_name]()._all_gather_into_tensor(out, inp))
    return g


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


def recorded(stage, run):
    from sglang.srt.distributed import collective_stats

    collective_stats.reset()
    with collective_stats.recording(stage):
        run()
    return collective_stats.snapshot()[stage]


def test_collectives_counted_by_op_and_backend(tp8):
    """One recorded forward: each collective is noted with the backend the real code picked."""
    def forward():
        tp8.all_reduce(meta(8, HIDDEN))  # a decode-sized reduction: PCIe IPC
        tp8.all_reduce(meta(2048, HIDDEN))  # prefill-sized: NCCL
        tp8.all_gather_into_tensor(meta(8 * 64, KIMI_VOCAB_SHARD), meta(64, KIMI_VOCAB_SHARD))
        tp8.broadcast(meta(12, dtype=torch.int32))

    got = recorded("target_verify", forward)
    assert got["calls"] == {"all_reduce": {"nccl": 1, "pcie_ipc": 1}, "all_gather": {"pcie_ipc": 1},
                            "broadcast": {"pcie_ipc": 1}}
    assert got["graphs"] == 1 and got["bytes"]["all_gather"] == 64 * KIMI_VOCAB_SHARD * 2
    assert tp8.pynccl_comm.calls == ["all_reduce"]


@pytest.mark.parametrize("rows, dtype, width, want", [
    (64, torch.bfloat16, KIMI_VOCAB_SHARD, "pcie_ipc"),  # the widest verify's logits shard
    (65, torch.bfloat16, KIMI_VOCAB_SHARD, "nccl"),  # wider: NCCL keeps it
    (64, torch.float32, 4, "pcie_ipc"),  # the greedy verify's (max, index, 0, 0) rows
    (1, torch.int32, 3, "nccl"),  # 12 bytes: not whole 16-byte packs
])
def test_decode_sized_all_gathers_take_pcie_ipc(tp8, rows, dtype, width, want):
    got = recorded("draft_decode", lambda: tp8.all_gather_into_tensor(meta(8 * rows, width, dtype=dtype),
                                                                   meta(rows, width, dtype=dtype)))
    assert got["calls"] == {"all_gather": {want: 1}}


def test_greedy_verify_argmax_from_shards_equals_the_full_argmax():
    """Two CPU ranks over gloo, the real LogitsProcessor and ParallelLMHead (vocab 250 padded to 256): the deferred
    shard, its full gather and its argmax equal the processor without deferral, a tie across shards included."""
    outcome = run_ranks("deferred_verify_logits", world=2, device="cpu", timeout=240, params={"vocab": 250})
    assert outcome.ok, outcome.explain()
    for x in outcome.results:
        assert x["shard"] == [6, 128] and x["full"] == [6, 250] and x["deferred_shard"]
        assert x["finish_equal"] and x["argmax"] == x["reference"] and x["reference"][0] == 3


def test_the_greedy_verify_needs_only_the_argmax_when_nothing_reads_the_logits():
    from sglang.srt.speculative.eagle_worker_common import _verify_needs_only_argmax

    def batch(**kw):
        info = dict(is_all_greedy=True, has_custom_logit_processor=False, acc_additive_penalties=None,
                    acc_scaling_penalties=None, logit_bias=None, penalizer_orchestrator=None,
                    has_watermark_candidates=False, sampling_mask_batch_indices=None)
        info.update({k: v for k, v in kw.items() if k in info})
        return SimpleNamespace(has_grammar=kw.get("has_grammar", False), return_logprob=kw.get("return_logprob",
                                                                                                False),
                               sampling_info=SimpleNamespace(**info))

    assert _verify_needs_only_argmax(batch())
    for kw in ({"is_all_greedy": False}, {"has_grammar": True}, {"return_logprob": True}, {"logit_bias": 1},
               {"acc_additive_penalties": 1}, {"has_watermark_candidates": True}):
        assert not _verify_needs_only_argmax(batch(**kw)), kw


def test_the_sampled_verify_broadcasts_once(tp8):
    """eagle_sample's three rank-0 broadcasts (predict, accept_index, num_correct_drafts) are one packed call."""
    from sglang.srt.speculative.eagle_utils import broadcast_packed

    t = [torch.arange(8, dtype=torch.int32), torch.arange(8, dtype=torch.int32).view(2, 4),
         torch.arange(2, dtype=torch.int32)]
    got = recorded("target_verify", lambda: broadcast_packed(tp8, [x.to("meta") for x in t]))
    assert got["calls"] == {"broadcast": {"pcie_ipc": 1}}


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
                        tp8.all_gather_into_tensor(meta(8 * shape[0], *shape[1:], dtype=dtype),
                                                   meta(*shape, dtype=dtype))
                    else:
                        tp8.broadcast(meta(*shape, dtype=dtype))

            got = recorded(stage, run)
            for op, backends in got["calls"].items():
                assert set(backends) == {"pcie_ipc"}, (stage, site, backends)
                totals[(stage, op, site.get("when", "always"))] = \
                    totals.get((stage, op, site.get("when", "always")), 0) + backends["pcie_ipc"]
    assert tp8.pynccl_comm.calls == []
    for mode in ("greedy", "sampling"):
        for stage, counts in table["per_forward"][mode].items():
            got = {op: sum(v for (s, o, w), v in totals.items() if s == stage and o == op and w in ("always", mode))
                   for op in counts}
            assert got == counts, (mode, stage)
