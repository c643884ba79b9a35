"""PCIe-only defaults: NCCL variables and the PCIe-IPC all-reduce set by the launcher, and the all-reduce routing.

The launcher tests run the real `_set_envs_and_config` (entrypoints/engine.py) on resolved Kimi-K2.5 TP8 server
arguments, with NVML faked through the pynvml functions SGLang calls; multiprocessing.set_start_method,
signal.signal and set_ulimit are stubbed, and the environment is restored after each test. The routing tests call
the real `GroupCoordinator.all_reduce` on a coordinator built with __new__, with meta tensors (not CPU, so the
GPU path is taken) and the real `PcieIpcCommunicator.should_pcie_ipc_ar` over a fake FlashInfer workspace.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from _fake_nvml import BUS, FakeNvml
from _sgl import platform, server_args

REPO = Path(__file__).resolve().parents[2]
HIDDEN = 7168  # Kimi-K2.5 / DeepSeek-V3
DECODE_ROWS = 48 * 4  # max_bs x draft tokens: the decode-sized PCIe-IPC workspace
# Variables the launcher may touch for these tests; cleared before each run so the host's environment
# cannot leak in, and put back afterwards.
WATCHED = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NCCL_MAX_CTAS", "NCCL_MIN_CTAS", "NCCL_MAX_NRINGS",
           "NCCL_MIN_NRINGS", "SGLANG_PCIE_NCCL_DEFAULTS", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE",
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
    """What the patched launcher sets on a PCIe-only host in a clean environment (its own nccl_defaults)."""
    from sglang.srt.entrypoints.pcie_defaults import nccl_defaults

    return nccl_defaults({})[0]


def all_pairs(indices) -> set:
    return {frozenset(p) for p in itertools.combinations(indices, 2)}


@pytest.fixture
def numa(tmp_path, monkeypatch):
    """numa(nodes): sysfs numa_node files for BUS (one node per GPU), read by the launcher instead of /sys."""
    from sglang.srt.entrypoints import pcie_defaults

    def make(nodes):
        for bus, node in zip(BUS, nodes):
            (tmp_path / bus).mkdir(exist_ok=True)
            (tmp_path / bus / "numa_node").write_text(f"{node}\n")

    monkeypatch.setattr(pcie_defaults, "_SYSFS_PCI_DEVICES", str(tmp_path))
    return make


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
    assert env_file_values() == {"NCCL_MIN_NCHANNELS": "8"}
    for k, v in env_file_values().items():
        assert changed.get(k) == v, k
    assert not ({"NCCL_PROTO", "NCCL_ALGO", "NCCL_P2P_LEVEL", "NCCL_IB_DISABLE", "NCCL_MAX_NCHANNELS"} & set(changed))
    applied = [m for m in pcie_log(caplog) if "NCCL defaults for PCIe applied" in m]
    assert len(applied) == 1 and "NCCL_MIN_NCHANNELS" in applied[0]


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
    changed = launch(server_args(12, tp=4), CUDA_VISIBLE_DEVICES="4,5,6,7", CUDA_DEVICE_ORDER="PCI_BUS_ID")
    assert nvml.pairs == all_pairs([4, 5, 6, 7])
    assert set(env_file_values()) <= set(changed)


@pytest.mark.parametrize("kw, gpus, pcie_only", [
    (dict(), [0, 1, 2, 3], True),                       # GPUs 0-3: no NVLink among them
    (dict(base_gpu_id=4), [4, 5, 6, 7], False),         # GPUs 4-7 include the NVLink pair 6-7
    (dict(gpu_id_step=2), [0, 2, 4, 6], True),          # every other GPU: 6 without its NVLink peer 7
    (dict(base_gpu_id=1, gpu_id_step=2), [1, 3, 5, 7], True),
])
def test_pcie_nccl_probes_exactly_the_tp_group(launch, monkeypatch, kw, gpus, pcie_only):
    """A TP4 server on an 8-GPU host where only GPUs 6 and 7 share an NVLink bridge: the probe covers the GPUs
    the engine will place the TP ranks on (--base-gpu-id, --gpu-id-step, --tp-size), nothing else."""
    nvml = FakeNvml(monkeypatch, nvlink=[(6, 7)])
    changed = launch(server_args(12, tp=4, **kw), CUDA_DEVICE_ORDER="PCI_BUS_ID")
    assert nvml.pairs == all_pairs(gpus)
    assert (set(env_file_values()) <= set(changed)) is pcie_only
    assert ("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" in changed) is pcie_only


# NVML enumerates the GPUs in another order than PCI bus order (index 0 is the GPU on the highest bus).
SCRAMBLED = list(reversed(BUS))


def test_pcie_nccl_maps_cuda_ordinals_in_pci_bus_order(launch, monkeypatch):
    """CUDA numbers GPUs in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID, or identical GPUs); NVML indices carry
    no order. CUDA GPUs 0-1 are the two lowest buses (NVML 7 and 6), not NVML indices 0-1 (joined by NVLink)."""
    nvml = FakeNvml(monkeypatch, nvlink=[(0, 1)], buses=SCRAMBLED)
    changed = launch(server_args(12, tp=2), CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES="0,1")
    assert nvml.pairs == {frozenset((7, 6))}
    assert set(env_file_values()) <= set(changed)


def test_pcie_nccl_maps_cuda_visible_devices_uuids(launch, monkeypatch):
    """GPU UUIDs (unique prefixes, as CUDA accepts them) are matched against NVML's UUIDs."""
    nvml = FakeNvml(monkeypatch, nvlink=[(0, 1)])
    uuids = ",".join(FakeNvml.uuid(i)[:8] for i in (5, 2))
    changed = launch(server_args(12, tp=2), CUDA_VISIBLE_DEVICES=uuids)
    assert nvml.pairs == {frozenset((5, 2))}
    assert set(env_file_values()) <= set(changed)


def test_pcie_nccl_mixed_gpus_need_pci_bus_order(launch, monkeypatch, caplog):
    """With different GPU models CUDA's default order puts the fastest first: CUDA ordinals cannot be mapped to
    PCI devices without CUDA_DEVICE_ORDER=PCI_BUS_ID, so the topology is unknown and nothing is set."""
    names = ["NVIDIA RTX PRO 6000 Blackwell Server Edition"] * 6 + ["NVIDIA RTX 5090"] * 2
    FakeNvml(monkeypatch, names=names)
    changed = launch(server_args(12, tp=2))
    assert not (set(env_file_values()) & set(changed))
    (line,) = [m for m in pcie_log(caplog) if "topology unknown" in m]
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in line


def test_pcie_nccl_fastest_first_subset_is_unknown(launch, monkeypatch, caplog):
    """CUDA's default order (FASTEST_FIRST) leaves the order of GPUs unspecified (CUDA Programming Guide, "CUDA
    Environment Variables"), so CUDA ordinals that pick a subset cannot be matched to NVML devices: the topology of
    a TP4 group on an 8-GPU host is unknown without CUDA_DEVICE_ORDER=PCI_BUS_ID, and nothing is set."""
    FakeNvml(monkeypatch)
    changed = launch(server_args(12, tp=4))
    assert not (set(env_file_values()) & set(changed)) and "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in changed
    (line,) = [m for m in pcie_log(caplog) if "topology unknown" in m]
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in line


def test_pcie_nccl_fastest_first_all_gpus_decides_without_a_rank_map(launch, kimi_tp8, monkeypatch, caplog, numa):
    """A TP8 group on all 8 GPUs: whatever CUDA's order, the group's set of GPUs is known, so the NVLink question
    is answered; which GPU (and NUMA node) each rank gets is not, so no rank map and no island warning, and the log
    names the fix."""
    numa([0, 1, 0, 1, 0, 1, 0, 1])
    FakeNvml(monkeypatch)
    changed = launch(kimi_tp8)
    assert set(env_file_values()) <= set(changed)
    log = pcie_log(caplog)
    assert not [m for m in log if m.startswith("PCIe-only TP group")]
    assert not [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert any("Rank -> NUMA map not logged" in m and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in m for m in log)


@pytest.mark.parametrize("nodes, warned", [([0, 0, 0, 0, 1, 1, 1, 1], []),
                                           ([0, 1, 0, 1, 0, 1, 0, 1], ["0-3", "4-7"]),
                                           ([0, 0, 0, 1, 1, 1, 1, 1], ["0-3"])])
def test_pcie_nccl_logs_rank_numa_map_and_warns_on_split_islands(launch, kimi_tp8, monkeypatch, caplog, numa,
                                                                 nodes, warned):
    """On a two-NUMA 8-GPU host the launcher logs which NUMA node each TP rank's GPU sits on, and warns when a
    PCIe-IPC island (ranks 0-3, 4-7) spans both nodes."""
    numa(nodes)
    FakeNvml(monkeypatch)
    launch(kimi_tp8, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    (rank_map,) = [m for m in pcie_log(caplog) if m.startswith("PCIe-only TP group")]
    for rank, (bus, node) in enumerate(zip(BUS, nodes)):
        assert f"rank {rank}: GPU {rank} {bus} NUMA {node}" in rank_map
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert [w.split("TP ranks ")[1].split(" ")[0] for w in warnings] == warned
    assert all("CUDA_VISIBLE_DEVICES" in w for w in warnings)


@pytest.mark.parametrize("failure", ["init", "pair", "import", "mig", "too_few"])
def test_pcie_nccl_unknown_topology_changes_nothing_and_says_so(launch, kimi_tp8, monkeypatch, caplog, failure):
    import pynvml

    env = {}
    if failure == "init":
        FakeNvml(monkeypatch, init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    elif failure == "pair":
        FakeNvml(monkeypatch, pair_error=pynvml.NVML_ERROR_UNKNOWN)
    elif failure == "import":
        monkeypatch.setitem(sys.modules, "pynvml", None)
    elif failure == "mig":
        FakeNvml(monkeypatch)
        env["CUDA_VISIBLE_DEVICES"] = "MIG-0e1f2a3b-4c5d-6e7f-8091-a2b3c4d5e6f7"
    else:  # the TP8 group needs 8 GPUs, 4 are visible
        FakeNvml(monkeypatch)
        env["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"
    changed = launch(kimi_tp8, **env)
    assert {k for k in changed if k.startswith("NCCL_")} <= UPSTREAM_NCCL
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in changed
    assert len([m for m in pcie_log(caplog) if "topology unknown" in m]) == 1


@pytest.mark.parametrize("user, kept_floor", [
    ({"NCCL_MAX_NCHANNELS": "4"}, False), ({"NCCL_MAX_CTAS": "2"}, False), ({"NCCL_MAX_NRINGS": "4"}, False),
    ({"NCCL_MIN_CTAS": "1"}, False), ({"NCCL_MAX_NCHANNELS": "16"}, True), ({"NCCL_MAX_CTAS": "8"}, True),
    # NCCL_MIN_NCHANNELS replaces the legacy NCCL_MIN_NRINGS whenever both are set (graph/connect.cc
    # ncclMinNchannels): any NCCL_MIN_NRINGS is the user's floor, above 8 too.
    ({"NCCL_MIN_NRINGS": "16"}, False), ({"NCCL_MIN_NRINGS": "2"}, False),
])
def test_pcie_nccl_channel_floor_never_overrides_a_user_setting(launch, kimi_tp8, monkeypatch, caplog, user,
                                                                kept_floor):
    """NCCL runs max(floor, min(found, ceiling)) channels (graph/connect.cc), so NCCL_MIN_NCHANNELS=8 would raise
    a user's ceiling (NCCL_MAX_NCHANNELS/NRINGS/CTAS) or floor below 8: then it is not set, and the log says why."""
    FakeNvml(monkeypatch)
    changed = launch(kimi_tp8, **user)
    assert ("NCCL_MIN_NCHANNELS" in changed) is kept_floor
    assert {k: os.environ[k] for k in user} == user
    (line,) = [m for m in pcie_log(caplog) if "NCCL defaults for PCIe applied" in m]
    if not kept_floor:
        assert f"{next(iter(user))}={next(iter(user.values()))}" in line


def test_pcie_defaults_of_an_earlier_launch_are_defaults_again(launch, kimi_tp8, monkeypatch, caplog):
    """Two launches in one process (sgl.Engine twice, notebooks, tests): what the first set is not the user's value
    for the second. --disable-custom-all-reduce then keeps PCIe IPC off, and the NCCL floor is applied, not kept."""
    FakeNvml(monkeypatch)
    first = launch(kimi_tp8)
    assert first["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1" and first["NCCL_MIN_NCHANNELS"] == "8"
    caplog.clear()
    launch(server_args(12, disable_custom_all_reduce=True))
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in os.environ and not pcie_ipc_on()
    (line,) = [m for m in pcie_log(caplog) if "NCCL defaults for PCIe applied" in m]
    assert "applied {'NCCL_MIN_NCHANNELS': '8'}" in line and "kept none" in line
    assert os.environ["NCCL_MIN_NCHANNELS"] == "8"


def test_pcie_defaults_a_value_changed_after_a_launch_is_the_users(launch, kimi_tp8, monkeypatch, caplog):
    """A value the user puts in the environment between two launches wins, even under a name the launcher set."""
    FakeNvml(monkeypatch)
    launch(kimi_tp8)
    caplog.clear()
    launch(kimi_tp8, NCCL_MIN_NCHANNELS="4", SGLANG_ENABLE_PCIE_IPC_ALLREDUCE="0")
    assert os.environ["NCCL_MIN_NCHANNELS"] == "4" and not pcie_ipc_on()
    (line,) = [m for m in pcie_log(caplog) if "NCCL defaults for PCIe applied" in m]
    assert "kept {'NCCL_MIN_NCHANNELS': '4'}" in line


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


def test_pcie_ipc_allreduce_default_respects_disable_custom_all_reduce(launch, monkeypatch, caplog):
    """PCIe IPC is a custom all-reduce: --disable-custom-all-reduce keeps the default off (the NCCL defaults still
    apply), and the log says why and how to enable it anyway."""
    FakeNvml(monkeypatch)
    changed = launch(server_args(12, disable_custom_all_reduce=True))
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in changed and not pcie_ipc_on()
    assert set(env_file_values()) <= set(changed)
    assert any("--disable-custom-all-reduce" in m for m in pcie_log(caplog))


def test_pcie_ipc_allreduce_default_stays_off_in_deterministic_inference(launch, monkeypatch, caplog):
    """Deterministic inference pins the reduction order; PCIe IPC picks a tactic per shape, so the launcher leaves
    it off (the NCCL defaults still apply) and says why."""
    FakeNvml(monkeypatch)
    changed = launch(server_args(12, enable_deterministic_inference=True))
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in changed and not pcie_ipc_on()
    assert any("deterministic inference" in m for m in pcie_log(caplog))


def test_pcie_ipc_allreduce_default_starts_at_tp4(launch, monkeypatch, caplog):
    """At TP2 on PCIe SGLang's custom all-reduce takes every size first, so PCIe IPC would be built and tuned
    for nothing (or, with the fusion, displace it unmeasured): not a default there; =1 still enables it."""
    FakeNvml(monkeypatch)
    changed = launch(server_args(12, tp=2), CUDA_DEVICE_ORDER="PCI_BUS_ID")
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in changed and not pcie_ipc_on()
    assert set(env_file_values()) <= set(changed)
    assert any("left off at TP2" in m for m in pcie_log(caplog))
    launch(server_args(12, tp=2), CUDA_DEVICE_ORDER="PCI_BUS_ID", SGLANG_ENABLE_PCIE_IPC_ALLREDUCE="1")
    assert pcie_ipc_on()
    monkeypatch.delenv("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE")
    changed = launch(server_args(12, tp=4), CUDA_DEVICE_ORDER="PCI_BUS_ID")
    assert changed["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1" and pcie_ipc_on()


@pytest.mark.unchanged
def test_pcie_ipc_allreduce_stays_off_on_nvlink_sm120(launch, kimi_tp8, monkeypatch):
    FakeNvml(monkeypatch, nvlink=[(2, 5)])
    launch(kimi_tp8)
    assert not pcie_ipc_on()


# ---------------------------------------------------------------------------------------------------------------
# Routing in GroupCoordinator.all_reduce


PROFILE = REPO / "docker" / "profiles" / "kimi-k25-eagle3-tp8.yaml"
RTX_PRO_6000_MIB = 97887
# Profile keys that name files or the HTTP front end rather than how the model runs.
NOT_SERVER_SHAPE = {"model-path", "speculative-draft-model-path", "host", "port", "tool-call-parser",
                    "reasoning-parser", "trust-remote-code", "enable-metrics"}


@pytest.fixture(scope="module")
def kimi_profile_args():
    """ServerArgs resolved from the shipped serving profile's [args] (Kimi-K2.5, TP8, EAGLE-3 3/1/4, 16 running
    requests, decode graphs up to bs 16) on a faked SM120 box with 96 GB GPUs."""
    from unittest import mock

    import yaml
    from sglang.srt.arg_groups import memory_hook

    args = yaml.safe_load(PROFILE.read_text())
    kw = {k.replace("-", "_"): v for k, v in args.items() if k not in NOT_SERVER_SHAPE and v is not False}
    kw.pop("tp_size")
    with mock.patch.object(memory_hook, "get_device_memory_capacity", lambda device=None: RTX_PRO_6000_MIB):
        return server_args(12, tp=args["tp-size"], **kw)


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
    vars(mr).update(spec_algorithm=SpeculativeAlgorithm.EAGLE3, is_draft_worker=False, server_args=sa,
                    req_to_token_pool=SimpleNamespace(
                        size=pool or sa.max_running_requests // get_parallel().attn_dp_size))
    return BaseRunner._widest_decode_rows(SimpleNamespace(model_runner=mr))


class PcieIpcWorkspace:
    """Stands in for flashinfer.comm.PcieIpcAllReduceWorkspace (needs GPUs): built with the max_numel SGLang asks
    for, and, like FlashInfer's, it cannot take more elements than that."""

    built: list = []

    def __init__(self, group, max_numel, dtype, tune_batches, tune_cache):
        self.max_numel, self.tune_batches = max_numel, tune_batches
        PcieIpcWorkspace.built.append(self)

    def supports(self, t):
        return t.numel() <= self.max_numel


GIB = 1 << 30


@pytest.fixture(autouse=True)
def device_memory(monkeypatch):
    """set(free_bytes): what torch.cuda.mem_get_info answers (no GPU here), and FlashInfer's JIT module's
    workspace_size (2 bytes x max_numel x 2 stages here; the real one is compiled CUDA code)."""
    import flashinfer.comm.pcie_ipc_ar as fi_ar

    state = {"free": 80 * GIB}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (state["free"], 96 * GIB))
    monkeypatch.setattr(fi_ar, "get_pcie_ipc_comm_module",
                        lambda: SimpleNamespace(workspace_size=lambda world, numel, elem, blocks: 2 * numel * elem))
    return lambda free: state.__setitem__("free", free)


def prepared_pcie_ipc(max_rows, disabled=False):
    """SGLang's PcieIpcCommunicator for a TP8 group, prepared as BaseRunner._pre_initialize_pcie_ipc_workspace does
    (prepare(hidden, max_rows)), with FlashInfer's workspace class replaced (no GPU)."""
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import PcieIpcCommunicator

    c = PcieIpcCommunicator.__new__(PcieIpcCommunicator)
    vars(c).update(disabled=disabled, max_numel=0, _workspace=None, _bound_stream=None, _cpu_group=None,
                   _max_rows=None, _group=None, _device=torch.device("meta"), _world_size=8,
                   _workspace_cls=PcieIpcWorkspace, _build_failed=False)
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
        vars(manager).update(workspace=ws, world_size=8, rank=0, group=(None, None), max_token_num=tokens,
                             hidden_dim=HIDDEN, dtype=torch.bfloat16, backend="trtllm", use_fp32_lamport=False,
                             initialized=True)
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
    monkeypatch.setattr(ps, "outplace_all_reduce",
                        lambda t, group_name, outplace_all_reduce_method: calls.append(outplace_all_reduce_method) or t)
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


@pytest.mark.unchanged
def test_pcie_ipc_workspace_is_sized_from_the_profile(published_profile):
    """The shipped profile (16 running requests, decode graphs to bs 16, 4 draft tokens) gives a 64-row PCIe-IPC
    workspace: the widest verify batch, not the 192-row default of an unconfigured server."""
    PcieIpcWorkspace.built.clear()
    max_rows = widest_decode_rows(published_profile)
    prepared_pcie_ipc(max_rows)
    assert max_rows == 64
    (ws,) = PcieIpcWorkspace.built
    assert ws.max_numel == 64 * HIDDEN and max(ws.tune_batches) == 64


U = pytest.mark.unchanged


@pytest.mark.parametrize("n, fusion_on, want", [
    # decode and chain verify (bs x 4 draft tokens up to bs 16): PCIe-IPC ahead of FlashInfer's one-shot kernel
    (1, True, "pcie_ipc"), (4, True, "pcie_ipc"), (16, True, "pcie_ipc"), (64, True, "pcie_ipc"),
    # wider than the PCIe-IPC workspace: a short prefill or a draft-extend chunk keeps FlashInfer up to its cap...
    pytest.param(65, True, "flashinfer", marks=U), pytest.param(256, True, "flashinfer", marks=U),
    # ... and NCCL above it
    pytest.param(257, True, "nccl", marks=U), pytest.param(8192, True, "nccl", marks=U),
    # fusion off (the TP8 default): no FlashInfer workspace, PCIe-IPC up to 64 rows, NCCL above
    pytest.param(64, False, "pcie_ipc", marks=U), pytest.param(65, False, "nccl", marks=U),
    pytest.param(8192, False, "nccl", marks=U),
])
def test_pcie_ipc_routing_from_the_profile_sizes(published_profile, coordinator, fusion_workspace, n, fusion_on,
                                                 want):
    """Which collective takes a plain TP all-reduce of n rows x 7168 bf16, with the workspaces sized as the patched
    server sizes them for the shipped profile on SM120."""
    make, calls = coordinator
    if fusion_on:
        fusion_workspace(SM120_FUSION_CAP)
    pcie_ipc = prepared_pcie_ipc(widest_decode_rows(published_profile))
    assert route(make, calls, n, pcie_ipc=pcie_ipc, fi=fusion_on) == want


def test_pcie_ipc_short_of_memory_stays_off_with_a_reason(published_profile, coordinator, fusion_workspace,
                                                          device_memory, caplog):
    """A rank that cannot allocate the workspace (FlashInfer's cudaMalloc comes before its handle exchange) does
    not enter the build: the communicator is disabled, says why, and reductions keep the FlashInfer/NCCL route.
    (The group agreement itself is tested on two CPU ranks in tests/gpu/test_harness.py.)"""
    make, calls = coordinator
    fusion_workspace(SM120_FUSION_CAP)
    PcieIpcWorkspace.built.clear()
    device_memory(1 << 20)
    with caplog.at_level(logging.WARNING):
        pcie_ipc = prepared_pcie_ipc(widest_decode_rows(published_profile))
    assert pcie_ipc.disabled and PcieIpcWorkspace.built == []
    assert any("this rank (it has 1048576 bytes free" in r.getMessage() and "could not allocate it" in r.getMessage()
               for r in caplog.records)
    assert route(make, calls, 8, pcie_ipc=pcie_ipc) == "flashinfer"


@pytest.mark.unchanged
def test_pcie_ipc_absent_disabled_or_refusing_keeps_flashinfer(published_profile, coordinator, fusion_workspace):
    make, calls = coordinator
    fusion_workspace(SM120_FUSION_CAP)
    max_rows = widest_decode_rows(published_profile)
    assert route(make, calls, 8, pcie_ipc=None) == "flashinfer"
    assert route(make, calls, 8, pcie_ipc=prepared_pcie_ipc(max_rows, disabled=True)) == "flashinfer"
    calls.clear()
    make(pcie_ipc=prepared_pcie_ipc(max_rows)).all_reduce(rows(8, torch.float16))  # PCIe-IPC serves bf16 only
    assert calls == ["flashinfer"]


def test_pcie_ipc_size_that_cannot_be_computed_is_no_refusal(published_profile, device_memory, monkeypatch, caplog):
    """Where FlashInfer cannot compute the workspace size (no module for this GPU, as on a CPU runner), the
    free-memory check is skipped with a note, not turned into a silent "off": the constructor decides."""
    import flashinfer.comm.pcie_ipc_ar as fi_ar

    def no_module():
        raise RuntimeError("FlashInfer requires GPUs with sm75 or higher")

    monkeypatch.setattr(fi_ar, "get_pcie_ipc_comm_module", no_module)
    PcieIpcWorkspace.built.clear()
    with caplog.at_level(logging.INFO):
        pcie_ipc = prepared_pcie_ipc(64)
    assert not pcie_ipc.disabled and pcie_ipc.max_numel == 64 * HIDDEN and len(PcieIpcWorkspace.built) == 1
    assert any("workspace size unknown" in r.getMessage() for r in caplog.records)


def test_pcie_ipc_prepare_resizes_a_workspace_built_before_it(published_profile, monkeypatch):
    """A reduction before warmup builds the workspace from the configured decode max_bs (16 x 4 = 64 rows for the
    profile); the capture list can be narrower (here the request pool holds 8 requests, as when the KV pool is
    small: 32 rows), and prepare() rebuilds the workspace to the captured width, so the runner's derivation is the
    one that sizes it and nothing wider reaches PCIe IPC."""
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import PcieIpcCommunicator

    destroyed = []
    monkeypatch.setattr(PcieIpcWorkspace, "destroy", lambda self: destroyed.append(self.max_numel), raising=False)
    PcieIpcWorkspace.built.clear()
    c = PcieIpcCommunicator.__new__(PcieIpcCommunicator)
    vars(c).update(disabled=False, max_numel=0, _workspace=None, _bound_stream=None, _cpu_group=None,
                   _max_rows=None, _group=None, _device=torch.device("meta"), _world_size=8,
                   _workspace_cls=PcieIpcWorkspace, _build_failed=False)
    c.should_pcie_ipc_ar(rows(4))  # the lazy build: sized from the resolved decode config
    lazy = c.max_numel
    c.prepare(hidden=HIDDEN, max_rows=widest_decode_rows(published_profile, pool=8))
    assert lazy == 64 * HIDDEN and destroyed == [lazy]
    assert c.max_numel == 32 * HIDDEN and [w.max_numel for w in PcieIpcWorkspace.built] == [lazy, 32 * HIDDEN]
    assert not c.should_pcie_ipc_ar(rows(33)) and c.should_pcie_ipc_ar(rows(32))
