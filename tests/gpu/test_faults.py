"""What happens when one rank fails. The kernels under test spin on peer flags with no timeout of their own, so a
group whose ranks disagree about a backend would hang: every fault must end with every rank on the same backend,
with correct results, or with the same clear error on every rank; never a hang (the harness timeout ends one)."""

import pytest

from _harness import run_ranks

# scenario of _ranks.py -> (the failing rank, from the end where negative; PCIe IPC disabled afterwards, None: either)
PCIE_IPC_FAULTS = {
    "fault_pcie_ipc_oom": (-1, True),  # a failed build leaves PCIe IPC off everywhere
    "fault_pcie_ipc_bind": (-1, True),
    "fault_pcie_ipc_tune": (-1, None),
    "fault_pcie_ipc_tune_dir": (0, False),  # nobody tuned, nobody hung: the same seed-policy workspace on all
    "fault_nvml": (-1, None),  # one rank's NVML answer differs: it changes nothing
}


def _results(scenario, world, timeout, bad_rank):
    outcome = run_ranks(scenario, world=world, timeout=min(timeout, 180), params={"bad_rank": bad_rank % world})
    assert outcome.ok, outcome.explain()  # a hang too
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


@pytest.mark.parametrize("scenario", PCIE_IPC_FAULTS)
def test_a_pcie_ipc_or_nvml_fault_on_one_rank_ends_in_agreement(gpu_world, gpu_timeout, record, scenario):
    bad_rank, want_disabled = PCIE_IPC_FAULTS[scenario]
    results = _results(scenario, gpu_world, gpu_timeout, bad_rank)
    calls, disabled = _same_backends_and_right(results)
    record(scenario, {"calls": calls, "pcie_ipc_disabled": disabled, "prepare": [r["prepare"] for r in results]})
    if want_disabled is not None:
        assert disabled is want_disabled


@pytest.mark.parametrize("scenario", ["fault_fusion_oom", "fault_fusion_exchange"])
def test_fusion_workspace_fault_on_one_rank_ends_in_agreement(gpu_world, gpu_timeout, record, scenario):
    results = _results(scenario, gpu_world, gpu_timeout, -1)
    declined = [r["fused_declined"] for r in results]
    record(scenario, {"declined": declined, "fusion": [r["fusion"] for r in results]})
    assert len(set(declined)) == 1 and declined[0], f"the fused op ran on some ranks only: {declined}"
    _same_backends_and_right(results)
