"""test-serve's instrumentation, an SGLang general plugin (entry point group sglang.srt.plugins), loaded in every
server process whose path has this directory (tests/gpu/serve/_servers.py puts it there). Each hook acts only where:

keep_moe_dispatch (the lent-GPU route, SGLANG_FORCE_FUSED_OP_BACKEND set): the route runs the fused ops on their
  torch reference; the unquantized fused MoE's copies expert counts to the host, which CUDA graph capture refuses,
  so that one op keeps its own dispatch (forward_cuda: SGLang's Triton fused MoE).
no dual GEMM (no nvidia-cutlass-dsl, as on the lent GPUs): SGLang's Llama MLP would import its SM100 CuTe-DSL dual
  GEMM module only to choose it, which below SM100 it never does: nothing is chosen.
sync_guard (EAGLE_SYNC_GUARD=FILE): every speculative decode cycle (EAGLEWorkerV2.forward_batch_generation) after
  the first SKIP of each kind of batch (a first call may compile or allocate) runs under
  torch.cuda.set_sync_debug_mode("warn") and appends {"cycle", "greedy", "syncs": [{"at", "when", "stack"}]} to
  FILE. A synchronisation "when" "cycle" (or "exit": left pending by it) counts; "entry" is raised by the guard's own
  switch to "warn" before the cycle's first line ran (once per run on the lent H200, torch 2.11): reported apart.
"""

import importlib.util
import json
import os
import traceback
import warnings

KEEP_DISPATCH = ("UnquantizedFusedMoEMethod",)
GUARDED = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation"
DUAL_GEMM = "sglang.srt.layers.dual_gemm.DualGemm._select_mode"
SKIP = 8
KIND = ("is_all_greedy", "need_top_p_sampling", "need_top_k_sampling", "need_min_p_sampling")
_cycles: dict = {}


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if os.environ.get("SGLANG_FORCE_FUSED_OP_BACKEND"):
        keep_moe_dispatch()
    if importlib.util.find_spec("cutlass") is None:
        HookRegistry.register(DUAL_GEMM, lambda original, *args, **kwargs: None, HookType.AROUND)
    if os.environ.get("EAGLE_SYNC_GUARD"):
        HookRegistry.register(GUARDED, sync_guard, HookType.AROUND)


def keep_moe_dispatch() -> None:
    from sglang.kernels.fused_op import BaseFusedOp

    forward = BaseFusedOp.forward
    if getattr(forward, "eagle_keeps_dispatch", False):
        return

    def keep_dispatch(self, *args, backend=None, **kwargs):
        if backend is None and type(self).__name__ in KEEP_DISPATCH:
            if self._forward_method is None:
                self._forward_method = self._resolve_forward_method()
            return self._forward_method(*args, **kwargs)
        return forward(self, *args, backend=backend, **kwargs)

    keep_dispatch.eagle_keeps_dispatch = True
    BaseFusedOp.forward = keep_dispatch


def sync_guard(original, self, batch, *args, **kwargs):
    mode, info = getattr(batch, "forward_mode", None), getattr(batch, "sampling_info", None)
    # seeded sampling is a path of its own (its first calls may load a kernel), as are the four flags
    kind = (*(getattr(info, k, None) for k in KIND), getattr(info, "sampling_seed", None) is not None)
    decode = mode is not None and mode.is_decode()
    if decode:
        _cycles[kind] = _cycles.get(kind, 0) + 1
    if not decode or _cycles[kind] <= SKIP:
        return original(self, batch, *args, **kwargs)
    import torch

    syncs, where = [], ["entry"]  # entry: raised by the guard's own switch, before the cycle's first line

    def seen(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            stack = [f"{f.filename}:{f.lineno} {f.name}" for f in traceback.extract_stack()[:-1]][-12:]
            syncs.append({"at": f"{filename}:{lineno}", "when": where[0], "stack": stack})

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = seen
        torch.cuda.set_sync_debug_mode("warn")
        where[0] = "cycle"
        try:
            return original(self, batch, *args, **kwargs)
        finally:
            where[0] = "exit"  # a warning the cycle's C++ code left pending surfaces here
            torch.cuda.set_sync_debug_mode(0)
            with open(os.environ["EAGLE_SYNC_GUARD"], "a") as f:
                f.write(json.dumps({"cycle": sum(_cycles.values()), "greedy": kind[0], "syncs": syncs}) + "\n")
