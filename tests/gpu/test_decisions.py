"""What the patched code decides on the real device and host.

Fusion auto-enable and token cap resolved on this GPU (no backend given), the launcher's NVML answer for this TP
group, and the PCIe-IPC autotune outcome (what it covered, whether it saved configurations, how long it took).
Skips without >= 2 GPUs. (The fusion workspace's sizes: test_collectives, where the battery builds it.)
"""

from __future__ import annotations

from _harness import run_ranks


def test_decisions_on_this_device(gpu_world, gpu_timeout, record):
    outcome = run_ranks("decisions", world=gpu_world, timeout=gpu_timeout)
    assert outcome.ok, outcome.explain()
    results = outcome.results
    d = results[0]
    record("decisions", d)
    assert all(r["fusion_backend_resolved"] == d["fusion_backend_resolved"] for r in results)
    assert all(r["launcher"]["topology"] == d["launcher"]["topology"] for r in results)
    assert d["launcher"]["topology"] in ("pcie-only", "nvlink"), d["launcher"]
    # the PCIe-IPC workspace was built and autotuned (or said why it kept FlashInfer's seed policy)
    pcie = d["pcie_ipc"]
    assert pcie["present"] and not pcie["disabled"], pcie
    assert pcie["tune_cache"]["bytes_after"] or any("seed policy" in line for line in d["log"]), (pcie, d["log"])
