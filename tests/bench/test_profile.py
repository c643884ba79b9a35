"""make report's profile part (scripts/report/profile.py): a chrome trace as SGLang v0.5.23's torch profiler writes it
(its record_function spans, CUDA-graph launches and the kernels CUPTI correlates with them), reduced per forward to
the profile the cost model refits from."""

import argparse
import gzip
import json
import sys

import pytest

from scripts.report import kernels as kn
from scripts.report import profile as pf
from scripts.report import receipt_data as rd
from scripts.report import spec_model as sm
from scripts.lib.errors import UserError

NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
IPC = "void flashinfer::comm::pcie_ipc::flat_push_kernel<__nv_bfloat16, 8>(flashinfer::comm::pcie_ipc::KernelParams)"
FORWARDS = {  # kernels (name, us) of each forward's graph, 10 us apart on the GPU
    "step[DECODE bs=1]": [("gemm", 4500), (NCCL, 30), (IPC, 6), ("gemm", 4500)],
    "step[VERIFY bs=1]": [("gemm", 6500), (NCCL, 40), (IPC, 12), ("gemm", 6500)],
    "draft": [("gemm", 300), ("ncclDevKernel_AllGather_RING_LL(x)", 8)],
    "draft_extend": [("gemm", 400), ("void flashinfer::comm::pcie_ipc::all_gather::push_kernel<8>(p)", 5)],
}


def trace(spans: list[str], iterations: int = 4, period: float = 15000.0) -> dict:
    """Each iteration: per span a CPU range with a glue kernel launched eagerly, then its graph's launch; the GPU
    runs them in order from the iteration's start (every `period` us)."""
    ev, corr = [], 0
    for i in range(iterations):
        gpu = i * period + 50
        for j, name in enumerate(spans):
            cpu = i * period + 200 * j
            ev.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 9, "tid": 9, "ts": cpu, "dur": 100})
            for k, (launch, kernels) in enumerate(
                (("cudaLaunchKernel", [("glue", 4)]), ("cudaGraphLaunch", FORWARDS[name]))
            ):
                corr += 1
                call = {"ph": "X", "cat": "cuda_runtime", "name": launch, "pid": 9, "tid": 9, "ts": cpu + 10 + k}
                ev.append(call | {"dur": 1, "args": {"correlation": corr}})
                for kname, us in kernels:
                    ran = {"ph": "X", "cat": "kernel", "name": kname, "pid": 0, "tid": 7, "ts": gpu, "dur": us}
                    ev.append(ran | {"args": {"correlation": corr, "device": 0, "stream": 7}})
                    gpu += us + 10
    ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": "draft", "pid": 0, "tid": 7, "ts": 0, "dur": 1e9})
    return {"deviceProperties": [{"id": 0, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}], "traceEvents": ev}


def recorded(tmp_path, name: str, spans: list[str]) -> dict:
    f = tmp_path / f"{name}-1.5-TP-0-DECODE.trace.json.gz"
    with gzip.open(f, "wt") as out:
        json.dump(trace(spans), out)
    return pf.read_trace(f)


def test_a_recorded_trace_reduces_to_the_profile_per_forward(tmp_path):
    plain = pf.forwards(recorded(tmp_path, "nospec", ["step[DECODE bs=1]"]))
    spec = pf.forwards(recorded(tmp_path, "spec", ["draft", "step[VERIFY bs=1]", "draft_extend"]), draft_tokens=4)
    p = pf.profile(plain, spec, tp=8, steps=3, accept_length=2.5)
    assert set(p) == {*sm.PROFILE_FIELDS, "cycle_busy_ms"}
    assert all(set(p[s]) == {*sm.STAGE_FIELDS, *kn.FIELDS} for s in sm.PROFILE_STAGES)
    assert p["gpu"].startswith("NVIDIA RTX PRO 6000") and (p["tp"], p["steps"], p["accept_length"]) == (8, 3, 2.5)
    # the graph's kernels only (the glue kernel launched before it is not the forward's); gaps are the 10 us between
    got = {s: {k: p[s][k] for k in sm.STAGE_FIELDS} for s in sm.PROFILE_STAGES}
    assert got["decode"] == {"forward_ms": 9.066, "comm_ms": 0.036, "busy_ms": 9.0, "gap_ms": 0.03, "kernels": 4}
    assert got["target_verify"] == dict(forward_ms=13.082, comm_ms=0.052, busy_ms=13.0, gap_ms=0.03, kernels=4)
    assert got["draft_decode"] == {"forward_ms": 0.318, "comm_ms": 0.008, "busy_ms": 0.3, "gap_ms": 0.01, "kernels": 2}
    assert p["decode"]["classes"] == {"all_reduce": [2, 36.0], "gemm": [2, 9000.0]} and p["decode"]["nodes"] == 4
    assert p["draft_extend"]["comm_ms"] == 0.005 and p["cycle_ms"] == 15.0  # first GPU work of one draft to the next
    # per call, by rows: NCCL's all-reduce in the graphs, PCIe IPC's all-reduce (its all-gather is not one)
    assert p["nccl_graph_us"] == {"1": 30.0, "4": 40.0} and p["pcie_ipc_us"] == {"1": 6.0, "4": 12.0}
    m = sm.Model(*sm.load(), **sm.refit(p))  # what the cost model refits from (make docs: test_cost_model.py)
    assert m.B() == pytest.approx(9.03) and m.p["glue_ms"] == pytest.approx(15.0 - 13.082 - 0.318 - 0.415)


def test_an_eager_forward_is_its_step_spans_and_gives_no_in_graph_nccl():
    t = trace(["step[VERIFY bs=1]"])
    for e in t["traceEvents"]:
        e["name"] = e["name"].replace("cudaGraphLaunch", "cudaLaunchKernel")
    got = pf.forwards(t, draft_tokens=4)
    assert got["stages"]["target_verify"][0]["kernels"] == 5 and not any(got["calls"]["nccl"].values())
    assert got["calls"]["pcie_ipc"][4] == [12] * 4


def test_a_trace_without_a_stage_is_named(tmp_path):
    plain = pf.forwards(recorded(tmp_path, "nospec", ["step[DECODE bs=1]"]))
    with pytest.raises(UserError, match="the traces show no target_verify, draft_extend forward"):
        pf.profile(plain, pf.forwards(trace(["draft"])), tp=1, steps=3, accept_length=4.0)
    with pytest.raises(UserError, match="--profiles NOSPEC,SPEC"):
        pf.main(["--profiles", "kimi-k25-tp8", "--out", str(tmp_path / "p.json")])


def test_the_receipt_runs_the_part_as_its_own_verb(tmp_path):
    part = rd.PARTS["profile"]
    assert part.result == "raw/profile.json" and part.measures
    verb = [sys.executable, "-m", "scripts.report.profile", "--out", str(tmp_path / "raw/profile.json")]
    assert part.command(tmp_path, argparse.Namespace(image="img:1")) == [*verb, "--image", "img:1"]
