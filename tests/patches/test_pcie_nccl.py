"""PCIe-only hosts: the launcher's NCCL default, the PCIe-IPC all-reduce (on by default, its group decisions, its
routing ahead of FlashInfer's allreduce-only path, its rank -> NUMA log, the backend of each size timed at start).

The launcher tests run the real `_set_envs_and_config` (entrypoints/engine.py) on resolved Kimi-K2.5 server
arguments, with NVML faked through the pynvml functions SGLang calls (tests/_fake_nvml.py); multiprocessing,
signal and ulimit calls are stubbed and the environment is restored after each test. The routing tests call the
real `GroupCoordinator.all_reduce` on a coordinator built with __new__, with meta tensors (so the GPU path is
taken), and the real `PcieIpcCommunicator` over a stand-in of FlashInfer's workspace.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import _gloo
from _fake_nvml import BUS, FakeNvml
from _sgl import platform, server_args

REPO = Path(__file__).resolve().parents[2]
HIDDEN = 7168  # Kimi-K2.5 / DeepSeek-V3
# Variables the launcher may touch; cleared before each test so the host's environment cannot leak in.
WATCHED = (
    "CUDA_VISIBLE_DEVICES",
    "SGLANG_PCIE_NCCL_DEFAULTS",
    "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_NRINGS",
    "NCCL_MAX_NRINGS",
    "NCCL_MIN_CTAS",
    "NCCL_MAX_CTAS",
    "NCCL_CUMEM_ENABLE",
    "NCCL_NVLS_ENABLE",
    "NCCL_GRAPH_MIXING_SUPPORT",
)
# What upstream's launcher itself sets among NCCL_* on one node (engine.py _set_envs_and_config).
UPSTREAM_NCCL = {"NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE", "NCCL_MNNVL_ENABLE"}
SET_LINE = "No NVLink between the visible GPUs: set NCCL_MIN_NCHANNELS=8 (SGLANG_PCIE_NCCL_DEFAULTS=0 skips this)."


def all_pairs(indices) -> set:
    return {frozenset(p) for p in itertools.combinations(indices, 2)}


@pytest.fixture(scope="module")
def kimi_tp8():
    return server_args(12)


def nvml(monkeypatch, **kw) -> FakeNvml:
    """FakeNvml, also where SGLang's NVML helpers (custom_all_reduce_utils) import pynvml only on a CUDA build."""
    import pynvml

    from sglang.srt.distributed.device_communicators import custom_all_reduce_utils

    monkeypatch.setattr(custom_all_reduce_utils, "pynvml", pynvml, raising=False)
    return FakeNvml(monkeypatch, **kw)


@pytest.fixture
def launch(monkeypatch, caplog):
    """run(server_args, major=12, **env): the real _set_envs_and_config; returns the variables it added or changed."""
    from sglang.srt.entrypoints import engine

    monkeypatch.setattr(multiprocessing, "set_start_method", lambda *a, **k: None)
    monkeypatch.setattr(signal, "signal", lambda *a, **k: None)
    monkeypatch.setattr(engine, "set_ulimit", lambda *a, **k: None)

    def no_cuda_context(*a, **k):
        raise AssertionError("the launcher must not initialise CUDA (it would poison the scheduler spawn)")

    monkeypatch.setattr(torch.cuda, "_lazy_init", no_cuda_context)
    caplog.set_level(logging.INFO, logger="sglang.srt.entrypoints.engine")
    saved = dict(os.environ)
    for k in WATCHED:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK", "1")

    def run(sa, major=12, **env):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        before = dict(os.environ)
        with platform(major):
            engine._set_envs_and_config(sa)
        return {k: v for k, v in os.environ.items() if before.get(k) != v}

    yield run
    os.environ.clear()
    os.environ.update(saved)


def launcher_log(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "sglang.srt.entrypoints.engine"
        and ("NVLink" in r.getMessage() or "NCCL defaults" in r.getMessage())
    ]


# ---------------------------------------------------------------------------------------------------------------
# The launcher's NCCL default


def test_pcie_nccl_default_applied_without_nvlink(launch, kimi_tp8, monkeypatch, caplog):
    nvml(monkeypatch)
    changed = launch(kimi_tp8)
    assert changed["NCCL_MIN_NCHANNELS"] == "8" and {k for k in changed if k.startswith("NCCL_")} <= UPSTREAM_NCCL | {
        "NCCL_MIN_NCHANNELS"
    }
    assert launcher_log(caplog) == [SET_LINE]


def test_pcie_nccl_notsupported_pair_counts_as_no_nvlink(launch, kimi_tp8, monkeypatch):
    import pynvml

    nvml(monkeypatch, pair_error=pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert launch(kimi_tp8)["NCCL_MIN_NCHANNELS"] == "8"


def test_pcie_nccl_probes_the_visible_gpus(launch, monkeypatch):
    """GPUs 0-1 share NVLink, but this server sees 4-7 only (CUDA_VISIBLE_DEVICES numbers are NVML indices)."""
    fake = nvml(monkeypatch, nvlink=[(0, 1)])
    changed = launch(server_args(12, tp=4), CUDA_VISIBLE_DEVICES="4,5,6,7")
    assert fake.pairs == all_pairs([4, 5, 6, 7]) and changed["NCCL_MIN_NCHANNELS"] == "8"


@pytest.mark.parametrize(
    "user",
    [
        {"NCCL_MIN_NCHANNELS": "4"},
        {"NCCL_MAX_NCHANNELS": "16"},
        {"NCCL_MIN_NRINGS": "2"},
        {"NCCL_MAX_CTAS": "8"},
        {"NCCL_MIN_CTAS": "1"},
    ],
)
def test_pcie_nccl_default_never_overrides_a_channel_setting(launch, kimi_tp8, monkeypatch, caplog, user):
    """NCCL runs max(floor, min(found, ceiling)) channels: a floor would override any channel setting of the
    user's, so none is set then, and the log says which setting kept it off."""
    nvml(monkeypatch)
    changed = launch(kimi_tp8, **user)
    assert "NCCL_MIN_NCHANNELS" not in changed and {k: os.environ[k] for k in user} == user
    assert launcher_log(caplog) == [f"NCCL defaults for PCIe not applied: {next(iter(user))} set."]


def test_pcie_nccl_default_opt_out(launch, kimi_tp8, monkeypatch, caplog):
    from sglang.srt.environ import envs

    fake = nvml(monkeypatch)
    changed = launch(kimi_tp8, SGLANG_PCIE_NCCL_DEFAULTS="0")
    assert envs.SGLANG_PCIE_NCCL_DEFAULTS.get() is False
    assert "NCCL_MIN_NCHANNELS" not in changed and fake.inits == 0 and launcher_log(caplog) == []


@pytest.mark.parametrize("failure", ["init", "pair", "uuid"])
def test_pcie_nccl_unknown_topology_changes_nothing_and_says_so(launch, kimi_tp8, monkeypatch, caplog, failure):
    import pynvml

    env = {}
    if failure == "init":
        nvml(monkeypatch, init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    elif failure == "pair":
        nvml(monkeypatch, pair_error=pynvml.NVML_ERROR_UNKNOWN)
    else:  # GPU UUIDs in CUDA_VISIBLE_DEVICES: not NVML indices
        nvml(monkeypatch)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(FakeNvml.uuid(i) for i in range(8))
    changed = launch(kimi_tp8, **env)
    assert {k for k in changed if k.startswith("NCCL_")} <= UPSTREAM_NCCL
    (line,) = launcher_log(caplog)
    assert line.startswith("NCCL defaults for PCIe not applied: topology unknown (")


@pytest.mark.unchanged
@pytest.mark.parametrize("shape", ["nvlink", "tp1", "two_nodes"])
def test_pcie_nccl_nvlink_tp1_and_multi_node_unchanged(launch, monkeypatch, shape):
    fake = nvml(monkeypatch, nvlink=[(2, 5)] if shape == "nvlink" else ())
    sa = {"nvlink": server_args(12), "tp1": server_args(12, tp=1), "two_nodes": server_args(12, nnodes=2)}[shape]
    changed = launch(sa)
    assert {k for k in changed if k.startswith("NCCL_")} <= UPSTREAM_NCCL
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in changed
    assert shape == "nvlink" or fake.inits == 0


# ---------------------------------------------------------------------------------------------------------------
# PCIe IPC on by default on PCIe-only SM120 (pcie_ipc_ar.eligible_group, every rank voting on the host group)


@pytest.fixture
def published(kimi_tp8):
    from sglang.srt import runtime_context as rc

    with rc.use_context(rc.create_context(kimi_tp8, role="scheduler")):
        yield kimi_tp8


def eligible(world=8, major=12, deterministic=False, **kw):
    """pcie_ipc_ar.eligible_group for the TP group (kw: custom_allreduce, cpu_group) on a faked GPU."""
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import eligible_group

    with platform(major):
        return eligible_group(group_name="tp", world_size=world, deterministic=deterministic, **kw)


def test_pcie_ipc_allreduce_default_on_pcie_only_sm120(published, monkeypatch, caplog):
    nvml(monkeypatch)
    with caplog.at_level(logging.INFO):
        assert eligible() and eligible(world=4)
    assert any("Set SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0 to keep it off" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("case", ["nvlink", "sm90", "tp2", "no_custom_all_reduce", "deterministic", "nvml_error"])
def test_pcie_ipc_allreduce_default_stays_off(published, monkeypatch, case):
    """Where another all-reduce serves the group (NVLink; TP2, where the custom all-reduce takes PCIe hosts), on
    other GPUs, with --disable-custom-all-reduce (PCIe IPC is a custom all-reduce), with deterministic inference
    (its tactic follows the shape), or when NVML cannot answer. The same host with NVLink-free SM120 GPUs at TP8
    turns it on."""
    import pynvml

    nvml(
        monkeypatch,
        nvlink=[(2, 5)] if case == "nvlink" else (),
        init_error=pynvml.NVML_ERROR_UNKNOWN if case == "nvml_error" else None,
    )
    kw = {
        "sm90": dict(major=9),
        "tp2": dict(world=2),
        "no_custom_all_reduce": dict(custom_allreduce=False),
        "deterministic": dict(deterministic=True),
    }.get(case, {})
    assert not eligible(**kw)
    nvml(monkeypatch)
    assert eligible()


def test_pcie_ipc_allreduce_default_is_a_group_vote(published, monkeypatch):
    """Every rank asks NVML; a rank whose answer differs (here: another rank answered no) is outvoted on the host
    group, so no rank builds a backend its peers skip."""
    import torch.distributed as dist

    nvml(monkeypatch)
    votes = []

    def another_rank_says_no(flag, op, group):
        votes.append((int(flag.item()), op, group))
        flag.zero_()

    monkeypatch.setattr(dist, "all_reduce", another_rank_says_no)
    assert not eligible(cpu_group="host-group")
    assert votes == [(1, dist.ReduceOp.MIN, "host-group")]


@pytest.mark.unchanged
@pytest.mark.parametrize("value, on", [("0", False), ("1", True)])
def test_pcie_ipc_allreduce_explicit_value_wins(published, monkeypatch, value, on):
    nvml(monkeypatch, nvlink=[(2, 5)])
    monkeypatch.setenv("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", value)
    assert eligible() is on


# ---------------------------------------------------------------------------------------------------------------
# Routing in GroupCoordinator.all_reduce, with the workspaces the shipped profile gives


PROFILES = REPO / "docker" / "profiles"
RTX_PRO_6000_MIB = 97887
# Profile keys that name files or the HTTP front end rather than how the model runs.
NOT_SERVER_SHAPE = {
    "model_path",
    "speculative_draft_model_path",
    "host",
    "port",
    "tool_call_parser",
    "reasoning_parser",
    "trust_remote_code",
    "enable_metrics",
}


def profile_args() -> dict:
    """The shipped serving profile's SGLang arguments (its --config YAML)."""
    import yaml

    args = yaml.safe_load((PROFILES / "kimi-k25-eagle3-tp8.yaml").read_text())
    return {k.replace("-", "_"): v for k, v in args.items()}


@pytest.fixture(scope="module")
def kimi_profile_args():
    """ServerArgs resolved from the shipped serving profile (Kimi-K2.5, TP8, EAGLE-3 3/1/4, 16 running requests,
    decode graphs up to bs 16) on a faked SM120 box with 96 GB GPUs."""
    from unittest import mock

    from sglang.srt.arg_groups import memory_hook

    kw = {k: v for k, v in profile_args().items() if k not in NOT_SERVER_SHAPE and v is not False}
    tp = kw.pop("tp_size")
    with mock.patch.object(memory_hook, "get_device_memory_capacity", lambda device=None: RTX_PRO_6000_MIB):
        return server_args(12, tp=tp, **kw)


@pytest.fixture
def published_profile(kimi_profile_args):
    from sglang.srt import runtime_context as rc

    with rc.use_context(rc.create_context(kimi_profile_args, role="scheduler")):
        yield kimi_profile_args


def widest_decode_rows(sa, pool: int | None = None) -> int:
    """BaseRunner._widest_decode_rows (what the PCIe-IPC workspace is prepared with) on a target ModelRunner whose
    request pool holds the profile's running requests (kv_cache_configurator.resolve_max_num_reqs), or `pool`."""
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.runner.base_runner import BaseRunner
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    mr = ModelRunner.__new__(ModelRunner)
    vars(mr).update(
        spec_algorithm=SpeculativeAlgorithm.EAGLE3,
        is_draft_worker=False,
        server_args=sa,
        req_to_token_pool=SimpleNamespace(size=pool or sa.max_running_requests // get_parallel().attn_dp_size),
    )
    return BaseRunner._widest_decode_rows(SimpleNamespace(model_runner=mr))


class PcieIpcWorkspace:
    """Stands in for FlashInfer's PcieIpcAllReduceWorkspace and PcieIpcAllGatherWorkspace (GPUs only): built with
    the max_numel SGLang asks for, and, like FlashInfer's, it cannot take more elements than that."""

    built: list = []

    def __init__(self, group, max_numel, dtype, tune_batches=(), tune_cache=None):
        self.max_numel, self.tune_batches, self.destroyed = max_numel, tune_batches, False
        PcieIpcWorkspace.built.append(self)

    def supports(self, t):
        return t.numel() <= self.max_numel

    def tune(self, hiddens, **kw):
        return {}

    def destroy(self):
        self.destroyed = True


GIB = 1 << 30


@pytest.fixture(autouse=True)
def device_memory(monkeypatch):
    """set(free_bytes): what torch.cuda.mem_get_info answers (no GPU here), and FlashInfer's JIT module's
    workspace_size (2 bytes x max_numel x 2 stages here; the real one is compiled CUDA code)."""
    import flashinfer.comm as fi_comm
    import flashinfer.comm.pcie_ipc_ar as fi_ar

    state = {"free": 80 * GIB}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (state["free"], 96 * GIB))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(
        fi_ar,
        "get_pcie_ipc_comm_module",
        lambda: SimpleNamespace(workspace_size=lambda world, numel, elem, blocks: 2 * numel * elem),
    )
    monkeypatch.setattr(fi_comm, "PcieIpcAllGatherWorkspace", PcieIpcWorkspace, raising=False)
    PcieIpcWorkspace.built = []
    return lambda free: state.__setitem__("free", free)


def communicator(disabled=False, **attrs):
    """SGLang's PcieIpcCommunicator for a TP8 group (its constructor needs a CUDA device); FlashInfer's workspace
    class replaced."""
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import PcieIpcCommunicator

    c = PcieIpcCommunicator.__new__(PcieIpcCommunicator)
    vars(c).update(
        dict(
            disabled=disabled,
            max_numel=0,
            _workspace=None,
            _bound_stream=None,
            _cpu_group=None,
            _max_rows=None,
            _group=None,
            _device=torch.device("meta"),
            _world_size=8,
            _workspace_cls=PcieIpcWorkspace,
            _build_failed=False,
        ),
        **attrs,
    )
    return c


def prepared_pcie_ipc(max_rows, disabled=False):
    """As BaseRunner._pre_initialize_pcie_ipc_workspace prepares it (prepare(hidden, max_rows))."""
    c = communicator(disabled)
    c.prepare(hidden=HIDDEN, max_rows=max_rows)
    return c


@pytest.fixture
def fusion_workspace(monkeypatch):
    """fusion_workspace(tokens): FlashInfer's allreduce-only/fusion workspace as BaseRunner pre-initializes it
    (tokens = the fusion's token cap), in SGLang's own workspace manager; FlashInfer's real size check answers."""
    from flashinfer.comm.allreduce import TRTLLMAllReduceFusionWorkspace

    from sglang.srt.layers import flashinfer_comm_fusion as fcf

    def make(tokens):
        ws = TRTLLMAllReduceFusionWorkspace.__new__(TRTLLMAllReduceFusionWorkspace)
        ws.metadata = {"max_token_num": tokens, "tp_size": 8, "hidden_dim": HIDDEN, "use_fp32_lamport": False}
        ws._destroyed = True  # nothing was allocated, nothing to free
        manager = fcf._get_workspace_manager(True)
        vars(manager).update(
            workspace=ws,
            world_size=8,
            rank=0,
            group=(None, None),
            max_token_num=tokens,
            hidden_dim=HIDDEN,
            dtype=torch.bfloat16,
            backend="trtllm",
            use_fp32_lamport=False,
            initialized=True,
        )
        manager._configure_workspace_size_check()
        monkeypatch.setattr(fcf, "_flashinfer_allreduce_unavailable", False)
        monkeypatch.setattr(fcf, "_flashinfer_comm", SimpleNamespace())

    yield make
    vars(fcf._get_workspace_manager(True)).update(workspace=None, initialized=False)


@pytest.fixture
def coordinator(monkeypatch):
    """make(pcie_ipc=..., fi=True) -> (GroupCoordinator of TP8 on one PCIe node, list of routed calls).

    The real GroupCoordinator.all_reduce decides; only the collectives it dispatches to are recorded."""
    from sglang.srt.distributed import parallel_state as ps

    calls = []
    monkeypatch.setattr(ps, "flashinfer_allreduce", lambda t, group_name: calls.append("flashinfer") or t)
    monkeypatch.setattr(
        ps,
        "outplace_all_reduce",
        lambda t, group_name, outplace_all_reduce_method: calls.append(outplace_all_reduce_method) or t,
    )
    monkeypatch.setattr(ps, "inplace_all_reduce", lambda t, group_name: calls.append("nccl"))

    def make(pcie_ipc=None, fi=True):
        g = ps.GroupCoordinator.__new__(ps.GroupCoordinator)
        g.world_size, g.unique_name = 8, "tp:0"
        g.hpu_communicator = g.xpu_communicator = None
        g.ca_comm = g.qr_comm = g.pymscclpp_comm = g.torch_symm_mem_comm = g.pynccl_comm = None
        g.device_group = g.cpu_group = None
        g.is_symmetric_memory_enabled = lambda: False
        g._fi_workspace_hint = "attn_tp" if fi else None
        g.pcie_ipc_comm = pcie_ipc
        return g

    return make, calls


def rows(n, dtype=torch.bfloat16):
    return torch.empty((n, HIDDEN), dtype=dtype, device="meta")


def route(make, calls, n, **kw) -> str:
    calls.clear()
    make(**kw).all_reduce(rows(n))
    (taken,) = calls
    return taken


SM120_FUSION_CAP = 256  # SGLANG_SM120_ALLREDUCE_FUSION_MAX_TOKENS default: sizes the FlashInfer workspace
U = pytest.mark.unchanged


@U
def test_pcie_ipc_workspace_is_sized_from_the_profile(published_profile):
    """The shipped profile (16 running requests, decode graphs to bs 16, 4 draft tokens) gives a 64-row PCIe-IPC
    workspace: the widest verify batch, not the 192-row default of an unconfigured server."""
    max_rows = widest_decode_rows(published_profile)
    prepared_pcie_ipc(max_rows)
    assert max_rows == 64
    (ws,) = PcieIpcWorkspace.built
    assert ws.max_numel == 64 * HIDDEN and max(ws.tune_batches) == 64


@pytest.mark.parametrize(
    "n, fusion_on, want",
    [
        # decode and chain verify (bs x 4 draft tokens up to bs 16): PCIe-IPC ahead of FlashInfer's one-shot kernel
        (1, True, "pcie_ipc"),
        (4, True, "pcie_ipc"),
        (16, True, "pcie_ipc"),
        (64, True, "pcie_ipc"),
        # wider than the PCIe-IPC workspace: a short prefill or a draft-extend chunk keeps FlashInfer up to its cap...
        pytest.param(65, True, "flashinfer", marks=U),
        pytest.param(256, True, "flashinfer", marks=U),
        # ... and NCCL above it
        pytest.param(257, True, "nccl", marks=U),
        pytest.param(8192, True, "nccl", marks=U),
        # fusion off (the TP8 default): no FlashInfer workspace, PCIe-IPC up to 64 rows, NCCL above
        pytest.param(64, False, "pcie_ipc", marks=U),
        pytest.param(65, False, "nccl", marks=U),
        pytest.param(8192, False, "nccl", marks=U),
    ],
)
def test_pcie_ipc_routing_from_the_profile_sizes(published_profile, coordinator, fusion_workspace, n, fusion_on, want):
    """Which collective takes a plain TP all-reduce of n rows x 7168 bf16, with the workspaces sized as the patched
    server sizes them for the shipped profile on SM120."""
    make, calls = coordinator
    if fusion_on:
        fusion_workspace(SM120_FUSION_CAP)
    pcie_ipc = prepared_pcie_ipc(widest_decode_rows(published_profile))
    assert route(make, calls, n, pcie_ipc=pcie_ipc, fi=fusion_on) == want


@U
def test_pcie_ipc_absent_disabled_or_refusing_keeps_flashinfer(published_profile, coordinator, fusion_workspace):
    make, calls = coordinator
    fusion_workspace(SM120_FUSION_CAP)
    max_rows = widest_decode_rows(published_profile)
    assert route(make, calls, 8, pcie_ipc=None) == "flashinfer"
    assert route(make, calls, 8, pcie_ipc=prepared_pcie_ipc(max_rows, disabled=True)) == "flashinfer"
    calls.clear()
    make(pcie_ipc=prepared_pcie_ipc(max_rows)).all_reduce(rows(8, torch.float16))  # PCIe-IPC serves bf16 only
    assert calls == ["flashinfer"]


# ---------------------------------------------------------------------------------------------------------------
# Building the workspaces: every group decision taken together, the first prepare() wins


def test_pcie_ipc_short_of_memory_stays_off_with_a_reason(
    published_profile, coordinator, fusion_workspace, device_memory, caplog
):
    """A rank that cannot allocate the workspace (FlashInfer's cudaMalloc comes before its handle exchange) does
    not enter the build: the communicator is disabled, says why, and reductions keep the FlashInfer/NCCL route."""
    make, calls = coordinator
    fusion_workspace(SM120_FUSION_CAP)
    device_memory(1 << 20)
    with caplog.at_level(logging.WARNING):
        pcie_ipc = prepared_pcie_ipc(widest_decode_rows(published_profile))
    assert pcie_ipc.disabled and PcieIpcWorkspace.built == []
    assert any(
        "this rank (it has 1048576 bytes free" in r.getMessage() and "could not allocate it" in r.getMessage()
        for r in caplog.records
    )
    assert route(make, calls, 8, pcie_ipc=pcie_ipc) == "flashinfer"


def test_pcie_ipc_size_that_cannot_be_computed_is_no_refusal(published_profile, monkeypatch, caplog):
    """Where FlashInfer cannot compute the workspace size (no module for this GPU, as on a CPU runner), the
    free-memory check is skipped with a note, not turned into a silent "off": the constructor decides."""
    import flashinfer.comm.pcie_ipc_ar as fi_ar

    def no_module():
        raise RuntimeError("FlashInfer requires GPUs with sm75 or higher")

    monkeypatch.setattr(fi_ar, "get_pcie_ipc_comm_module", no_module)
    with caplog.at_level(logging.INFO):
        pcie_ipc = prepared_pcie_ipc(64)
    assert not pcie_ipc.disabled and pcie_ipc.max_numel == 64 * HIDDEN and len(PcieIpcWorkspace.built) == 1
    assert any("workspace size unknown" in r.getMessage() for r in caplog.records)


def test_pcie_ipc_prepare_resizes_a_workspace_built_before_it(published_profile):
    """A reduction before warmup builds the workspace from the configured decode max_bs (16 x 4 = 64 rows for the
    profile); the capture list can be narrower (here the request pool holds 8 requests, as when the KV pool is
    small: 32 rows), and the first prepare() rebuilds it to the captured width."""
    c = communicator()
    c.should_pcie_ipc_ar(rows(4))  # the lazy build: sized from the resolved decode config
    lazy = PcieIpcWorkspace.built[0]
    c.prepare(hidden=HIDDEN, max_rows=widest_decode_rows(published_profile, pool=8))
    assert lazy.max_numel == 64 * HIDDEN and lazy.destroyed
    assert c.max_numel == 32 * HIDDEN and [w.max_numel for w in PcieIpcWorkspace.built] == [lazy.max_numel, 32 * HIDDEN]
    assert not c.should_pcie_ipc_ar(rows(33)) and c.should_pcie_ipc_ar(rows(32))


def test_pcie_ipc_the_first_prepare_wins(published_profile):
    """The target's runner prepares first and captures its graphs with those workspaces; the draft's runner
    prepares next with its own width, rows and vocab shard (here a 4096-wide STANDALONE draft). Nothing the target's
    graphs captured is destroyed or replaced (FlashInfer: keep a workspace alive while a graph may replay it); the
    draft's wider reductions fall back by size."""
    c = communicator()
    c.prepare(hidden=HIDDEN, max_rows=64, gather_width=20480)
    target = list(PcieIpcWorkspace.built)
    c.prepare(hidden=4096, max_rows=16, gather_width=4000)
    assert [w.max_numel for w in target] == [64 * HIDDEN, 64 * 20480]
    assert PcieIpcWorkspace.built == target and not any(w.destroyed for w in target)
    assert c._workspace is target[0] and c._gather_workspace is target[1]


def test_pcie_ipc_tune_cache_save_failing_on_rank_0_is_no_hang():
    """Two CPU ranks: FlashInfer's tune() saves its cache on rank 0 between two device-group barriers; a save that
    fails there (for real: the cache path is under a regular file) is recorded, rank 0 reaches the second barrier,
    and both ranks keep PCIe IPC with the measured tactics."""
    assert _gloo.run("tune_cache_save_fails", timeout=400) == [{"disabled": False, "barrier_broken": []}] * 2


def test_pcie_ipc_logs_each_ranks_numa_node_and_warns_on_a_split_island(
    published_profile, monkeypatch, tmp_path, caplog
):
    """On a two-NUMA 8-GPU host the first build logs each rank's GPU and NUMA node (from CUDA's PCI address and
    sysfs) and warns for an island of the 8-rank schedule (ranks 0-3, 4-7) on both nodes. The host-group
    collectives are stood in by what 8 ranks would exchange: each rank's answer from the same code."""
    import torch.distributed as dist

    from sglang.srt.distributed.device_communicators import pcie_ipc_ar

    nodes = [0, 0, 0, 1, 1, 1, 1, 1]  # GPU 3 sits on the other node: ranks 0-3 span both
    for bus, node in zip(BUS, nodes):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "numa_node").write_text(f"{node}\n")
    monkeypatch.setattr(pcie_ipc_ar, "_SYSFS_PCI_DEVICES", str(tmp_path))
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda d: SimpleNamespace(
            pci_domain_id=0, pci_bus_id=int(BUS[d.index or 0].split(":")[1], 16), pci_device_id=0
        ),
    )
    monkeypatch.setattr(dist, "all_reduce", lambda flag, op, group: None)  # every rank agrees
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(
        dist,
        "all_gather_object",
        lambda out, obj, group: out.__setitem__(
            slice(None), [pcie_ipc_ar._gpu_placement(torch.device("cuda", r)) for r in range(8)]
        ),
    )
    monkeypatch.setenv("FLASHINFER_AUTOTUNE_DIR", str(tmp_path / "tune"))
    c = communicator(_cpu_group="host-group", _tune=lambda hidden: None)
    with caplog.at_level(logging.INFO):
        c.prepare(hidden=HIDDEN, max_rows=64)
    (ranks,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("FlashInfer PCIe-IPC ranks")]
    for rank, (bus, node) in enumerate(zip(BUS, nodes)):
        assert f"rank {rank}: GPU {bus} NUMA {node}" in ranks
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split(" span")[0] for w in warned] == ["TP ranks 0-3"] and "CUDA_VISIBLE_DEVICES" in warned[0]


# ---------------------------------------------------------------------------------------------------------------
# Timed at start: each decode size goes to the backend that times fastest, PCIe IPC only by SGLANG_PCIE_IPC_MIN_SPEEDUP


def crossing(backend, n):
    """Microseconds per all-reduce of n rows: PCIe IPC faster at small sizes and slower at large; FlashInfer's
    one-shot kernel (where the fusion is on) the fastest at 32 rows only."""
    return {"pcie_ipc": 5 + 0.5 * n, "nccl": 20 + 0.1 * n, "flashinfer": 22.0 if n == 32 else 50.0}[backend]


@pytest.fixture
def timed(monkeypatch):
    """timed(us) -> calls: pcie_ipc_ar._time_backends (the one function that measures, on GPUs) answers us(backend,
    rows); calls lists the row counts of each call. No decision recorded yet."""
    from sglang.srt.distributed.device_communicators import pcie_ipc_ar

    calls = []

    def install(us):
        monkeypatch.setattr(
            pcie_ipc_ar,
            "_time_backends",
            lambda comm, tp, hidden, rows, backends: calls.append(rows) or [[us(b, n) for b in backends] for n in rows],
            raising=False,
        )
        return calls

    monkeypatch.setattr(pcie_ipc_ar, "_decision", {}, raising=False)
    return install


@pytest.mark.parametrize("fusion_on", [False, True])
def test_allreduce_timing_routes_each_size_to_its_fastest(
    published_profile, coordinator, fusion_workspace, timed, caplog, fusion_on
):
    """Prepared as the model runner prepares it (the profile's 64-row workspace, the TP group's coordinator), each
    tuned row count is timed and GroupCoordinator.all_reduce routes by the table: PCIe IPC up to 16 rows (>= 1.2x
    faster), NCCL where it is within 1.2x (32 rows) or faster (64), FlashInfer's kernel where it is the fastest
    (32 rows, fusion on; at 64 rows NCCL wins even though FlashInfer's path would take the tensor). A size between
    two timed ones takes the wider one's backend; wider than the table, the route is as before."""
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import allreduce_backends

    make, calls = coordinator
    if fusion_on:
        fusion_workspace(SM120_FUSION_CAP)
    timings = timed(crossing)
    pcie_ipc = communicator()
    with caplog.at_level(logging.INFO):
        pcie_ipc.prepare(
            hidden=HIDDEN,
            max_rows=widest_decode_rows(published_profile),
            coordinator=make(pcie_ipc=pcie_ipc, fi=fusion_on),
        )
    assert timings == [(1, 2, 4, 8, 16, 32, 64)]
    mid = "flashinfer" if fusion_on else "nccl"
    assert [s["backend"] for s in allreduce_backends()["sizes"]] == ["pcie_ipc"] * 5 + [mid, "nccl"]
    for n, want in ((1, "pcie_ipc"), (3, "pcie_ipc"), (16, "pcie_ipc"), (17, mid), (32, mid), (64, "nccl"), (65, mid)):
        assert route(make, calls, n, pcie_ipc=pcie_ipc, fi=fusion_on) == want, n
        assert pcie_ipc.should_pcie_ipc_ar(rows(n)) is (want == "pcie_ipc")
    (table,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("All-reduce backend per")]
    assert "timed at start in CUDA graphs" in table and "SGLANG_PCIE_IPC_MIN_SPEEDUP=1.2x" in table
    assert "pcie_ipc   PCIe IPC 5.5 us vs NCCL 20.1 us, wins 3.7x >= 1.2x" in table
    assert "nccl       NCCL faster: PCIe IPC 37.0 us vs NCCL 26.4 us" in table
    assert (
        "flashinfer FlashInfer within 1.2x: PCIe IPC 21.0 us vs FlashInfer 22.0 us"
        if fusion_on
        else "nccl       NCCL within 1.2x: PCIe IPC 21.0 us vs NCCL 23.2 us"
    ) in table


def test_allreduce_timing_in_server_info(published_profile, coordinator, timed):
    """GET /server_info returns internal_states[0] from get_internal_state: allreduce_backends holds the table."""
    import json

    from sglang.srt.managers.scheduler_components.internal_state import SchedulerInternalStateController

    make, _ = coordinator
    timed(crossing)
    pcie_ipc = communicator()
    pcie_ipc.prepare(hidden=HIDDEN, max_rows=64, coordinator=make(pcie_ipc=pcie_ipc, fi=False))
    state = {}
    SchedulerInternalStateController(SimpleNamespace(), record_step_time=False)._add_allreduce_backends(state)
    info = json.loads(json.dumps(state))["allreduce_backends"]
    assert info["source"] == "measured" and info["margin"] == 1.2 and info["why"].startswith("timed at start")
    assert [s["rows"] for s in info["sizes"]] == [1, 2, 4, 8, 16, 32, 64]
    assert info["sizes"][0] == {
        "rows": 1,
        "bytes": 2 * HIDDEN,
        "us": {"pcie_ipc": 5.5, "nccl": 20.1},
        "backend": "pcie_ipc",
        "why": "PCIe IPC 5.5 us vs NCCL 20.1 us, wins 3.7x >= 1.2x",
    }


@pytest.mark.parametrize(
    "setting",
    [
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1",
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0",
        "--disable-custom-all-reduce",
        "SGLANG_PCIE_IPC_MIN_SPEEDUP=4",
    ],
)
def test_allreduce_timing_a_user_setting_wins(published, monkeypatch, timed, caplog, setting):
    """=1 keeps every size on PCIe IPC untimed; =0 and --disable-custom-all-reduce keep it off, untimed, and say so
    in the log and /server_info; a margin the user set is the one applied (here no size wins by 4x)."""
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import allreduce_backends

    nvml(monkeypatch)
    calls = timed(crossing)
    if setting.startswith("SGLANG_"):
        monkeypatch.setenv(*setting.split("="))
    with caplog.at_level(logging.INFO):
        on = eligible(custom_allreduce=setting != "--disable-custom-all-reduce")
        if on:
            pcie_ipc = communicator()
            pcie_ipc.prepare(hidden=HIDDEN, max_rows=64, coordinator=SimpleNamespace(pynccl_comm=None))
    info, log = allreduce_backends(), [r.getMessage() for r in caplog.records]
    if setting.endswith("=1"):
        assert on and calls == [] and info["source"] == "forced" and pcie_ipc.should_pcie_ipc_ar(rows(64))
        assert {s["backend"] for s in info["sizes"]} == {"pcie_ipc"} and any("=1 is set: untimed" in m for m in log)
    elif setting.endswith("=4"):
        assert on and len(calls) == 1 and info["margin"] == 4.0 and not pcie_ipc.should_pcie_ipc_ar(rows(1))
        assert {s["backend"] for s in info["sizes"]} == {"nccl"}
    else:
        assert not on and calls == [] and info["source"] == "off" and info["sizes"] == []
        assert info["why"] == f"{setting} is set" and f"FlashInfer PCIe-IPC all-reduce off: {setting} is set." in log


CHANGES = [
    "NCCL_P2P_LEVEL=SYS",
    "NCCL_PROTO=Simple",
    "NCCL_CONF_FILE edited",
    "~/.nccl.conf written",
    "kernels untuned",
    "FlashInfer takes fewer sizes",
    "another SGLang",
]


@pytest.mark.parametrize("change", CHANGES)
def test_allreduce_timing_cache_is_keyed_on_every_input_of_the_measurement(
    published_profile, coordinator, timed, fusion_workspace, monkeypatch, tmp_path, change
):
    """A second start on the same box reads the table the first one timed (FlashInfer's real store, NVML faked); a
    start that changed anything the timing depended on times again: NCCL's environment or a config file it reads,
    whether the PCIe-IPC kernels run measured tactics, the sizes FlashInfer's kernel can take, SGLang's version."""
    import sglang.version
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import PcieIpcCommunicator, allreduce_backends

    nvml(monkeypatch)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device: SimpleNamespace(pci_domain_id=0, pci_bus_id=1, pci_device_id=0),
    )
    for k in [k for k in os.environ if k.startswith("NCCL_")]:
        monkeypatch.delenv(k)
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_PROTO=LL\n")
    monkeypatch.setenv("NCCL_CONF_FILE", str(conf))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("FLASHINFER_AUTOTUNE_DIR", str(tmp_path / "autotune"))
    tuned = {"now": True}
    monkeypatch.setattr(PcieIpcCommunicator, "_tune", lambda self, hidden: tuned["now"])
    make, _ = coordinator
    fusion_workspace(SM120_FUSION_CAP)
    calls = timed(crossing)

    def start() -> str:
        c = communicator()
        c.prepare(hidden=HIDDEN, max_rows=64, coordinator=make(pcie_ipc=c, fi=True))
        return allreduce_backends()["source"]

    assert [start(), start()] == ["measured", "cache"] and len(calls) == 1
    if "=" in change:
        monkeypatch.setenv(*change.split("="))
    elif change == "NCCL_CONF_FILE edited":
        conf.write_text("NCCL_PROTO=Simple\n")
    elif change == "~/.nccl.conf written":
        (tmp_path / ".nccl.conf").write_text("NCCL_P2P_LEVEL=SYS\n")
    elif change == "kernels untuned":
        tuned["now"] = None
    elif change == "FlashInfer takes fewer sizes":
        fusion_workspace(16)
    else:
        monkeypatch.setattr(sglang.version, "__version__", "0.5.24")
    assert start() == "measured" and len(calls) == 2


@pytest.fixture(scope="module")
def timing_starts(tmp_path_factory):
    """Four starts on two CPU ranks over gloo (tests/patches/_gloo.py allreduce_timing): per rank, per start."""
    return _gloo.run("allreduce_timing", timeout=400, cache_dir=str(tmp_path_factory.mktemp("autotune")))


TABLE = ["pcie_ipc", "pcie_ipc", "nccl", "nccl"]  # the MAX of both ranks' times at 1, 2, 4 and 8 rows


def test_allreduce_timing_is_one_group_decision(timing_starts):
    """Each rank's own times would route 1, 4 or 8 rows differently: the group reduces them with MAX on the host
    group and both ranks route by the same table."""
    assert [r["differ"] for r in timing_starts] == [
        {"timed": 1, "disabled": False, "source": "measured", "table": TABLE}
    ] * 2


def test_allreduce_timing_second_start_reads_the_cache(timing_starts):
    """The first rank reads the cache for the group: a second start on the same box times nothing and routes alike;
    another driver is another box, timed again."""
    assert [r["cached"] for r in timing_starts] == [
        {"timed": 0, "disabled": False, "source": "cache", "table": TABLE}
    ] * 2
    assert [r["new_driver"]["timed"] for r in timing_starts] == [1, 1]


def test_allreduce_timing_failing_on_one_rank_turns_it_off_everywhere(timing_starts):
    """Rank 1 cannot time: both ranks turn PCIe IPC off (reductions keep NCCL), and neither is left waiting."""
    assert [r["fails"] for r in timing_starts] == [
        {"timed": 1, "disabled": True, "source": "off", "table": [None] * 4}
    ] * 2
