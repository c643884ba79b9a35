"""FlashInfer all-reduce + residual + RMSNorm fusion on SM12X (patches flashinfer-*.patch): the real SGLang code on a
faked platform, a fake CUDA driver for the workspace preflight, a recording stand-in for FlashInfer's kernel call."""

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


TRTLLM_FLAG = "--flashinfer-allreduce-fusion-backend=trtllm"
SM120_BACKENDS = [  # (major, backend, multi-node, the backend or what the ValueError says)
    (12, "auto", False, "trtllm"),
    (12, "trtllm", False, "trtllm"),
    (12, "mnnvl", False, ("multicast", TRTLLM_FLAG)),
    (12, "cutedsl", False, ("SM100", TRTLLM_FLAG)),
    *[(12, backend, True, ("single-node",)) for backend in ("auto", "trtllm", "mnnvl", "cutedsl")],
]
OTHER_GPUS_BACKENDS = [  # other GPUs reach upstream's resolver as before: each backend it returns, most errors
    (10, "auto", False, "mnnvl"),
    (10, "cutedsl", False, "cutedsl"),
    (9, "auto", False, "trtllm"),
    (9, "auto", True, ()),
    (9, "cutedsl", False, ()),
    (10, "trtllm", True, ()),
    (8, "auto", False, ()),
]


@pytest.mark.parametrize(
    "major, backend, multi, want", SM120_BACKENDS + [pytest.param(*row, marks=unchanged) for row in OTHER_GPUS_BACKENDS]
)
def test_fusion_backend_resolution(fcf, major, backend, multi, want):
    """SM12X takes trtllm on one node and refuses the rest saying why and what works; other GPUs as before."""
    with platform(major):
        if isinstance(want, str):
            assert fcf._resolve_backend(backend, is_multi_node=multi) == want
            return
        with pytest.raises(ValueError) as e:
            fcf._resolve_backend(backend, is_multi_node=multi)
    assert all(needle in str(e.value) for needle in want), e.value


# ----------------------------------------------------------------------------- ServerArgs auto-enable gate
FUSION = "flashinfer_allreduce_fusion_backend"


def test_fusion_sm120_auto_enable_gate_and_switch(monkeypatch):
    """Evidence gate: auto-enable on SM12X at TP2 on one node only (TP4 regressed upstream, TP8 one-shot lost to NCCL
    across NUMA); =1 enables it where the gate would not, =0 disables it; enforce-disable still wins over =1."""
    monkeypatch.delenv("SGLANG_SM120_ALLREDUCE_FUSION", raising=False)
    got = {
        (tp, n): resolved(server_args(12, tp=tp, nnodes=n, spec=(tp == 8)), FUSION) for tp in (2, 4, 8) for n in (1, 2)
    }
    assert got == {(2, 1): "auto", (4, 1): None, (8, 1): None, (2, 2): None, (4, 2): None, (8, 2): None}
    monkeypatch.setenv("SGLANG_SM120_ALLREDUCE_FUSION", "1")
    on = {tp: resolved(server_args(12, tp=tp, spec=False), FUSION) for tp in (2, 4, 8)}
    enforced = server_args(12, tp=2, spec=False, enforce_disable_flashinfer_allreduce_fusion=True)
    monkeypatch.setenv("SGLANG_SM120_ALLREDUCE_FUSION", "0")
    off = resolved(server_args(12, tp=2, spec=False), FUSION)
    assert (on, resolved(enforced, FUSION), off) == ({2: "auto", 4: "auto", 8: "auto"}, None, None)


@unchanged
@pytest.mark.parametrize("major, kw", [(12, {FUSION: "trtllm"}), (9, {}), (10, {})])
def test_fusion_explicit_backend_and_other_gpus_unchanged(monkeypatch, major, kw):
    """A backend the user set is kept; SM90 and SM100 auto-enable as before, the SM12X switch touching neither."""
    monkeypatch.setenv("SGLANG_SM120_ALLREDUCE_FUSION", "0")
    assert resolved(server_args(major, tp=8, spec=False, **kw), FUSION) == kw.get(FUSION, "auto")


# ------------------------------------------------------------------------ per-batch predicate and token cap
@pytest.fixture
def fusion_on():
    from sglang.srt.runtime_context import get_context

    with get_context().override_server_args(flashinfer_allreduce_fusion_backend="trtllm"):
        yield


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


@pytest.mark.parametrize(
    "env, want, fused",
    [({}, 256, [1, 8, 64, 65, 256]), ({"SGLANG_SM120_ALLREDUCE_FUSION_MAX_TOKENS": "64"}, 64, [1, 8, 64])],
)
def test_fusion_sm120_token_cap_sizes_the_workspaces_and_bounds_the_predicate(
    reload_add_norm, monkeypatch, fusion_on, env, want, fused
):
    """The cap sizes both fusion workspaces before graph capture (base_runner) and bounds add_norm's per-batch
    predicate: decode and chain verify fuse, one token past the cap does not, and no other GPU generation does."""
    from sglang.srt.layers import flashinfer_comm_fusion as fcf
    from sglang.srt.model_executor.runner import base_runner

    mod = reload_add_norm(12, **env)
    assert mod.FUSE_ALLREDUCE_MAX_BATCH_SIZE == want
    seen = {}
    monkeypatch.setattr(fcf, "pre_initialize_workspaces", lambda **kw: seen.update(kw))
    model_runner = SimpleNamespace(
        model_config=SimpleNamespace(hidden_size=7168), dtype=torch.bfloat16, is_draft_worker=False
    )
    base_runner.BaseRunner._pre_initialize_flashinfer_allreduce_workspace(SimpleNamespace(model_runner=model_runner))
    assert seen["max_token_num"] == want and seen["hidden_dim"] == 7168
    monkeypatch.setattr(mod, "_is_flashinfer_available", True)
    assert (mod._is_sm90_supported, mod._is_sm100_supported, mod._is_sm120_supported) == (False, False, True)
    assert [n for n in (0, 1, 8, 64, 65, 256, 257, 2048) if mod.flashinfer_ar_fusion_applies(n)] == fused
    monkeypatch.setattr(mod, "_is_sm120_supported", False)
    assert not mod.flashinfer_ar_fusion_applies(8)


@unchanged
def test_fusion_token_cap_and_per_batch_predicate_sm90_unchanged(reload_add_norm, monkeypatch, fusion_on):
    mod = reload_add_norm(9)
    monkeypatch.setattr(mod, "_is_flashinfer_available", True)
    assert mod.FUSE_ALLREDUCE_MAX_BATCH_SIZE == 2048 and mod.flashinfer_ar_fusion_applies(2048)


# --------------------------------------------------------------------------------- workspace preflight
class _FlashInferStop(Exception):
    pass


def assert_probes_cover(monkeypatch, probe: list[int], tokens: int, drv: FakeCudaDriver, multicast=False) -> None:
    """The preflight probes at least what FlashInfer 0.7.2 allocates per rank for the trtllm fusion workspace (else it
    passes where the real allocation fails) and at most one granule more (else it refuses one that would fit). The
    oracle: the three buffer sizes FlashInfer asks SymmDeviceMemory for, made allocation sizes by its own
    _get_allocation_prop with this driver's granularities."""
    from flashinfer.comm import mnnvl, trtllm_ar

    world = 8

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
            hidden_dim=7168,
            create_metadata=True,
            comm_backend=object(),
            use_symm_dev_mem=True,
        )

    ok = SimpleNamespace(value=0)
    fake_cuda = SimpleNamespace(**{k: getattr(mnnvl.cuda, k) for k in dir(mnnvl.cuda) if not k.startswith("_")})
    fake_cuda.cuMemGetAllocationGranularity = lambda prop, flags: (ok, drv.granularity)
    fake_cuda.cuMulticastGetGranularity = lambda prop, flags: (ok, drv.mc_granularity)
    monkeypatch.setattr(mnnvl, "cuda", fake_cuda)
    allocated = []
    for buf_size in asked:
        mem = mnnvl.SymmDeviceMemory.__new__(mnnvl.SymmDeviceMemory)
        mem.device_idx, mem.group_size, mem.SIGNAL_PAD_SIZE = 0, world, mnnvl.SIGNAL_PAD_SIZE
        mem._enable_multicast = multicast
        mem._exchanger = SimpleNamespace(
            handle_type=mnnvl.cuda.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        )
        mem._get_allocation_prop(buf_size)
        allocated.append(mem.allocation_size)
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
    """The preflight's handle-exchange probe runs on the comm backend FlashInfer will exchange the handles over."""
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
    """The fused RMSNorm path asks for the 256-token workspace BaseRunner pre-initialized (a re-init would build a
    2048-token one, ~0.9 GiB a GPU, maybe inside graph capture) and completes PDL at kernel end."""
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
