"""Stand-in for sgl-kernel, for machines that cannot install the real one: imports succeed, ops raise.

SGLang's argument resolution and distributed bring-up import modules that import `sgl_kernel` (quantization,
KV-cache helpers), although the collectives the GPU tier tests never call an sgl-kernel op. The real sgl-kernel
wheel is built for one torch (2.14 for SGLang 0.5.23) and is too large to carry to a lent GPU machine with another
torch; the CI machine has no GPU build of it at all. This package makes every `sgl_kernel` and `sgl_kernel.*` import
succeed; every attribute is a placeholder that raises when it is called, named by what was asked for, so a test
that reaches a kernel fails loudly instead of passing on a fake. The serving image has the real sgl-kernel and
never puts this directory on sys.path (tests/gpu/_harness.py adds it only when `import sgl_kernel` fails; the
lent-GPU route of `make test-serve`, scripts/host/serve_plan.py, names it).

Not placeholders, for the tiny servers of `make test-serve` (scripts/host/serve_plan.py LENT):
  utils.is_arch_support_pdl() is False: SGLang's triton attention asks it at start; the stand-in vouches for no
    programmatic-dependent-launch path (the real sgl-kernel says True from SM90 on; the e2e probe ran with False)
  moe_align_block_size, moe_sum_reduce: the DeepSeek-shaped server reaches them in its MoE layers, and SGLang
    itself ships kernels of the same contract, which they call (nothing is re-implemented here):
    moe_align_block_size -> sglang.kernels.ops.moe.moe_align.moe_align_block_size (SGLang's JIT CUDA kernel)
    moe_sum_reduce       -> sglang.kernels.ops.moe.fused_moe_triton_kernels.moe_sum_reduce_triton (its Triton one)
A placeholder is falsy (`op or fallback` takes the fallback).
With EAGLE_STANDIN_LOG=FILE, every call of an op appends "<pid> <delegated|answered|missing> <name>" to FILE, so
a run can say which stand-in ops it used.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types

STANDIN = True
__version__ = "0.0.0+standin"
LOG_VAR = "EAGLE_STANDIN_LOG"
DELEGATES = {"moe_align_block_size": "sglang.kernels.ops.moe.moe_align:moe_align_block_size",
             "moe_sum_reduce": "sglang.kernels.ops.moe.fused_moe_triton_kernels:moe_sum_reduce_triton"}


def _log(kind: str, name: str) -> None:
    path = os.environ.get(LOG_VAR)
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {kind} {name}\n")


def _target(name: str):
    module, _, attr = DELEGATES[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def moe_align_block_size(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids, num_tokens_post_pad,
                         cumsum_buffer, pad_sorted_token_ids=False, ignore_invalid_expert=False):
    """sgl_kernel's "+1 offset" bucket alignment, by SGLang's JIT kernel of the same contract."""
    _log("delegated", "moe_align_block_size")
    if ignore_invalid_expert:
        raise NotImplementedError("sgl_kernel.moe_align_block_size(ignore_invalid_expert=True) has no SGLang "
                                  "kernel to stand in for it (tests/gpu/standin); run with the real sgl-kernel")
    _target("moe_align_block_size")(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
                                    num_tokens_post_pad, cumsum_buffer, pad_sorted_token_ids)


def moe_sum_reduce(input, output, routed_scaling_factor=1.0):
    """output = routed_scaling_factor * input.sum(dim=1), by SGLang's Triton kernel of the same contract."""
    _log("delegated", "moe_sum_reduce")
    _target("moe_sum_reduce")(input, output, float(routed_scaling_factor))


def is_arch_support_pdl() -> bool:
    _log("answered", "utils.is_arch_support_pdl")
    return False


_OPS = {"moe_align_block_size": moe_align_block_size, "moe_sum_reduce": moe_sum_reduce,
        "is_arch_support_pdl": is_arch_support_pdl}


class _Missing:
    """A stand-in for an sgl-kernel symbol: fine to import and pass around, an error to call."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        _log("missing", self._name)
        raise NotImplementedError(f"{self._name} is an sgl-kernel op and this is an import-only stand-in "
                                  "(tests/gpu/standin); run with the real sgl-kernel (the serving image has it)")

    def __getattr__(self, attr: str) -> "_Missing":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in {self._name}>"


class _Module(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _OPS.get(attr) or _Missing(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def __getattr__(attr: str):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _Missing(f"sgl_kernel.{attr}")


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.append(_Finder())
