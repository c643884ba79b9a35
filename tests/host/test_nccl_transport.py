"""scripts/host/nccl_transport.py: NCCL's transport lines read from recorded probe outputs in NCCL 2.29's formats
(tests/fixtures/doctor/make_nccl_transport.py), and the probe itself through its real entry points: the `python -c`
code the doctor runs (here: torch without a GPU says "not measured" and why), and the same code run inside an image
by a fake `docker` that records its argv and runs it with this interpreter."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from scripts.host import nccl_transport as nt
from scripts.host.tools import Probe

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "doctor"


def fixture(box: str) -> str:
    return (FIX / box / "nccl-transport.txt").read_text()


def test_p2p_shm_and_net_lines_in_nccl_s_formats():
    p2p = nt.parse(fixture("pcie8x"))
    assert p2p.measured and p2p.version == "2.29.7+cuda13.0" and p2p.kinds() == {"P2P": 16}
    first = p2p.links[0]
    assert (first.channel, first.src_rank, first.src_dev, first.dst_rank, first.dst_dev, first.via) == \
        (0, 0, 0, 1, 1, "P2P/CUMEM")
    shm = nt.parse(fixture("pcie8x-cns"))  # "Channel %02d : ..." (no connection index) for SHM
    assert shm.kinds() == {"P2P": 12, "SHM": 4}
    assert [x.pair for x in shm.by_kind("SHM")] == ["GPU3->GPU4", "GPU7->GPU0"]
    net = nt.parse(fixture("pcie8x-net"))  # a [send] and a [receive] line per hop, one pair each
    assert net.kinds() == {"NET": 32} and len(net.by_kind("NET")) == 8
    assert net.result["nccl_env"] == {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
    hung = nt.parse(fixture("pcie8x-hang"))
    assert not hung.measured and hung.result["hung"] and hung.kinds() == {"P2P": 16}


def test_other_spellings_of_nccl_s_lines():
    text = "\n".join([
        "h:1:2 [0] NCCL INFO Channel 03/0 : 0[0] -> 1[1] via P2P/IPC/read",
        "h:1:2 [0] NCCL INFO Channel 04/0 : 0[0] -> 1[1] via P2P/direct pointer",
        "[2026-12-01 10:00:00] h:1:2 [1] NCCL INFO Channel 00/1 : 1[1] -> 0[0] via P2P/CUMEM/CE",  # a timestamp
        "h:1:2 [1] NCCL INFO Channel 05 : 11[3e000] -> 9[1b000] via P2P/direct pointer",  # older NCCL: bus ids
        "h:1:2 [1] NCCL INFO P2P is disabled between connected GPUs 1 and 2. You can repress this message with "
        "NCCL_IGNORE_DISABLED_P2P=1.",
        "not an NCCL line: Channel 00 : 0[0] -> 1[1] via SHM/direct/direct",
    ])
    t = nt.parse(text)
    assert [x.via for x in t.links] == ["P2P/IPC/read", "P2P/direct pointer", "P2P/CUMEM/CE", "P2P/direct pointer"]
    assert t.links[3].pair == "rank 11->rank 9" and t.disabled == [(1, 2)]
    assert not t.measured and t.result == {}  # no result line: the doctor says why (tests/host/test_doctor.py)


def test_the_probe_here_without_a_gpu_says_not_measured():
    """The code the doctor runs with --python, run by this interpreter (torch, no CUDA GPU here)."""
    out = Probe(python=sys.executable, ranks=8).get("nccl-transport")
    assert out.ok, out.why
    r = nt.parse(out.text).result
    assert r["measured"] is False and r["too_few_gpus"] is True and r["gpus"] == 0
    assert r["why"].startswith(f"torch {r['torch']} sees 0 CUDA GPU(s)")


DOCKER = """#!{python}
import json, os, subprocess, sys
argv = sys.argv[1:]
with open({log!r}, "a") as f:
    f.write(json.dumps(argv) + "\\n")
if argv[:2] == ["image", "inspect"]:
    sys.exit(print("sha256:0123456789abcdef0123") or 0)
i = argv.index({image!r})
env = {{k: os.environ[k] for k in ("PATH", "HOME")}} | {{"EAGLE_HOME": {root!r}}}
env |= {{argv[j + 1]: os.environ[argv[j + 1]] for j in range(i) if argv[j] == "-e" and argv[j + 1] in os.environ}}
cmd = [{python!r} if argv[i + 1] == "python3" else argv[i + 1], *argv[i + 2:]]
sys.exit(subprocess.run(cmd, env=env, cwd="/").returncode)
"""


def test_the_probe_falls_back_to_the_image_with_the_gpus_and_the_callers_nccl_settings(tmp_path, monkeypatch):
    """This python sees no GPU, so the probe runs in the image: `docker run --gpus all --ipc=host`, the caller's
    NCCL_* variables passed by name, the package found through the image's $EAGLE_HOME; a fake docker runs that
    command (with this interpreter as the image's python3), so the code printed is the code that runs."""
    log, image = tmp_path / "docker.log", "eagle-fast-verify/sglang:test"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text(DOCKER.format(python=sys.executable, log=str(log), image=image, root=str(ROOT)))
    (bindir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    out = Probe(python=sys.executable, image=image, ranks=2).get("nccl-transport")
    assert out.ok, out.why
    calls = [json.loads(ln) for ln in log.read_text().splitlines()]
    run = next(c for c in calls if c[0] == "run")
    assert run[:5] == ["run", "--rm", "--gpus", "all", "--ipc=host"] and ["-e", "NCCL_P2P_DISABLE"] == \
        run[run.index("NCCL_P2P_DISABLE") - 1:run.index("NCCL_P2P_DISABLE") + 1]
    assert run[run.index(image) + 1:run.index(image) + 3] == ["python3", "-c"]
    assert "os.environ['EAGLE_HOME']" in run[-1] and "cli(2, 120.0)" in run[-1]
    r = nt.parse(out.text).result  # what the image's python said: no GPU there either (this machine)
    assert r["measured"] is False and "sees 0 CUDA GPU(s)" in r["why"]


def test_the_image_not_there_is_said_with_what_here_lacks(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker client at all
    out = Probe(python=sys.executable, image="eagle-fast-verify/sglang:none", ranks=2).get("nccl-transport")
    why = nt.parse(out.text).result["why"]
    assert why.startswith("here, torch ") and "sees 0 CUDA GPU(s)" in why
    assert "; in the image: docker is not installed" in why


def test_a_rank_that_fails_is_reported_not_raised():
    """The ranks run as processes spawned from this interpreter; one that fails (no NVIDIA driver here, at its
    first CUDA call) makes the probe's result say so instead of a traceback."""
    r = nt._spawn(2, 60)
    assert r["why"].startswith("a rank failed: ") and "measured" not in r
    assert "NVIDIA driver" in r["why"] or "CUDA" in r["why"]
