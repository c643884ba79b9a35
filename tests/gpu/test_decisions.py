"""The PCIe-IPC all-reduce's start-up decision on this device (_ranks.decisions): timed per decode size in CUDA
graphs, then read back from the cache by a second start; forced by SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1; off with =0.
Every rank holds the same table and each size's all-reduce reaches the backend it names, summing right."""

from _harness import run_ranks

# What RouteLog records for each backend of the table (NCCL: pynccl in a graph, torch.distributed eagerly).
ROUTED = {"pcie_ipc": {"pcie_ipc"}, "nccl": {"pynccl", "torch_distributed"}, "flashinfer": {"flashinfer"}}


def test_allreduce_backend_decision_on_this_device(gpu_world, gpu_timeout, record, tmp_path):
    tables = {}
    for start, setting, source in (
        ("timed", None, "measured"),
        ("cached", None, "cache"),
        ("forced", "1", "forced"),
        ("off", "0", "off"),
    ):
        outcome = run_ranks(
            "decisions",
            world=gpu_world,
            timeout=gpu_timeout,
            params={"setting": setting},
            env={"FLASHINFER_AUTOTUNE_DIR": str(tmp_path)},
        )
        assert outcome.ok, outcome.explain()
        record(f"allreduce_backends_{start}", outcome.results[0])
        reports = [x["report"] for x in outcome.results]
        assert reports[0]["source"] == source, (start, reports[0], outcome.results[0]["log"])
        assert all(rep["source"] == source and rep["sizes"] == reports[0]["sizes"] for rep in reports), start
        tables[start] = reports[0]["sizes"]
        for x in outcome.results:
            for call, size in zip(x["calls"], x["report"]["sizes"], strict=True):
                assert set(call["backend"]) <= ROUTED[size["backend"]], (start, call, size)
                assert not call["nan"] and call["max_rel_err"] < 2e-2, (start, call)
    assert tables["cached"] == tables["timed"] and len(tables["timed"]) >= 4, tables
    assert {s["backend"] for s in tables["forced"]} == {"pcie_ipc"} and tables["off"] == []
