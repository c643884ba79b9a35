"""The one PCIe-only rule (scripts/host/topology.py) agrees with the patched launcher's, pair by pair.

The launcher's own NVML probe (sglang/srt/entrypoints/pcie_defaults.py, from the tree under test) and the doctor's
live NVML reader run against the same faked pynvml: no NVLink, NVLink on one pair, NotSupported answers, failed
queries, CUDA_VISIBLE_DEVICES mapping, UUIDs, one GPU, no driver. Replayed `nvidia-smi topo -p2p n` matrices follow
the same rule.
"""

from __future__ import annotations

import pytest

from _fake_nvml import FakeNvml

from scripts.host import nvml as live
from scripts.host.topology import pcie_only, visible_gpus


def launcher_says(environ: dict) -> bool | None:
    """The patched launcher's answer for a TP group of every visible GPU (read_topology, the probe of
    decide_pcie_only_defaults): True PCIe-only, False NVLink, None unknown (it raises)."""
    from types import SimpleNamespace

    from sglang.srt.entrypoints import pcie_defaults

    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        spec = environ.get("CUDA_VISIBLE_DEVICES")
        tp = n if spec is None else len(spec.split(","))
        cfg = SimpleNamespace(tp_size=tp, pp_size=1, dp_size=1, enable_dp_attention=False, base_gpu_id=0,
                              gpu_id_step=1)
        if tp < 2:
            raise ValueError(f"{tp} GPU(s)")
        return pcie_defaults.read_topology(cfg)[0] == "pcie-only"
    except Exception:  # noqa: BLE001 - the launcher's "topology unknown"
        return None


def doctor_says(environ: dict) -> bool | None:
    try:
        inv, nvlink, _ = live.read_inventory()
    except Exception:  # noqa: BLE001 - no driver: unknown
        return None
    ids, _ = visible_gpus(inv.gpus, environ)
    return pcie_only(nvlink, ids)[0]


PCI = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
CASES = {
    "no-nvlink": (dict(), {}, True),
    "nvlink-pair": (dict(nvlink=[(2, 5)]), {}, False),
    "not-supported-answers": (dict(pair_error="NOT_SUPPORTED"), {}, True),
    "failed-queries": (dict(pair_error="UNKNOWN"), {}, None),
    "visible-subset-without-the-nvlink-pair": (dict(nvlink=[(0, 1)]), {"CUDA_VISIBLE_DEVICES": "4,5,6,7", **PCI},
                                               True),
    "visible-subset-with-it": (dict(nvlink=[(0, 1)]), {"CUDA_VISIBLE_DEVICES": "1,0", **PCI}, False),
    # CUDA's default order (FASTEST_FIRST) is unspecified: numbered subsets cannot be matched, all GPUs can
    "numbered-subset-in-fastest-first-order": (dict(nvlink=[(0, 1)]), {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, None),
    "all-numbered-in-fastest-first-order": (dict(nvlink=[(0, 1)]), {"CUDA_VISIBLE_DEVICES": "7,6,5,4,3,2,1,0"},
                                            False),
    "uuids": (dict(nvlink=[(2, 5)]), {"CUDA_VISIBLE_DEVICES": "GPU-222,GPU-555"}, False),
    "uuids-without-the-pair": (dict(nvlink=[(2, 5)]), {"CUDA_VISIBLE_DEVICES": "GPU-222,GPU-444"}, True),
    "mig": (dict(), {"CUDA_VISIBLE_DEVICES": "MIG-0e1f2a3b"}, None),
    "mixed-models-all-gpus": (dict(names=["NVIDIA H200"] * 4 + ["NVIDIA H100"] * 4), {}, True),
    "mixed-models-in-pci-order": (dict(names=["NVIDIA H200"] * 4 + ["NVIDIA H100"] * 4), PCI, True),
    "nvml-order-is-not-pci-order": (dict(nvlink=[(6, 7)], buses=[f"0000:{0xe1 - 0x20 * i:02x}:00.0"
                                                                for i in range(8)]),
                                    {"CUDA_VISIBLE_DEVICES": "0,1", **PCI}, False),
    "one-gpu": (dict(count=1), {}, None),
    "no-driver": (dict(init_error="DRIVER_NOT_LOADED"), {}, None),
}


@pytest.mark.parametrize("case", CASES)
def test_pcie_only_agrees_with_the_patched_launcher(case, monkeypatch, sglang_tree):
    import pynvml

    fake, environ, expected = CASES[case]
    fake = dict(fake)
    for key in ("pair_error", "init_error"):
        if key in fake:
            fake[key] = getattr(pynvml, f"NVML_ERROR_{fake[key]}")
    FakeNvml(monkeypatch, **fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    for k, v in environ.items():
        monkeypatch.setenv(k, v)
    assert launcher_says(environ) is expected
    assert doctor_says(environ) is expected


def test_recorded_matrices_follow_the_rule():
    ok, ns = {(0, 1): "OK", (1, 0): "OK"}, {(0, 1): "NS", (1, 0): "NS"}
    assert pcie_only(ns, [0, 1]) == (True, "")
    assert pcie_only(ok, [0, 1]) == (False, "")
    assert pcie_only({(0, 1): "CNS"}, [0, 1])[0] is True  # any answer but OK is "no NVLink"
    assert pcie_only({(0, 1): "U"}, [0, 1])[0] is None  # nvidia-smi's U: the query may have failed
    assert pcie_only({}, [0, 1])[0] is None and pcie_only(ns, None)[0] is None
    # pairs in the launcher's order: a failure before the first NVLink pair means unknown, after it NVLink
    assert pcie_only({(0, 1): "ERR", (0, 2): "OK"}, [0, 1, 2])[0] is None
    assert pcie_only({(0, 1): "OK", (0, 2): "ERR"}, [0, 1, 2])[0] is False
    from scripts.host.parsers import Gpu

    gpus = [Gpu(bus_id=f"00000000:{b:02X}:00.0", name="H200", uuid=f"GPU-{b}") for b in (0x41, 0x01)]
    assert visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "1", **PCI}) == (None, "1 GPU(s) visible")
    assert "set CUDA_DEVICE_ORDER=PCI_BUS_ID" in visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "1"})[1]
    assert visible_gpus(gpus, {}) == ([1, 0], "")  # CUDA's order is PCI bus order, whatever NVML's order
