"""`make bench-comm` (scripts/bench/bench_comm.py): the harness end to end on CPU ranks (gloo), and the summary,
bars and recommendation computed from a committed H200 run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.bench import bench_comm, comm_report
from scripts.host.pcie import package_dir, read_defaults

ROOT = Path(__file__).resolve().parents[2]
H200 = sorted((ROOT / "bench" / "results").glob("bench-comm_H200_x2_run*.json"))


def test_bench_comm_harness_end_to_end_on_cpu(tmp_path):
    out = tmp_path / "bc.json"
    cp = subprocess.run([sys.executable, "-m", "scripts.bench.bench_comm", "--device", "cpu", "--variants",
                         "default,pcie_defaults,LL", "--rows", "4,8", "--prefill-rows", "64", "--layers", "2",
                         "--chain", "4", "--iters", "3", "--reps", "2", "--out", str(out)],
                        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    res = json.loads(out.read_text())
    recs = res["records"]
    # every variant ran in its own ranks with its own environment, and every reduction was checked
    assert {r["variant"] for r in recs} == {"default", "pcie_defaults", "LL"}
    assert res["meta"]["variants"]["pcie_defaults"] == read_defaults(package_dir())  # from the patched source
    ar = [r for r in recs if r.get("kind") == "allreduce" and r.get("impl") == "nccl"]
    assert {(r["rows"], r["mode"]) for r in ar} >= {(4, "eager"), (8, "eager_single"), (64, "eager")}
    assert all(r["max_rel_err"] < 0.02 and not r["nan"] for r in ar)
    vf = [r for r in recs if r.get("kind") == "verify_forward" and "us" in r]
    assert {r["rows"] for r in vf} == {4, 8} and all(r["layers"] == 2 and r["us"] > 0 for r in vf)
    # the SGLang rows (PCIe IPC, fused op) need CUDA ranks: skipped on CPU, and the result says so
    assert res["meta"]["sglang_rows"] == {"server_args": None, "skipped": "--device cpu"}
    assert not [r for r in recs if str(r.get("impl", "")).startswith("sglang")]
    assert res["summary"]["correctness"]["ok"]
    assert "[3/3] variant LL done" in cp.stderr  # progress
    assert "Verify-shaped forward, 2 layers" in cp.stdout and out.with_suffix(".png").stat().st_size > 1000


def test_bench_comm_refuses_a_machine_without_gpus():
    cp = subprocess.run([sys.executable, "-m", "scripts.bench.bench_comm"], cwd=ROOT, capture_output=True, text=True)
    assert cp.returncode == 2 and "needs at least 2 GPUs" in cp.stderr


def test_bench_comm_unknown_variant_is_named():
    with pytest.raises(Exception, match="unknown variant 'TREE'"):
        bench_comm.variants(["TREE"])


def _default_variant_ran(path: Path) -> bool:
    """run4's default variant (the one carrying the forward and fused rows) died on an import: its bars are absent."""
    return not [r for r in json.loads(path.read_text())["records"]
                if r.get("kind") == "variant_error" and r.get("variant") == "default"]


@pytest.mark.skipif(not H200, reason="no committed H200 run")
def test_bench_comm_summary_of_a_committed_h200_run():
    res = json.loads([p for p in H200 if _default_variant_ran(p)][-1].read_text())
    s = comm_report.summarize(res)
    assert s["correctness"]["ok"]
    bars = s["bars"]
    assert bars["graph_vs_eager_nccl_8rows"]["pass"] and bars["fused_graph_vs_nccl_eager_8rows"]["pass"]
    # the recommendation is the fastest correct graph-replayed forward at each row count
    for rows, pick in s["recommendation"].items():
        cands = [r["graph_ms"] for r in s["verify_forward"] if r["rows"] == int(rows) and r["graph_ms"]]
        assert pick["graph_ms"] == min(cands)
    # per-call rows carry the ratio to NCCL and to the bandwidth floor measured in the same run
    row = next(r for r in s["allreduce"] if r["impl"] == "nccl" and r["variant"] == "default" and r["rows"] == 8)
    assert row["x_nccl_default"] == 1.0 and row["floor_us"] == pytest.approx(
        comm_report.floor_us(8, res["meta"]["world"], s["peer_gbps_min"]))


def test_bench_comm_floor():
    # ring / two-shot: 2 (n-1)/n x bytes per rank; 8 ranks, 8 rows x 7168 bf16 at 50 GB/s = 4.0 us
    assert comm_report.floor_us(8, 8, 50.0) == pytest.approx(2 * 7 / 8 * 8 * 7168 * 2 / 50e9 * 1e6)
    assert comm_report.floor_us(8, 8, None) is None


def test_table_and_plot_name_the_measured_layers_and_chain(tmp_path):
    """A result measured with --layers 2 --chain 4 is labelled so, also when its meta does not say (files written
    before meta carried the layer count): the labels come from the records, never from the 61-layer default."""
    recs = [{"kind": "verify_forward", "variant": "default", "impl": "nccl", "rows": 4, "layers": 2, "mode": m,
             "us": us} for m, us in (("eager", 900.0), ("graph", 300.0))]
    recs += [{"kind": "allreduce", "variant": "default", "impl": "nccl", "rows": 4, "chain": 4, "mode": "graph",
              "us_per_call": 20.0, "us_chain": 80.0}]
    res = tmp_path / "bc.json"
    res.write_text(json.dumps({"meta": {"world": 2, "gpu_name": "cpu"}, "records": recs}))
    cp = subprocess.run([sys.executable, "-m", "scripts.bench.bench_comm", "--plot", str(res)], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert "Verify-shaped forward, 2 layers (ms)" in cp.stdout and "61 layers" not in cp.stdout
    assert "graph-replayed chain of 4 calls" in cp.stdout
