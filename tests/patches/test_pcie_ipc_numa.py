"""The PCIe-IPC ranks' GPU and NUMA node logged at the first build, and a warning where an island spans two nodes."""

import logging

import torch

from _fake_nvml import BUS
from _pcie import HIDDEN, communicator, on_pci_buses


def test_pcie_ipc_logs_each_ranks_numa_node_and_warns_on_a_split_island(profile, monkeypatch, tmp_path, caplog):
    """On a two-NUMA 8-GPU host the first build logs each rank's GPU and NUMA node (from CUDA's PCI address and
    sysfs) and warns for an island of the 8-rank schedule (ranks 0-3, 4-7) on both nodes. The host-group
    collectives are stood in by what 8 ranks would exchange: each rank's answer from the same code."""
    import torch.distributed as dist

    from sglang.srt.distributed.device_communicators import pcie_ipc_ar

    nodes = [0, 0, 0, 1, 1, 1, 1, 1]  # GPU 3 sits on the other node: ranks 0-3 span both
    for bus, node in zip(BUS, nodes, strict=True):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "numa_node").write_text(f"{node}\n")
    monkeypatch.setattr(pcie_ipc_ar, "_SYSFS_PCI_DEVICES", str(tmp_path))
    on_pci_buses(monkeypatch)
    monkeypatch.setattr(dist, "all_reduce", lambda flag, op, group: None)  # every rank agrees
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)

    def all_gather_object(out, obj, group):
        out[:] = [pcie_ipc_ar._gpu_placement(torch.device("cuda", r)) for r in range(8)]

    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)
    monkeypatch.setenv("FLASHINFER_AUTOTUNE_DIR", str(tmp_path / "tune"))
    with caplog.at_level(logging.INFO):
        communicator(_cpu_group="host-group", _tune=lambda hidden: None).prepare(hidden=HIDDEN, max_rows=64)
    (ranks,) = [m for m in caplog.messages if m.startswith("FlashInfer PCIe-IPC ranks")]
    for rank, (bus, node) in enumerate(zip(BUS, nodes, strict=True)):
        assert f"rank {rank}: GPU {bus} NUMA {node}" in ranks
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split(" span")[0] for w in warned] == ["TP ranks 0-3"] and "CUDA_VISIBLE_DEVICES" in warned[0]
