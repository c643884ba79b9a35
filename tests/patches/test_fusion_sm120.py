"""FlashInfer all-reduce + residual + RMSNorm fusion on SM12X (patches flashinfer-*.patch).

Real SGLang code from the tree under test; only the GPU platform is faked (override_platform), plus a fake CUDA
driver object for the workspace preflight and a recording stand-in for FlashInfer's kernel call.
"""

from __future__ import annotations

import importlib
import inspect
import socket
from types import SimpleNamespace

import pytest
import torch

from _sgl import platform, resolved, server_args

unchanged = pytest.mark.unchanged


# --------------------------------------------------------------------------------------------- resolver
@pytest.fixture(scope="module")
def fcf():
    return importlib.import_module("sglang.srt.layers.flashinfer_comm_fusion")


@pytest.mark.parametrize("backend", ["auto", "trtllm"])
def test_fusion_sm120_resolves_to_trtllm_single_node(fcf, backend):
    with platform(12):
        assert fcf._resolve_backend(backend, is_multi_node=False) == "trtllm"


@pytest.mark.parametrize("backend,needle", [("mnnvl", "multicast"), ("cutedsl", "SM100")])
def test_fusion_sm120_rejects_mnnvl_and_cutedsl_with_a_reason(fcf, backend, needle):
    with platform(12), pytest.raises(ValueError) as e:
        fcf._resolve_backend(backend, is_multi_node=False)
    assert needle in str(e.value) and "--flashinfer-allreduce-fusion-backend=trtllm" in str(e.value)


@pytest.mark.parametrize("backend", ["auto", "trtllm", "mnnvl", "cutedsl"])
def test_fusion_sm120_rejects_multi_node(fcf, backend):
    with platform(12), pytest.raises(ValueError, match="single-node"):
        fcf._resolve_backend(backend, is_multi_node=True)


@unchanged
@pytest.mark.parametrize("major,backend,multi,want", [
    (10, "auto", False, "mnnvl"), (10, "auto", True, "mnnvl"), (10, "trtllm", False, "trtllm"),
    (10, "mnnvl", True, "mnnvl"), (10, "cutedsl", False, "cutedsl"),
    (9, "auto", False, "trtllm"), (9, "trtllm", False, "trtllm"), (9, "mnnvl", False, "mnnvl"),
])
def test_fusion_resolver_sm90_sm100_unchanged(fcf, major, backend, multi, want):
    with platform(major):
        assert fcf._resolve_backend(backend, is_multi_node=multi) == want


@unchanged
@pytest.mark.parametrize("major,backend,multi", [(9, "auto", True), (9, "cutedsl", False), (10, "trtllm", True),
                                                 (8, "auto", False)])
def test_fusion_resolver_rejections_unchanged(fcf, major, backend, multi):
    with platform(major), pytest.raises(ValueError):
        fcf._resolve_backend(backend, is_multi_node=multi)


# ----------------------------------------------------------------------------- ServerArgs auto-enable gate
FUSION = "flashinfer_allreduce_fusion_backend"


def test_fusion_sm120_auto_enable_gate_kimi_k25(monkeypatch):
    """Evidence gate: auto-enable on SM12X at TP2 on one node only (TP4 regressed upstream, TP8 one-shot lost
    to NCCL across NUMA). Real resolution of a Kimi-K2.5 config at TP 2/4/8 x nnodes 1/2 (EAGLE-3 on at TP8)."""
    monkeypatch.delenv("SGLANG_SM120_ALLREDUCE_FUSION", raising=False)
    got = {(tp, n): resolved(server_args(12, tp=tp, nnodes=n, spec=(tp == 8)), FUSION)
           for tp in (2, 4, 8) for n in (1, 2)}
    assert got == {(2, 1): "auto", (4, 1): None, (8, 1): None, (2, 2): None, (4, 2): None, (8, 2): None}


def test_fusion_sm120_switch_each_way(monkeypatch):
    monkeypatch.setenv("SGLANG_SM120_ALLREDUCE_FUSION", "1")
    on = {tp: resolved(server_args(12, tp=tp, spec=False), FUSION) for tp in (4, 8)}
    monkeypatch.setenv("SGLANG_SM120_ALLREDUCE_FUSION", "0")
    off = resolved(server_args(12, tp=2, spec=False), FUSION)
    assert (on, off) == ({4: "auto", 8: "auto"}, None)


def test_fusion_sm120_enforce_disable_still_wins(monkeypatch):
    monkeypatch.setenv("SGLANG_SM120_ALLREDUCE_FUSION", "1")
    sa = server_args(12, tp=2, spec=False, enforce_disable_flashinfer_allreduce_fusion=True)
    assert resolved(sa, FUSION) is None
    # ... and the gate really would have enabled it (so the assertion above is about the flag)
    assert resolved(server_args(12, tp=2, spec=False), FUSION) == "auto"


@unchanged
def test_fusion_sm120_explicit_backend_kept(monkeypatch):
    monkeypatch.delenv("SGLANG_SM120_ALLREDUCE_FUSION", raising=False)
    assert resolved(server_args(12, tp=8, spec=False, flashinfer_allreduce_fusion_backend="trtllm"), FUSION) == "trtllm"


@unchanged
@pytest.mark.parametrize("major", [9, 10])
def test_fusion_auto_enable_sm90_sm100_unchanged(monkeypatch, major):
    monkeypatch.setenv("SGLANG_SM120_ALLREDUCE_FUSION", "0")  # the SM12X switch must not touch other GPUs
    assert resolved(server_args(major, tp=8, spec=False), FUSION) == "auto"


# ------------------------------------------------------------------------ per-batch predicate and token cap
@pytest.fixture
def add_norm():
    return importlib.import_module("sglang.srt.layers.layer_boundary.residual.add_norm")


@pytest.fixture
def fusion_on():
    from sglang.srt.runtime_context import get_context

    with get_context().override_server_args(flashinfer_allreduce_fusion_backend="trtllm"):
        yield


def test_fusion_sm120_per_batch_predicate(monkeypatch, add_norm, fusion_on):
    monkeypatch.setattr(add_norm, "_is_sm90_supported", False)
    monkeypatch.setattr(add_norm, "_is_sm100_supported", False)
    monkeypatch.setattr(add_norm, "_is_sm120_supported", True)  # AttributeError on the unpatched tree
    monkeypatch.setattr(add_norm, "_is_flashinfer_available", True)
    cap = add_norm.FUSE_ALLREDUCE_MAX_BATCH_SIZE
    assert add_norm.flashinfer_ar_fusion_applies(8)
    assert add_norm.flashinfer_ar_fusion_applies(cap)
    assert not add_norm.flashinfer_ar_fusion_applies(cap + 1)
    assert not add_norm.flashinfer_ar_fusion_applies(0)
    monkeypatch.setattr(add_norm, "_is_sm120_supported", False)
    assert not add_norm.flashinfer_ar_fusion_applies(8)


@unchanged
def test_fusion_per_batch_predicate_sm90_unchanged(monkeypatch, add_norm, fusion_on):
    monkeypatch.setattr(add_norm, "_is_sm90_supported", True)
    monkeypatch.setattr(add_norm, "_is_flashinfer_available", True)
    assert add_norm.flashinfer_ar_fusion_applies(2048)


@pytest.fixture
def reload_add_norm(monkeypatch):
    """Re-import add_norm (and the layer_boundary package that re-exports its cap) on a faked CUDA platform;
    put the real modules back afterwards."""
    import sglang.srt.utils as utils

    mods = ["sglang.srt.layers.layer_boundary.residual.add_norm", "sglang.srt.layers.layer_boundary"]
    # everything else imported for real first: only these two modules see the faked platform
    importlib.import_module("sglang.srt.model_executor.runner.base_runner")

    def load(major: int, **env):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr(utils, "is_cuda", lambda: True)
        with platform(major):
            for m in mods:
                importlib.reload(importlib.import_module(m))
        return importlib.import_module(mods[0])

    yield load
    monkeypatch.undo()
    for m in mods:
        importlib.reload(importlib.import_module(m))


@pytest.mark.parametrize("env,want", [({}, 256), ({"SGLANG_SM120_ALLREDUCE_FUSION_MAX_TOKENS": "64"}, 64)])
def test_fusion_sm120_token_cap_sizes_the_workspaces(reload_add_norm, monkeypatch, env, want):
    mod = reload_add_norm(12, **env)
    assert mod.FUSE_ALLREDUCE_MAX_BATCH_SIZE == want
    # the same cap sizes both fusion workspaces before graph capture (base_runner)
    from sglang.srt.layers import flashinfer_comm_fusion as fcf
    from sglang.srt.model_executor.runner import base_runner

    seen = {}
    monkeypatch.setattr(fcf, "pre_initialize_workspaces", lambda **kw: seen.update(kw))
    runner = SimpleNamespace(model_runner=SimpleNamespace(model_config=SimpleNamespace(hidden_size=7168),
                                                          dtype=torch.bfloat16, is_draft_worker=False))
    from sglang.srt.runtime_context import get_context

    with get_context().override_server_args(flashinfer_allreduce_fusion_backend="trtllm"):
        base_runner.BaseRunner._pre_initialize_flashinfer_allreduce_workspace(runner)
    assert seen["max_token_num"] == want and seen["hidden_dim"] == 7168


@unchanged
def test_fusion_token_cap_sm90_unchanged(reload_add_norm):
    assert reload_add_norm(9).FUSE_ALLREDUCE_MAX_BATCH_SIZE == 2048


# --------------------------------------------------------------------------------- workspace preflight
class FakeDriver:
    """The cuda-python driver calls the preflight makes, with a switchable multicast capability."""

    class CUresult:
        CUDA_SUCCESS = 0
        CUDA_ERROR_NOT_SUPPORTED = 801

    class CUdevice_attribute:
        CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 132

    class CUmemAllocationGranularity_flags:
        CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1

    class CUmulticastGranularity_flags:
        CU_MULTICAST_GRANULARITY_RECOMMENDED = 1

    CUmulticastObjectProp = SimpleNamespace

    def __init__(self, multicast: bool, granularity: int = 2 << 20, mc_granularity: int = 512 << 20):
        self.multicast, self.granularity, self.mc_granularity = multicast, granularity, mc_granularity
        self.calls: list[str] = []
        self.created: list[int] = []

    def cuDeviceGetAttribute(self, attr, device):
        self.calls.append("cuDeviceGetAttribute")
        return self.CUresult.CUDA_SUCCESS, int(self.multicast)

    def cuMemGetAllocationGranularity(self, prop, flags):
        return self.CUresult.CUDA_SUCCESS, self.granularity

    def cuMulticastGetGranularity(self, prop, flags):
        self.calls.append("cuMulticastGetGranularity")
        if not self.multicast:  # what a PCIe-only GPU answers
            return self.CUresult.CUDA_ERROR_NOT_SUPPORTED, 0
        return self.CUresult.CUDA_SUCCESS, self.mc_granularity

    def cuMemCreate(self, size, prop, flags):
        self.created.append(size)
        return self.CUresult.CUDA_SUCCESS, len(self.created)

    def cuMemRelease(self, handle):
        return (self.CUresult.CUDA_SUCCESS,)


def _align(x, a):
    return (x + a - 1) // a * a


def _expected_sizes(world, tokens, hidden, gran, mc=None):
    buf = world * tokens * hidden * 2
    flag = world * 256 * 4
    lamport = min(world * tokens * hidden * 2, 2147483647 & ~((1 << 21) - 1)) * 3
    out = []
    for s in (buf, flag, lamport):
        a = _align(_align(s, 1 << 21) + 2048, gran)
        out.append(_align(a, mc) if mc else a)
    return out


PROP = SimpleNamespace(location=SimpleNamespace(id=0), requestedHandleTypes=1)


def test_fusion_preflight_sizes_without_multicast(fcf):
    drv = FakeDriver(multicast=False)
    sizes = fcf._flashinfer_trtllm_workspace_allocation_sizes(drv, PROP, 8, 256, 7168, torch.bfloat16)
    assert "cuMulticastGetGranularity" not in drv.calls
    assert sizes == _expected_sizes(8, 256, 7168, drv.granularity)


@unchanged
def test_fusion_preflight_sizes_with_multicast_unchanged(fcf):
    drv = FakeDriver(multicast=True)
    sizes = fcf._flashinfer_trtllm_workspace_allocation_sizes(drv, PROP, 8, 2048, 7168, torch.bfloat16)
    assert drv.calls.count("cuMulticastGetGranularity") == 3
    assert sizes == _expected_sizes(8, 2048, 7168, drv.granularity, drv.mc_granularity)


@pytest.fixture
def gloo_group():
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_fusion_preflight_votes_proceed_without_multicast(fcf, monkeypatch, gloo_group):
    """The collective preflight on a multicast-less GPU: unpatched it raises inside, votes SKIP and turns the
    fusion off for the whole group; patched it probes FlashInfer's real allocation sizes and proceeds."""
    drv = FakeDriver(multicast=False)
    monkeypatch.setattr(fcf, "get_cuda_driver_bindings", lambda: drv)
    monkeypatch.setattr(fcf, "_make_flashinfer_workspace_allocation_prop", lambda d: PROP)
    assert fcf._preflight_check_workspace_memory(8, 256, 7168, torch.bfloat16, cpu_group=gloo_group) is True
    assert drv.created == _expected_sizes(8, 256, 7168, drv.granularity)


# ----------------------------------------------------------------------------------- small-token guard
class FakeComm:
    class AllReduceFusionPattern:
        kAllReduce = 0
        kARResidualRMSNorm = 1

    def __init__(self):
        self.calls: list[dict] = []

    def allreduce_fusion(self, **kw):
        self.calls.append(kw)


@pytest.fixture
def fake_flashinfer(fcf, monkeypatch):
    comm = FakeComm()
    manager = SimpleNamespace(workspace=object(), backend="trtllm", initialized=True)
    monkeypatch.setattr(fcf, "_flashinfer_comm", comm)
    monkeypatch.setattr(fcf, "is_flashinfer_available", lambda: True)
    monkeypatch.setattr(fcf, "_flashinfer_allreduce_supports_trigger_completion", True)
    monkeypatch.setattr(fcf, "resolve_fusion_world_size", lambda **kw: 8)
    monkeypatch.setattr(fcf, "ensure_workspace_initialized", lambda **kw: True)
    monkeypatch.setattr(fcf, "_get_workspace_manager", lambda use_attn_tp_group: manager)
    return comm


def fused_op(fcf):
    """The Python body of the registered custom op (its CPU dispatch is not registered; the body is the code)."""
    return inspect.unwrap(fcf.flashinfer_allreduce_residual_rmsnorm)


def test_fusion_small_token_guard_fused_call(fcf, fake_flashinfer):
    """Batches of <= 16 tokens (chain verify at bs <= 4) complete the one-shot kernel's PDL trigger at its end."""
    rows = [1, 4, 8, 16, 17, 64]
    for r in rows:
        x = torch.randn(r, 7168, dtype=torch.bfloat16)
        fused_op(fcf)(x, torch.randn_like(x), torch.ones(7168, dtype=torch.bfloat16))
    assert all(kw["launch_with_pdl"] for kw in fake_flashinfer.calls)
    assert [kw["trigger_completion_at_end"] for kw in fake_flashinfer.calls] == [True] * 4 + [False] * 2


def test_fusion_small_token_guard_allreduce_only(fcf, fake_flashinfer):
    for r in (4, 16, 32):
        fcf.flashinfer_allreduce(torch.randn(r, 7168, dtype=torch.bfloat16), use_attn_tp_group=True)
    assert [kw["trigger_completion_at_end"] for kw in fake_flashinfer.calls] == [True, True, False]


@unchanged
def test_fusion_small_token_guard_keeps_explicit_true(fcf, fake_flashinfer):
    x = torch.randn(64, 7168, dtype=torch.bfloat16)
    fused_op(fcf)(x, torch.randn_like(x), torch.ones(7168, dtype=torch.bfloat16), trigger_completion_at_end=True)
    assert fake_flashinfer.calls[0]["trigger_completion_at_end"] is True
