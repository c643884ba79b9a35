"""scripts/host/nccl.py: which NCCL torch loaded, NCCL's transport lines, and the GPU probes' machinery through fake
runners (a child that hangs, ranks that hang, fail or sum wrong), the PCIe-IPC smoke's bring-up through the real
patched SGLang on CPU ranks, and the probes' route into the image through a fake docker."""

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

import _fake_docker
from scripts.host import facts as F
from scripts.host import nccl
from scripts.series.pin import load_pin

ROOT = Path(__file__).resolve().parents[2]
PIN = load_pin()


def test_the_probe_reports_the_nccl_torch_loaded_not_the_one_it_was_built_with(nccl_wheels, tmp_path):
    """The pinned wheel first on sys.path: torch preloads its libnccl.so.2, the library every NCCL call then uses."""
    assert PIN.nccl_version not in nccl.KNOWN_BAD_NCCL and {"2.26.2", "2.30.4"} <= set(nccl.KNOWN_BAD_NCCL)
    wheel = next(nccl_wheels.glob(f"{PIN.nccl_package.replace('-', '_')}-{PIN.nccl_version}-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    cp = subprocess.run([sys.executable, "-c", nccl.NCCL_PROBE], capture_output=True, text=True, timeout=120, env=env)
    info = json.loads(cp.stdout.strip().splitlines()[-1])
    import torch

    built = ".".join(map(str, torch.cuda.nccl.version()[:3]))
    assert info["nccl"] == PIN.nccl_version != built and info["nccl_build"] == built and info["gpus"] == 0
    assert info["nccl_lib"].startswith(str(tmp_path / "site"))


def test_nccl_transport_lines_in_their_spellings():
    text = """h:1:2 [0] NCCL INFO NCCL version 2.29.7+cuda13.0
h:1:2 [0] NCCL INFO Channel 03/0 : 0[0] -> 1[1] via P2P/IPC/read
[2026-12-01 10:00:00] h:1:2 [1] NCCL INFO Channel 00/1 : 1[1] -> 0[0] via P2P/CUMEM/CE
h:1:2 [1] NCCL INFO Channel 05 : 11[3e000] -> 9[1b000] via P2P/direct pointer
h:1:2 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[4] [send] via NET/Socket/0
h:1:2 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[4] [receive] via NET/Socket/0
not an NCCL line: Channel 00 : 0[0] -> 1[1] via SHM/direct/direct"""  # the third: older NCCL printed bus ids
    version, links = nccl.transport_links(text)
    assert version == "2.29.7+cuda13.0" and [x["kind"] for x in links] == ["P2P"] * 3 + ["NET"] * 2
    assert [x["via"] for x in links][:3] == ["P2P/IPC/read", "P2P/CUMEM/CE", "P2P/direct pointer"]
    assert links[2]["pair"] == "rank 11->rank 9" and links[3]["pair"] == "GPU3->GPU4"


def test_the_watchdog_kills_a_probe_that_hangs_and_says_so():
    """A probe child that starts a grandchild and hangs: both killed at the deadline, the output so far kept."""
    code = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print('bring-up done', flush=True); time.sleep(60)"
    )
    t0 = time.monotonic()
    out = nccl.watch([sys.executable, "-c", code], timeout=3)
    assert time.monotonic() - t0 < 20 and out.startswith("bring-up done\n")
    assert nccl.result(out) == {"measured": False, "hung": True, "why": "no answer within 3 s (the probe was killed)"}
    out = nccl.watch([sys.executable, "-c", "import sys; print('Traceback: boom'); sys.exit(3)"], timeout=30)
    assert nccl.result(out)["why"] == "the probe exited 3 without a result: Traceback: boom"
    assert "could not run" in nccl.result(nccl.watch(["/no/such/python"], 5))["why"]


def _hanging_rank(rank, world, port, phase, *_):
    phase("workspace")
    time.sleep(0.5)
    phase(f"iterate {8}x7168")
    time.sleep(0 if rank else 60)  # rank 0 spins on its peers' flags forever
    return {"engaged": True, "bad": 0, "us": {}}


def _failing_rank(rank, world, port, phase, *_):
    if rank == 1:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    time.sleep(60)  # waits for the peer in a collective that never comes


def _summing_rank(rank, world, port, phase, *_):
    phase("iterate 4x7168")
    return {"engaged": True, "bad": 57344 if rank == 1 else 0, "us": {"4": None, "8": None}}


def test_ranks_that_hang_fail_or_sum_wrong(monkeypatch):
    """The smoke's rank machinery with fake ranks; one that raises gets its peer, left waiting, killed at once."""
    monkeypatch.setattr(nccl, "STALL", 2.0)
    r = nccl.pcie_ipc_smoke(2, 120, device="cpu", rank_fn=_hanging_rank)
    assert r["hung"] and r["measured"] is False and r["phase"] == "ranks 0,1: iterate 8x7168"
    assert r["why"] == "no progress within 2 s (ranks 0,1: iterate 8x7168); the ranks were killed"
    t0 = time.monotonic()
    r = nccl.pcie_ipc_smoke(2, 120, device="cpu", rank_fn=_failing_rank)
    assert r["why"] == "a rank failed: rank 1: RuntimeError: CUDA error: an illegal memory access was encountered"
    assert time.monotonic() - t0 < 30
    r = nccl.pcie_ipc_smoke(2, 120, device="cpu", rank_fn=_summing_rank)
    assert r["measured"] is True and r["sum_ok"] is False and r["wrong"] == {"1": 57344}
    assert r["rows"] == [4, 8] and r["iters"] == 300


def test_the_smoke_brings_up_sglangs_own_tp_group(sglang_tree):
    """The real rank code on a CPU rank over gloo, through the patched SGLang's bring-up: SGLang builds no PCIe-IPC
    all-reduce for one CPU rank, and the smoke says so (on GPUs this is the path the kernels run on)."""
    r = nccl.pcie_ipc_smoke(1, 300, device="cpu")
    why = "SGLang built no PCIe-IPC all-reduce for its tp group of 1 cpu rank(s) (FlashInfer's kernels serve 2, 4 or "
    why += "8 CUDA GPUs)"
    assert r == {"measured": False, "world": 1, "engaged": False, "why": why}, r


def test_without_gpus_here_the_probes_run_in_the_image(tmp_path, monkeypatch):
    """This python's torch sees no GPU, so each probe runs in the image (the fake docker runs it with this
    interpreter); on Ctrl-C a probe that hangs, deaf to signals as one stuck in the driver, is removed by its name."""
    image = "eagle-fast-verify/sglang:test"
    fake = _fake_docker.install(tmp_path, images=(image,))
    monkeypatch.setenv("PATH", _fake_docker.path_with(fake.bindir))
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    probe = F.Probe(python=sys.executable, image=image, ranks=8)
    probe.cache["nccl"] = F.Out(True, json.dumps({"torch": "2.14.1+cu130", "gpus": 0}))  # what this python says
    for key in ("peer-bandwidth", "nccl-transport"):
        r = nccl.result(probe.get(key).text)  # what the image's python said: no GPU there either (this machine)
        assert r["measured"] is False and "sees 0 CUDA GPU(s)" in r["why"], r
    run = fake.runs()[-1]
    assert run[:5] == ["run", "--rm", "--gpus", "all", "--ipc=host"]
    assert "sglang-flashinfer:/root/.cache/flashinfer" in run
    assert run[run.index("NCCL_P2P_DISABLE") - 1] == "-e"
    assert run[run.index(image) + 1 : run.index(image) + 3] == ["python3", "-c"]
    assert "os.environ['EAGLE_HOME']" in run[-1] and "run('nccl-transport', 8, 120.0)" in run[-1]
    assert run[run.index("--name") + 1] == f"eagle-doctor-nccl-transport-pid{os.getpid()}"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no docker client at all
    probe.cache.pop("nccl-transport")
    why = nccl.result(probe.get("nccl-transport").text)["why"]
    assert why.startswith(
        "here, torch 2.14.1+cu130 sees 0 CUDA GPU(s), and the all-reduce needs 2; in the image: the docker engine is "
        "missing here (docker not found on PATH)"
    )
    hang = f"trap '' INT TERM; sleep 1; kill -INT {os.getpid()}; sleep 600"  # Ctrl-C while it hangs, deaf to signals
    hung = _fake_docker.install(tmp_path / "hung", images=(image,), verbs={"python3": hang})
    monkeypatch.setenv("PATH", _fake_docker.path_with(hung.bindir))
    probe.cache.pop("nccl-transport")
    with pytest.raises(KeyboardInterrupt):
        probe.get("nccl-transport")
    assert ["rm", "-f", run[run.index("--name") + 1]] in hung.calls() and not hung.running()
