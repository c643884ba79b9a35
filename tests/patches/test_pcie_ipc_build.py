"""The PCIe-IPC all-reduce's build and autotune, decided on every rank together (PcieIpcCommunicator.prepare).

The real PcieIpcCommunicator over FlashInfer's workspace stood in (tests/patches/_pcie.py), prepared as the model
runner prepares it for the shipped Kimi-K2.5 profile; two CPU ranks over gloo for the autotune's cache save.
"""

from __future__ import annotations

import logging

import _gloo
from _pcie import HIDDEN, Workspace, communicator, prepared, route, rows, widest_decode_rows


def test_pcie_ipc_short_of_memory_stays_off_with_a_reason(profile, tp8, fusion_workspace, no_gpu, caplog):
    """A rank that cannot allocate the workspace (FlashInfer's cudaMalloc comes before its handle exchange) does
    not enter the build: the communicator is disabled, says why, and reductions keep the FlashInfer/NCCL route."""
    fusion_workspace()
    no_gpu(1 << 20)
    with caplog.at_level(logging.WARNING):
        tp8.pcie_ipc_comm = prepared(widest_decode_rows(profile))
    assert tp8.pcie_ipc_comm.disabled and Workspace.built == []
    assert any("this rank (it has 1048576 bytes free" in m and "could not allocate it" in m for m in caplog.messages)
    assert route(tp8, 8) == "flashinfer"


def test_pcie_ipc_size_that_cannot_be_computed_is_no_refusal(profile, monkeypatch, caplog):
    """Where FlashInfer cannot compute the workspace size (no module for this GPU, as on a CPU runner), the
    free-memory check is skipped with a note, not turned into a silent "off": the constructor decides."""
    import flashinfer.comm.pcie_ipc_ar as fi_ar

    def no_module():
        raise RuntimeError("FlashInfer requires GPUs with sm75 or higher")

    monkeypatch.setattr(fi_ar, "get_pcie_ipc_comm_module", no_module)
    with caplog.at_level(logging.INFO):
        comm = prepared(64)
    assert not comm.disabled and comm.max_numel == 64 * HIDDEN and len(Workspace.built) == 1
    assert any("workspace size unknown" in m for m in caplog.messages)


def test_pcie_ipc_prepare_resizes_a_workspace_built_before_it(profile):
    """A reduction before warmup builds the workspace from the configured decode max_bs (16 x 4 = 64 rows for the
    profile); the capture list can be narrower (here the request pool holds 8 requests, as when the KV pool is
    small: 32 rows), and the first prepare() rebuilds it to the captured width."""
    comm = communicator(_tune=lambda hidden: None)
    comm.should_pcie_ipc_ar(rows(4))  # the lazy build: sized from the resolved decode config
    lazy = Workspace.built[0]
    comm.prepare(hidden=HIDDEN, max_rows=widest_decode_rows(profile, pool=8))
    assert lazy.max_numel == 64 * HIDDEN and lazy.destroyed and comm.max_numel == 32 * HIDDEN
    assert [w.max_numel for w in Workspace.built] == [64 * HIDDEN, 32 * HIDDEN]
    assert not comm.should_pcie_ipc_ar(rows(33)) and comm.should_pcie_ipc_ar(rows(32))


def test_pcie_ipc_the_first_prepare_wins(profile):
    """The target's runner prepares first and captures its graphs with those workspaces; the draft's runner
    prepares next with its own width, rows and vocab shard (here a 4096-wide STANDALONE draft). Nothing the target's
    graphs captured is destroyed or replaced (FlashInfer: keep a workspace alive while a graph may replay it); the
    draft's wider reductions fall back by size."""
    comm = prepared(64, gather_width=20480)
    target = list(Workspace.built)
    comm.prepare(hidden=4096, max_rows=16, gather_width=4000)
    assert [w.max_numel for w in target] == [64 * HIDDEN, 64 * 20480]
    assert Workspace.built == target and not any(w.destroyed for w in target)
    assert comm._workspace is target[0] and comm._gather_workspace is target[1]


def test_pcie_ipc_tune_cache_save_failing_on_rank_0_is_no_hang():
    """Two CPU ranks: FlashInfer's tune() saves its cache on rank 0 between two device-group barriers; a save that
    fails there (for real: the cache path is under a regular file) is recorded, rank 0 reaches the second barrier,
    and both ranks keep PCIe IPC with the measured tactics."""
    assert (
        _gloo.run("tune_cache_save_fails", timeout=400, autotune=True)
        == [{"disabled": False, "barrier_broken": []}] * 2
    )
