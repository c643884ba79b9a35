"""PCIe-only defaults: NCCL variables and the PCIe-IPC all-reduce set by the launcher, and the all-reduce routing.

The launcher tests run the real `_set_envs_and_config` (entrypoints/engine.py) on resolved Kimi-K2.5 TP8 server
arguments, with NVML faked through the pynvml functions SGLang calls; multiprocessing.set_start_method,
signal.signal and set_ulimit are stubbed, and the environment is restored after each test. The routing tests call
the real `GroupCoordinator.all_reduce` on a coordinator built with __new__, with meta tensors (not CPU, so the
GPU path is taken) and the real `PcieIpcCommunicator.should_pcie_ipc_ar` over a fake FlashInfer workspace.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

from _sgl import platform, server_args

REPO = Path(__file__).resolve().parents[2]
ENV_FILE = REPO / "docker" / "pcie-nccl.env"
HIDDEN = 7168  # Kimi-K2.5 / DeepSeek-V3
DECODE_ROWS = 48 * 4  # max_bs x draft tokens: the decode-sized PCIe-IPC workspace
# Variables the launcher may touch for these tests; cleared before each run so the host's environment
# cannot leak in, and put back afterwards.
WATCHED = ("CUDA_VISIBLE_DEVICES", "SGLANG_PCIE_NCCL_DEFAULTS", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE",
           "SGLANG_ENABLE_DETERMINISTIC_INFERENCE", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_PROTO",
           "NCCL_ALGO", "NCCL_P2P_LEVEL", "NCCL_IB_DISABLE", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE",
           "NCCL_GRAPH_MIXING_SUPPORT")
# What upstream's launcher itself sets among NCCL_* on one node without symm-mem/DCP (engine.py:1898-1915).
UPSTREAM_NCCL = {"NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE"}
LOGGER = "sglang.srt.entrypoints.pcie_defaults"


@pytest.fixture(scope="module")
def kimi_tp8():
    return server_args(12)


@pytest.fixture(scope="module")
def kimi_tp1():
    return server_args(12, tp=1)


@pytest.fixture(scope="module")
def kimi_two_nodes():
    return server_args(12, nnodes=2)


def env_file_values() -> dict[str, str]:
    """The NCCL defaults as `python -m scripts.host.pcie_env` prints them: read with ast from the tree under test."""
    import sglang
    from scripts.host.pcie import read_defaults

    return read_defaults(Path(sglang.__file__).parent)


class FakeNvml:
    """The pynvml calls SGLang makes, answering for `count` GPUs; `nvlink` holds the NVLink-joined index pairs."""

    def __init__(self, monkeypatch, count=8, nvlink=(), fail=None, pair_error=None):
        import pynvml

        self.pynvml, self.count, self.fail, self.pair_error = pynvml, count, fail, pair_error
        self.nvlink = {frozenset(p) for p in nvlink}
        self.queried: set[int] = set()
        self.inits = 0
        for name in ("nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
                     "nvmlDeviceGetP2PStatus"):
            monkeypatch.setattr(pynvml, name, getattr(self, name))

    def nvmlInit(self):
        self.inits += 1
        if self.fail == "init":
            raise self.pynvml.NVMLError(self.pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < self.count:
            raise self.pynvml.NVMLError(self.pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self.queried.add(i)
        return ("gpu", i)

    def nvmlDeviceGetP2PStatus(self, a, b, index):
        assert index == self.pynvml.NVML_P2P_CAPS_INDEX_NVLINK
        if self.pair_error is not None:
            raise self.pynvml.NVMLError(self.pair_error)
        if frozenset((a[1], b[1])) in self.nvlink:
            return self.pynvml.NVML_P2P_STATUS_OK
        return self.pynvml.NVML_P2P_STATUS_NOT_SUPPORTED


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
    caplog.set_level(logging.INFO, logger=LOGGER)
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


def pcie_log(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def pcie_ipc_on() -> bool:
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import eligible_group

    return eligible_group(group_name="tp", world_size=8, deterministic=False)


# ---------------------------------------------------------------------------------------------------------------
# NCCL defaults


def test_pcie_nccl_defaults_applied_without_nvlink(launch, kimi_tp8, monkeypatch, caplog):
    FakeNvml(monkeypatch)
    changed = launch(kimi_tp8)
    assert env_file_values(), "docker/pcie-nccl.env holds no variable"
    for k, v in env_file_values().items():
        assert changed.get(k) == v, k
    assert not ({"NCCL_PROTO", "NCCL_ALGO", "NCCL_P2P_LEVEL", "NCCL_IB_DISABLE", "NCCL_MAX_NCHANNELS"} & set(changed))
    applied = [m for m in pcie_log(caplog) if "NCCL defaults for PCIe applied" in m]
    assert len(applied) == 1 and "NCCL_MIN_NCHANNELS" in applied[0]


def test_pcie_nccl_launcher_applies_exactly_the_env_file(launch, kimi_tp8, monkeypatch):
    from sglang.srt.entrypoints.pcie_defaults import _PCIE_NCCL_DEFAULTS

    FakeNvml(monkeypatch)
    changed = launch(kimi_tp8)
    assert env_file_values() == _PCIE_NCCL_DEFAULTS
    assert {k: changed[k] for k in _PCIE_NCCL_DEFAULTS} == env_file_values()


def test_pcie_nccl_defaults_keep_user_values(launch, kimi_tp8, monkeypatch, caplog):
    from sglang.srt.entrypoints.pcie_defaults import _PCIE_NCCL_DEFAULTS

    FakeNvml(monkeypatch)
    user = {k: f"{v}-user" for k, v in _PCIE_NCCL_DEFAULTS.items()}
    launch(kimi_tp8, **user)
    assert {k: os.environ[k] for k in user} == user
    (line,) = [m for m in pcie_log(caplog) if "NCCL defaults for PCIe applied" in m]
    assert "kept" in line and all(k in line for k in user)


def test_pcie_nccl_defaults_opt_out(launch, kimi_tp8, monkeypatch, caplog):
    from sglang.srt.environ import envs

    FakeNvml(monkeypatch)
    changed = launch(kimi_tp8, SGLANG_PCIE_NCCL_DEFAULTS="0")
    assert envs.SGLANG_PCIE_NCCL_DEFAULTS.get() is False
    assert not (set(env_file_values()) & set(changed))
    assert any("SGLANG_PCIE_NCCL_DEFAULTS=0" in m for m in pcie_log(caplog))


def test_pcie_nccl_notsupported_pair_counts_as_no_nvlink(launch, kimi_tp8, monkeypatch):
    import pynvml

    FakeNvml(monkeypatch, pair_error=pynvml.NVML_ERROR_NOT_SUPPORTED)
    changed = launch(kimi_tp8)
    assert set(env_file_values()) <= set(changed)


def test_pcie_nccl_maps_cuda_visible_devices_to_nvml(launch, kimi_tp8, monkeypatch):
    # GPUs 0-1 share NVLink, but this server sees 4-7 only: PCIe-only for it.
    nvml = FakeNvml(monkeypatch, nvlink=[(0, 1)])
    changed = launch(kimi_tp8, CUDA_VISIBLE_DEVICES="4,5,6,7")
    assert nvml.queried == {4, 5, 6, 7}
    assert set(env_file_values()) <= set(changed)


@pytest.mark.parametrize("failure", ["init", "pair", "import", "uuid"])
def test_pcie_nccl_unknown_topology_changes_nothing_and_says_so(launch, kimi_tp8, monkeypatch, caplog, failure):
    import pynvml

    env = {}
    if failure == "init":
        FakeNvml(monkeypatch, fail="init")
    elif failure == "pair":
        FakeNvml(monkeypatch, pair_error=pynvml.NVML_ERROR_UNKNOWN)
    elif failure == "import":
        monkeypatch.setitem(sys.modules, "pynvml", None)
    else:  # UUIDs cannot be mapped the way custom all-reduce maps ordinals
        FakeNvml(monkeypatch)
        env["CUDA_VISIBLE_DEVICES"] = "GPU-0e1f,GPU-2a3b"
    changed = launch(kimi_tp8, **env)
    assert {k for k in changed if k.startswith("NCCL_")} <= UPSTREAM_NCCL
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in changed
    assert len([m for m in pcie_log(caplog) if "topology unknown" in m]) == 1


@pytest.mark.unchanged
def test_pcie_nccl_nvlink_host_unchanged(launch, kimi_tp8, monkeypatch):
    FakeNvml(monkeypatch, nvlink=[(0, 1)])
    changed = launch(kimi_tp8)
    assert {k for k in changed if k.startswith("NCCL_")} <= UPSTREAM_NCCL
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in changed


@pytest.mark.unchanged
@pytest.mark.parametrize("shape", ["tp1", "two_nodes"])
def test_pcie_nccl_single_node_tp_only(launch, request, monkeypatch, shape):
    nvml = FakeNvml(monkeypatch)
    sa = request.getfixturevalue("kimi_tp1" if shape == "tp1" else "kimi_two_nodes")
    changed = launch(sa)
    assert {k for k in changed if k.startswith("NCCL_")} <= UPSTREAM_NCCL | {"NCCL_MNNVL_ENABLE"}
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in changed
    assert nvml.inits == 0


# ---------------------------------------------------------------------------------------------------------------
# PCIe-IPC all-reduce on by default on PCIe-only SM120


def test_pcie_ipc_allreduce_default_on_pcie_only_sm120(launch, kimi_tp8, monkeypatch, caplog):
    FakeNvml(monkeypatch)
    launch(kimi_tp8)
    assert pcie_ipc_on()
    assert any("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0" in m for m in pcie_log(caplog))


def test_pcie_ipc_allreduce_default_is_independent_of_the_nccl_opt_out(launch, kimi_tp8, monkeypatch):
    FakeNvml(monkeypatch)
    changed = launch(kimi_tp8, SGLANG_PCIE_NCCL_DEFAULTS="0")
    assert "NCCL_MIN_NCHANNELS" not in changed
    assert pcie_ipc_on()


@pytest.mark.parametrize("value, on", [
    pytest.param("0", False, marks=pytest.mark.unchanged, id="opt-out"),
    pytest.param("1", True, marks=pytest.mark.unchanged, id="explicit-on"),
])
def test_pcie_ipc_allreduce_explicit_value_wins(launch, kimi_tp8, monkeypatch, value, on):
    FakeNvml(monkeypatch)
    launch(kimi_tp8, SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=value)
    assert os.environ["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == value
    assert pcie_ipc_on() is on


def test_pcie_ipc_allreduce_default_needs_sm120_but_nccl_defaults_do_not(launch, kimi_tp8, monkeypatch):
    # A PCIe-only Hopper host (H100 PCIe): NCCL defaults yes, PCIe-IPC stays upstream's opt-in.
    FakeNvml(monkeypatch)
    changed = launch(kimi_tp8, major=9)
    assert set(env_file_values()) <= set(changed)
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in changed and not pcie_ipc_on()


@pytest.mark.unchanged
def test_pcie_ipc_allreduce_stays_off_on_nvlink_sm120(launch, kimi_tp8, monkeypatch):
    FakeNvml(monkeypatch, nvlink=[(2, 5)])
    launch(kimi_tp8)
    assert not pcie_ipc_on()


# ---------------------------------------------------------------------------------------------------------------
# Routing in GroupCoordinator.all_reduce


class FakeWorkspace:
    def supports(self, t):
        return True


def pcie_ipc_comm(disabled=False, max_rows=DECODE_ROWS):
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import PcieIpcCommunicator

    c = PcieIpcCommunicator.__new__(PcieIpcCommunicator)
    c.disabled, c.max_numel, c._workspace, c._build_failed = disabled, max_rows * HIDDEN, FakeWorkspace(), False
    return c


@pytest.fixture
def coordinator(monkeypatch):
    """make(pcie_ipc=..., fi=True) -> (GroupCoordinator of TP8 on one PCIe node, list of routed calls)."""
    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.layers import flashinfer_comm_fusion as fcf

    calls = []
    monkeypatch.setattr(ps, "flashinfer_allreduce", lambda t, group_name: calls.append("flashinfer") or t)
    monkeypatch.setattr(ps, "outplace_all_reduce",
                        lambda t, group_name, outplace_all_reduce_method: calls.append(outplace_all_reduce_method) or t)
    monkeypatch.setattr(ps, "inplace_all_reduce", lambda t, group_name: calls.append("nccl"))
    # FlashInfer's allreduce-only workspace exists and fits (fusion on): upstream sends plain reductions there.
    monkeypatch.setattr(fcf, "can_use_flashinfer_allreduce", lambda *a, **k: True)

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


@pytest.mark.parametrize("n", [1, 8, DECODE_ROWS])
def test_pcie_ipc_takes_decode_allreduce_before_flashinfer(coordinator, n):
    make, calls = coordinator
    make(pcie_ipc=pcie_ipc_comm()).all_reduce(rows(n))
    assert calls == ["pcie_ipc"]


@pytest.mark.unchanged
def test_pcie_ipc_prefill_allreduce_keeps_upstream_route(coordinator):
    make, calls = coordinator
    make(pcie_ipc=pcie_ipc_comm()).all_reduce(rows(DECODE_ROWS + 1))  # wider than the decode workspace
    make(pcie_ipc=pcie_ipc_comm()).all_reduce(rows(8192))
    make(pcie_ipc=pcie_ipc_comm(), fi=False).all_reduce(rows(8192))
    assert calls == ["flashinfer", "flashinfer", "nccl"]


@pytest.mark.unchanged
def test_pcie_ipc_absent_disabled_or_refusing_keeps_flashinfer(coordinator):
    make, calls = coordinator
    make(pcie_ipc=None).all_reduce(rows(8))
    make(pcie_ipc=pcie_ipc_comm(disabled=True)).all_reduce(rows(8))
    make(pcie_ipc=pcie_ipc_comm()).all_reduce(rows(8, torch.float16))  # PCIe-IPC serves bf16 only
    assert calls == ["flashinfer"] * 3


@pytest.mark.unchanged
def test_pcie_ipc_without_flashinfer_keeps_upstream_route(coordinator):
    make, calls = coordinator
    make(pcie_ipc=pcie_ipc_comm(), fi=False).all_reduce(rows(8))
    assert calls == ["pcie_ipc"]
