"""Per-rank measurement code for scripts/comm/bench_comm.py (one process per GPU, spawned by the parent).

Everything a rank measures is appended to a list of plain dicts; rank 0 writes them to a JSON file the parent
reads. Shapes are Kimi-K2.5 / DeepSeek-V3 at TP8 (scripts/lib/kimi.py): hidden 7168 bf16, and per-rank matmul
shapes of a TP8 layer, whatever the world size of the machine running it.
"""

import json
import math
import os
import statistics
import traceback
from pathlib import Path
from types import SimpleNamespace

from ..lib.kimi import ATTN_GEMMS, HIDDEN, MOE_GEMMS
from .sglang_comm import EPS, Tensors, Timer


def _log(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"[bench-comm] {msg}", flush=True)


class ResidualChain:
    """One residual buffer per reduction of a forward (the fused kernel writes the next residual out of place);
    `advance()` hands out the index of the residual in, `reset()` starts a forward again."""

    def __init__(self, x0, reductions: int):
        self.x0, self.bufs, self.i = x0, [x0.clone() for _ in range(reductions + 1)], 0

    def reset(self) -> None:
        self.i = 0
        self.bufs[0].copy_(self.x0)

    def advance(self) -> int:
        self.i += 1
        return self.i - 1


class RankSession:
    """One rank's measurements in one variant: FlashInfer kernels, the records it collects; inputs, references and
    timing from sglang_comm (Tensors, Timer), the same helpers the GPU tests use. sc, sa: scripts/comm/sglang_comm
    and the ServerArgs where SGLang was brought up (None: raw NCCL ranks)."""

    def __init__(self, rank: int, world: int, cfg: dict, sc=None, sa=None):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.rank, self.world, self.cfg = torch, dist, rank, world, cfg
        self.cpu, self.variant, self.sc, self.sa = cfg["device"] == "cpu", cfg["variant"], sc, sa
        self.dev = torch.device("cpu") if self.cpu else torch.device("cuda", rank)
        self.records: list[dict] = []
        self.t = Tensors(rank, world, self.dev)
        self.timer = Timer(cfg["device"], in_sglang=sc is not None)  # every rank lined up around each launch
        self.fi_norm, self.fi_reason = None, "cpu run" if self.cpu else "disabled (--no-flashinfer)"
        if not self.cpu and cfg.get("flashinfer"):
            try:
                from flashinfer.norm import fused_add_rmsnorm

                self.fi_norm, self.fi_reason = fused_add_rmsnorm, ""
            except Exception as e:  # noqa: BLE001 - not installed, or its JIT failed: torch's add-RMSNorm
                self.fi_reason = f"flashinfer unavailable: {type(e).__name__}: {e}"

    # ------------------------------------------------------------------ helpers
    def rec(self, **kw) -> None:
        kw.setdefault("variant", self.variant)
        kw.setdefault("world", self.world)
        self.records.append(kw)

    def measure(self, many, chain: int, **base) -> tuple[float, float | None]:
        """A chain eagerly and graph-replayed: a record each with `base`; returns both timings (us)."""
        eager = self.timer.median_us(many, self.cfg["reps"])
        graph = self.timer.graph_chain_us(many, self.cfg["reps"])
        self.rec(**base, chain=chain, mode="eager", us_per_call=eager / chain, us_chain=eager)
        if graph is not None:
            self.rec(**base, chain=chain, mode="graph", us_per_call=graph / chain, us_chain=graph)
        return eager, graph

    def add_rmsnorm(self, x, residual, gamma):
        """In place: residual += x; x = rmsnorm(residual) * gamma. FlashInfer's fused kernel where available."""
        if self.fi_norm is not None:
            self.fi_norm(x, residual, gamma, EPS)
            return
        torch = self.torch
        residual.add_(x)
        r = residual.float()
        x.copy_((r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + EPS) * gamma.float()).to(x.dtype))

    # ------------------------------------------------------------------ measurements
    def allreduce_sizes(self) -> None:
        """NCCL all-reduce per call at verify and prefill row counts, in a chain: eager and graph-replayed."""
        dist = self.dist
        for rows in self.cfg["rows"] + self.cfg["prefill_rows"]:
            chain = self.cfg["chain"] if rows <= 256 else 4
            x = self.t.randn(rows, seed=rows)
            out = x.clone()
            dist.all_reduce(out)
            err = self.t.errors(out, self.t.ref_sum(rows, seed=rows))
            bufs = [x.clone() for _ in range(chain)]

            def many(bufs=bufs):
                for b in bufs:
                    dist.all_reduce(b)

            eager, graph = self.measure(
                many, chain, kind="allreduce", impl="nccl", rows=rows, bytes=rows * HIDDEN * 2, **err
            )
            _log(
                self.rank,
                f"{self.variant}: nccl all-reduce {rows} rows: {eager / chain:.1f} eager, "
                f"{(graph or float('nan')) / chain:.1f} graph us per call",
            )

    def sglang_paths(self) -> None:
        """The patched SGLang's own paths, as the server runs them (scripts/comm/sglang_comm.py): the PCIe-IPC
        communicator and both fusion workspaces prepared by BaseRunner's methods; per row count, tp.all_reduce's
        route and result, the fused all-reduce + residual + RMSNorm op's result; per-call timings of those paths in
        graph-replayed chains (sglang_comm.path_timings)."""
        torch, sc, rows = self.torch, self.sc, self.cfg["rows"]
        self.rec(kind="workspace", impl="sglang_pcie_ipc", **sc.prepare_pcie_ipc(self.sa))
        self.rec(kind="workspace", impl="sglang_fused_op", **sc.prepare_fusion(torch.bfloat16))
        tp, log, t = sc.tp_group(), sc.RouteLog(), self.t
        gamma = (t.randn(1, seed=7, rank=0, scale=0.5)[0] + 1.0).contiguous()
        try:
            for n in rows:
                y = tp.all_reduce(t.randn(n, seed=n))
                self.rec(
                    kind="allreduce_check",
                    impl="sglang_tp",
                    rows=n,
                    backend=log.take(),
                    **t.errors(y, t.ref_sum(n, seed=n)),
                )
                x, res = t.randn(n, seed=n + 1), t.randn(n, seed=n + 2, rank=0)
                norm, res_out = sc.fused_allreduce_rmsnorm(x, res, gamma)
                if norm is None:
                    self.rec(kind="fused_check", impl="sglang_fused_op", rows=n, ok=False, declined=True)
                    continue
                ref_res = t.ref_sum(n, seed=n + 1) + res.float()
                e_res, e_norm = t.errors(res_out, ref_res), t.errors(norm, t.rmsnorm_ref(ref_res, gamma))
                self.rec(
                    kind="fused_check",
                    impl="sglang_fused_op",
                    rows=n,
                    trigger_at_end=True,
                    residual=e_res,
                    norm=e_norm,
                    ok=not (e_res["nan"] or e_norm["nan"]) and e_norm["max_abs_err"] < 0.25,
                )
        finally:
            log.close()
        me = SimpleNamespace(rank=self.rank, world=self.world, device="cuda")
        for r in sc.path_timings(me, rows, chain=self.cfg["chain"], reps=self.cfg["reps"]):
            path = r.pop("path").replace("/", "_")
            impl = f"sglang_{path}" if r["kind"] == "fused" else f"sglang_tp_{path}"
            self.rec(**r, impl=impl, mode="graph")
        _log(self.rank, f"SGLang paths timed at {rows} rows")

    def _weights(self) -> tuple[list, list, object]:
        """Per-rank TP8 GEMM weights of one layer (attention, MoE) and an RMSNorm gamma, fixed seeds."""
        torch = self.torch
        gen = torch.Generator(device="cpu").manual_seed(11)

        def w(k, n):
            return (torch.randn(k, n, generator=gen) / math.sqrt(k)).to(self.dev, torch.bfloat16)

        gamma = self.t.randn(1, seed=5, scale=0.1, rank=0)[0] + 1.0
        return [w(k, n) for k, n in ATTN_GEMMS], [w(k, n) for k, n in MOE_GEMMS], gamma

    def _reduce_norm(self, impl: str, resid: ResidualChain, gamma):
        """reduce_norm(y, tag): all-reduce this rank's partial sum y with `impl`, add the residual, RMSNorm; returns
        the normed hidden state and advances the residual chain."""
        dist = self.dist

        def reduce_norm(y, tag):
            i = resid.advance()
            if impl == "sglang_fused_op":
                norm, resid.bufs[i + 1] = self.sc.fused_allreduce_rmsnorm(y, resid.bufs[i], gamma)
                return norm
            if impl == "sglang_tp":
                y = self.sc.tp_group().all_reduce(y)
            else:
                dist.all_reduce(y)
            self.add_rmsnorm(y, resid.bufs[i], gamma)  # in place: resid[i] += y; y = norm(resid[i])
            resid.bufs[i + 1] = resid.bufs[i]
            return y

        return reduce_norm

    def _forward(self, x0, impl: str, gamma, weights):
        """forward(): the layers of one verify-shaped forward with all-reduce `impl`, from x0."""
        layers = self.cfg["layers"]
        attn_w, moe_w = weights
        h = x0.clone()
        resid = ResidualChain(x0, 2 * layers)
        reduce_norm = self._reduce_norm(impl, resid, gamma)

        def forward():
            resid.reset()
            hs = h
            hs.copy_(x0)
            for _ in range(layers):
                a = hs @ attn_w[0]
                a = a[:, :1536] @ attn_w[1]
                a = a[:, :1024] @ attn_w[2]
                hs = reduce_norm(a, "a")
                m = hs @ moe_w[0]
                m = m[:, :2304] @ moe_w[1]
                hs = reduce_norm(m, "m")
            return hs

        return forward

    def verify_forward(self, impls: list[str]) -> None:
        """61 layers x (attention GEMMs -> all-reduce -> add+RMSNorm -> MoE GEMMs -> all-reduce -> add+RMSNorm),
        per-rank TP8 shapes, eager vs CUDA-graph-replayed, for each all-reduce implementation."""
        layers = self.cfg["layers"]
        attn_w, moe_w, gamma = self._weights()
        for rows in self.cfg["rows"]:
            x0 = self.t.randn(rows, seed=4000 + rows, rank=0)
            outputs = {}
            for impl in impls:
                forward = self._forward(x0, impl, gamma, (attn_w, moe_w))
                out = forward()
                self.timer.sync()
                outputs[impl] = out.float().clone()
                eager = self.timer.median_us(forward, self.cfg["reps"])
                graph = self.timer.graph_chain_us(forward, self.cfg["reps"])
                self.rec(kind="verify_forward", impl=impl, rows=rows, layers=layers, mode="eager", us=eager)
                if graph is not None:
                    self.rec(kind="verify_forward", impl=impl, rows=rows, layers=layers, mode="graph", us=graph)
                _log(
                    self.rank,
                    f"{self.variant}: verify forward {impl} {rows} rows: eager {eager / 1e3:.2f} ms, "
                    f"graph {(graph or float('nan')) / 1e3:.2f} ms",
                )
            ref = outputs.get("nccl")
            for impl, out in outputs.items():
                if ref is not None and impl != "nccl":
                    self.rec(
                        kind="verify_forward_check", impl=impl, rows=rows, against="nccl", **self.t.errors(out, ref)
                    )


def p2p_bandwidth(size_mb: int = 256) -> list[dict]:
    """Peer copy bandwidth between every ordered pair of visible GPUs (GB/s), one process, events."""
    import torch

    n = torch.cuda.device_count()
    out = []
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            src = torch.empty(size_mb << 20, dtype=torch.uint8, device=f"cuda:{a}")
            dst = torch.empty_like(src, device=f"cuda:{b}")
            for _ in range(3):
                dst.copy_(src)
            torch.cuda.synchronize(a), torch.cuda.synchronize(b)
            times = []
            for _ in range(10):
                with torch.cuda.device(a):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    dst.copy_(src)
                    e.record()
                    e.synchronize()
                    times.append(s.elapsed_time(e) / 1e3)
            gbps, peer = src.numel() / statistics.median(times) / 1e9, torch.cuda.can_device_access_peer(a, b)
            out.append({"kind": "p2p_bw", "src": a, "dst": b, "bytes": src.numel(), "gbps": gbps, "peer_access": peer})
            del src, dst
    return out


def worker(rank: int, world: int, port: int, phase, cfg: dict) -> dict:
    """One rank of one variant (scripts/box/ranks.py runs it); rank 0 keeps the records in cfg["out"] after each
    step, so a step that fails leaves the ones before it."""
    import torch
    import torch.distributed as dist

    def keep(meta: dict) -> None:
        if rank == 0:
            Path(cfg["out"]).write_text(json.dumps({"meta": meta, "records": bench.records}))

    try:
        sc = sa = None
        if cfg["device"] != "cpu":
            torch.cuda.set_device(rank)
        phase("bring-up")
        if cfg.get("sglang"):
            # SGLang's distributed state, brought up as the model runner brings it up (it creates the default
            # NCCL group the raw rows use too); PCIe IPC on unless the caller's environment says otherwise
            from . import sglang_comm as sc

            os.environ.setdefault("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "1")
            sa = sc.bring_up(rank, world, port, **cfg["sglang"])
        else:  # the world group only, as SGLang's own benchmark_all_reduce brings it up
            from sglang.srt.distributed.parallel_state import init_distributed_environment

            backend = "gloo" if cfg["device"] == "cpu" else "nccl"
            init_distributed_environment(
                world_size=world,
                rank=rank,
                local_rank=rank,
                backend=backend,
                distributed_init_method=f"tcp://127.0.0.1:{port}",
            )
        bench = RankSession(rank, world, cfg, sc, sa)
        for step, run_step in (
            ("allreduce", bench.allreduce_sizes),
            ("sglang", bench.sglang_paths),
            ("verify", lambda: bench.verify_forward(cfg["verify_impls"])),
        ):
            if step in cfg["steps"]:
                phase(step)
                run_step()
                keep({})
        dist.barrier()
        # torch's build-time NCCL; the library it loaded is the parent's meta.nccl (bench_comm.nccl_axis)
        build = None if bench.cpu else ".".join(map(str, torch.cuda.nccl.version()))
        keep({"nccl_torch_build": build, "torch": torch.__version__, "flashinfer_reason": bench.fi_reason})
        return {}
    except Exception:
        print(f"[bench-comm] rank {rank} failed:\n{traceback.format_exc()}", flush=True)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
