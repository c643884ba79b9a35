"""What the patched code decides on the real device and host.

Fusion auto-enable and token cap resolved on this GPU (no backend given), the fusion workspace's preflight sizes
against FlashInfer's real allocations, the launcher's NVML answer for this TP group, and the PCIe-IPC autotune
outcome (what it covered, whether it saved configurations, how long it took). Skips without >= 2 GPUs.
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
    fusion = d["fusion"]
    if fusion["initialized"] and fusion["allocated"]:
        # the preflight must probe at least what FlashInfer allocates, and not more than one 2 MiB granule above
        for probe, real in zip(fusion["preflight_sizes"], fusion["allocated"]):
            assert real <= probe <= real + (2 << 20), (fusion["preflight_sizes"], fusion["allocated"])
