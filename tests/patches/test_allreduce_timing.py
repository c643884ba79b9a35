"""Each decode size's all-reduce backend timed at start (PcieIpcCommunicator._choose_backends): PCIe IPC only where
it wins by SGLANG_PCIE_IPC_MIN_SPEEDUP, one decision for the group, a user's setting winning. Only the measuring
method (_time_backends) is faked; two CPU ranks over gloo for the group decision (_gloo.py allreduce_timing)."""

import logging

import pytest

from _pcie import HIDDEN, nvml, prepared, route, rows, server_info, widest_decode_rows
from _sgl import platform


def crossing(backend, n):
    """Microseconds per all-reduce of n rows: PCIe IPC faster at small sizes and slower at large; FlashInfer's
    one-shot kernel (where the fusion is on) the fastest at 32 rows only."""
    return {"pcie_ipc": 5 + 0.5 * n, "nccl": 20 + 0.1 * n, "flashinfer": 22.0 if n == 32 else 50.0}[backend]


@pytest.fixture
def timed(monkeypatch):
    """calls: the row counts each timing asked for; the timing answers crossing(backend, rows)."""
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import PcieIpcCommunicator

    calls = []

    def time_backends(self, tp, hidden, rows, backends):
        calls.append(rows)
        return [[crossing(b, n) for b in backends] for n in rows]

    monkeypatch.setattr(PcieIpcCommunicator, "_time_backends", time_backends)
    return calls


@pytest.mark.parametrize("fusion_on", [False, True])
def test_allreduce_timing_routes_each_size_to_its_fastest(
    profile, tp8, fusion_workspace, timed, monkeypatch, caplog, fusion_on
):
    """Prepared for the profile's 64 rows, each tuned row count is timed and GroupCoordinator.all_reduce routes by the
    table: PCIe IPC up to 16 rows (>= 1.2x faster), NCCL where it is within 1.2x (32) or faster (64), FlashInfer's
    kernel where it is the fastest (32, fusion on). A size between two timed ones takes the wider one's backend;
    wider than the table, the route is as before."""
    if fusion_on:
        fusion_workspace()
    with caplog.at_level(logging.INFO):
        comm = tp8.pcie_ipc_comm = prepared(widest_decode_rows(profile), coordinator=tp8)
    assert timed == [(1, 2, 4, 8, 16, 32, 64)]
    mid = "flashinfer" if fusion_on else "nccl"
    info = server_info(monkeypatch, tp8)  # GET /server_info's allreduce_backends, as JSON
    assert info["source"] == "measured" and info["margin"] == 1.2 and info["why"].startswith("timed at start")
    assert [s["rows"] for s in info["sizes"]] == [1, 2, 4, 8, 16, 32, 64]
    assert [s["backend"] for s in info["sizes"]] == ["pcie_ipc"] * 5 + [mid, "nccl"]
    assert info["sizes"][0] == {
        "rows": 1,
        "bytes": 2 * HIDDEN,
        "us": {"pcie_ipc": 5.5, "nccl": 20.1, **({"flashinfer": 50.0} if fusion_on else {})},
        "backend": "pcie_ipc",
        "why": "PCIe IPC 5.5 us vs NCCL 20.1 us, wins 3.7x >= 1.2x",
    }
    for n, want in ((1, "pcie_ipc"), (3, "pcie_ipc"), (16, "pcie_ipc"), (17, mid), (32, mid), (64, "nccl"), (65, mid)):
        assert route(tp8, n) == want, n
        assert comm.should_pcie_ipc_ar(rows(n)) is (want == "pcie_ipc")
    (table,) = [m for m in caplog.messages if m.startswith("All-reduce backend per")]
    assert "timed at start in CUDA graphs" in table and "SGLANG_PCIE_IPC_MIN_SPEEDUP=1.2x" in table
    assert "pcie_ipc   PCIe IPC 5.5 us vs NCCL 20.1 us, wins 3.7x >= 1.2x" in table
    assert "nccl       NCCL faster: PCIe IPC 37.0 us vs NCCL 26.4 us" in table
    assert (
        "flashinfer FlashInfer within 1.2x: PCIe IPC 21.0 us vs FlashInfer 22.0 us"
        if fusion_on
        else "nccl       NCCL within 1.2x: PCIe IPC 21.0 us vs NCCL 23.2 us"
    ) in table


@pytest.mark.parametrize(
    "setting",
    [
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1",
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0",
        "--disable-custom-all-reduce",
        "SGLANG_PCIE_IPC_MIN_SPEEDUP=4",
    ],
)
def test_allreduce_timing_a_user_setting_wins(profile, tp8, monkeypatch, timed, caplog, setting):
    """=1 keeps every size on PCIe IPC untimed; =0 and --disable-custom-all-reduce keep it off, untimed, and say so;
    a margin the user set is the one applied (here no size wins by 4x)."""
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import off_reason

    nvml(monkeypatch)
    if setting.startswith("SGLANG_"):
        monkeypatch.setenv(*setting.split("="))
    with caplog.at_level(logging.INFO), platform(12):
        tp8.pcie_ipc_off_reason = off_reason(
            group_name="tp",
            world_size=8,
            deterministic=False,
            custom_allreduce=setting != "--disable-custom-all-reduce",
        )
        if tp8.pcie_ipc_off_reason is None:
            tp8.pcie_ipc_comm = prepared(64, coordinator=tp8)
    info, log = server_info(monkeypatch, tp8), caplog.messages
    if setting.endswith("=1"):
        assert timed == [] and info["source"] == "forced" and tp8.pcie_ipc_comm.should_pcie_ipc_ar(rows(64))
        assert {s["backend"] for s in info["sizes"]} == {"pcie_ipc"} and any("=1 is set: untimed" in m for m in log)
    elif setting.endswith("=4"):
        assert len(timed) == 1 and info["margin"] == 4.0 and not tp8.pcie_ipc_comm.should_pcie_ipc_ar(rows(1))
        assert {s["backend"] for s in info["sizes"]} == {"nccl"}
    else:
        assert tp8.pcie_ipc_comm is None and timed == [] and info["source"] == "off" and info["sizes"] == []
        assert info["why"] == f"{setting} is set" and f"FlashInfer PCIe-IPC all-reduce off: {setting} is set." in log


def test_allreduce_timing_is_one_group_decision(timing_starts):
    """Each rank's own times would route 1, 4 or 8 rows differently: the group takes the MAX on the host group and both
    route alike; where rank 1 cannot time, both turn PCIe IPC off, neither left waiting. Before, the real
    GroupCoordinator of this 2-rank CPU group said why it built none."""
    table = ["pcie_ipc", "pcie_ipc", "nccl", "nccl"]  # the MAX of both ranks' times at 1, 2, 4 and 8 rows
    assert [r["differ"] for r in timing_starts] == [
        {"timed": 1, "disabled": False, "source": "measured", "table": table}
    ] * 2
    assert [r["fails"] for r in timing_starts] == [
        {"timed": 1, "disabled": True, "source": "off", "table": [None] * 4}
    ] * 2
    assert [r["before"] for r in timing_starts] == [
        {"source": "off", "why": "not a TP group of >= 4 SM120 GPUs without NVLink"}
    ] * 2
