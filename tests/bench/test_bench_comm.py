"""`make bench-comm` (scripts/comm/bench_comm.py, the image's verb): the harness end to end on CPU ranks (gloo,
brought up by SGLang's init_distributed_environment), its refusals, and the summary of committed H200 runs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.comm import comm_report
from scripts.series.pin import load_pin

ROOT = Path(__file__).resolve().parents[2]
TREE = ROOT / "build" / "sglang" / "python"
H200 = [ROOT / "bench" / "results" / f"bench-comm_H200_x2_{n}.json" for n in ("run3", "sglang1")]


def bench_comm(*args, path: str, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SGLANG_", "CUDA_", "EAGLE_"))}
    cmd = [sys.executable, "-m", "scripts.comm.bench_comm", *args]
    return subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env={**clean, "PATH": path, **env}
    )


def test_bench_comm_end_to_end_on_cpu_ranks(tmp_path):
    out = tmp_path / "bc.json"
    small = "--device cpu --variants default,LL --rows 4 --prefill-rows 64 --layers 1 --chain 4 --reps 1".split()
    cp = bench_comm(*small, "--out", str(out), path=os.environ["PATH"], PYTHONPATH=str(TREE))
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    res = json.loads(out.read_text())
    recs, meta = res["records"], res["meta"]
    assert {r["variant"] for r in recs} == {"default", "LL"} and meta["variants"]["LL"] == {"NCCL_PROTO": "LL"}
    assert "host" not in meta and meta["sglang_rows"] == {"server_args": None, "skipped": "--device cpu"}
    assert meta["nccl"]["expected"] == load_pin().nccl_version and meta["nccl"]["torch_build"]
    ar = [r for r in recs if r.get("kind") == "allreduce" and r.get("impl") == "nccl"]
    assert {(r["rows"], r["mode"]) for r in ar} >= {(4, "eager"), (64, "eager")}
    assert all(r["max_rel_err"] < 0.02 and not r["nan"] for r in ar) and res["summary"]["correctness"]["ok"]
    assert {r["rows"] for r in recs if r.get("kind") == "verify_forward"} == {4}
    assert "[2/2] variant LL done" in cp.stderr and "Verify-shaped forward, 1 layers (ms):" in cp.stdout
    assert "| variant | impl | rows |" in cp.stdout and out.with_suffix(".png").stat().st_size > 1000


def test_bench_comm_refuses_a_machine_without_gpus_and_an_image_without_its_mount(tmp_path):
    cp = bench_comm("--variants", "default", path="/usr/bin:/bin", PYTHONPATH=str(TREE))
    assert cp.returncode == 2 and "needs at least 2 GPUs" in cp.stderr
    cp = bench_comm("--variants", "TREE", path="/usr/bin:/bin")
    assert cp.returncode == 2 and "unknown variant 'TREE'" in cp.stderr
    cp = bench_comm("--variants", "default", path="/usr/bin:/bin", EAGLE_RESULTS=str(tmp_path / "results"))
    assert cp.returncode == 2 and "mount a directory there" in cp.stderr and "Traceback" not in cp.stderr


@pytest.mark.parametrize("path", H200, ids=lambda p: p.stem)
def test_bench_comm_summary_of_a_committed_h200_run(path):
    res = json.loads(path.read_text())
    s = comm_report.summarize(res)
    assert s["correctness"]["ok"]
    row = next(r for r in s["allreduce"] if r["impl"] == "nccl" and r["variant"] == "default" and r["rows"] == 8)
    floor = comm_report.floor_us(8, res["meta"]["world"], s["peer_gbps_min"])
    assert row["x_nccl_default"] == 1.0 and row["floor_us"] == pytest.approx(floor)
    # ring / two-shot floor: 2 (n-1)/n x bytes per rank; 8 ranks, 8 rows x 7168 bf16 at 50 GB/s
    assert comm_report.floor_us(8, 8, 50.0) == pytest.approx(2 * 7 / 8 * 8 * 7168 * 2 / 50e9 * 1e6)


def test_table_and_plot_name_the_measured_layers_and_chain(tmp_path):
    """Labels come from the records (--layers 2 --chain 4), never from the 61-layer default."""
    recs = [
        {"kind": "verify_forward", "variant": "default", "impl": "nccl", "rows": 4, "layers": 2, "mode": m, "us": us}
        for m, us in (("eager", 900.0), ("graph", 300.0))
    ]
    ar = dict(kind="allreduce", variant="default", impl="nccl", rows=4, chain=4, mode="graph")
    recs.append({**ar, "us_per_call": 20.0, "us_chain": 80.0})
    res = {"meta": {"world": 2, "gpu_name": "cpu"}, "records": recs}
    text = comm_report.table(comm_report.summarize(res))
    assert "Verify-shaped forward, 2 layers (ms)" in text and "61 layers" not in text
    assert "graph-replayed chain of 4 calls" in text
    assert comm_report.plot({**res, "summary": comm_report.summarize(res)}, tmp_path / "bc.png")
    assert (tmp_path / "bc.png").stat().st_size > 1000
