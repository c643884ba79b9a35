"""What each rank runs in the GPU tier: scenarios of a Rank (_harness.py) returning JSON dicts. Each brings SGLang up
as the model runner does (sglang_comm.bring_up), then drives SGLang's own code; inputs are seeded per rank, so each
rank computes the fp32 reference of every reduction itself."""

import logging.handlers
import os
import tempfile
import time
from pathlib import Path

import torch

from scripts.comm import sglang_comm as sc
from scripts.lib.kimi import HIDDEN
from scripts.series.pin import applied_patchset

# Bring-up for most scenarios: the fusion on (trtllm, which the SM12X patch admits), PCIe IPC forced on (an NVLink
# host's topology gate would leave it off), autotune off (minutes per process), SGLang's custom all-reduce off (on an
# NVLink host it would take PCIe IPC's reductions; the PCIe-only box disables it beyond 2 GPUs anyway).
DEFAULT_SA = dict(
    flashinfer_allreduce_fusion_backend="trtllm", disable_flashinfer_autotune=True, disable_custom_all_reduce=True
)
RACE_ROWS, TIMING_ROWS = (4, 16, 64), (1, 4, 8, 16, 32, 64)  # the battery's PDL race stress and per-call timings


def _up(r, *, pcie_ipc: bool = True, **server_args):
    if pcie_ipc:
        os.environ["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] = "1"
    return sc.bring_up(r.rank, r.world, r.port, device=r.device, **{**DEFAULT_SA, **server_args})


def _device(r):
    return torch.device("cuda", torch.cuda.current_device()) if r.device == "cuda" else torch.device("cpu")


def _allreduces(r, rows) -> list[dict]:
    """One tp.all_reduce per row count: the backend it reached and its error against the fp32 sum."""
    tp, log, t = sc.tp_group(), sc.RouteLog(), sc.Tensors(r.rank, r.world, _device(r))
    calls = []
    for n in rows:
        y = tp.all_reduce(t.randn(n, seed=n))
        calls.append({"rows": n, "backend": log.take(), **t.errors(y, t.ref_sum(n, seed=n))})
    log.close()
    return calls


def _tune_dir(unwritable: bool) -> None:
    """FLASHINFER_AUTOTUNE_DIR: a fresh directory, or one under a regular file (unwritable, for root too)."""
    path = tempfile.mkdtemp(prefix="tune-")
    if unwritable:
        blocker = os.path.join(path, "not-a-dir")
        open(blocker, "w").close()
        path = os.path.join(blocker, "tune")
    os.environ["FLASHINFER_AUTOTUNE_DIR"] = path


# ------------------------------------------------------------------------------------------ harness (CPU and GPU)
def routing_only(r, rows=(1, 8), **server_args):
    """Bring-up and plain TP all-reduces; on CPU ranks over gloo (SGLang's CPU engine), NCCL-free."""
    sa = sc.bring_up(r.rank, r.world, r.port, device=r.device, **server_args)
    tp, calls = sc.tp_group(), _allreduces(r, rows)
    from sglang.srt.runtime_context import get_exec

    published = get_exec().comm.flashinfer_allreduce_fusion_backend
    group = {"tp_size": tp.world_size, "rank_in_group": tp.rank_in_group, "device": sa.device, "pid": os.getpid()}
    return {**group, "calls": calls, "fusion_backend_published": published}


def fail_on(r, bad_rank: int):
    if r.rank == bad_rank:
        raise RuntimeError(f"injected failure on rank {bad_rank}")
    return {"rank": r.rank}


def hang_on(r, stuck_rank: int):
    while r.rank == stuck_rank:
        time.sleep(1)
    return {"rank": r.rank}


# ------------------------------------------------------------------------------------------ GPU: the battery
def _routing(r, rows, prefill_rows) -> list[dict]:
    """tp.all_reduce eager and replayed from a graph captured inside graph_capture(), fresh inputs each way."""
    tp, log, t, timer = sc.tp_group(), sc.RouteLog(), sc.Tensors(r.rank, r.world, _device(r)), sc.Timer(r.device)
    out = []
    try:
        for n in list(rows) + list(prefill_rows):
            y = tp.all_reduce(t.randn(n, seed=n))
            out.append({"rows": n, "mode": "eager", "backend": log.take(), **t.errors(y, t.ref_sum(n, seed=n))})
            static, held = t.randn(n, seed=n), {}
            graph = timer.capture(lambda held=held, static=static: held.__setitem__("y", tp.all_reduce(static)))
            routed = log.take()
            static.copy_(t.randn(n, seed=n + 50000))
            graph.replay()
            timer.sync()
            err = t.errors(held["y"], t.ref_sum(n, seed=n + 50000))
            out.append({"rows": n, "mode": "graph", "backend": routed[-1:], **err})
            del graph
    finally:
        log.close()
    return out


def _fused(r, rows) -> list[dict]:
    """SGLang's fused op vs an fp32 reference and vs tp.all_reduce + fused add-RMSNorm; eager and graph-replayed."""
    from flashinfer.norm import fused_add_rmsnorm

    t, timer, tp = sc.Tensors(r.rank, r.world, _device(r)), sc.Timer(r.device), sc.tp_group()
    gamma = (t.randn(1, seed=7, rank=0, scale=0.5)[0] + 1.0).contiguous()
    out = []
    for n in rows:
        x, res = t.randn(n, seed=n), t.randn(n, seed=n + 1, rank=0)
        ref_res = t.ref_sum(n, seed=n) + res.float()
        ref_norm = t.rmsnorm_ref(ref_res, gamma)
        norm, res_out = sc.fused_allreduce_rmsnorm(x.clone(), res.clone(), gamma)
        rec = {"rows": n, "declined": norm is None}
        if norm is not None:
            rec["fused"] = {"norm": t.errors(norm, ref_norm), "residual": t.errors(res_out, ref_res)}
        y, res2 = tp.all_reduce(x.clone()), res.clone()
        fused_add_rmsnorm(y, res2, gamma, sc.EPS)
        rec["unfused"] = {"norm": t.errors(y, ref_norm), "residual": t.errors(res2, ref_res)}
        if norm is not None:
            sx, sres, held = x.clone(), res.clone(), {}
            graph = timer.capture(
                lambda held=held, sx=sx, sres=sres: held.__setitem__("o", sc.fused_allreduce_rmsnorm(sx, sres, gamma))
            )
            sx.copy_(t.randn(n, seed=n + 60000))
            sres.copy_(t.randn(n, seed=n + 60001, rank=0))
            graph.replay()
            timer.sync()
            ref2 = t.ref_sum(n, seed=n + 60000) + sres.float()
            rec["fused_graph"] = {
                "norm": t.errors(held["o"][0], t.rmsnorm_ref(ref2, gamma)),
                "residual": t.errors(held["o"][1], ref2),
            }
            del graph
        out.append(rec)
        torch.cuda.synchronize()
    return out


def _fusion_sizes(world: int, dtype) -> dict:
    """The fusion workspace's cuMem allocation sizes as FlashInfer built them, and as SGLang's preflight probes them."""
    from sglang.srt.layers import flashinfer_comm_fusion as fcf
    from sglang.srt.layers.layer_boundary import FUSE_ALLREDUCE_MAX_BATCH_SIZE

    manager = fcf._get_workspace_manager(True)
    handles = getattr(manager.workspace, "mem_handles", None) or [] if manager.workspace is not None else []
    drv = fcf.get_cuda_driver_bindings()
    prop = fcf._make_flashinfer_workspace_allocation_prop(drv)
    return {
        "allocated": [getattr(h, "allocation_size", None) for h in handles],
        "preflight_sizes": fcf._flashinfer_trtllm_workspace_allocation_sizes(
            drv, prop, world, FUSE_ALLREDUCE_MAX_BATCH_SIZE, HIDDEN, dtype
        ),
    }


def _versions() -> dict:
    """What ran: GPU names, driver, torch, NCCL, FlashInfer, the patch set of the sglang imported."""
    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": [], "driver": None, "nccl": None}
    if torch.cuda.is_available():
        out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        try:
            import pynvml

            pynvml.nvmlInit()
            out["driver"] = pynvml.nvmlSystemGetDriverVersion()
            out["driver"] = out["driver"].decode() if isinstance(out["driver"], bytes) else out["driver"]
            pynvml.nvmlShutdown()
        except Exception as e:  # noqa: BLE001 - a version is a fact to report, not a reason to fail
            out["driver"] = f"unknown ({type(e).__name__})"
    import flashinfer  # the battery's fused op has run: it is there
    import sglang

    out["flashinfer"] = flashinfer.__version__
    out["sglang"] = str(Path(sglang.__file__).parent)
    out["patchset"] = applied_patchset(Path(sglang.__file__).parent)
    prefixes = ("NCCL_", "SGLANG_ENABLE_PCIE", "SGLANG_SM120", "CUDA_VISIBLE")
    out["env"] = {k: v for k, v in os.environ.items() if k.startswith(prefixes)}
    return out


def _pdl_race(r, rows, *, chain: int = 16, trials: int = 20) -> list[dict]:
    """Graph-replayed chains of the fused op (each residual feeding the next, as between layers), each call's norm
    read at once by a PDL-launched rmsnorm; the op's default and trigger_completion_at_end=False (a control)."""
    from flashinfer.norm import rmsnorm

    t, timer = sc.Tensors(r.rank, r.world, _device(r)), sc.Timer(r.device)
    gamma = (t.randn(1, seed=8, rank=0, scale=0.5)[0] + 1.0).contiguous()
    out = []
    for n in rows:
        for label, kw in (("default", {}), ("trigger_at_end_false", {"trigger_completion_at_end": False})):
            xs = [t.randn(n, seed=900 + i, scale=0.05) for i in range(chain)]
            res0 = t.randn(n, seed=899, rank=0)
            outs, resid = [None] * chain, [None] * chain

            def run(kw=kw, xs=xs, res0=res0, outs=outs, resid=resid):
                h = res0
                for i in range(chain):
                    norm, h = sc.fused_allreduce_rmsnorm(xs[i], h, gamma, **kw)
                    resid[i] = h
                    outs[i] = rmsnorm(norm, gamma, sc.EPS, enable_pdl=True)

            graph = timer.capture(run)
            bad, worst = 0, 0.0
            for trial in range(trials):
                seed = 10000 * (trial + 1)
                for i, x in enumerate(xs):
                    x.copy_(t.randn(n, seed=seed + i, scale=0.05))
                res0.copy_(t.randn(n, seed=seed - 1, rank=0))
                ref_res, refs = res0.float(), []
                for i in range(chain):
                    ref_res = (ref_res + t.ref_sum(n, seed=seed + i, scale=0.05)).to(torch.bfloat16).float()
                    refs.append(t.rmsnorm_ref(t.rmsnorm_ref(ref_res, gamma).to(torch.bfloat16).float(), gamma))
                for o in outs:
                    o.fill_(float("nan"))
                timer.sync()
                timer.dist.barrier()
                graph.replay()
                timer.sync()
                errs = [t.errors(resid[-1], ref_res)] + [t.errors(o, ref) for o, ref in zip(outs, refs)]
                worst = max([worst] + [e["max_abs_err"] for e in errs])
                bad += int(any(e["nan"] or e["max_abs_err"] > 1.0 for e in errs))
            del graph
            stats = {"chain": chain, "trials": trials, "bad_trials": bad, "worst_abs_err": worst}
            out.append({"rows": n, "variant": label, **stats})
    return out


def battery(r, rows, prefill_rows, fused_rows):
    """One bring-up, then: routing + correctness, fused op, PDL race stress, per-call timings."""
    sa = _up(r)
    result = {"pcie_ipc": sc.prepare_pcie_ipc(sa), "fusion": sc.prepare_fusion(torch.bfloat16)}
    result["fusion"].update(_fusion_sizes(r.world, torch.bfloat16))
    result["routing"] = _routing(r, rows, prefill_rows)
    result["fused"] = _fused(r, fused_rows)
    result["pdl_race"] = _pdl_race(r, RACE_ROWS)
    result["timings"] = sc.path_timings(r, TIMING_ROWS)
    result["versions"] = _versions()
    return result


# ------------------------------------------------------------------------------------------ decisions
def decisions(r, setting: str | None = None):
    """The PCIe-IPC all-reduce's start-up decision, SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=`setting` at prepare() (None:
    unset, so timed, or read from an earlier start's cache), then one all-reduce per decided size."""
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import allreduce_backends

    captured = logging.handlers.BufferingHandler(capacity=1 << 20)
    logger = logging.getLogger("sglang.srt.distributed.device_communicators.pcie_ipc_ar")
    logger.addHandler(captured)
    logger.setLevel(logging.INFO)
    if setting == "0":
        os.environ["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] = "0"
    sa = _up(r, pcie_ipc=setting != "0")
    if setting is None:
        del os.environ["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"]
    tp, t0 = sc.tp_group(), time.perf_counter()
    if tp.pcie_ipc_comm is not None:
        tp.pcie_ipc_comm.prepare(hidden=sc.HIDDEN, max_rows=sc.widest_decode_rows(sa), coordinator=tp)
    report = allreduce_backends()
    out = {"prepare_s": round(time.perf_counter() - t0, 3), "report": report}
    out["calls"] = _allreduces(r, [size["rows"] for size in report["sizes"]])
    out["log"] = [f"{x.name}: {x.getMessage()}" for x in captured.buffer]
    return out


# ------------------------------------------------------------------------------------------ faults
def _after_fault(r) -> dict:
    """An 8-row and a 64-row all-reduce after the fault: which backend every rank used, and whether it was right."""
    comm = sc.tp_group().pcie_ipc_comm
    return {"calls": _allreduces(r, (8, 64)), "pcie_ipc_disabled": None if comm is None else comm.disabled}


def _fused_declined(r) -> bool:
    """One 8-row call of the fused op after the fault: whether it declined."""
    t = sc.Tensors(r.rank, r.world, _device(r))
    gamma = torch.ones(sc.HIDDEN, dtype=torch.bfloat16, device=_device(r))
    norm, _ = sc.fused_allreduce_rmsnorm(t.randn(8, seed=8), t.randn(8, seed=9, rank=0), gamma)
    return norm is None


def _hog_memory(leave_bytes: int) -> list:
    """Take the device's free memory down to `leave_bytes`: the realistic single-rank failure of a workspace build."""
    free, _ = torch.cuda.mem_get_info()
    return [torch.empty(max(free - leave_bytes, 0), dtype=torch.uint8, device="cuda")]


def fault_pcie_ipc_oom(r, bad_rank: int):
    """One rank keeps half of what the PCIe-IPC workspace needs free (a fixed margin would leave it enough) while
    the workspace is built."""
    from flashinfer.comm.pcie_ipc_ar import AR_MAX_BLOCKS, get_pcie_ipc_comm_module

    sa = _up(r)
    need = get_pcie_ipc_comm_module().workspace_size(r.world, sc.HIDDEN * sc.widest_decode_rows(sa), 2, AR_MAX_BLOCKS)
    hog = _hog_memory(need // 2) if r.rank == bad_rank else []
    info = sc.prepare_pcie_ipc(sa)
    del hog
    torch.cuda.empty_cache()
    return {"prepare": {**info, "workspace_bytes": need}, **_after_fault(r)}


def fault_pcie_ipc_bind(r, bad_rank: int):
    """One rank fails inside FlashInfer's workspace construction (binding its IPC buffers)."""
    import flashinfer.comm.pcie_ipc_ar as fi_ar

    if r.rank == bad_rank:
        real = fi_ar.get_pcie_ipc_comm_module

        class Failing:
            def __init__(self, module):
                self._m = module

            def __getattr__(self, name):
                return getattr(self._m, name)

            def init(self, *a, **k):
                raise RuntimeError(f"injected IPC bind failure on rank {bad_rank}")

        fi_ar.get_pcie_ipc_comm_module = lambda: Failing(real())
    sa = _up(r)
    return {"prepare": sc.prepare_pcie_ipc(sa), **_after_fault(r)}


def fault_pcie_ipc_tune(r, bad_rank: int):
    """Every tactic FlashInfer's PCIe-IPC autotuner profiles fails on one rank."""
    import flashinfer.comm.pcie_ipc_ar as fi_ar

    if r.rank == bad_rank:
        real_forward = fi_ar.PcieIpcAllReduceRunner.forward

        def forward(self, *a, **k):
            tactic = k.get("tactic", a[1] if len(a) > 1 else -1)
            if tactic not in (-1, None):
                raise RuntimeError(f"injected tactic failure on rank {bad_rank}")
            return real_forward(self, *a, **k)

        fi_ar.PcieIpcAllReduceRunner.forward = forward
    sa = _up(r, disable_flashinfer_autotune=False, cuda_graph_max_bs_decode=1, max_running_requests=1)
    return {"prepare": sc.prepare_pcie_ipc(sa), **_after_fault(r)}


def fault_pcie_ipc_tune_dir(r, bad_rank: int):
    """bad_rank cannot write the tune cache (pcie_ipc_tune_vote's fault, on GPUs): no rank may tune."""
    _tune_dir(unwritable=r.rank == bad_rank)
    sa = _up(r, disable_flashinfer_autotune=False, cuda_graph_max_bs_decode=1, max_running_requests=1)
    return {"prepare": sc.prepare_pcie_ipc(sa), **_after_fault(r)}


def fault_fusion_exchange(r, bad_rank: int):
    """bad_rank cannot import its peers' handles in the fusion preflight's exchange probe: every rank must skip."""
    from sglang.srt.layers import flashinfer_comm_fusion as fcf

    if r.rank == bad_rank:
        real = fcf.get_cuda_driver_bindings()

        class Failing:
            def __getattr__(self, name):
                return getattr(real, name)

            def cuMemImportFromShareableHandle(self, *a):
                return (real.CUresult.CUDA_ERROR_INVALID_VALUE, None)

        fcf.get_cuda_driver_bindings = lambda: Failing()
    _up(r, pcie_ipc=False)
    info = sc.prepare_fusion(torch.bfloat16)
    return {"fusion": info, "fused_declined": _fused_declined(r), **_after_fault(r)}


def fault_fusion_oom(r, bad_rank: int):
    """One rank cannot allocate the fusion workspace: SGLang's collective preflight must turn it off everywhere."""
    sa = _up(r, pcie_ipc=False)
    hog = _hog_memory(64 << 20) if r.rank == bad_rank else []
    info = sc.prepare_fusion(torch.bfloat16)
    del hog
    torch.cuda.empty_cache()
    backend = sa.flashinfer_allreduce_fusion_backend
    return {"fusion": info, "fused_declined": _fused_declined(r), "server_args_backend": backend, **_after_fault(r)}


def fault_nvml(r, bad_rank: int):
    """One rank's NVML claims NVLink between every pair: FlashInfer's joint topology probe must still agree."""
    if r.rank == bad_rank:
        import pynvml

        pynvml.nvmlDeviceGetP2PStatus = lambda a, b, index: pynvml.NVML_P2P_STATUS_OK
    sa = _up(r)
    return {"prepare": sc.prepare_pcie_ipc(sa), **_after_fault(r)}


# ------------------------------------------------------------------------------------------ CPU: the draft embedding
def eagle3_draft_embedding(r, replicate: bool):
    """The EAGLE-3 draft handed the target's embedding table (set_embed), built as DeepSeek-V2 builds it
    (get_embedding_tp_kwargs()), on CPU ranks: its lookup against a plain lookup of the full table."""
    from transformers import LlamaConfig

    if replicate:
        os.environ["SGLANG_ENABLE_EMBED_REPLICATION"] = "1"
    sc.bring_up(r.rank, r.world, r.port, device="cpu")
    from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding, get_embedding_tp_kwargs
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

    vocab, hidden = 512, 64
    full = torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(0))
    target = VocabParallelEmbedding(vocab, hidden, params_dtype=torch.float32, **get_embedding_tp_kwargs())
    target.weight_loader(target.weight, full)
    shape = dict(vocab_size=vocab, hidden_size=hidden, draft_vocab_size=vocab, target_hidden_size=hidden)
    layer = dict(intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    draft = LlamaForCausalLMEagle3(LlamaConfig(**shape, **layer, tie_word_embeddings=False))
    draft.set_embed(target.weight)
    ids = torch.tensor([0, 1, vocab // 2 - 1, vocab // 2, vocab - 1])
    got = draft.model.embed_tokens(ids)
    return {"max_abs_err": float((got - full[ids]).abs().max()), "table": list(target.weight.shape)}
