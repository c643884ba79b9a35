"""scripts/host/serve.py and the serving profiles, through SGLang's own parser (the patched tree under test) and the
verb's real entry points: main() for the dry run, a subprocess for what reaches SGLang, the fake docker for make serve.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import _fake_docker
from scripts.host import drafters, serve
from scripts.lib.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
PROFILES = {p.stem: p for p in (ROOT / "docker" / "profiles").glob("*.yaml")}
SPEC = ("kimi-k25-eagle3-tp8", "kimi-k25-dflash-tp8")
KEY = "k3y-0f-the-0perator"


@pytest.fixture
def hf(tmp_path, monkeypatch) -> Path:
    """An HF cache of this test's own (HF_HOME), holding one drafter that is not a known one."""
    snap = tmp_path / "hf" / "hub" / "models--x--own-drafter" / "snapshots" / "r1"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("SGLANG_API_KEY", raising=False)
    return tmp_path / "hf"


def dry_run(capsys, *argv) -> dict:
    assert serve.main(["--dry-run", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def sglang_parse(argv: list[str]):
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(argv[3:])


def test_the_profiles_are_sglang_config_files(sglang_tree):
    eagle, dflash, base = (serve.parse_with_sglang(["--config", str(PROFILES[n])]) for n in SPEC + ("kimi-k25-tp8",))
    assert (eagle.model_path, eagle.tp_size, eagle.host, eagle.port) == ("moonshotai/Kimi-K2.5", 8, "127.0.0.1", 30000)
    assert eagle.speculative_algorithm == "EAGLE3" and eagle.speculative_draft_model_path in drafters.KNOWN
    assert (eagle.speculative_num_steps, eagle.speculative_eagle_topk, eagle.speculative_num_draft_tokens) == (3, 1, 4)
    assert (dflash.speculative_algorithm, dflash.speculative_num_draft_tokens) == ("DFLASH", 8)
    assert drafters.KNOWN[dflash.speculative_draft_model_path][0] == "DFLASH"
    assert eagle.cuda_graph_max_bs_decode >= eagle.max_running_requests and eagle.enable_metrics
    assert base.speculative_algorithm is None
    import yaml

    b = yaml.safe_load(PROFILES["kimi-k25-tp8"].read_text())
    for name in SPEC:  # the baseline differs in nothing else
        assert {k: v for k, v in yaml.safe_load(PROFILES[name].read_text()).items() if "speculative" not in k} == b


@pytest.mark.parametrize("extra, want", [([], "triton"), (["--speculative-draft-attention-backend=fa4"], "fa4")])
def test_the_dflash_draft_attends_on_triton_on_sm120_unless_told_otherwise(sglang_tree, extra, want):
    """SGLang's resolution of the DFlash profile for Kimi-K2.5 on an SM120 GPU (the fixtures' configs)."""
    import _sgl

    argv = [
        "--config",
        str(PROFILES["kimi-k25-dflash-tp8"]),
        "--model-path",
        str(_sgl.KIMI_K25),
        "--speculative-draft-model-path",
        str(_sgl.FIXTURES / "kimi-k25-dflash"),
        "--device",
        "cuda",
        *extra,
    ]
    sa = serve.parse_with_sglang(argv)
    with _sgl.platform(12):
        sa.resolve_once()
    assert (_sgl.resolved(sa, "attention_backend"), _sgl.resolved(sa, "speculative_draft_attention_backend")) == (
        "triton",
        want,
    )


def test_dry_run_is_sglangs_own_command_line(capsys, sglang_tree, hf):
    doc = dry_run(
        capsys, "--model", "/m", "--draft-model", "x/own-drafter", "--port", "31000", "--", "--context-length", "4096"
    )
    assert {"argv", "env", "listen", "notes", "profile", "launcher"} <= set(doc)
    assert doc["argv"][1:5] == ["-m", "sglang.launch_server", "--config", str(PROFILES["kimi-k25-eagle3-tp8"])]
    sa = sglang_parse(doc["argv"])  # the command line wins over the file: SGLang's rule
    assert (sa.model_path, sa.speculative_draft_model_path, sa.port, sa.context_length) == (
        "/m",
        "x/own-drafter",
        31000,
        4096,
    )
    assert sa.tp_size == 8 and doc["listen"] == "listening on 127.0.0.1 only"


@pytest.mark.parametrize(
    "extra, named",
    [
        (["--mem-fraction-static", "1.5"], "mem-fraction-static"),
        (["--speculative-eagle-topk", "0"], "speculative-eagle-topk"),
        (["--speculative-algorithm", "EAGLE9"], "EAGLE9"),
        (["--speculative-num-stpes", "2"], "--speculative-num-steps"),
        (["--tp-size", "eight"], "eight"),
    ],
)
def test_values_sglang_would_fail_on_after_the_load_are_refused_first(capsys, sglang_tree, hf, extra, named):
    with pytest.raises(UserError) as e:
        dry_run(capsys, "--", *extra)
    assert named in str(e.value)


def test_a_drafter_without_its_algorithm_is_refused(capsys, sglang_tree, hf):
    with pytest.raises(UserError, match="--speculative-algorithm EAGLE3"):
        dry_run(capsys, "--profile", "kimi-k25-tp8", "--draft-model", "lightseekorg/kimi-k2.5-eagle3")
    with pytest.raises(UserError, match="drafts for DFLASH, not EAGLE3: add -- --speculative-algorithm DFLASH"):
        dry_run(capsys, "--draft-model", "z-lab/Kimi-K2.5-DFlash")
    doc = dry_run(
        capsys,
        "--profile",
        "kimi-k25-tp8",
        "--draft-model",
        "lightseekorg/kimi-k2.5-eagle3",
        "--",
        "--speculative-algorithm",
        "EAGLE3",
    )
    assert sglang_parse(doc["argv"]).speculative_algorithm == "EAGLE3"


@pytest.mark.parametrize(
    "argv, right", [(["--draft-modle", "x"], "--draft-model"), (["--prot", "1"], "--port"), (["--tp", "4"], "-- --tp")]
)
def test_serves_own_typos_name_the_right_option(capsys, argv, right):
    with pytest.raises(UserError) as e:
        serve.main(argv)
    assert right in str(e.value)


def test_drafters_are_checked_against_the_known_ones_and_the_hf_cache(capsys, hf):
    with pytest.raises(UserError) as e:
        dry_run(capsys, "--draft-model", "lightseekorg/kimi-k2.5-eagle")  # a typo, and not in the cache
    assert "lightseekorg/kimi-k2.5-eagle3?" in str(e.value) and str(hf) in str(e.value)
    own = dry_run(capsys, "--draft-model", "x/own-drafter")["notes"]
    assert any(n.startswith("drafter x/own-drafter: not one of the known") for n in own)
    known = dry_run(capsys, "--draft-model", "AQ-MedAI/Kimi-K25-eagle3")["notes"]
    assert any(n.startswith("drafter AQ-MedAI/Kimi-K25-eagle3") and str(hf) in n for n in known)
    notes = dry_run(capsys, "--profile", "kimi-k25-dflash-tp8")["notes"]  # make serve SERVE_ARGS="--profile ..."
    assert any(
        n.startswith("drafter z-lab/Kimi-K2.5-DFlash (DFLASH): block drafting")
        and n.endswith("(or before: hf download z-lab/Kimi-K2.5-DFlash)")
        for n in notes
    ), notes


def test_profile_lookup(capsys, tmp_path, hf):
    with pytest.raises(UserError, match="kimi-k25-eagle3-tp8"):
        serve.main(["--dry-run", "--profile", "nope"])
    mine = tmp_path / "mine.yaml"
    mine.write_text("model-path: /m\nport: 31001\n")
    assert dry_run(capsys, "--profile", str(mine))["argv"][4] == str(mine)


# ------------------------------------------------------------------------------------------ who can reach it


@pytest.mark.parametrize("how", [["--host", "0.0.0.0"], ["--", "--host", "0.0.0.0"], ["--", "--host=::"]])
def test_beyond_loopback_without_a_key_is_refused(capsys, hf, how):
    with pytest.raises(UserError, match="refusing to listen") as e:
        dry_run(capsys, *how)
    assert str(e.value).index("--api-key-file") < str(e.value).index("SGLANG_API_KEY")  # the key file first


def test_key_sources(capsys, hf, tmp_path, monkeypatch):
    key = tmp_path / "key"
    key.write_text(KEY + "\n")
    assert "the file" in dry_run(capsys, "--host", "0.0.0.0", "--api-key-file", str(key))["listen"]
    assert "the command line" in dry_run(capsys, "--host", "0.0.0.0", "--", "--api-key", KEY)["listen"]
    (tmp_path / "empty").write_text("\n")
    for bad in (["--api-key-file", str(tmp_path / "empty")], ["--api-key-file", str(tmp_path / "missing")]):
        with pytest.raises(UserError):
            dry_run(capsys, "--host", "0.0.0.0", *bad)
    monkeypatch.setenv("SGLANG_API_KEY", KEY)
    assert "$SGLANG_API_KEY" in dry_run(capsys, "--host", "0.0.0.0")["listen"]
    with pytest.raises(UserError, match="both"):
        dry_run(capsys, "--api-key-file", str(key))


def fake_sglang(tmp_path: Path) -> Path:
    """A stand-in sglang.launch_server that reports what reached it: its argv, the --config it read, its command line
    as ps shows it, whether the key is in its environment."""
    pkg = tmp_path / "fake" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(
        "import json, os, sys\nc = sys.argv[sys.argv.index('--config') + 1]\n"
        "print(json.dumps({'argv': sys.argv[1:], 'config': open(c).read(), 'env_key': os.environ.get("
        "'SGLANG_API_KEY'), 'cmdline': open('/proc/self/cmdline').read()}))\n"
    )
    return pkg.parent


def test_the_key_reaches_sglang_in_a_private_copy_read_once(tmp_path, hf):
    env = {**os.environ, "PYTHONPATH": str(fake_sglang(tmp_path)), "SGLANG_API_KEY": KEY, "TMPDIR": str(tmp_path)}
    cp = subprocess.run(
        [sys.executable, "-m", "scripts.host.serve", "--host", "0.0.0.0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cp.returncode == 0, cp.stderr
    got = json.loads(cp.stdout)
    import yaml

    assert yaml.safe_load(got["config"])["api-key"] == KEY and got["argv"][-2:] == ["--host", "0.0.0.0"]
    assert KEY not in got["cmdline"] + cp.stderr and got["env_key"] is None
    for _ in range(50):  # the pipe is gone once read
        if not list(tmp_path.glob("serve-*")):
            break
        subprocess.run(["sleep", "0.1"])
    assert not list(tmp_path.glob("serve-*"))


def printed_command(out: str) -> list[str]:
    lines = out.splitlines()
    end = next(i for i, ln in enumerate(lines) if not ln.endswith("\\"))
    return shlex.split(" ".join(ln.rstrip("\\") for ln in lines[: end + 1]))


def test_make_serve_runs_the_images_serve_through_docker_run(tmp_path, hf, capsys, monkeypatch):
    """serve --image: the docker run (GPUs, --network host, the HF cache, a key file mounted read-only, SGLang's
    variables but not this repository's) is printed, then run; through the image's entrypoint it reaches SGLang's
    launch_server with the profile as --config."""
    image = "eagle-fast-verify/sglang:test"
    key = tmp_path / "key"
    key.write_text(KEY)
    monkeypatch.setenv("SGLANG_BASE", "auto")  # make exports it for apply
    monkeypatch.setenv("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "0")
    assert serve.main(["--image", image, "--dry-run", "--host", "0.0.0.0", "--api-key-file", str(key)]) == 0
    out = capsys.readouterr().out
    cmd = printed_command(out)
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" in cmd and "SGLANG_BASE" not in cmd
    assert f"{image} serve --dry-run --host 0.0.0.0" in out.splitlines()[-1]
    assert cmd[cmd.index("--network") + 1] == "host" and f"{hf}:/root/.cache/huggingface" in cmd
    assert f"{key}:/run/serve/key:ro" in cmd and cmd[cmd.index("--api-key-file") + 1] == "/run/serve/key"
    docker = _fake_docker.install(tmp_path, images=(image,), pythonpath=(fake_sglang(tmp_path),))
    env = {**os.environ, "PATH": _fake_docker.path_with(docker.bindir), "HF_HOME": str(hf)}
    cp = subprocess.run(
        [sys.executable, "-m", "scripts.host.serve", f"--image={image}", "--", "--tp-size", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cp.returncode == 0, cp.stderr
    (run,) = docker.runs()
    assert printed_command(cp.stdout) == ["docker", *run] and run[run.index(image) + 1] == "serve"
    reached = json.loads(cp.stdout.splitlines()[-1])
    assert reached["argv"] == ["--config", str(PROFILES["kimi-k25-eagle3-tp8"]), "--tp-size", "2"]
