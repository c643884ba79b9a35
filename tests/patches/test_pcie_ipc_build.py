"""The PCIe-IPC all-reduce's build and autotune, decided on every rank together (PcieIpcCommunicator.prepare): the
real communicator, FlashInfer's workspace stood in (_pcie.py); two CPU ranks over gloo for the autotune's save."""

import logging

import _gloo
from _pcie import HIDDEN, Workspace, communicator, prepared, route, rows, server_info, widest_decode_rows


def test_pcie_ipc_short_of_memory_stays_off_with_a_reason(profile, tp8, fusion_workspace, no_gpu, monkeypatch, caplog):
    """A rank that cannot allocate the workspace (FlashInfer's cudaMalloc precedes its handle exchange) does not enter
    the build: disabled, saying why; reductions keep the FlashInfer/NCCL route."""
    fusion_workspace()
    no_gpu(1 << 20)
    with caplog.at_level(logging.WARNING):
        tp8.pcie_ipc_comm = prepared(widest_decode_rows(profile))
    assert tp8.pcie_ipc_comm.disabled and Workspace.built == []
    assert any("this rank (it has 1048576 bytes free" in m and "could not allocate it" in m for m in caplog.messages)
    assert route(tp8, 8) == "flashinfer"
    assert server_info(monkeypatch, tp8)["why"] == "its workspace could not be built or tuned on every rank"


def test_pcie_ipc_size_that_cannot_be_computed_is_no_refusal(profile, monkeypatch, caplog):
    """Where FlashInfer cannot compute the workspace size (no module for this GPU), the free-memory check is skipped
    with a note, not a silent "off"."""
    import flashinfer.comm.pcie_ipc_ar as fi_ar

    def no_module():
        raise RuntimeError("FlashInfer requires GPUs with sm75 or higher")

    monkeypatch.setattr(fi_ar, "get_pcie_ipc_comm_module", no_module)
    with caplog.at_level(logging.INFO):
        comm = prepared(64)
    assert not comm.disabled and comm.max_numel == 64 * HIDDEN and len(Workspace.built) == 1
    assert any("workspace size unknown" in m for m in caplog.messages)


def test_pcie_ipc_prepare_resizes_a_workspace_built_before_it(profile):
    """A reduction before warmup builds the workspace from the configured decode max_bs (64 rows for the profile); the
    capture list can be narrower (a pool of 8 requests when the KV pool is small: 32 rows): prepare() rebuilds it."""
    comm = communicator(_tune=lambda hidden: None)
    comm.should_pcie_ipc_ar(rows(4))  # the lazy build: sized from the resolved decode config
    lazy = Workspace.built[0]
    comm.prepare(hidden=HIDDEN, max_rows=widest_decode_rows(profile, pool=8))
    assert lazy.max_numel == 64 * HIDDEN and lazy.destroyed and comm.max_numel == 32 * HIDDEN
    assert [w.max_numel for w in Workspace.built] == [64 * HIDDEN, 32 * HIDDEN]
    assert not comm.should_pcie_ipc_ar(rows(33)) and comm.should_pcie_ipc_ar(rows(32))


def test_pcie_ipc_the_first_prepare_wins(profile):
    """The target's runner prepares and captures first; the draft's (here a 4096-wide STANDALONE draft) prepares next.
    Nothing the target's graphs captured is destroyed or replaced (a graph may replay it); the draft falls back by
    size."""
    comm = prepared(64, gather_width=20480)
    target = list(Workspace.built)
    comm.prepare(hidden=4096, max_rows=16, gather_width=4000)
    assert [w.max_numel for w in target] == [64 * HIDDEN, 64 * 20480]
    assert Workspace.built == target and not any(w.destroyed for w in target)
    assert comm._workspace is target[0] and comm._gather_workspace is target[1]


def test_pcie_ipc_tune_cache_save_failing_on_rank_0_is_no_hang():
    """Two CPU ranks: FlashInfer's tune() saves its cache on rank 0 between two barriers; a save failing for real
    there is recorded, rank 0 reaches the second barrier, both keep PCIe IPC with the measured tactics."""
    ranks = _gloo.run("tune_cache_save_fails", timeout=400, autotune=True)
    assert ranks == [{"disabled": False, "barrier_broken": []}] * 2
