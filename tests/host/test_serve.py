"""scripts/serve.py and the serving profiles.

Every flag of every profile is checked against sglang 0.5.23's own argument parser, imported from the patched tree
under test (the sglang_tree fixture), and the whole profile command line must parse with it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import serve
from scripts.lib.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
PROFILES = sorted((ROOT / "docker" / "profiles").glob("*.toml"))
DEFAULT = ROOT / "docker" / "profiles" / f"{serve.DEFAULT_PROFILE}.toml"


@pytest.fixture(scope="module")
def parser(sglang_tree):
    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser(add_help=False)
    ServerArgs.add_cli_args(p)
    return p


@pytest.fixture(scope="module")
def index(parser):
    return serve.FlagIndex(parser)


def _plan(index, environ=None, topology="pcie", env_file=None, **kw):
    env_file = env_file or ROOT / "docker" / "pcie-nccl.env"
    return serve.build_plan(serve.load_profile(DEFAULT), environ=environ or {}, index=index, python="python3",
                            env_file=env_file if env_file.is_file() else None, topology=topology, **kw)


def _opt(argv, flag):
    return argv[argv.index(flag) + 1]


# ---------------------------------------------------------------------------------------------------------------
# profiles against sglang's parser


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_every_profile_flag_is_a_real_sglang_flag(path, parser):
    prof = serve.load_profile(path)
    actions = parser._option_string_actions
    for flag, value in prof.args.items():
        assert f"--{flag}" in actions, f"{path.name}: --{flag} is not an sglang 0.5.23 flag"
        takes_value = actions[f"--{flag}"].nargs != 0
        assert takes_value == (not isinstance(value, bool)), f"{path.name}: --{flag} = {value!r}"
    plan = serve.build_plan(prof, environ={}, python="python3", topology="pcie", env_file=None)
    ns = parser.parse_args(plan.argv[3:])  # choices and types as sglang checks them
    assert ns.model_path == prof.defaults.get("model", ns.model_path)


def test_default_profile_is_kimi_tp8_eagle3_chain(parser):
    plan = serve.build_plan(serve.load_profile(DEFAULT), environ={}, python="python3", topology="pcie", env_file=None)
    assert plan.argv[:3] == ["python3", "-m", "sglang.launch_server"]
    ns = parser.parse_args(plan.argv[3:])
    assert ns.model_path == "moonshotai/Kimi-K2.5" and ns.tp_size == 8 and ns.trust_remote_code
    assert ns.speculative_algorithm == "EAGLE3"
    assert (ns.speculative_num_steps, ns.speculative_eagle_topk, ns.speculative_num_draft_tokens) == (3, 1, 4)
    assert ns.speculative_draft_model_path == "AQ-MedAI/Kimi-K25-eagle3"
    assert ns.host == "0.0.0.0" and ns.port == 30000 and ns.enable_metrics
    assert ns.cuda_graph_max_bs_decode >= ns.max_running_requests
    assert ns.flashinfer_allreduce_fusion_backend is None  # gated to TP2 by the series; A/B by hand
    assert "flashinfer-allreduce-fusion-backend" not in serve.load_profile(DEFAULT).args


# ---------------------------------------------------------------------------------------------------------------
# the plan


def test_cli_values_fill_placeholders(index):
    plan = _plan(index, draft_model="/models/draft", model="/models/k25", port=31000)
    assert _opt(plan.argv, "--speculative-draft-model-path") == "/models/draft"
    assert _opt(plan.argv, "--model-path") == "/models/k25"
    assert _opt(plan.argv, "--port") == "31000"


def test_extra_args_win_over_the_profile(index):
    plan = _plan(index, extra=["--tp", "4", "--mem-fraction-static=0.8", "--context-length", "65536"])
    sgl = plan.argv[3:]
    assert "--tp-size" not in sgl and sgl.count("--tp") == 1 and _opt(sgl, "--tp") == "4"
    assert "--mem-fraction-static" not in sgl and "--mem-fraction-static=0.8" in sgl
    assert sgl[-5:] == ["--tp", "4", "--mem-fraction-static=0.8", "--context-length", "65536"]
    assert any("--tp from the command line replaces the profile's --tp-size 8" in n for n in plan.notes)
    assert any("--mem-fraction-static" in n and "0.9" in n for n in plan.notes)


def test_alias_spelling_replaces_the_profile_flag(index):
    plan = _plan(index, extra=["--tensor-parallel-size", "2", "--speculative-draft-model", "x/y"])
    sgl = plan.argv[3:]
    assert "--tp-size" not in sgl and "--speculative-draft-model-path" not in sgl
    assert _opt(sgl, "--speculative-draft-model") == "x/y"


def test_bad_values_and_flags_are_refused_before_launch(index, tmp_path):
    with pytest.raises(UserError, match="invalid int value"):
        _plan(index, extra=["--tp-size", "eight"])
    bad = tmp_path / "bad.toml"
    bad.write_text(DEFAULT.read_text().replace("cuda-graph-max-bs-decode = 16", "cuda-graph-max-bs = 16"))
    with pytest.raises(UserError, match="--cuda-graph-max-bs is not a flag.*did you mean"):
        serve.build_plan(serve.load_profile(bad), environ={}, index=index, topology="pcie", env_file=None)


@pytest.mark.parametrize("edit, match", [
    (("[args]", "[arg]"), "unknown top-level key"),
    (('tp-size = 8', '"--tp-size" = 8'), "without the leading dashes"),
    (('draft_model = "AQ-MedAI/Kimi-K25-eagle3"', ""), "pass --draft-model"),
    (("enable-metrics = true", "enable-metrics = {a = 1}"), "must be a string"),
])
def test_profile_mistakes_name_the_fix(tmp_path, edit, match):
    p = tmp_path / "p.toml"
    text = DEFAULT.read_text()
    assert edit[0] in text
    p.write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(UserError, match=match):
        serve.build_plan(serve.load_profile(p), environ={}, topology="pcie", env_file=None)


def test_profile_lookup(tmp_path):
    assert serve.resolve_profile(serve.DEFAULT_PROFILE) == DEFAULT
    with pytest.raises(UserError, match="known: kimi-k25-eagle3-tp8"):
        serve.resolve_profile("nope")
    with pytest.raises(UserError, match="does not exist"):
        serve.resolve_profile(str(tmp_path / "missing.toml"))


# ---------------------------------------------------------------------------------------------------------------
# environment: setdefault semantics


def _env_file(tmp_path) -> Path:
    f = tmp_path / "pcie-nccl.env"
    f.write_text("# generated\nNCCL_MIN_NCHANNELS=8\nNCCL_P2P_LEVEL=SYS\n")
    return f


def test_env_file_and_profile_env_only_fill_gaps(tmp_path):
    plan = _plan(None, environ={"NCCL_P2P_LEVEL": "PHB"}, env_file=_env_file(tmp_path))
    assert plan.env_set["NCCL_MIN_NCHANNELS"] == ("8", str(tmp_path / "pcie-nccl.env"))
    assert "NCCL_P2P_LEVEL" not in plan.env_set and plan.env_kept["NCCL_P2P_LEVEL"][:2] == ("PHB", "SYS")
    assert plan.env_set["CUDA_DEVICE_ORDER"][0] == "PCI_BUS_ID"
    text = serve.render(plan)
    assert "export NCCL_MIN_NCHANNELS=8" in text and "kept NCCL_P2P_LEVEL=PHB" in text
    env = plan.child_env({"NCCL_P2P_LEVEL": "PHB", "PYTHONPATH": f"{ROOT}{os.pathsep}/other"})
    assert env["NCCL_MIN_NCHANNELS"] == "8" and env["NCCL_P2P_LEVEL"] == "PHB"
    assert env["PYTHONPATH"] == "/other"  # the entrypoint's project path does not leak into sglang


def test_env_file_skipped_by_switch_and_on_nvlink(tmp_path):
    f = _env_file(tmp_path)
    off = _plan(None, environ={"SGLANG_PCIE_NCCL_DEFAULTS": "0"}, env_file=f)
    nvl = _plan(None, environ={}, env_file=f, topology="nvlink")
    for plan in (off, nvl):
        assert "NCCL_MIN_NCHANNELS" not in plan.env_set
    assert any("SGLANG_PCIE_NCCL_DEFAULTS=0" in n for n in off.notes)
    assert any("NVLink" in n for n in nvl.notes)


def test_env_file_errors(tmp_path):
    bad = tmp_path / "bad.env"
    bad.write_text("NOT A LINE\n")
    with pytest.raises(UserError, match="not KEY=VALUE"):
        _plan(None, env_file=bad)
    with pytest.raises(UserError, match="does not exist"):
        serve.build_plan(serve.load_profile(DEFAULT), environ={}, env_file=tmp_path / "missing.env",
                         topology="pcie")


# ---------------------------------------------------------------------------------------------------------------
# the command line


def test_dry_run_prints_a_runnable_script(capsys, monkeypatch, tmp_path, sglang_tree):
    monkeypatch.setattr(serve, "detect_topology", lambda: "pcie")
    monkeypatch.setenv(serve.ENV_FILE_VAR, str(_env_file(tmp_path)))
    monkeypatch.delenv("NCCL_MIN_NCHANNELS", raising=False)
    monkeypatch.delenv("NCCL_P2P_LEVEL", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    assert serve.main(["--dry-run", "--draft-model", "lightseekorg/kimi-k2.5-eagle3", "--python", "python3",
                       "--", "--context-length", "65536"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    cmd = shlex.split(out[-1])
    assert cmd[1:3] == ["-m", "sglang.launch_server"] and cmd[-2:] == ["--context-length", "65536"]
    assert _opt(cmd, "--speculative-draft-model-path") == "lightseekorg/kimi-k2.5-eagle3"
    assert "export NCCL_MIN_NCHANNELS=8  # from " + str(tmp_path / "pcie-nccl.env") in out
    assert all(ln.startswith(("#", "export ")) for ln in out[:-1])
    assert any("AL 2.69 MT-Bench" in ln for ln in out)  # known drafter noted


def test_dry_run_json_and_exec(capsys, monkeypatch, tmp_path, sglang_tree):
    monkeypatch.setattr(serve, "detect_topology", lambda: "unknown")
    monkeypatch.setenv(serve.ENV_FILE_VAR, str(_env_file(tmp_path)))
    monkeypatch.delenv("NCCL_MIN_NCHANNELS", raising=False)
    assert serve.main(["--dry-run", "--json", "--port", "32000"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert _opt(rep["argv"], "--port") == "32000" and rep["env"]["NCCL_MIN_NCHANNELS"] == "8"
    assert any("topology unknown" in n for n in rep["notes"])

    seen = {}

    def fake_exec(path, argv, env):
        seen.update(path=path, argv=argv, env=env)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execve", fake_exec)
    with pytest.raises(SystemExit):
        serve.main(["--port", "32000"])
    assert seen["path"] == seen["argv"][0] == sys.executable
    assert seen["argv"] == rep["argv"] and seen["env"]["NCCL_MIN_NCHANNELS"] == "8"
    assert "export NCCL_MIN_NCHANNELS=8" in capsys.readouterr().err  # says what it applied


def test_unknown_serve_option_points_to_the_separator(sglang_tree):
    with pytest.raises(UserError, match="go after `--`"):
        serve.main(["--dry-run", "--context-length", "1000"])


def test_check_runs_the_doctor(monkeypatch):
    from scripts import doctor

    got = {}
    monkeypatch.setattr(doctor, "main", lambda argv: got.setdefault("argv", argv) and 7)
    assert serve.main(["--check"]) == 7
    assert got["argv"][:2] == ["--tp", "8"]


def _entry(tmp_path, *args) -> subprocess.CompletedProcess:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    shim = bindir / "python3"
    shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PATH=f"{bindir}{os.pathsep}{env['PATH']}", EAGLE_HOME=str(ROOT),
               SGLANG_PCIE_NCCL_DEFAULTS="0")
    return subprocess.run(["sh", str(ROOT / "docker" / "entrypoint"), *args], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)


def test_entrypoint_dispatch(tmp_path):
    cp = _entry(tmp_path, "serve", "--dry-run", "--json")  # no sglang importable here: flags unchecked, said so
    assert cp.returncode == 0, cp.stderr
    rep = json.loads(cp.stdout)
    assert rep["argv"][1:3] == ["-m", "sglang.launch_server"]
    assert any("not importable" in n for n in rep["notes"])
    assert json.loads(_entry(tmp_path, "--dry-run", "--json").stdout)["argv"] == rep["argv"]
    other = _entry(tmp_path, "echo", "hello")
    assert other.returncode == 0 and other.stdout == "hello\n"
