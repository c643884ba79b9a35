"""What happens when one rank fails.

Faults, one rank at a time, each bounded by the harness timeout: the kernels under test spin on peer flags with no
timeout of their own, so a group whose ranks disagree about a backend would hang; every fault must end with every
rank on the same backend, with correct results, or with the same clear error on every rank. Never a hang.
Skips without >= 2 GPUs.
"""

from __future__ import annotations

import pytest

from _harness import run_ranks


def _ok(outcome):
    assert not outcome.hung, outcome.explain()
    assert outcome.ok, outcome.explain()
    return outcome.results


def _same_backends_and_right(results):
    calls = [r["calls"] for r in results]
    for i, call in enumerate(calls[0]):
        routes = [c[i]["backend"] for c in calls]
        assert all(x == routes[0] for x in routes), f"{call['rows']} rows: ranks took {routes}"
        for rank, c in enumerate(calls):
            assert not c[i]["nan"] and c[i]["max_rel_err"] < 2e-2, f"rank {rank}: {c[i]}"
    disabled = [r["pcie_ipc_disabled"] for r in results]
    assert len(set(disabled)) == 1, f"PCIe IPC disabled on some ranks only: {disabled}"
    return calls[0], disabled[0]


@pytest.mark.parametrize(
    "scenario, bad_rank",
    [
        ("fault_pcie_ipc_oom", -1),
        ("fault_pcie_ipc_bind", -1),
        ("fault_pcie_ipc_tune", -1),
        ("fault_pcie_ipc_tune_dir", 0),
    ],
)
def test_pcie_ipc_fault_on_one_rank_ends_in_agreement(gpu_world, gpu_timeout, record, scenario, bad_rank):
    results = _ok(
        run_ranks(scenario, world=gpu_world, timeout=min(gpu_timeout, 180), params={"bad_rank": bad_rank % gpu_world})
    )
    calls, disabled = _same_backends_and_right(results)
    record(scenario, {"calls": calls, "pcie_ipc_disabled": disabled, "prepare": [r["prepare"] for r in results]})
    if scenario in ("fault_pcie_ipc_oom", "fault_pcie_ipc_bind"):  # a failed build leaves PCIe IPC off everywhere
        assert disabled is True
    if scenario == "fault_pcie_ipc_tune_dir":  # nobody tuned, nobody hung: the same seed-policy workspace on all
        assert disabled is False


@pytest.mark.parametrize("scenario", ["fault_fusion_oom", "fault_fusion_exchange"])
def test_fusion_workspace_fault_on_one_rank_ends_in_agreement(gpu_world, gpu_timeout, record, scenario):
    results = _ok(
        run_ranks(scenario, world=gpu_world, timeout=min(gpu_timeout, 180), params={"bad_rank": gpu_world - 1})
    )
    declined = [r["fused_declined"] for r in results]
    record(scenario, {"declined": declined, "fusion": [r["fusion"] for r in results]})
    assert len(set(declined)) == 1 and declined[0], f"the fused op ran on some ranks only: {declined}"
    _same_backends_and_right(results)


def test_nvml_answer_differing_on_one_rank_changes_nothing(gpu_world, gpu_timeout, record):
    results = _ok(
        run_ranks("fault_nvml", world=gpu_world, timeout=min(gpu_timeout, 180), params={"bad_rank": gpu_world - 1})
    )
    record("fault_nvml", {"prepare": [r["prepare"] for r in results]})
    _same_backends_and_right(results)
