"""The GPU tier's harness itself, in CI: CPU ranks over gloo (SGLang's CPU engine, no NCCL library) spawned, brought
up, failing or hanging, and the GPU tests' skip where there is no GPU; and the group decisions that need no GPU.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from _harness import gpu_count, run_ranks
from scripts.box.results import read_junit

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def cpu_routing():
    return run_ranks("routing_only", world=2, device="cpu", timeout=240, params={"rows": [1, 8]})


def test_harness_brings_sglang_up_on_cpu_ranks(cpu_routing):
    """Two CPU ranks: SGLang's TP group of 2 over gloo, each rank's all-reduce equal to the fp32 sum of both ranks'
    inputs, routed through SGLang's in-place path to torch.distributed (no NCCL anywhere)."""
    assert cpu_routing.ok, cpu_routing.explain()
    # the published state the runners read (the decisions test reads the fusion backend there): no fusion on CPU
    assert all(r["fusion_backend_published"] is None for r in cpu_routing.results)
    assert [r["tp_size"] for r in cpu_routing.results] == [2, 2]
    assert sorted(r["rank_in_group"] for r in cpu_routing.results) == [0, 1]
    assert len({r["pid"] for r in cpu_routing.results}) == 2
    for r in cpu_routing.results:
        assert r["device"] == "cpu"
        for call in r["calls"]:
            assert call["backend"] == ["torch_distributed"], call
            assert not call["nan"] and call["max_rel_err"] < 2e-2, call


def test_harness_reports_a_rank_error_with_its_traceback():
    outcome = run_ranks("fail_on", world=2, device="cpu", timeout=120, params={"bad_rank": 1})
    assert not outcome.ok and not outcome.hung
    assert list(outcome.errors) == [1] and "injected failure on rank 1" in outcome.errors[1]
    assert outcome.results[0] == {"rank": 0}
    assert "rank 1 failed" in outcome.explain()


def test_harness_ends_a_hang_at_the_timeout():
    outcome = run_ranks("hang_on", world=2, device="cpu", timeout=15, params={"stuck_rank": 0})
    assert outcome.hung == [0] and not outcome.ok
    assert outcome.seconds < 60
    assert "a hang" in outcome.explain()


def test_gpu_tests_skip_with_their_reason_without_gpus(tmp_path):
    """On a machine without GPUs the tier's GPU tests skip, each saying why, and its result counts them."""
    if gpu_count() >= 2:
        pytest.skip("this machine has GPUs: the GPU tests run instead of skipping")
    out = tmp_path / "result.xml"
    tier = [str(HERE), "--ignore", str(HERE / "serve"), "-k", "not harness", f"--junitxml={out}"]
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tier]
    cp = subprocess.run(argv, cwd=HERE.parents[1], capture_output=True, text=True, timeout=600)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    doc = read_junit(out)
    assert doc["passed"] == doc["failed"] == 0 and doc["skipped"] >= 5, doc
    assert all("needs >= 2 GPUs" in c["message"] for c in doc["cases"]), doc["cases"]


def two_cpu_ranks(scenario: str, **params) -> list:
    """What `scenario` returned on each of two CPU ranks over gloo (SGLang's real TP group)."""
    outcome = run_ranks(scenario, world=2, device="cpu", timeout=240, params=params)
    assert outcome.ok, outcome.explain()
    return outcome.results


@pytest.mark.parametrize("short_rank", [None, 1])
def test_pcie_ipc_build_is_a_group_decision(short_rank):
    """The PCIe-IPC workspace is built on both ranks or on neither: with one rank short of memory, neither enters
    FlashInfer's build (whose handle exchange would block the other)."""
    results = two_cpu_ranks("pcie_ipc_vote", short_rank=short_rank)
    disabled, built = [r["disabled"] for r in results], [r["built"] for r in results]
    if short_rank is None:
        assert disabled == [False, False] and built == [[64 * 7168]] * 2
    else:
        assert disabled == [True, True] and built == [[], []]


@pytest.mark.parametrize("fault, bad_rank", [("unwritable", 0), ("raises", 1)])
def test_pcie_ipc_autotune_is_a_group_decision(fault, bad_rank):
    """A tune cache one rank cannot write keeps every rank from tuning (all on the seed policy, PCIe IPC kept); a
    tune() that raises on one rank takes PCIe IPC off on every rank (each destroys its workspace), so no rank is left
    in a collective its peers never enter."""
    results = two_cpu_ranks("pcie_ipc_tune_vote", bad_rank=bad_rank, fault=fault)
    got = [(x["disabled"], x["tune"], x["destroy"]) for x in results]
    if fault == "unwritable":
        assert got == [(False, 0, 0)] * 2
    else:
        assert got == [(True, 1, 1)] * 2


@pytest.mark.parametrize(
    "fail", [None, "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle", "cuMemMap", "cuMemSetAccess"]
)
def test_fusion_workspace_handle_exchange_is_a_group_decision(fail):
    """The fusion preflight exports, exchanges (FlashInfer's own SCM_RIGHTS exchange), imports and maps one probe
    handle per workspace buffer: one rank failing any step makes every rank skip the fusion; with no failure both
    proceed; every probe handle is released."""
    results = two_cpu_ranks("fusion_exchange_vote", bad_rank=1, fail=fail)
    assert [x["proceed"] for x in results] == [fail is None] * 2, results
    for x in results:
        assert x["releases"] >= x["creates"]
    if fail == "cuMemExportToShareableHandle":  # voted down before any exchange
        assert [x["imports"] for x in results] == [0, 0]
