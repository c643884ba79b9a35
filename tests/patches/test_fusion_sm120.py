"""FlashInfer all-reduce + residual + RMSNorm fusion on SM12X (patches flashinfer-*.patch): the real SGLang code on a
faked platform, a fake CUDA driver for the workspace preflight, a recording stand-in for FlashInfer's kernel call.
"""

import contextlib
import importlib
import inspect
from types import SimpleNamespace

import pytest
import torch

import _gloo
from _fake_cuda import FakeCudaDriver
from _sgl import platform, resolved, server_args
from scripts.box.ranks import free_port

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
@pytest.mark.parametrize(
    "major,backend,multi,want",  # want None: refused
    [
        (10, "auto", False, "mnnvl"),
        (10, "auto", True, "mnnvl"),
        (10, "trtllm", False, "trtllm"),
        (10, "mnnvl", True, "mnnvl"),
        (10, "cutedsl", False, "cutedsl"),
        (9, "auto", False, "trtllm"),
        (9, "trtllm", False, "trtllm"),
        (9, "mnnvl", False, "mnnvl"),
        (9, "auto", True, None),
        (9, "cutedsl", False, None),
        (10, "trtllm", True, None),
        (8, "auto", False, None),
    ],
)
def test_fusion_resolver_of_other_gpus_unchanged(fcf, major, backend, multi, want):
    with platform(major), pytest.raises(ValueError) if want is None else contextlib.nullcontext():
        assert fcf._resolve_backend(backend, is_multi_node=multi) == want


# ----------------------------------------------------------------------------- ServerArgs auto-enable gate
FUSION = "flashinfer_allreduce_fusion_backend"


def test_fusion_sm120_auto_enable_gate_kimi_k25(monkeypatch):
    """Evidence gate: auto-enable on SM12X at TP2 on one node only (TP4 regressed upstream, TP8 one-shot lost
    to NCCL across NUMA). Real resolution of a Kimi-K2.5 config at TP 2/4/8 x nnodes 1/2 (EAGLE-3 on at TP8)."""
    monkeypatch.delenv("SGLANG_SM120_ALLREDUCE_FUSION", raising=False)
    got = {
        (tp, n): resolved(server_args(12, tp=tp, nnodes=n, spec=(tp == 8)), FUSION) for tp in (2, 4, 8) for n in (1, 2)
    }
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
def fusion_on():
    from sglang.srt.runtime_context import get_context

    with get_context().override_server_args(flashinfer_allreduce_fusion_backend="trtllm"):
        yield


@unchanged
def test_fusion_per_batch_predicate_sm90_unchanged(monkeypatch, fusion_on):
    add_norm = importlib.import_module("sglang.srt.layers.layer_boundary.residual.add_norm")
    monkeypatch.setattr(add_norm, "_is_sm90_supported", True)
    monkeypatch.setattr(add_norm, "_is_flashinfer_available", True)
    assert add_norm.flashinfer_ar_fusion_applies(2048)


@pytest.fixture
def reload_add_norm(monkeypatch):
    """load(major, **env): add_norm (and the layer_boundary package that re-exports its cap) re-imported on a faked
    CUDA platform; the real modules put back afterwards."""
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
def test_fusion_sm120_token_cap_sizes_the_workspaces(reload_add_norm, monkeypatch, fusion_on, env, want):
    """The cap sizes both fusion workspaces before graph capture (base_runner)."""
    from sglang.srt.layers import flashinfer_comm_fusion as fcf
    from sglang.srt.model_executor.runner import base_runner

    assert reload_add_norm(12, **env).FUSE_ALLREDUCE_MAX_BATCH_SIZE == want
    seen = {}
    monkeypatch.setattr(fcf, "pre_initialize_workspaces", lambda **kw: seen.update(kw))
    model_runner = SimpleNamespace(
        model_config=SimpleNamespace(hidden_size=7168), dtype=torch.bfloat16, is_draft_worker=False
    )
    base_runner.BaseRunner._pre_initialize_flashinfer_allreduce_workspace(SimpleNamespace(model_runner=model_runner))
    assert seen["max_token_num"] == want and seen["hidden_dim"] == 7168


def test_fusion_sm120_per_batch_predicate(reload_add_norm, monkeypatch, fusion_on):
    """add_norm's per-batch predicate as imported on an SM12X GPU (cap 256): decode and chain verify fuse, one token
    past the cap does not, and the SM12X term admits no other GPU generation."""
    mod = reload_add_norm(12)
    monkeypatch.setattr(mod, "_is_flashinfer_available", True)
    assert (mod._is_sm90_supported, mod._is_sm100_supported, mod._is_sm120_supported) == (False, False, True)
    assert mod.FUSE_ALLREDUCE_MAX_BATCH_SIZE == 256
    assert [n for n in (0, 1, 8, 64, 256, 257, 2048) if mod.flashinfer_ar_fusion_applies(n)] == [1, 8, 64, 256]
    monkeypatch.setattr(mod, "_is_sm120_supported", False)
    assert not mod.flashinfer_ar_fusion_applies(8)


@unchanged
def test_fusion_token_cap_sm90_unchanged(reload_add_norm):
    assert reload_add_norm(9).FUSE_ALLREDUCE_MAX_BATCH_SIZE == 2048


# --------------------------------------------------------------------------------- workspace preflight
class _FlashInferStop(Exception):
    pass


def flashinfer_allocation_sizes(monkeypatch, world, tokens, hidden, drv: FakeCudaDriver, multicast: bool) -> list[int]:
    """The oracle: what FlashInfer 0.7.2 itself allocates per rank for the trtllm fusion workspace. The three buffer
    sizes trtllm_create_ipc_workspace_for_all_reduce_fusion asks SymmDeviceMemory for, each made an allocation size
    by SymmDeviceMemory._get_allocation_prop with this driver's granularities (multicast rounding when asked)."""
    import types

    from flashinfer.comm import mnnvl, trtllm_ar

    asked: list[int] = []

    class RecordingSymmDeviceMemory:
        def __init__(self, buf_size, group_size, **kw):
            asked.append(buf_size)
            if len(asked) == 3:  # buffer, flags, Lamport: everything FlashInfer allocates
                raise _FlashInferStop

        def get_buffer_ptrs_host(self):
            return [0] * world

    monkeypatch.setattr(trtllm_ar, "SymmDeviceMemory", RecordingSymmDeviceMemory)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(_FlashInferStop):
        trtllm_ar.trtllm_create_ipc_workspace_for_all_reduce_fusion(
            tp_rank=0,
            tp_size=world,
            max_token_num=tokens,
            hidden_dim=hidden,
            create_metadata=True,
            comm_backend=object(),
            use_symm_dev_mem=True,
        )

    ok = SimpleNamespace(value=0)
    fake_cuda = types.SimpleNamespace(**{k: getattr(mnnvl.cuda, k) for k in dir(mnnvl.cuda) if not k.startswith("_")})
    fake_cuda.cuMemGetAllocationGranularity = lambda prop, flags: (ok, drv.granularity)
    fake_cuda.cuMulticastGetGranularity = lambda prop, flags: (ok, drv.mc_granularity)
    monkeypatch.setattr(mnnvl, "cuda", fake_cuda)
    sizes = []
    for buf_size in asked:
        mem = mnnvl.SymmDeviceMemory.__new__(mnnvl.SymmDeviceMemory)
        mem.device_idx, mem.group_size, mem.SIGNAL_PAD_SIZE = 0, world, mnnvl.SIGNAL_PAD_SIZE
        mem._enable_multicast = multicast
        mem._exchanger = SimpleNamespace(
            handle_type=mnnvl.cuda.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        )
        mem._get_allocation_prop(buf_size)
        sizes.append(mem.allocation_size)
    return sizes


def assert_probes_cover(monkeypatch, probe: list[int], tokens: int, drv: FakeCudaDriver, multicast=False) -> None:
    """The preflight must probe at least what FlashInfer allocates (else it passes where the real allocation
    fails), and no more than one allocation granule above it (else it refuses a workspace that would fit)."""
    allocated = flashinfer_allocation_sizes(monkeypatch, 8, tokens, 7168, drv, multicast)
    granule = drv.mc_granularity if multicast else drv.granularity
    assert len(probe) == len(allocated) == 3
    for p, a in zip(probe, allocated, strict=True):
        assert a <= p <= a + granule, (probe, allocated)


PROP = SimpleNamespace(location=SimpleNamespace(id=0), requestedHandleTypes=1)


@pytest.mark.parametrize("multicast, tokens", [(False, 256), pytest.param(True, 2048, marks=unchanged)])
def test_fusion_preflight_sizes(fcf, monkeypatch, multicast, tokens):
    drv = FakeCudaDriver(multicast=multicast)
    sizes = fcf._flashinfer_trtllm_workspace_allocation_sizes(drv, PROP, 8, tokens, 7168, torch.bfloat16)
    assert drv.calls.count("cuMulticastGetGranularity") == (3 if multicast else 0)
    assert_probes_cover(monkeypatch, sizes, tokens, drv, multicast)


@pytest.fixture
def gloo_group():
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_fusion_preflight_votes_proceed_without_multicast(fcf, monkeypatch, gloo_group):
    """The collective preflight on a multicast-less GPU: unpatched it raises inside, votes SKIP and turns the
    fusion off for the whole group; patched it probes FlashInfer's real allocation sizes and proceeds."""
    drv = FakeCudaDriver(multicast=False)
    monkeypatch.setattr(fcf, "get_cuda_driver_bindings", lambda: drv)
    monkeypatch.setattr(fcf, "_make_flashinfer_workspace_allocation_prop", lambda d: PROP)
    assert fcf._preflight_check_workspace_memory(8, 256, 7168, torch.bfloat16, cpu_group=gloo_group) is True
    assert drv.created == fcf._flashinfer_trtllm_workspace_allocation_sizes(drv, PROP, 8, 256, 7168, torch.bfloat16)
    assert_probes_cover(monkeypatch, drv.created, 256, drv)


def test_fusion_workspace_preflight_gets_the_workspace_comm_backend(fcf, monkeypatch, gloo_group):
    """The workspace manager hands the preflight the comm backend FlashInfer will exchange the handles over, so the
    preflight's handle-exchange probe runs on the same transport (tests/gpu/test_harness.py runs the probe itself
    on two CPU ranks)."""
    seen = {}

    class Backend:
        def __init__(self, device_group, cpu_group):
            seen["backend"] = self

    def preflight(**kw):
        seen.update(kw)
        return False

    monkeypatch.setattr(fcf, "_TorchDistBackend", Backend)
    monkeypatch.setattr(fcf, "_flashinfer_comm", SimpleNamespace())
    monkeypatch.setattr(fcf, "_create_allreduce_fusion_workspace", lambda **kw: pytest.fail("must not be built"))
    monkeypatch.setattr(fcf, "_preflight_check_workspace_memory", preflight)
    monkeypatch.setattr(fcf, "in_the_same_node_as", lambda group, source_rank: [True])
    monkeypatch.setattr(fcf, "_flashinfer_allreduce_unavailable", False)
    manager = fcf.FlashInferWorkspaceManager()
    manager.initialize(
        world_size=8,
        rank=0,
        max_token_num=256,
        hidden_dim=7168,
        backend="trtllm",
        dtype=torch.bfloat16,
        device_group=gloo_group,
        cpu_group=gloo_group,
    )
    assert seen["comm_backend"] is seen["backend"] and not manager.initialized


def test_fusion_handle_exchange_failing_before_its_first_collective_is_joint():
    """Two CPU ranks, FlashInfer's real handle exchange over a group of its own (as the device group is): rank 1
    cannot make the exchange's temporary socket directory, before the exchange's one collective. It still enters
    that collective, with nothing to share, so rank 0 leaves the exchange too, and both skip the fusion."""
    assert _gloo.run("fusion_exchange_fails_early", timeout=400, bad_rank=1) == [{"proceed": False}] * 2


# ------------------------------------------------------------------------ PDL completion at kernel end
@pytest.fixture
def fake_flashinfer(fcf, monkeypatch):
    """FlashInfer's comm module stood in: `calls` lists the keyword arguments of each allreduce_fusion call."""
    comm = SimpleNamespace(calls=[], AllReduceFusionPattern=SimpleNamespace(kAllReduce=0, kARResidualRMSNorm=1))
    comm.allreduce_fusion = lambda **kw: comm.calls.append(kw)
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


# Row counts from decode (1) through chain verify (bs x 4 draft tokens) to the SM12X cap (256), and beyond it to
# FlashInfer's own one-shot bound at TP8 (192 rows of 7168 bf16) and a prefill chunk.
PDL_ROWS = [1, 4, 8, 16, 17, 32, 64, 128, 192, 193, 256, 1024]


@pytest.mark.parametrize("rows", [r for r in PDL_ROWS if r <= 256])
def test_fusion_the_layernorm_caller_takes_the_capped_workspace_and_completes_pdl_at_end(
    reload_add_norm, monkeypatch, fcf, fake_flashinfer, kimi, rows
):
    """The fused RMSNorm path (layernorm._forward_with_allreduce_fusion) at every row count the SM12X cap admits
    (FlashInfer may run any of them one-shot): it asks for the 256-token workspace BaseRunner pre-initialized, so
    that a re-init cannot build a 2048-token one (~0.9 GiB a GPU at TP8, maybe inside graph capture), and reaches
    FlashInfer's fused call with PDL on and the completion trigger at kernel end."""
    reload_add_norm(12)
    from sglang.srt.layers import flashinfer_comm_fusion as fcf_mod
    from sglang.srt.layers import layernorm

    asked = []
    monkeypatch.setattr(fcf_mod, "flashinfer_allreduce_residual_rmsnorm", fused_op(fcf_mod))  # the op's real body
    monkeypatch.setattr(fcf_mod, "ensure_workspace_initialized", lambda **kw: asked.append(kw) or True)
    norm = SimpleNamespace(variance_epsilon=1e-6, forward=lambda x, residual, extra: (x, residual))
    x = torch.randn(rows, 7168, dtype=torch.bfloat16)
    layernorm._forward_with_allreduce_fusion(norm, x, torch.randn_like(x), None, torch.ones(7168))
    assert [(kw["max_token_num"], kw["token_num"]) for kw in asked] == [(256, rows)]
    (call,) = fake_flashinfer.calls
    assert call["launch_with_pdl"] is True and call["trigger_completion_at_end"] is True


def test_fusion_pdl_completion_at_end_allreduce_only(fcf, fake_flashinfer):
    for r in PDL_ROWS:
        fcf.flashinfer_allreduce(torch.randn(r, 7168, dtype=torch.bfloat16), use_attn_tp_group=True)
    assert [kw["trigger_completion_at_end"] for kw in fake_flashinfer.calls] == [True] * len(PDL_ROWS)


@unchanged
def test_fusion_pdl_completion_keeps_explicit_true(fcf, fake_flashinfer):
    x = torch.randn(64, 7168, dtype=torch.bfloat16)
    fused_op(fcf)(x, torch.randn_like(x), torch.ones(7168, dtype=torch.bfloat16), trigger_completion_at_end=True)
    assert fake_flashinfer.calls[0]["trigger_completion_at_end"] is True
