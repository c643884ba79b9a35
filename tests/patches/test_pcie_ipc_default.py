"""The PCIe-IPC all-reduce on by default for TP groups of >= 4 SM120 GPUs without NVLink (pcie_ipc_ar.off_reason,
every rank voting on the host group), with NVML faked through the pynvml calls SGLang makes."""

import logging

import pytest

from _pcie import nvml
from _sgl import platform

pytestmark = pytest.mark.usefixtures("kimi")


def off(world=8, major=12, deterministic=False, **kw):
    """pcie_ipc_ar.off_reason for the TP group (kw: custom_allreduce, cpu_group) on a faked GPU."""
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import off_reason

    with platform(major):
        return off_reason(group_name="tp", world_size=world, deterministic=deterministic, **kw)


def test_pcie_ipc_allreduce_default_on_pcie_only_sm120(monkeypatch, caplog):
    nvml(monkeypatch)
    with caplog.at_level(logging.INFO):
        assert off() is None and off(world=4) is None
    assert any("Set SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0 to keep it off" in m for m in caplog.messages)


@pytest.mark.parametrize("case", ["nvlink", "sm90", "tp2", "deterministic", "nvml_error"])
def test_pcie_ipc_allreduce_default_stays_off(monkeypatch, case):
    """Where another all-reduce serves the group (NVLink; TP2: the custom all-reduce), on other GPUs, with
    deterministic inference (its tactic follows the shape), or when NVML cannot answer (--disable-custom-all-reduce:
    test_allreduce_timing.py)."""
    import pynvml

    nvml(
        monkeypatch,
        nvlink=[(2, 5)] if case == "nvlink" else (),
        init_error=pynvml.NVML_ERROR_UNKNOWN if case == "nvml_error" else None,
    )
    kw = {
        "sm90": dict(major=9),
        "tp2": dict(world=2),
        "deterministic": dict(deterministic=True),
    }.get(case, {})
    assert off(**kw) is not None


def test_pcie_ipc_allreduce_default_is_a_group_vote(monkeypatch):
    """Every rank asks NVML and the host group votes (here another rank answered no): no rank builds what a peer
    skips."""
    import torch.distributed as dist

    nvml(monkeypatch)
    votes = []

    def another_rank_says_no(flag, op, group):
        votes.append((int(flag.item()), op, group))
        flag.zero_()

    monkeypatch.setattr(dist, "all_reduce", another_rank_says_no)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    assert off(cpu_group="host-group") == "not a TP group of >= 4 SM120 GPUs without NVLink"
    assert votes == [(1, dist.ReduceOp.MIN, "host-group")]


def test_pcie_ipc_allreduce_explicit_on_wins(monkeypatch):
    """=1 is kept as upstream reads it, NVLink or not (=0: test_allreduce_timing.py)."""
    nvml(monkeypatch, nvlink=[(2, 5)])
    monkeypatch.setenv("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "1")
    assert off() is None
