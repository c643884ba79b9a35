"""The patched SGLang's own collectives, one rank's side, shared by make test-gpu (tests/gpu) and bench-comm's SGLang
rows so both exercise what the server runs: bring_up() (the model runner's own init_parallel_runtime), RouteLog
(which backend each TP all_reduce reached, at SGLang's dispatch methods), prepare_pcie_ipc() / prepare_fusion()
(BaseRunner's own workspace methods), fused_allreduce_rmsnorm() (SGLang's op), Timer (eager and CUDA-graph chains
captured in SGLang's graph_capture()). CUDA ranks, or CPU ranks over gloo where a test only needs the routing.
"""

import statistics
import time
from pathlib import Path
from types import SimpleNamespace

from ..lib.kimi import HIDDEN

EPS = 1e-6
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
KIMI_CONFIG = FIXTURES / "kimi-k25"  # config.json of Kimi-K2.5 (no weights)
# The shipped profile (kimi-k25-eagle3-tp8): EAGLE-3 chain drafting 3/1/4, decode graphs up to 16 x 4 rows.
PROFILE_SERVER_ARGS = dict(
    cuda_graph_max_bs_decode=16,
    max_running_requests=16,
    speculative_algorithm="EAGLE3",
    speculative_draft_model_path=str(FIXTURES / "kimi-k25-eagle3"),
    speculative_num_steps=3,
    speculative_eagle_topk=1,
    speculative_num_draft_tokens=4,
)


def bring_up(rank: int, world: int, port: int, *, device: str = "cuda", **server_args):
    """SGLang's distributed state for TP `world`, rank `rank`, as the model runner brings it up. Returns ServerArgs."""
    from sglang.srt.distributed.bootstrap import init_parallel_runtime
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    kw = dict(model_path=str(KIMI_CONFIG), tp_size=world, device=device, **PROFILE_SERVER_ARGS)
    kw.update(server_args)
    sa = ServerArgs(**kw)
    sa.resolve_once()
    publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=rank, gpu_id=rank))
    init_parallel_runtime(server_args=sa, device=device, dist_port=port)
    return sa


def tp_group():
    from sglang.srt.distributed import get_tp_group

    return get_tp_group()


class RouteLog:
    """Records which backend each TP all_reduce reached: SGLang's dispatch methods of GroupCoordinator, wrapped,
    and torch.distributed.all_reduce where all_reduce calls it directly (CPU tensors)."""

    def __init__(self):
        import torch.distributed as dist
        from sglang.srt.distributed.parallel_state import GroupCoordinator

        self.calls: list[str] = []
        self._depth = 0
        self._cls, self._dist = GroupCoordinator, dist
        self._saved = {
            n: getattr(GroupCoordinator, n)
            for n in ("_all_reduce_out_place", "_all_reduce_in_place", "_flashinfer_allreduce")
        }
        self._dist_all_reduce = dist.all_reduce
        log = self

        def out_place(group, input_, method):
            if method == "auto":
                method = f"auto:{group._resolve_outplace_all_reduce_method(input_)}"
            return log._through(group, method, log._saved["_all_reduce_out_place"], input_, method)

        def in_place(group, input_):
            pynccl = group.pynccl_comm
            backend = "pynccl" if pynccl is not None and not pynccl.disabled else "torch_distributed"
            return log._through(group, backend, log._saved["_all_reduce_in_place"], input_)

        def flashinfer(group, input_):
            return log._through(group, "flashinfer", log._saved["_flashinfer_allreduce"], input_)

        def dist_all_reduce(tensor, *args, **kwargs):
            group = kwargs.get("group")
            if log._depth == 0 and group is not None and group is getattr(tp_group(), "device_group", None):
                log.calls.append("torch_distributed")
            return log._dist_all_reduce(tensor, *args, **kwargs)

        GroupCoordinator._all_reduce_out_place = out_place
        GroupCoordinator._all_reduce_in_place = in_place
        GroupCoordinator._flashinfer_allreduce = flashinfer
        dist.all_reduce = dist_all_reduce

    def _through(self, group, backend: str, fn, *args):
        if group.unique_name.startswith("tp") and self._depth == 0:
            self.calls.append(backend)
        self._depth += 1
        try:
            return fn(group, *args)
        finally:
            self._depth -= 1

    def take(self) -> list[str]:
        calls, self.calls = self.calls, []
        return calls

    def close(self) -> None:
        for name, fn in self._saved.items():
            setattr(self._cls, name, fn)
        self._dist.all_reduce = self._dist_all_reduce


def widest_decode_rows(sa) -> int | None:
    """BaseRunner._widest_decode_rows for a speculative target runner with the server's request pool."""
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.runner.base_runner import BaseRunner
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    mr = ModelRunner.__new__(ModelRunner)
    algo = SpeculativeAlgorithm.NONE
    if sa.speculative_algorithm:
        algo = SpeculativeAlgorithm.from_string(sa.speculative_algorithm)
    vars(mr).update(
        spec_algorithm=algo,
        is_draft_worker=False,
        server_args=sa,
        req_to_token_pool=SimpleNamespace(size=sa.max_running_requests // get_parallel().attn_dp_size),
    )
    return BaseRunner._widest_decode_rows(SimpleNamespace(model_runner=mr))


def prepare_pcie_ipc(sa) -> dict:
    """The TP group's PCIe-IPC communicator prepared as BaseRunner._pre_initialize_pcie_ipc_workspace does."""
    comm = tp_group().pcie_ipc_comm
    if comm is None:
        return {"present": False}
    rows = widest_decode_rows(sa)
    t0 = time.perf_counter()
    comm.prepare(hidden=HIDDEN, max_rows=rows)
    return {
        "present": True,
        "disabled": comm.disabled,
        "max_rows": rows,
        "max_numel": comm.max_numel,
        "prepare_s": round(time.perf_counter() - t0, 2),
    }


def prepare_fusion(dtype) -> dict:
    """Both fusion workspaces, pre-initialized by BaseRunner._pre_initialize_flashinfer_allreduce_workspace."""
    from sglang.srt.layers import flashinfer_comm_fusion as fcf
    from sglang.srt.layers.layer_boundary import FUSE_ALLREDUCE_MAX_BATCH_SIZE
    from sglang.srt.model_executor.runner.base_runner import BaseRunner

    runner = SimpleNamespace(
        model_runner=SimpleNamespace(
            model_config=SimpleNamespace(hidden_size=HIDDEN), dtype=dtype, is_draft_worker=False
        )
    )
    t0 = time.perf_counter()
    BaseRunner._pre_initialize_flashinfer_allreduce_workspace(runner)
    manager = fcf._get_workspace_manager(True)
    return {
        "token_cap": FUSE_ALLREDUCE_MAX_BATCH_SIZE,
        "initialized": bool(manager.initialized),
        "backend": manager.backend,
        "max_token_num": manager.max_token_num,
        "unavailable": bool(fcf.is_flashinfer_allreduce_unavailable()),
        "seconds": round(time.perf_counter() - t0, 2),
    }


def fused_allreduce_rmsnorm(x, residual, weight, **kw):
    """SGLang's op (layers/flashinfer_comm_fusion.py), with the token cap the server passes."""
    from sglang.srt.layers.flashinfer_comm_fusion import flashinfer_allreduce_residual_rmsnorm
    from sglang.srt.layers.layer_boundary import FUSE_ALLREDUCE_MAX_BATCH_SIZE

    return flashinfer_allreduce_residual_rmsnorm(
        input_tensor=x,
        residual=residual,
        weight=weight,
        eps=EPS,
        max_token_num=max(x.shape[0], FUSE_ALLREDUCE_MAX_BATCH_SIZE),
        **kw,
    )


class Tensors:
    """Seeded inputs and fp32 references: every rank can rebuild every rank's input."""

    def __init__(self, rank: int, world: int, device):
        import torch

        self.torch, self.rank, self.world, self.device = torch, rank, world, device

    def randn(self, rows: int, cols: int = HIDDEN, *, seed: int, scale: float = 1.0, rank: int | None = None):
        torch = self.torch
        g = torch.Generator(device="cpu").manual_seed(seed * 1009 + (self.rank if rank is None else rank))
        return (torch.randn(rows, cols, generator=g) * scale).to(self.device, torch.bfloat16)

    def ref_sum(self, rows: int, *, seed: int, scale: float = 1.0):
        return sum(self.randn(rows, seed=seed, scale=scale, rank=r).float() for r in range(self.world))

    def rmsnorm_ref(self, h32, gamma):
        torch = self.torch
        return h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + EPS) * gamma.float()

    @staticmethod
    def errors(out, ref) -> dict:
        o = out.float()
        diff = (o - ref).abs()
        scale = ref.abs().max().item() or 1.0
        return {
            "max_abs_err": float(diff.max().item()),
            "max_rel_err": float(diff.max().item() / scale),
            "nan": bool(o.isnan().any().item() or o.isinf().any().item()),
        }


class Timer:
    """Eager and graph-replayed chains; every rank lined up (barrier + sync) before each measured launch. in_sglang:
    SGLang's distributed state is up, so graphs are captured as the server captures them (False: raw NCCL ranks)."""

    def __init__(self, device: str, in_sglang: bool = True):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.cuda, self.in_sglang = torch, dist, device == "cuda", in_sglang

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def capture(self, fn):
        """fn() captured once in a CUDA graph after an eager warm-up: inside SGLang's graph_capture() when SGLang is
        up (as the server captures), else on torch's own capture stream."""
        torch = self.torch
        self.sync()
        self.dist.barrier()
        graph = torch.cuda.CUDAGraph()
        if self.in_sglang:
            from sglang.srt.distributed.parallel_state import graph_capture

            with graph_capture() as ctx:
                fn()
                ctx.stream.synchronize()
                with torch.cuda.graph(graph, stream=ctx.stream):
                    fn()
        else:
            fn()
            self.sync()
            self.dist.barrier()
            with torch.cuda.graph(graph):
                fn()
        self.sync()
        self.dist.barrier()
        return graph

    def median_us(self, launch, reps: int) -> float:
        """Median wall microseconds of launch() after one warm-up, all ranks lined up and synchronised around it."""
        launch()
        self.sync()
        times = []
        for _ in range(reps):
            self.dist.barrier()
            self.sync()
            t0 = time.perf_counter()
            launch()
            self.sync()
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)

    def graph_chain_us(self, fn, reps: int) -> float | None:
        return self.median_us(self.capture(fn).replay, reps) if self.cuda else None


def _routes(tp, pcie_ipc: bool, flashinfer: bool):
    """Switch the TP group's PCIe-IPC communicator and FlashInfer allreduce-only tag on or off (SGLang's own state;
    every rank switches alike). Returns a function that restores them."""
    comm, hint = tp.pcie_ipc_comm, tp._fi_workspace_hint
    disabled = comm.disabled if comm is not None else None
    if comm is not None:
        comm.disabled = disabled or not pcie_ipc
    if not flashinfer:
        tp._fi_workspace_hint = None

    def restore():
        if comm is not None:
            comm.disabled = disabled
        tp._fi_workspace_hint = hint

    return restore


def path_timings(r, rows, *, chain: int = 122, reps: int = 10) -> list[dict]:
    """Per-call time of SGLang's own paths in graph-replayed chains of `chain` (one verify forward's reductions),
    all measured in this one process so their ratios compare like with like:
      allreduce/<route>: tp.all_reduce with PCIe IPC on (as configured), then FlashInfer allreduce-only, then NCCL;
      fused: the fused all-reduce + residual + RMSNorm op; unfused/<route>: tp.all_reduce + FlashInfer's fused
      add-RMSNorm, over the default route and over NCCL."""
    import torch
    from flashinfer.norm import fused_add_rmsnorm

    tp, timer, log = tp_group(), Timer(r.device), RouteLog()
    t = Tensors(r.rank, r.world, torch.device("cuda", torch.cuda.current_device()))
    gamma = (t.randn(1, seed=9, rank=0, scale=0.5)[0] + 1.0).contiguous()
    out = []
    try:
        for n in rows:
            xs = [t.randn(n, seed=n * 1000 + i) for i in range(chain)]
            for label, pcie_ipc, fi in (("default", True, True), ("flashinfer", False, True), ("nccl", False, False)):
                restore = _routes(tp, pcie_ipc, fi)
                try:
                    us = timer.graph_chain_us(lambda xs=xs: [tp.all_reduce(x) for x in xs], reps)
                    routed = sorted(set(log.take()))
                finally:
                    restore()
                row = {"kind": "allreduce", "path": label, "rows": n, "chain": chain}
                out.append(row | {"backend": routed, "us_per_call": us / chain})
            res = t.randn(n, seed=n + 7, rank=0)
            us = timer.graph_chain_us(lambda xs=xs, res=res: [fused_allreduce_rmsnorm(x, res, gamma) for x in xs], reps)
            log.take()
            out.append({"kind": "fused", "path": "fused_op", "rows": n, "chain": chain, "us_per_call": us / chain})
            for label, pcie_ipc, fi in (("default", True, True), ("nccl", False, False)):
                restore = _routes(tp, pcie_ipc, fi)
                resids = [res.clone() for _ in range(chain)]
                try:

                    def unfused(xs=xs, resids=resids):
                        for x, rr in zip(xs, resids, strict=True):
                            fused_add_rmsnorm(tp.all_reduce(x), rr, gamma, EPS)

                    us = timer.graph_chain_us(unfused, reps)
                    routed = sorted(set(log.take()))
                finally:
                    restore()
                row = {"kind": "fused", "path": f"unfused/{label}", "rows": n, "chain": chain}
                out.append(row | {"backend": routed, "us_per_call": us / chain})
    finally:
        log.close()
    return out
