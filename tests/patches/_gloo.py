"""Scenarios on CPU ranks over gloo, one fresh process each: `run("gather_semantics", world=2)` is one dict per rank
from scenario(tp, rank, **params), run on SGLang's TP group brought up as the model runner does on the CPU engine.
Only what needs a GPU is stood in, each by the contract of the FlashInfer call it replaces."""

import dataclasses
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from _sgl import EAGLE3_CHAIN, KIMI_K25, bare
from scripts.box import ranks

STANDIN = Path(__file__).resolve().parents[1] / "gpu" / "standin"  # sgl_kernel to import: any op of it raises
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_NCCL_SO_PATH": "/nonexistent/libnccl.so.2"}


def run(scenario: str, world: int = 2, timeout: float = 240, autotune: bool = False, **params) -> list:
    """One dict per rank (scripts/box/ranks.py spawns and watches them); fails the test on an error or a hang."""
    got = ranks.run(_child, world, timeout, scenario, autotune, params, env=CPU_ENV)
    if not got.ok:
        pytest.fail(dataclasses.replace(got, name=scenario).explain() + f"\nthe ranks' results: {got.results}")
    return got.results


def _child(rank, world, port, phase, scenario, autotune, params):
    """SGLang's TP group on this rank as the model runner brings it up (CUDA probes answer idle), then the scenario."""
    os.environ.update(
        SGLANG_CPU_OMP_THREADS_BIND="|".join(str(i % (os.cpu_count() or 1)) for i in range(world)),
        FLASHINFER_AUTOTUNE_DIR=tempfile.mkdtemp(),
    )
    if importlib.util.find_spec("sgl_kernel") is None:
        sys.path.append(str(STANDIN))
    import torch

    from sglang.srt.distributed import get_tp_group
    from sglang.srt.distributed.bootstrap import init_parallel_runtime
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    sa = ServerArgs(
        model_path=str(KIMI_K25), tp_size=world, device="cpu", disable_flashinfer_autotune=not autotune, **EAGLE3_CHAIN
    )
    sa.resolve_once()
    publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=rank, gpu_id=rank))
    init_parallel_runtime(server_args=sa, device="cpu", dist_port=port)
    torch.cuda.is_current_stream_capturing = lambda: False
    torch.cuda.current_stream = lambda device=None: None
    torch.cuda.mem_get_info = lambda device=None: (80 << 30, 96 << 30)
    return globals()[scenario](get_tp_group(), rank, **params)


def _pcie_ipc(tp, workspace_cls=None):
    """SGLang's PcieIpcCommunicator on the real TP group, FlashInfer's all-reduce workspace stood in (_pcie.py)."""
    import torch

    from _pcie import Workspace, communicator

    tp.pcie_ipc_comm = communicator(
        tp.world_size,
        _cpu_group=tp.cpu_group,
        _group=tp.device_group,
        _device=torch.device("cpu"),
        _workspace_cls=workspace_cls or Workspace,
    )
    return tp.pcie_ipc_comm


def _gloo_gather(tp, calls=None):
    """FlashInfer's PcieIpcAllGatherWorkspace as a gloo gather under its contract (rank-major bf16 output that must not
    overlap the input); `calls` lists each gather's input shape. PCIe IPC prepared for 8 rows of 64."""
    import flashinfer.comm as fi_comm
    import torch
    import torch.distributed as dist

    from _pcie import Workspace

    class Gather(Workspace):
        def all_gather(self, inp, out):
            assert out.dtype is torch.bfloat16 and tuple(out.shape) == (inp.shape[0] * tp.world_size, inp.shape[1])
            if max(inp.data_ptr(), out.data_ptr()) < min(inp.data_ptr() + inp.nbytes, out.data_ptr() + out.nbytes):
                raise ValueError("input and output must not overlap or alias")
            if calls is not None:
                calls.append(tuple(inp.shape))
            dist.all_gather(list(out.chunk(tp.world_size)), inp, group=tp.device_group)

    fi_comm.PcieIpcAllGatherWorkspace = Gather
    _pcie_ipc(tp).prepare(hidden=64, max_rows=8, gather_width=64)


def gather_semantics(tp, rank):
    """All-gathers and broadcasts through the real GroupCoordinator and PcieIpcCommunicator (_gloo_gather)."""
    import torch

    from sglang.srt.speculative.spec_tp_sync import broadcast_packed

    world, calls = tp.world_size, []
    _gloo_gather(tp, calls)

    def data(r, dtype, n=32):  # each rank's own bit patterns; NaN, -0.0 and inf among the floats
        x = torch.arange(n, dtype=torch.float32) * (r + 1) - 7
        if dtype.is_floating_point:
            x[:3] = torch.tensor([float("nan"), -0.0, float("inf")])
        return x.to(dtype).view(4, n // 4) if dtype != torch.uint8 else (x.abs() * 3).to(torch.uint8).view(4, -1)

    result = {}
    for dtype in (torch.int32, torch.float32, torch.bfloat16, torch.uint8):
        out = torch.empty((4 * world, 8), dtype=dtype)
        tp.all_gather_into_tensor(out, data(rank, dtype))
        want = torch.cat([data(r, dtype) for r in range(world)])
        result[str(dtype)] = bool(torch.equal(out.view(torch.uint8), want.view(torch.uint8)))
    for src in range(world):
        x = data(rank, torch.int32)
        tp.broadcast(x, src=src)
        result[f"broadcast_src{src}"] = bool(torch.equal(x, data(src, torch.int32)))

    def verify_results(r):  # each rank's three tensors of the sampled verify: 13 values, padded to 16
        i32 = torch.int32
        return [
            torch.arange(6, dtype=i32) + r,
            torch.arange(4, dtype=i32).view(2, 2) * (r + 2),
            torch.full((3,), r, dtype=i32),
        ]

    parts, want = verify_results(rank), verify_results(0)
    broadcast_packed(tp, parts)
    result["packed"] = all(torch.equal(a, b) for a, b in zip(parts, want, strict=True))
    result["pcie_ipc_calls"] = len(calls)
    out = torch.empty((4 * world, 8), dtype=torch.int32)
    out[4 * rank : 4 * rank + 4] = data(rank, torch.int32)
    tp.all_gather_into_tensor(out, out[4 * rank : 4 * rank + 4])  # in place: FlashInfer refuses it
    result["in_place"] = bool(torch.equal(out, torch.cat([data(r, torch.int32) for r in range(world)])))
    result["in_place_on_pcie_ipc"] = len(calls) > result["pcie_ipc_calls"]
    return result


class _Stop(Exception):
    pass


def verify_wiring(tp, rank, vocab):
    """EAGLEWorkerV2.verify to eagle_sample, the target's real LogitsProcessor and ParallelLMHead (padded last shard)
    armed by defer_target_verify_gather: the greedy tokens of each batch kind. The model body is stood in."""
    import contextlib

    import torch

    from _graphs import greedy_sampling
    from sglang.srt.layers.logits_processor import LogitsMetadata, LogitsProcessor, LogitsProcessorOutput
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative import eagle_utils, eagle_worker_common as ewc
    from sglang.srt.speculative.eagle_worker_common import defer_target_verify_gather
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    hidden, bs, width = 32, 3, 4
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(vocab, hidden, generator=g)
    weight[vocab - 1] = weight[3]  # ids 3 (shard 0) and vocab-1 (the last shard) tie in row 0
    lm_head = ParallelLMHead(vocab, hidden, params_dtype=torch.float32)
    lm_head.weight_loader(lm_head.weight, weight)
    states = torch.randn(bs * width, hidden, generator=g)
    states[0] = weight[3] * 4
    states[1] = weight[vocab - 2] * 4  # a row whose maximum lies in the last shard
    config = SimpleNamespace(vocab_size=vocab, final_logit_softcapping=None)
    meta = LogitsMetadata(forward_mode=ForwardMode.TARGET_VERIFY)
    reference = LogitsProcessor(config)._get_logits(states, lm_head, meta).argmax(dim=-1).tolist()
    model = torch.nn.Module()
    model.logits_processor = LogitsProcessor(config)
    runner = SimpleNamespace(model=model, watermark_state=None, attn_backend=SimpleNamespace(verify_mask=None))
    outputs = []

    def forward(**kw):  # the target's verify forward: its logits processor on the given hidden states
        logits = model.logits_processor._get_logits(states, lm_head, meta)
        outputs.append(LogitsProcessorOutput(next_token_logits=logits, hidden_states=None))
        return SimpleNamespace(logits_output=outputs[-1])

    target = SimpleNamespace(model_runner=runner, forward_batch_generation=forward)
    seen = []

    def greedy(**kw):
        seen.append(kw["target_predict"].flatten().tolist())
        raise _Stop

    eagle_utils.verify_tree_greedy_func = greedy
    ewc.eagle_prepare_for_verify = lambda *a, **k: (None, False)
    ewc.record_stream_for_v2_verify = ewc.record_stream_each = lambda *a, **k: None
    worker = bare(
        EAGLEWorkerV2,
        _target_worker=target,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=None,
        plan_stream=None,
        plan_stream_ctx=contextlib.nullcontext(),
        topk=1,
        speculative_num_draft_tokens=width,
        device="cpu",
        _target_logits_processor=defer_target_verify_gather(target),
    )
    tree = torch.zeros(bs * width, dtype=torch.long)
    verify_input = SimpleNamespace(
        draft_token=tree,
        draft_token_num=width,
        max_tree_depth=width,
        tree_topk=1,
        retrieve_index=tree,
        retrieve_next_token=tree,
        retrieve_next_sibling=tree,
    )
    out = {"reference": reference, "deferred": worker._target_logits_processor is not None}
    for kind, bias in (("greedy", None), ("logit_bias", torch.zeros(bs, vocab))):
        batch = SimpleNamespace(
            device="cpu",
            forward_mode=ForwardMode.DECODE,
            seq_lens=torch.ones(bs),
            sampling_info=greedy_sampling(logit_bias=bias),
            has_grammar=False,
            return_logprob=False,
            spec_info=verify_input,
            input_ids=None,
            out_cache_loc=None,
        )
        try:
            worker.verify(batch)
        except _Stop:
            logits = outputs[-1].next_token_logits  # what eagle_sample read: None when it took the shards' argmax
            out[kind] = {"tokens": seen.pop(), "logits": None if logits is None else list(logits.shape)}
    return out


def tune_cache_save_fails(tp, rank):
    """FlashInfer's tune() stood in by its own ending (barrier, rank 0 saves the AutoTuner cache, barrier), the save
    failing for real on rank 0 (its path under a regular file): every rank must leave tune() and decide together."""
    import torch.distributed as dist
    from flashinfer.autotuner import AutoTuner

    from _pcie import Workspace

    blocker = Path(tempfile.mkdtemp(), "a-file")
    blocker.write_text("")
    broken = []

    class Tuned(Workspace):
        def tune(self, hiddens, tune_group=None, **kw):
            dist.barrier(group=self.group)
            if rank == 0:
                AutoTuner.get().save_configs(str(blocker / "tactics.json"))
            try:  # a peer that left tune() early breaks this barrier (or never arrives: a hang)
                dist.barrier(group=self.group)
            except Exception as e:
                broken.append(repr(e))
                raise
            return {(hiddens[0], 8): "config"}

    comm = _pcie_ipc(tp, Tuned)
    comm.prepare(hidden=64, max_rows=8)
    return {"disabled": comm.disabled, "barrier_broken": broken}


def _workspace_size():
    """FlashInfer's PCIe-IPC workspace size function (JIT, GPU only), stood in: 2 bytes x max_numel x 2 stages."""
    import flashinfer.comm.pcie_ipc_ar as fi_ar

    fi_ar.get_pcie_ipc_comm_module = lambda: SimpleNamespace(workspace_size=lambda world, n, elem, blocks: 2 * n * elem)


def pcie_ipc_vote(tp, rank, short_rank):
    import torch

    from _pcie import HIDDEN, Workspace

    _workspace_size()
    free = (1 << 20) if rank == short_rank else (80 << 30)
    torch.cuda.mem_get_info = lambda device=None: (free, 96 << 30)
    comm = _pcie_ipc(tp)
    comm._tune = lambda hidden: None
    comm.prepare(hidden=HIDDEN, max_rows=64)
    return {"disabled": comm.disabled, "built": [w.max_numel for w in Workspace.built]}


def pcie_ipc_tune_vote(tp, rank, bad_rank, fault):
    from _pcie import HIDDEN, Workspace
    from _ranks import _tune_dir

    calls = {"tune": 0, "destroy": 0}

    class Tuned(Workspace):
        def tune(self, hiddens, **kw):
            calls["tune"] += 1
            if fault == "raises" and rank == bad_rank:
                raise OSError(f"injected tune failure on rank {bad_rank}")
            return {(hiddens[0], 8): "config"}

        def destroy(self):
            calls["destroy"] += 1

    _workspace_size()
    _tune_dir(unwritable=fault == "unwritable" and rank == bad_rank)
    comm = _pcie_ipc(tp, Tuned)
    comm.prepare(hidden=HIDDEN, max_rows=64)
    return {"disabled": comm.disabled, **calls}


def _fusion_preflight(tp, driver, group) -> bool:
    """The fusion workspace preflight on `driver` (_fake_cuda.py), FlashInfer's real handle exchange over `group`
    (FlashInfer's TorchDistBackend: SGLang's _FixedTorchDistBackend, its subclass, exists only where FlashInfer has
    the device, which a CPU rank is not)."""
    import flashinfer.comm.mnnvl as mnnvl
    import torch

    from _pcie import HIDDEN
    from sglang.srt.layers import flashinfer_comm_fusion as fcf

    posix = mnnvl.cuda.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop = SimpleNamespace(location=SimpleNamespace(id=0), requestedHandleTypes=posix)
    fcf.get_cuda_driver_bindings = lambda: driver
    fcf._make_flashinfer_workspace_allocation_prop = lambda d: prop
    mnnvl.is_mnnvl_fabric_supported = lambda dev: False  # a PCIe-only GPU: POSIX file descriptors
    comm = mnnvl.TorchDistBackend(group=group)
    return fcf._preflight_check_workspace_memory(
        tp.world_size, 256, HIDDEN, torch.bfloat16, cpu_group=tp.cpu_group, comm_backend=comm
    )


def fusion_exchange_vote(tp, rank, bad_rank, fail):
    """bad_rank's driver failing the call `fail`; the exchange over the TP group's gloo group."""
    from _fake_cuda import FakeCudaDriver

    drv = FakeCudaDriver(fail if rank == bad_rank else None)
    proceed, count = _fusion_preflight(tp, drv, tp.cpu_group), drv.calls.count
    calls = {"imports": count("cuMemImportFromShareableHandle"), "creates": count("cuMemCreate")}
    return {"proceed": proceed, **calls, "releases": count("cuMemRelease")}


def fusion_exchange_fails_early(tp, rank, bad_rank):
    """The exchange over a group of its own (as the device group is), bad_rank unable to make the exchange's socket
    directory: a failure before the exchange's first collective."""
    import torch.distributed as dist

    from _fake_cuda import FakeCudaDriver

    side = dist.new_group(backend="gloo")
    if rank == bad_rank:
        tempfile.tempdir = "/nonexistent/tmp"
    return {"proceed": _fusion_preflight(tp, FakeCudaDriver(None), side)}


def allreduce_timing(tp, rank, cache_dir):
    """Four starts of the all-reduce timing, each a fresh communicator prepared as the model runner does, the box and
    _time_backends faked per rank: differ (each rank's times alone would route differently), cached (a second start),
    new_driver (another driver is another box), fails (rank 1 cannot time); first what /server_info says."""
    import pynvml
    import torch

    from _fake_nvml import BUS, FakeNvml
    from sglang.srt.distributed.device_communicators import pcie_ipc_ar
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import PcieIpcCommunicator

    before = pcie_ipc_ar.allreduce_backends()  # the real GroupCoordinator's, built on this 2-rank CPU group
    os.environ["FLASHINFER_AUTOTUNE_DIR"] = cache_dir
    patch = pytest.MonkeyPatch()
    FakeNvml(patch, count=tp.world_size)
    torch.cuda.get_device_properties = lambda device: SimpleNamespace(
        pci_domain_id=0, pci_bus_id=int(BUS[rank].split(":")[1], 16), pci_device_id=0
    )
    own = {0: {"pcie_ipc": [5, 5, 5, 28], "nccl": [30] * 4}, 1: {"pcie_ipc": [5, 5, 26, 5], "nccl": [3, 30, 30, 30]}}
    timed, step = [], None

    def measure(self, group, hidden, rows, backends):
        timed.append(rows)
        if step == "fails" and rank == 1:
            raise RuntimeError("cudaErrorStreamCaptureInvalidated")
        return [[own[rank][b][i] for b in backends] for i in range(len(rows))]

    PcieIpcCommunicator._time_backends = measure
    out = {"before": {k: before[k] for k in ("source", "why")}}
    drivers = {"differ": "580.95.05", "cached": "580.95.05", "new_driver": "590.44.01", "fails": "595.1"}
    for step, driver in drivers.items():
        patch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda driver=driver: driver)
        timed.clear()
        comm = _pcie_ipc(tp)
        comm.prepare(hidden=64, max_rows=8, coordinator=tp)
        out[step] = {
            "timed": len(timed),
            "disabled": comm.disabled,
            "source": pcie_ipc_ar.allreduce_backends()["source"],
            "table": [comm.backend_for(torch.empty(r, 64)) for r in (1, 2, 4, 8)],
        }
    return out


def dflash_packing(tp, rank):
    """DFlash's draft heads (graph: _DflashDraftSampler, and eager) over a vocab-parallel lm_head (vocab 250, shards of
    128; ids 3 and 130 tie) beside the full argmax; rank 0's accept lengths and bonus tokens after sync_packed."""
    import torch

    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2, _DflashDraftSampler
    from sglang.srt.speculative.spec_tp_sync import SpecTpSync, SpecTpSyncSite

    calls = []
    _gloo_gather(tp, calls)
    g = torch.Generator().manual_seed(7)
    full = torch.randn(250, 16, generator=g).to(torch.bfloat16)
    hidden = torch.randn(8, 16, generator=g).to(torch.bfloat16)
    full[130] = full[3] = 4 * hidden[1]  # block position 1: a tie between rank 0's id 3 and rank 1's 130
    start, end = 128 * rank, min(250, 128 * rank + 128)
    shard = torch.zeros(128, 16, dtype=torch.bfloat16)
    shard[: end - start] = full[start:end]
    sampler = _DflashDraftSampler(
        weight=shard, block_size=8, num_org=end - start, org_vocab_start=start, max_bs=1, tp_group=tp
    )
    sampler(hidden)
    worker = bare(
        DFlashWorkerV2, _draft_greedy_local_max_buf=None, _draft_greedy_local_arg_buf=None, _draft_greedy_local_cap=0
    )
    head = SimpleNamespace(
        weight=shard,
        shard_indices=SimpleNamespace(
            org_vocab_start_index=start,
            num_org_elements=end - start,
            num_org_elements_padded=128,
            num_added_elements=0,
            added_vocab_start_index=256,
        ),
    )
    eager = worker._greedy_sample_from_vocab_parallel_head(hidden_states=hidden[1:], lm_head=head)
    accept_len = torch.tensor([2, 0, 7], dtype=torch.int32) if rank == 0 else torch.zeros(3, dtype=torch.int32)
    bonus = torch.tensor([2**40 + 5, 17, 250]) if rank == 0 else torch.full((3,), -1)
    SpecTpSync(tp).sync_packed(SpecTpSyncSite.DFLASH_ACCEPT_SAMPLE, (accept_len, bonus))
    assert len(calls) == 3, calls  # the two heads' gathers and the broadcast, each one PCIe-IPC gather
    return {
        "reference": (hidden[1:] @ full.T).argmax(-1).tolist(),
        "sampler": sampler.out[:7].tolist(),
        "eager": eager.tolist(),
        "accept": {"accept_len": accept_len.tolist(), "bonus": bonus.tolist()},
    }
