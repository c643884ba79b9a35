"""The lent-GPU route with one kernel per fused op, an SGLang general plugin (bench/device/kernels.py puts this
directory on the servers' PYTHONPATH for its "jit" variants, with SGLANG_FORCE_FUSED_OP_BACKEND unset).

sgl-kernel cannot load on the lent machines (built for another torch), so test-serve's route runs every fused op on
its torch reference (a norm is ~10 kernels there). Unforced, SGLang's CUDA dispatch already takes its own JIT and
Triton kernels for the rope, the router, the activation and the MoE; only RMSNorm calls sgl-kernel (rmsnorm,
fused_add_rmsnorm, layers/layernorm.py). With EAGLE_JIT_NORM=1 this plugin answers those two names with SGLang's own
JIT kernels of the same contract (sglang.kernels.ops.layernorm.norm), one kernel per call as on the box; a hidden
size they do not take falls back to the torch reference.
"""

import functools
import logging
import os


def install() -> None:
    if os.environ.get("EAGLE_JIT_NORM") != "1":
        return
    import torch

    from sglang.kernels.ops.layernorm import norm
    from sglang.srt.layers import layernorm

    @functools.lru_cache(maxsize=None)
    def warn_once(hidden: int, why: str) -> None:
        logging.getLogger(__name__).warning("eagle_kernels_plugin: rmsnorm(%d) on its torch reference: %s", hidden, why)

    def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
        out = torch.empty_like(input) if out is None else out
        try:
            norm.rmsnorm(input, weight, out, eps)
        except RuntimeError as e:  # a hidden size the JIT kernel does not take (it checks before launching)
            warn_once(input.shape[-1], str(e))
            x = input.float()
            out.copy_((x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(input.dtype) * weight)
        return out

    def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
        if norm.is_supported_jit_fused_add_rmsnorm_hidden_size(input.shape[-1]):
            norm.fused_add_rmsnorm(input, residual, weight, eps)
        else:
            residual.add_(input)
            rmsnorm(residual, weight, eps, out=input)

    layernorm.rmsnorm, layernorm.fused_add_rmsnorm = rmsnorm, fused_add_rmsnorm
