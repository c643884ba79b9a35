"""The lent-GPU route's stand-ins (scripts/host/serve_plan.py LENT): only what cannot load is replaced, and what is
replaced cannot pass on a fake. Each test runs in its own interpreter, with the route's PYTHONPATH, so the
stand-ins never leak into the other tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scripts.host import serve_plan as plan

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

TREE = ROOT / "build" / "sglang" / "python"


def run(code: str, tmp_path, **env) -> str:
    path = os.pathsep.join([str(TREE), str(ROOT), *map(str, plan.LENT.paths)])
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT,
                        env={**os.environ, "PYTHONPATH": path, "EAGLE_STANDIN_LOG": str(tmp_path / "calls"), **env})
    assert cp.returncode == 0, cp.stderr[-3000:]
    return cp.stdout


def test_sglangs_importers_of_cutlass_and_flash_mla_import_and_a_call_raises(sglang_tree, tmp_path):
    out = run("""
import sglang.kernels.ops.gemm.cutedsl_dual_gemm as dual
import sglang.kernels.ops.attention.flash_mla_interface as fmi
import cutlass, flash_mla
assert cutlass.STANDIN and flash_mla.STANDIN
try:
    fmi.flash_mla.get_mla_metadata()
except NotImplementedError as e:
    print("raised:", e)
""", tmp_path)
    assert "raised: flash_mla.get_mla_metadata belongs to a package this machine lacks" in out
    assert (tmp_path / "calls").read_text().split()[1:] == ["missing", "flash_mla.get_mla_metadata"]


def test_sgl_kernel_stand_in_routes_two_ops_to_sglangs_own_kernels_and_raises_on_the_rest(sglang_tree, tmp_path):
    out = run("""
import sgl_kernel
from sgl_kernel import DELEGATES, _target
from sgl_kernel.utils import is_arch_support_pdl
import sglang.kernels.ops.moe.moe_align as align, sglang.kernels.ops.moe.fused_moe_triton_kernels as tk
assert _target("moe_align_block_size") is align.moe_align_block_size
assert _target("moe_sum_reduce") is tk.moe_sum_reduce_triton
from sgl_kernel import moe_sum_reduce, moe_align_block_size
assert is_arch_support_pdl() is False and not sgl_kernel.rmsnorm
try:
    sgl_kernel.fused_add_rmsnorm(1, 2)
except NotImplementedError as e:
    print("raised:", e)
try:
    moe_align_block_size(None, 17, 16, None, None, None, None, True, True)
except NotImplementedError as e:
    print("raised:", e)
""", tmp_path)
    assert "raised: sgl_kernel.fused_add_rmsnorm is an sgl-kernel op and this is an import-only stand-in" in out
    assert "moe_align_block_size(ignore_invalid_expert=True) has no SGLang kernel" in out
    calls = [ln.split()[1:] for ln in (tmp_path / "calls").read_text().splitlines()]
    assert calls == [["answered", "utils.is_arch_support_pdl"], ["missing", "sgl_kernel.fused_add_rmsnorm"],
                     ["delegated", "moe_align_block_size"]]


PLUGIN = """
import torch
from sglang.kernels.fused_op import BaseFusedOp
from sglang.kernels.spec import KernelBackend
from sglang.srt.plugins import load_plugins

class Op(BaseFusedOp):
    # normal dispatch picks the triton backend on any device (on the GPU the real MoE's is forward_cuda)
    capabilities = {KernelBackend.TRITON: frozenset()}
    def forward_native(self, x):
        return "native"
    def forward_triton(self, x):
        return "normal"

class UnquantizedFusedMoEMethod(Op):  # the name the plugin keeps; SGLang's own needs a GPU to run
    pass

class RMSNormLike(Op):
    pass

load_plugins()
print(UnquantizedFusedMoEMethod()(torch.zeros(1)), RMSNormLike()(torch.zeros(1)))
"""


def test_the_plugin_keeps_the_fused_moe_off_the_forced_torch_backend_and_nothing_else(sglang_tree, tmp_path):
    assert run(PLUGIN, tmp_path, SGLANG_FORCE_FUSED_OP_BACKEND="torch").split() == ["normal", "native"]
    assert run(PLUGIN, tmp_path, SGLANG_PLUGINS="none", SGLANG_FORCE_FUSED_OP_BACKEND="torch").split() == \
        ["native", "native"]  # without it, the forced torch backend takes the MoE too
    assert run(PLUGIN, tmp_path).split() == ["normal", "normal"]  # no forced backend: the plugin does nothing
