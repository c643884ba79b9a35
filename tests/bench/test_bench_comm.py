"""`make bench-comm` (scripts/bench/bench_comm.py): the harness end to end on CPU ranks (gloo), and the summary,
bars and recommendation computed from a committed H200 run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.bench import bench_comm, comm_report
from scripts.series.pin import load_pin

ROOT = Path(__file__).resolve().parents[2]
# committed H200 runs with the default NCCL variant (run4's failed at bring-up: bench/results/README.md); the last
# direct-FlashInfer run and the run through SGLang's paths
H200 = [ROOT / "bench" / "results" / f"bench-comm_H200_x2_{n}.json" for n in ("run3", "sglang1")]


def test_bench_comm_harness_end_to_end_on_cpu(tmp_path, sglang_tree):
    out = tmp_path / "bc.json"
    env = {**os.environ, "PYTHONPATH": str(sglang_tree / "python")}  # the patched launcher answers pcie_defaults
    cp = subprocess.run([sys.executable, "-m", "scripts.bench.bench_comm", "--device", "cpu", "--variants",
                         "default,pcie_defaults,LL", "--rows", "4,8", "--prefill-rows", "64", "--layers", "2",
                         "--chain", "4", "--iters", "3", "--reps", "2", "--out", str(out)],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    res = json.loads(out.read_text())
    recs = res["records"]
    # every variant ran in its own ranks with its own environment, and every reduction was checked
    assert {r["variant"] for r in recs} == {"default", "pcie_defaults", "LL"}
    from sglang.srt.entrypoints.pcie_defaults import nccl_defaults

    assert res["meta"]["variants"]["pcie_defaults"] == nccl_defaults({})[0]  # what the launcher sets, asked of it
    # the NCCL axis: what torch loaded, what it was built with, and what the image pins (here: not in an image)
    import torch

    nccl = res["meta"]["nccl"]
    assert nccl["expected"] == load_pin().nccl_version and nccl["expected_from"] == "patches/pin.toml [nccl]"
    assert nccl["torch_build"] == ".".join(map(str, torch.cuda.nccl.version()[:3])) and nccl["loaded"]
    assert nccl["package"] == load_pin().nccl_package and res["meta"]["image"] is None
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


def test_bench_comm_refuses_a_machine_without_gpus(tmp_path):
    cp = run_bench_comm(path=f"{tmp_path}{os.pathsep}/usr/bin:/bin")  # no docker client here
    assert cp.returncode == 2 and "sees 0 CUDA GPU(s), and 2 are needed" in cp.stderr


def test_bench_comm_unknown_variant_is_named():
    with pytest.raises(Exception, match="unknown variant 'TREE'"):
        bench_comm.variants(["TREE"])


def test_pcie_defaults_variant_without_the_patched_launcher(monkeypatch, capsys):
    """Named with --variants it is an error with the fix; only in the default list it is skipped, and said."""
    from scripts.host import pcie
    from scripts.lib.errors import UserError

    monkeypatch.setitem(sys.modules, pcie.MODULE, None)  # this python cannot import the patched launcher
    with pytest.raises(UserError, match=r"variant pcie_defaults: .*cannot import.*PYTHONPATH=build/sglang/python.*"
                                        r"or drop pcie_defaults from --variants"):
        bench_comm.variants(["default", "pcie_defaults"])
    skipped: dict = {}
    assert bench_comm.variants(["default", "pcie_defaults"], given=False, skipped=skipped) == {"default": {}}
    assert "cannot import" in skipped["pcie_defaults"] and "pcie_defaults skipped" in capsys.readouterr().err


@pytest.mark.parametrize("path", H200, ids=lambda p: p.stem)
def test_bench_comm_summary_of_a_committed_h200_run(path):
    res = json.loads(path.read_text())
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


# ---------------------------------------------------------------------------------------------------------------
# where it runs: here, or in the serving image (a docker client on PATH that records what it is asked to run)

FAKE_DOCKER = """#!/bin/sh
# Stands in for the docker client: answers `image inspect` as told, and records the argv of `run` (runs nothing).
case "$1" in
  image)
    case "{state}" in
      present) echo sha256:0123456789abcdef0123456789abcdef; exit 0 ;;
      missing) echo "Error response from daemon: No such image: $5" >&2; exit 1 ;;
      down) echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock." >&2; exit 1 ;;
    esac ;;
  run) printf '%s\\n' "$@" > "{log}"; exit 0 ;;
esac
exit 3
"""


def fake_docker(tmp_path, state="present"):
    bindir, log = tmp_path / "bin", tmp_path / "docker-run.argv"
    bindir.mkdir()
    (bindir / "docker").write_text(FAKE_DOCKER.format(state=state, log=log))
    (bindir / "docker").chmod(0o755)
    return bindir, log


def run_bench_comm(*args, path, **env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SGLANG_", "CUDA_", "EAGLE_"))}
    return subprocess.run([sys.executable, "-m", "scripts.bench.bench_comm", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**clean, "PATH": path, **env})


def test_bench_comm_runs_in_the_image_when_this_python_cannot(tmp_path):
    bindir, log = fake_docker(tmp_path)
    out = tmp_path / "res" / "bc.json"
    cp = run_bench_comm("--variants", "default,LL", "--rows", "4", "--out", str(out),
                        path=f"{bindir}{os.pathsep}/usr/bin:/bin", NCCL_DEBUG="WARN", SGLANG_API_KEY="k")
    assert cp.returncode == 0, cp.stderr
    image = load_pin().serving_image
    assert f"bench-comm: running in the image {image} (sha256:" in cp.stderr
    assert "because" in cp.stderr and "sees 0 CUDA GPU(s)" in cp.stderr  # the route and why
    argv = log.read_text().splitlines()
    assert argv[:5] == ["run", "--rm", "--gpus", "all", "--ipc=host"]
    assert argv[argv.index(image) + 1:] == ["bench-comm", "--here", "--variants", "default,LL", "--rows", "4",
                                            "--out", "/results/bc.json"]
    assert f"{out.parent.resolve()}:/results" in argv and ["-e", "NCCL_DEBUG"] == argv[argv.index("NCCL_DEBUG") - 1:
                                                                                         argv.index("NCCL_DEBUG") + 1]
    assert "WARN" not in argv  # variables go by name: docker copies the value
    assert "SGLANG_API_KEY" not in argv  # the server's key has no business in a benchmark container


@pytest.mark.parametrize("state, why", [(None, "docker is not installed"),
                                        ("missing", "is not here (build it: make image)"),
                                        ("down", "the docker engine does not answer")])
def test_bench_comm_without_gpus_here_or_the_image_says_what_is_missing(tmp_path, state, why):
    bindir = fake_docker(tmp_path, state)[0] if state else tmp_path
    cp = run_bench_comm("--variants", "default", path=f"{bindir}{os.pathsep}/usr/bin:/bin")
    assert cp.returncode == 2, cp.stderr
    assert "bench-comm cannot run here (" in cp.stderr and "sees 0 CUDA GPU(s)" in cp.stderr
    assert why in cp.stderr and "make image" in cp.stderr and "Traceback" not in cp.stderr


def test_bench_comm_here_never_uses_the_image(tmp_path):
    bindir, log = fake_docker(tmp_path)
    cp = run_bench_comm("--here", "--variants", "default", path=f"{bindir}{os.pathsep}/usr/bin:/bin")
    assert cp.returncode == 2 and "needs at least 2 GPUs" in cp.stderr and not log.exists()


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
