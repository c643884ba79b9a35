"""make test-serve end to end: on a GPU machine the whole tier (skipped elsewhere, with the reason); on CPU its
refusals and its processes, ports, steps and documents against tests/serve/fake_sglang.py (a fake `nvidia-smi`
on PATH, tests/serve/fake_python as the servers' interpreter)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.host import route, serve_plan as plan

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

TREE = ROOT / "build" / "sglang" / "python"


def tier(args: list[str], tmp_path, gpus: int = 1, timeout: float = 900) -> subprocess.CompletedProcess:
    """python -m scripts.host.serve_tier ARGS, with `gpus` fake GPUs in nvidia-smi -L (0: no nvidia-smi)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if gpus:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n" + "".join(
            f'echo "GPU {i}: NVIDIA H200 (UUID: GPU-fake-{i})"\n' for i in range(gpus)))
        (bin_dir / "nvidia-smi").chmod(0o755)
    path = os.environ["PATH"] if gpus else "/usr/bin:/bin"
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "PATH": f"{bin_dir}:{path}", "PYTHONPATH": str(TREE), "EAGLE_REAL_PYTHON": sys.executable,
           "TMPDIR": str(tmp_path / "tmp")}
    return subprocess.run([sys.executable, "-m", "scripts.host.serve_tier", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_without_a_gpu_it_says_where_to_run_it(tmp_path):
    cp = tier(["--out", str(tmp_path / "r.json")], tmp_path, gpus=0)
    assert cp.returncode == 2 and not (tmp_path / "r.json").exists()
    assert "no NVIDIA GPU visible here" in cp.stderr and "eagle-fast-verify/sglang:" in cp.stderr
    assert "sglang-flashinfer:/root/.cache/flashinfer" in cp.stderr and " test-serve);" in cp.stderr


def test_where_it_cannot_serve_here_nor_in_the_image_it_says_both(tmp_path):
    cp = tier(["--out", str(tmp_path / "r.json")], tmp_path)  # this python's torch sees no CUDA GPU
    assert cp.returncode == 2 and not (tmp_path / "r.json").exists()
    assert "test-serve cannot run here (" in cp.stderr and "sees no CUDA GPU" in cp.stderr
    assert "nor in the image (" in cp.stderr


FAKE_DOCKER = """#!/bin/sh
echo "$*" >> "{log}"
case "$1 $2" in
  "image inspect") echo sha256:0123456789abcdef0123; exit 0;;
esac
results=$(echo "$*" | sed -n 's/.*-v \\([^ ]*\\):\\/results .*/\\1/p')
echo '{{"world": 1, "passed": 66, "failed": 0}}' > "$results/r.json"
"""


def test_with_image_it_runs_the_image_verb_and_reads_its_document(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "docker").write_text(FAKE_DOCKER.format(log=tmp_path / "docker.log"))
    (tmp_path / "bin" / "docker").chmod(0o755)
    cp = tier(["--image", "eagle/sglang:x", "--out", str(tmp_path / "res" / "r.json"), "--phases", "kimi-mla"],
              tmp_path)
    assert cp.returncode == 0, cp.stderr
    run = [ln for ln in (tmp_path / "docker.log").read_text().splitlines() if ln.startswith("run ")][0].split()
    assert run[run.index("eagle/sglang:x") + 1:][:4] == ["test-serve", "--here", "--out", "/results/r.json"]
    assert f"{tmp_path / 'res'}:/results" in run and "--gpus" in run and "--ipc=host" in run
    assert run[-2:] == ["--phases", "kimi-mla"] and "running in the image eagle/sglang:x" in cp.stderr


def test_more_ranks_than_gpus_and_a_busy_port_are_refused(tmp_path):
    cp = tier(["--world", "2", "--standins"], tmp_path)
    assert cp.returncode == 2 and "--world 2, but 1 GPU(s) are visible here: pass --world 1" in cp.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        base = s.getsockname()[1]
        cp = tier(["--standins", "--phases", "kimi-nospec", "--port", str(base)], tmp_path)
    assert cp.returncode == 2 and f"port(s) {base} are in use" in cp.stderr and "--port BASE" in cp.stderr


def test_the_tier_starts_its_phases_through_serve_steps_them_and_stops_every_server(sglang_tree, tmp_path):
    out = tmp_path / "res" / "r.json"
    cp = tier(["--standins", "--phases", "llama-eager", "--python", str(HERE / "fake_python"), "--out", str(out),
               "--port", "31500", "--ready-timeout", "120"], tmp_path)
    doc = json.loads(out.read_text())
    assert doc["world"] == 1 and doc["route"] == "lent-gpu" and list(doc["phases"]) == [
        "llama-nospec", "llama-graph", "llama-eager"]
    for name, rec in doc["phases"].items():
        assert rec["ready_s"] is not None and rec["stop"]["clean"] and rec["stop"]["port_free"], name
        assert rec["command"].split()[1:3] == ["-m", "scripts.host.serve"] and "<models>" in rec["command"]
        assert len(rec["outputs"]["seq"]) == len(plan.PROMPT_LENS)
    assert doc["phases"]["llama-graph"]["spec"]["spec_cuda_graph"]["target_verify"]["graph"] > 0
    assert len(doc["phases"]["llama-graph"]["timing"]) == 3 and doc["proxy"].startswith("proxy: torch ")
    # the fake is no SGLang: its eager verify is not logged per forward, and it runs as fast as its graph
    assert {(c["phase"], c["name"].split(" >=")[0]) for c in doc["checks"] if not c["ok"]} == {
        ("llama-eager", "the first eager target_verify forward is logged with its reason"),
        ("timing", "bs-1 tok/s with the verify graph")}
    assert cp.returncode == 1 and f"{doc['passed']} passed, 2 failed" in cp.stderr
    log = out.with_suffix(".log").read_text()
    assert "===== llama-eager: " in log and "fake sglang on 127.0.0.1:31520" in log and str(tmp_path) not in log
    assert not list((tmp_path / "tmp").glob("eagle-test-serve-*"))  # its models and logs are gone


@pytest.mark.skipif(not route.gpu_names(), reason="needs an NVIDIA GPU: make test-serve starts real servers")
def test_on_this_machines_gpus_every_check_passes(tmp_path):
    """The tier itself (the serving image, or with --standins where sgl-kernel cannot load)."""
    from scripts.host import serve_tier

    args = ["--out", str(tmp_path / "r.json")] + (["--standins"] if os.environ.get("EAGLE_STANDINS") else [])
    rc = serve_tier.main(args)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert rc == 0 and doc["failed"] == 0, [c for c in doc["checks"] if not c["ok"]]
