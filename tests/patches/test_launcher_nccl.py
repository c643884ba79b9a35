"""The launcher's NCCL default for single-node TP on PCIe-only GPUs: the real `_set_envs_and_config` on resolved
Kimi-K2.5 server arguments, NVML faked (tests/_fake_nvml.py); the launcher must not initialise CUDA."""

import itertools
import logging
import multiprocessing
import os
import signal

import pytest
import torch

from _fake_nvml import FakeNvml
from _pcie import nvml
from _sgl import platform, server_args

# NCCL's channel settings, and the variables the launcher may touch: cleared so that the host's cannot leak in.
CHANNELS = [f"NCCL_{bound}_{what}" for what in ("NCHANNELS", "NRINGS", "CTAS") for bound in ("MIN", "MAX")]
WATCHED = ["CUDA_VISIBLE_DEVICES", "SGLANG_PCIE_NCCL_DEFAULTS", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", *CHANNELS]
WATCHED += ["NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE", "NCCL_GRAPH_MIXING_SUPPORT"]
# What upstream's launcher itself sets among NCCL_* on one node (engine.py _set_envs_and_config).
UPSTREAM_NCCL = {"NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE", "NCCL_MNNVL_ENABLE"}
SET_LINE = "No NVLink between the visible GPUs: set NCCL_MIN_NCHANNELS=8 (SGLANG_PCIE_NCCL_DEFAULTS=0 skips this)."


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
    said = [r.getMessage() for r in caplog.records if r.name == "sglang.srt.entrypoints.engine"]
    return [m for m in said if "NVLink" in m or "NCCL defaults" in m]


def nccl(changed) -> set:
    return {k for k in changed if k.startswith("NCCL_")}


@pytest.mark.parametrize("pair_error", [None, "NVML_ERROR_NOT_SUPPORTED"])  # not supported: no NVLink either
def test_pcie_nccl_default_applied_without_nvlink(launch, kimi_sm120, monkeypatch, caplog, pair_error):
    import pynvml

    nvml(monkeypatch, pair_error=pair_error and getattr(pynvml, pair_error))
    changed = launch(kimi_sm120)
    assert changed["NCCL_MIN_NCHANNELS"] == "8" and nccl(changed) <= UPSTREAM_NCCL | {"NCCL_MIN_NCHANNELS"}
    assert launcher_log(caplog) == [SET_LINE]


def test_pcie_nccl_probes_the_visible_gpus(launch, monkeypatch):
    """GPUs 0-1 share NVLink, but this server sees 4-7 only (CUDA_VISIBLE_DEVICES numbers are NVML indices)."""
    fake = nvml(monkeypatch, nvlink=[(0, 1)])
    changed = launch(server_args(12, tp=4), CUDA_VISIBLE_DEVICES="4,5,6,7")
    assert fake.pairs == {frozenset(p) for p in itertools.combinations([4, 5, 6, 7], 2)}
    assert changed["NCCL_MIN_NCHANNELS"] == "8"


@pytest.mark.parametrize("setting", CHANNELS)
def test_pcie_nccl_default_never_overrides_a_channel_setting(launch, kimi_sm120, monkeypatch, caplog, setting):
    """NCCL runs max(floor, min(found, ceiling)) channels: a floor would override any channel setting of the
    user's, so none is set then, and the log says which setting kept it off."""
    nvml(monkeypatch)
    changed = launch(kimi_sm120, **{setting: "4"})
    assert "NCCL_MIN_NCHANNELS" not in changed and os.environ[setting] == "4"
    assert launcher_log(caplog) == [f"NCCL defaults for PCIe not applied: {setting} set."]


def test_pcie_nccl_default_opt_out(launch, kimi_sm120, monkeypatch, caplog):
    from sglang.srt.environ import envs

    fake = nvml(monkeypatch)
    changed = launch(kimi_sm120, SGLANG_PCIE_NCCL_DEFAULTS="0")
    assert envs.SGLANG_PCIE_NCCL_DEFAULTS.get() is False  # the switch exists: unpatched, =0 changes nothing either
    assert "NCCL_MIN_NCHANNELS" not in changed and fake.inits == 0 and launcher_log(caplog) == []


@pytest.mark.parametrize("failure", ["init", "pair", "uuid"])
def test_pcie_nccl_unknown_topology_changes_nothing_and_says_so(launch, kimi_sm120, monkeypatch, caplog, failure):
    import pynvml

    env = {}
    if failure == "init":
        nvml(monkeypatch, init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    elif failure == "pair":
        nvml(monkeypatch, pair_error=pynvml.NVML_ERROR_UNKNOWN)
    else:  # GPU UUIDs in CUDA_VISIBLE_DEVICES: not NVML indices
        nvml(monkeypatch)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(FakeNvml.uuid(i) for i in range(8))
    changed = launch(kimi_sm120, **env)
    assert nccl(changed) <= UPSTREAM_NCCL
    (line,) = launcher_log(caplog)
    assert line.startswith("NCCL defaults for PCIe not applied: topology unknown (")


@pytest.mark.unchanged
@pytest.mark.parametrize("shape", ["nvlink", "tp1", "two_nodes"])
def test_pcie_nccl_nvlink_tp1_and_multi_node_unchanged(launch, monkeypatch, shape):
    fake = nvml(monkeypatch, nvlink=[(2, 5)] if shape == "nvlink" else ())
    sa = {"nvlink": server_args(12), "tp1": server_args(12, tp=1), "two_nodes": server_args(12, nnodes=2)}[shape]
    changed = launch(sa)
    assert nccl(changed) <= UPSTREAM_NCCL
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" not in changed
    assert shape == "nvlink" or fake.inits == 0
