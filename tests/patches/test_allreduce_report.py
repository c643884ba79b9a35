"""/server_info allreduce_backends: whether the PCIe-IPC all-reduce serves the TP group's decode reductions, and why
not (pcie_ipc_ar.off_reason, PcieIpcCommunicator.report), read by the controller that answers GET /server_info."""

from types import SimpleNamespace

import pytest
import torch

from _pcie import HIDDEN, communicator, server_info


@pytest.mark.parametrize(
    "world, deterministic, why", [(1, False, "one rank: nothing to reduce"), (8, True, "deterministic inference is on")]
)
def test_server_info_says_why_the_tp_group_built_no_pcie_ipc(monkeypatch, world, deterministic, why):
    """Even asked for (=1; =0 and the other settings of the user's: test_allreduce_timing.py)."""
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import off_reason

    monkeypatch.setenv("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "1")
    reason = off_reason(group_name="tp", world_size=world, deterministic=deterministic)
    tp = SimpleNamespace(pcie_ipc_comm=None, pcie_ipc_off_reason=reason)
    assert server_info(monkeypatch, tp) == {"source": "off", "margin": 1.2, "why": why, "sizes": []}


@pytest.mark.parametrize(
    "case, why",
    [
        ("world 3", "its kernels serve 2, 4 or 8 ranks, not 3"),
        ("cpu", "not a CUDA device"),
        ("no pcie_ipc_comm", "this FlashInfer has no pcie_ipc_comm"),
    ],
)
def test_server_info_says_why_the_communicator_serves_nothing(monkeypatch, no_gpu, case, why):
    """The real constructor on a world it cannot serve, a CPU device, a FlashInfer without the kernels (a workspace
    that could not be allocated: test_pcie_ipc_build.py)."""
    import flashinfer.comm
    import torch.distributed as dist

    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import PcieIpcCommunicator

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 3 if case == "world 3" else 8)
    if case == "no pcie_ipc_comm":
        monkeypatch.delattr(flashinfer.comm, "PcieIpcAllReduceWorkspace")
    comm = PcieIpcCommunicator(group=None, device=torch.device("cpu") if case == "cpu" else 0)
    assert comm.disabled and server_info(monkeypatch, SimpleNamespace(pcie_ipc_comm=comm))["why"] == why


def test_server_info_says_what_pcie_ipc_takes_when_it_is_on(monkeypatch, no_gpu):
    comm = communicator(_tune=lambda hidden: None)
    assert server_info(monkeypatch, SimpleNamespace(pcie_ipc_comm=comm))["why"] == "its workspace is built at warm-up"
    comm.prepare(hidden=HIDDEN, max_rows=64)
    assert server_info(monkeypatch, SimpleNamespace(pcie_ipc_comm=comm)) == {
        "source": "on",
        "margin": 1.2,
        "sizes": [],
        "why": f"it takes every bf16 all-reduce of up to {64 * HIDDEN} elements its kernels support",
    }
