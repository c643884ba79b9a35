"""The all-reduce timing cached per box (PcieIpcCommunicator._read_timings, _timing_cache): keyed on every input of
the measurement, read by the first rank for the group. FlashInfer's real autotune store under a temporary
FLASHINFER_AUTOTUNE_DIR; NVML and the timing faked; two CPU ranks over gloo for the group's read."""

import os

import pytest

from _pcie import HIDDEN, communicator, nvml, on_pci_buses

CHANGES = [
    "NCCL_P2P_LEVEL=SYS",
    "NCCL_PROTO=Simple",
    "NCCL_CONF_FILE edited",
    "~/.nccl.conf written",
    "kernels untuned",
    "FlashInfer takes fewer sizes",
    "another SGLang",
    "another driver",
]


@pytest.mark.parametrize("change", CHANGES)
def test_allreduce_timing_cache_is_keyed_on_every_input_of_the_measurement(
    tp8, fusion_workspace, monkeypatch, tmp_path, change
):
    """A second start on the same box reads the table the first one timed; a start that changed anything the timing
    depended on times again."""
    import pynvml

    import sglang.version
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import PcieIpcCommunicator

    nvml(monkeypatch)
    on_pci_buses(monkeypatch)
    for k in [k for k in os.environ if k.startswith("NCCL_")]:
        monkeypatch.delenv(k)
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_PROTO=LL\n")
    monkeypatch.setenv("NCCL_CONF_FILE", str(conf))
    monkeypatch.setenv("HOME", str(tmp_path))
    tuned, calls = {"now": True}, []
    monkeypatch.setattr(PcieIpcCommunicator, "_tune", lambda self, hidden: tuned["now"])
    monkeypatch.setattr(
        PcieIpcCommunicator,
        "_time_backends",
        lambda self, tp, hidden, rows, backends: calls.append(rows) or [[10.0] * len(backends) for _ in rows],
    )
    fusion_workspace()

    def start() -> str:
        comm = communicator()
        comm.prepare(hidden=HIDDEN, max_rows=64, coordinator=tp8)
        return comm.report()["source"]

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
    elif change == "another SGLang":
        monkeypatch.setattr(sglang.version, "__version__", "0.5.24")
    else:
        monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: "590.44.01")
    assert start() == "measured" and len(calls) == 2


def test_allreduce_timing_second_start_reads_the_cache_for_the_group(timing_starts):
    """Two CPU ranks: the first rank reads the cache for the group, so a second start on the same box times nothing
    on either rank and routes alike; another driver is another box, timed again on both."""
    assert [r["cached"] for r in timing_starts] == [
        {"timed": 0, "disabled": False, "source": "cache", "table": ["pcie_ipc", "pcie_ipc", "nccl", "nccl"]}
    ] * 2
    assert [r["new_driver"]["timed"] for r in timing_starts] == [1, 1]
