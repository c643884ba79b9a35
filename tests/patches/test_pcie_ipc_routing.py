"""The PCIe-IPC all-reduce ahead of FlashInfer's allreduce-only path: the real GroupCoordinator.all_reduce, with the
workspaces the patched server sizes for the shipped Kimi-K2.5 profile on SM120 (_pcie.py, conftest.py)."""

import pytest
import torch

from _pcie import prepared, route, widest_decode_rows

U = pytest.mark.unchanged


@pytest.mark.parametrize(
    "n, fusion_on, want",
    [
        # decode and chain verify (bs x 4 draft tokens up to bs 16): PCIe-IPC ahead of FlashInfer's one-shot kernel
        (1, True, "pcie_ipc"),
        (16, True, "pcie_ipc"),
        (64, True, "pcie_ipc"),
        # wider than the PCIe-IPC workspace: a short prefill or a draft-extend chunk keeps FlashInfer up to its cap...
        pytest.param(65, True, "flashinfer", marks=U),
        pytest.param(256, True, "flashinfer", marks=U),
        # ... and NCCL above it
        pytest.param(257, True, "nccl", marks=U),
        # fusion off (the TP8 default): no FlashInfer workspace, PCIe-IPC up to 64 rows, NCCL above
        pytest.param(64, False, "pcie_ipc", marks=U),
        pytest.param(65, False, "nccl", marks=U),
        pytest.param(8192, False, "nccl", marks=U),
    ],
)
def test_pcie_ipc_routing_from_the_profile_sizes(profile, tp8, fusion_workspace, n, fusion_on, want):
    """Which collective takes a plain TP all-reduce of n rows x 7168 bf16."""
    if fusion_on:
        fusion_workspace()
    tp8.pcie_ipc_comm = prepared(widest_decode_rows(profile))
    assert route(tp8, n) == want


@U
def test_pcie_ipc_absent_disabled_or_refusing_keeps_flashinfer(profile, tp8, fusion_workspace):
    """No communicator, a disabled one, or one refusing the tensor (PCIe IPC serves bf16 only)."""
    fusion_workspace()
    assert route(tp8, 8) == "flashinfer"
    tp8.pcie_ipc_comm = prepared(64)
    tp8.pcie_ipc_comm.disabled = True
    assert route(tp8, 8) == "flashinfer"
    tp8.pcie_ipc_comm = prepared(64)
    assert route(tp8, 8, torch.float16) == "flashinfer"
