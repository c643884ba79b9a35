"""The GPU tier's harness itself, in CI: CPU ranks over gloo (SGLang's CPU engine, no NCCL library) spawned, brought
up, failing or hanging, and the GPU tests' skip where there is no GPU; and the group decisions that need no GPU, on
the patch tests' CPU ranks (their scenarios in tests/patches/_gloo.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

from _harness import gpu_count, run_ranks
from scripts.box.results import read_junit

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "patches"))  # the patch tests' CPU ranks (_gloo) and PCIe-IPC stand-ins (_pcie)
import _gloo  # noqa: E402


def test_harness_brings_sglang_up_on_cpu_ranks():
    """Two CPU ranks: SGLang's TP group of 2 over gloo, each rank's all-reduce equal to the fp32 sum of both ranks'
    inputs, routed through SGLang's in-place path to torch.distributed (no NCCL anywhere)."""
    outcome = run_ranks("routing_only", world=2, device="cpu", timeout=240, params={"rows": [1, 8]})
    assert outcome.ok, outcome.explain()
    results = outcome.results
    # the published state the runners read (the decisions test reads the fusion backend there): no fusion on CPU
    assert all(r["fusion_backend_published"] is None and r["device"] == "cpu" for r in results)
    assert [r["tp_size"] for r in results] == [2, 2] and sorted(r["rank_in_group"] for r in results) == [0, 1]
    assert len({r["pid"] for r in results}) == 2
    for call in (c for r in results for c in r["calls"]):
        assert call["backend"] == ["torch_distributed"] and not call["nan"] and call["max_rel_err"] < 2e-2, call


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


@pytest.mark.parametrize("short_rank", [None, 1])
def test_pcie_ipc_build_is_a_group_decision(short_rank):
    """The PCIe-IPC workspace is built on both ranks or on neither: with one rank short of memory, neither enters
    FlashInfer's build (whose handle exchange would block the other)."""
    results = _gloo.run("pcie_ipc_vote", short_rank=short_rank)
    want = (True, []) if short_rank else (False, [64 * 7168])
    assert [(r["disabled"], r["built"]) for r in results] == [want] * 2


@pytest.mark.parametrize("fault, bad_rank", [("unwritable", 0), ("raises", 1)])
def test_pcie_ipc_autotune_is_a_group_decision(fault, bad_rank):
    """A tune cache one rank cannot write keeps every rank from tuning (FlashInfer writes it on rank 0 between two
    barriers: an I/O error there would leave the others in the second); a tune() raising on one rank takes PCIe IPC
    off on every rank (each destroys its workspace): no rank is left in a collective its peers never enter."""
    results = _gloo.run("pcie_ipc_tune_vote", autotune=True, bad_rank=bad_rank, fault=fault)
    want = (False, 0, 0) if fault == "unwritable" else (True, 1, 1)
    assert [(x["disabled"], x["tune"], x["destroy"]) for x in results] == [want] * 2


@pytest.mark.parametrize(
    "fail", [None, "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle", "cuMemMap", "cuMemSetAccess"]
)
def test_fusion_workspace_handle_exchange_is_a_group_decision(fail):
    """The fusion preflight exports, exchanges (FlashInfer's own SCM_RIGHTS exchange), imports and maps one probe
    handle per workspace buffer: one rank failing any step makes every rank skip the fusion; with no failure both
    proceed; every probe handle is released."""
    results = _gloo.run("fusion_exchange_vote", bad_rank=1, fail=fail)
    assert [x["proceed"] for x in results] == [fail is None] * 2, results
    assert all(x["releases"] >= x["creates"] for x in results)
    if fail == "cuMemExportToShareableHandle":  # voted down before any exchange
        assert [x["imports"] for x in results] == [0, 0]
