"""scripts/host/serve.py and the serving profiles.

Every flag of every profile is checked against the pinned sglang's own argument parser, imported from the patched tree
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

from scripts.host import pcie, serve
from scripts.lib.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
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


def _plan(index, environ=None, **kw):
    kw.setdefault("python", "python3")
    return serve.build_plan(serve.load_profile(DEFAULT), environ=environ or {}, index=index, **kw)


def _opt(argv, flag):
    return argv[argv.index(flag) + 1]


# ---------------------------------------------------------------------------------------------------------------
# profiles against sglang's parser


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_every_profile_flag_is_a_real_sglang_flag(path, parser):
    prof = serve.load_profile(path)
    actions = parser._option_string_actions
    for flag, value in prof.args.items():
        assert f"--{flag}" in actions, f"{path.name}: --{flag} is not a flag of the pinned sglang"
        takes_value = actions[f"--{flag}"].nargs != 0
        assert takes_value == (not isinstance(value, bool)), f"{path.name}: --{flag} = {value!r}"
    plan = serve.build_plan(prof, environ={}, python="python3")
    ns = parser.parse_args(plan.argv[3:])  # choices and types as sglang checks them
    assert ns.model_path == prof.defaults.get("model", ns.model_path)


def test_default_profile_is_kimi_tp8_eagle3_chain(parser):
    plan = serve.build_plan(serve.load_profile(DEFAULT), environ={}, python="python3")
    assert plan.argv[:3] == ["python3", "-m", "sglang.launch_server"]
    ns = parser.parse_args(plan.argv[3:])
    assert ns.model_path == "moonshotai/Kimi-K2.5" and ns.tp_size == 8 and ns.trust_remote_code
    assert ns.speculative_algorithm == "EAGLE3"
    assert (ns.speculative_num_steps, ns.speculative_eagle_topk, ns.speculative_num_draft_tokens) == (3, 1, 4)
    assert ns.speculative_draft_model_path == "lightseekorg/kimi-k2.5-eagle3"
    assert ns.host == "127.0.0.1" and ns.port == 30000 and ns.enable_metrics  # loopback unless opted in
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
        serve.build_plan(serve.load_profile(bad), environ={}, index=index)


@pytest.mark.parametrize("edit, match", [
    (("[args]", "[arg]"), "unknown top-level key"),
    (('tp-size = 8', '"--tp-size" = 8'), "without the leading dashes"),
    (('draft_model = "lightseekorg/kimi-k2.5-eagle3"', ""), "pass --draft-model"),
    (("enable-metrics = true", "enable-metrics = {a = 1}"), "must be a string"),
])
def test_profile_mistakes_name_the_fix(tmp_path, edit, match):
    p = tmp_path / "p.toml"
    text = DEFAULT.read_text()
    assert edit[0] in text
    p.write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(UserError, match=match):
        serve.build_plan(serve.load_profile(p), environ={})


def test_profile_lookup(tmp_path):
    assert serve.resolve_profile(serve.DEFAULT_PROFILE) == DEFAULT
    with pytest.raises(UserError, match="known: kimi-k25-eagle3-tp8"):
        serve.resolve_profile("nope")
    with pytest.raises(UserError, match="does not exist"):
        serve.resolve_profile(str(tmp_path / "missing.toml"))


# ---------------------------------------------------------------------------------------------------------------
# environment: setdefault semantics; the PCIe-only defaults are the launcher's


def test_profile_env_only_fills_gaps():
    plan = _plan(None, environ={"CUDA_DEVICE_ORDER": "FASTEST_FIRST", "NCCL_P2P_LEVEL": "PHB"})
    assert "CUDA_DEVICE_ORDER" not in plan.env_set
    assert plan.env_kept["CUDA_DEVICE_ORDER"][:2] == ("FASTEST_FIRST", "PCI_BUS_ID")
    assert "kept CUDA_DEVICE_ORDER=FASTEST_FIRST" in serve.render(plan)
    plan = _plan(None, environ={"NCCL_P2P_LEVEL": "PHB"})
    assert plan.env_set["CUDA_DEVICE_ORDER"][0] == "PCI_BUS_ID"
    assert not [k for k in plan.env_set if k.startswith("NCCL_")]  # serve sets no NCCL value: the launcher does
    assert "export CUDA_DEVICE_ORDER=PCI_BUS_ID" in serve.render(plan)
    env = plan.child_env({"NCCL_P2P_LEVEL": "PHB", "PYTHONPATH": f"{ROOT}{os.pathsep}/other"})
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["NCCL_P2P_LEVEL"] == "PHB"
    assert env["PYTHONPATH"] == "/other"  # the entrypoint's project path does not leak into sglang


SM120 = dict(is_cuda=True, is_hip=False, is_npu=False, is_xpu=False, is_musa=False, is_mps=False, is_sm90=False,
             is_sm100=False, is_sm100_or_sm110=False, is_sm110=False, is_sm120=True, is_blackwell=True,
             is_hopper_with_cuda_12_3=False, has_amx=False, has_flashinfer=True, device_sm=120,
             device_capability=(12, 0))


@pytest.fixture
def pcie_only_sm120(tmp_path, sglang_tree) -> dict[str, str]:
    """The environment of a faked host for the patched launcher serve asks (a subprocess of this python): 8 RTX PRO
    6000 (SM120) on two PCIe root complexes, no NVLink (tests/_fake_nvml.py, installed by a sitecustomize; the
    platform through SGLang's own override_platform), the tree under test importable."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import types\nfrom _fake_nvml import FakeNvml\nfrom sglang.srt.runtime_context import override_platform\n"
        f"FakeNvml(types.SimpleNamespace(setattr=setattr))\noverride_platform(**{SM120!r}).install()\n")
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(tmp_path)),
            "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "tests"), str(sglang_tree / "python")])}


def _asked(env: dict[str, str], **kw) -> dict:
    return serve.as_json(_plan(None, environ=env, ask_launcher=True, python=sys.executable, **kw))["pcie_defaults"]


def test_pcie_defaults_are_reported_from_the_patched_launcher(pcie_only_sm120, monkeypatch):
    """serve asks the patched launcher's own decide_pcie_only_defaults, with sglang's own parse of the command and
    the child's environment: a user's NCCL_MAX_NCHANNELS=4 there keeps the launcher's channel floor out, and the
    report says why; the profile's CUDA_DEVICE_ORDER reaches it (the rank -> GPU map); an API key given by hand is
    not passed on."""
    ran, real = [], pcie.proc.run
    monkeypatch.setattr(pcie.proc, "run", lambda cmd, **kw: ran.append((cmd, kw["env"])) or real(cmd, **kw))
    report = _asked({**pcie_only_sm120, "NCCL_MAX_NCHANNELS": "4"}, extra=["--api-key", "s3cret"])
    assert report["known"], report["lines"]
    decision = report["decision"]
    assert decision["topology"] == "pcie-only" and decision["pcie_ipc"] is True
    assert decision["nccl_set"] == {} and "NCCL_MAX_NCHANNELS=4" in decision["nccl_skipped"]["NCCL_MIN_NCHANNELS"]
    assert [g["pci_bus_id"] for g in decision["tp_groups"][0]][:2] == ["0000:01:00.0", "0000:21:00.0"]
    assert "launcher PCIe defaults: topology: pcie-only" in report["lines"]
    (cmd, env), = [(c, e) for c, e in ran if pcie.ASK in c]
    assert "s3cret" not in " ".join(cmd) and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and "--tp-size" in cmd
    assert _asked(pcie_only_sm120)["decision"]["nccl_set"] == {"NCCL_MIN_NCHANNELS": "8"}


def test_pcie_defaults_opt_outs_reach_the_launcher(pcie_only_sm120):
    off = _asked({**pcie_only_sm120, "SGLANG_PCIE_NCCL_DEFAULTS": "0"})["decision"]
    assert off["nccl_set"] == {} and off["pcie_ipc"] is True
    assert any("SGLANG_PCIE_NCCL_DEFAULTS=0" in n for n in off["notes"])
    assert _asked({**pcie_only_sm120, "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "0"})["decision"]["pcie_ipc"] is False


def test_pcie_defaults_without_an_answer_in_advance(tmp_path):
    report = _asked({"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path)})  # a python without sglang
    assert not report["known"] and "decides the PCIe-only defaults when it starts" in report["lines"][0]
    assert "cannot say in advance" in report["lines"][0] and "sglang" in report["lines"][0]
    assert "when it starts" in _plan(None).pcie.lines[0]  # not asked: said plainly


# ---------------------------------------------------------------------------------------------------------------
# the command line


def test_dry_run_prints_a_runnable_script(capsys, monkeypatch, pcie_only_sm120):
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.setenv("PYTHONPATH", pcie_only_sm120["PYTHONPATH"])  # the python below asks its patched launcher
    assert serve.main(["--dry-run", "--draft-model", "lightseekorg/kimi-k2.5-eagle3", "--python", sys.executable,
                       "--", "--context-length", "65536"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    cmd = shlex.split(out[-1])
    assert cmd[1:3] == ["-m", "sglang.launch_server"] and cmd[-2:] == ["--context-length", "65536"]
    assert _opt(cmd, "--speculative-draft-model-path") == "lightseekorg/kimi-k2.5-eagle3"
    assert f"export CUDA_DEVICE_ORDER=PCI_BUS_ID  # from profile {DEFAULT.name}" in out
    assert "# pcie: launcher PCIe defaults: topology: pcie-only" in out
    assert all(ln.startswith(("#", "export ")) for ln in out[:-1])
    assert any("AL 2.69 MT-Bench" in ln for ln in out)  # known drafter noted


def test_dry_run_json_and_exec(capsys, monkeypatch, sglang_tree):
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    assert serve.main(["--dry-run", "--json", "--port", "32000"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert _opt(rep["argv"], "--port") == "32000" and rep["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert rep["pcie_defaults"]["lines"] and "env_file" not in rep

    seen = {}

    def fake_exec(path, argv, env):
        seen.update(path=path, argv=argv, env=env)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execve", fake_exec)
    with pytest.raises(SystemExit):
        serve.main(["--port", "32000"])
    assert seen["path"] == seen["argv"][0] == sys.executable
    assert seen["argv"] == rep["argv"] and seen["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    err = capsys.readouterr().err
    assert "export CUDA_DEVICE_ORDER=PCI_BUS_ID" in err and "when it starts" in err  # says what it applied


def test_unknown_serve_option_points_to_the_separator(sglang_tree):
    with pytest.raises(UserError, match="go after `--`"):
        serve.main(["--dry-run", "--context-length", "1000"])


def test_check_runs_the_doctor(monkeypatch):
    got = {}

    def fake_exec(path, argv, env):
        got.update(argv=argv, env=env)
        raise SystemExit(7)

    monkeypatch.setattr(os, "execve", fake_exec)
    with pytest.raises(SystemExit):
        serve.main(["--check"])
    assert got["argv"][1:3] == ["-m", "scripts.host.doctor"] and got["argv"][3:5] == ["--tp", "8"]
    assert str(ROOT) in got["env"]["PYTHONPATH"].split(os.pathsep)


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


# ---------------------------------------------------------------------------------------------------------------
# who can reach the server: loopback unless the operator opts in, and then only with an API key

KEY = "k3y-0f-the-0perator"


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_profiles_listen_on_loopback_and_say_so(path, parser):
    plan = serve.build_plan(serve.load_profile(path), environ={}, python="python3")
    assert parser.parse_args(plan.argv[3:]).host == "127.0.0.1"
    assert plan.listen.loopback and "# listen: listening on 127.0.0.1 only" in serve.render(plan)


@pytest.mark.parametrize("how", [{"host": "0.0.0.0"}, {"extra": ["--host", "0.0.0.0"]}, {"extra": ["--host=::"]}])
def test_beyond_loopback_without_a_key_is_refused(index, how):
    with pytest.raises(UserError, match=r"refusing to listen on (0\.0\.0\.0|::) without an API key") as e:
        serve.main(["--dry-run", *(["--host", how["host"]] if "host" in how else []), "--", *how.get("extra", [])])
    assert "export SGLANG_API_KEY=" in str(e.value) and "docker run -e SGLANG_API_KEY" in str(e.value)


def test_a_profile_can_opt_in_and_still_needs_the_key(tmp_path, index):
    p = tmp_path / "open.toml"
    assert '\nhost = "127.0.0.1"\n' in DEFAULT.read_text()
    p.write_text(DEFAULT.read_text().replace('\nhost = "127.0.0.1"\n', '\nhost = "0.0.0.0"\n', 1))
    with pytest.raises(UserError, match="refusing to listen on 0.0.0.0"):
        serve.build_plan(serve.load_profile(p), environ={}, index=index, python="python3")
    plan = serve.build_plan(serve.load_profile(p), environ={"SGLANG_API_KEY": KEY}, index=index, python="python3")
    assert plan.listen.line.startswith("listening on 0.0.0.0 with an API key from $SGLANG_API_KEY")


def _fake_sglang(tmp_path) -> Path:
    """A stand-in `sglang.launch_server` that reports what reached it: its sys.argv, its own command line as the
    kernel shows it (/proc/self/cmdline, what `ps` prints) and whether the key is still in its environment."""
    pkg = tmp_path / "fake" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(
        "import json, os, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'cmdline': open('/proc/self/cmdline').read().split('\\0'),\n"
        "                  'env_key': os.environ.get('SGLANG_API_KEY')}))\n")
    return pkg.parent


def _exec_plan(plan, tmp_path) -> dict:
    env = {**plan.child_env({"SGLANG_API_KEY": KEY, "PATH": os.environ["PATH"]}), "PYTHONPATH": str(_fake_sglang(tmp_path))}
    cp = subprocess.run(plan.argv, env=env, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def test_the_key_from_the_environment_reaches_sglang_off_every_command_line(index, tmp_path, parser, capsys):
    plan = _plan(index, host="0.0.0.0", environ={"SGLANG_API_KEY": KEY})
    assert plan.listen.line.startswith("listening on 0.0.0.0 with an API key from $SGLANG_API_KEY")
    shown = serve.render(plan) + json.dumps(serve.as_json(plan))
    assert KEY not in shown and KEY not in " ".join(plan.argv)
    got = _exec_plan(plan, tmp_path)
    assert got["argv"][-2:] == ["--api-key", KEY] and got["env_key"] is None
    assert not [t for t in got["cmdline"] if KEY in t]  # not in what ps shows
    ns = parser.parse_args(got["argv"])
    assert ns.api_key == KEY and ns.host == "0.0.0.0" and ns.model_path == "moonshotai/Kimi-K2.5"


def test_the_key_from_a_file_the_operator_names(index, tmp_path):
    secret = tmp_path / "api_key"
    secret.write_text(KEY + "\n")
    plan = _plan(index, host="0.0.0.0", api_key_file=str(secret))
    assert plan.listen.line.startswith(f"listening on 0.0.0.0 with an API key from the file {secret}")
    got = _exec_plan(plan, tmp_path)
    assert got["argv"][-2:] == ["--api-key", KEY] and KEY not in " ".join(plan.argv)
    with pytest.raises(UserError, match="both"):
        _plan(index, host="0.0.0.0", api_key_file=str(secret), environ={"SGLANG_API_KEY": KEY})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(UserError, match="is empty"):
        _plan(index, host="0.0.0.0", api_key_file=str(tmp_path / "empty"))
    with pytest.raises(UserError, match="is empty"):
        _plan(index, host="0.0.0.0", environ={"SGLANG_API_KEY": ""})


def test_a_key_given_to_sglang_by_hand_wins_and_is_never_printed(index):
    plan = _plan(index, extra=["--host", "0.0.0.0", "--api-key", KEY], environ={"SGLANG_API_KEY": "other"})
    assert plan.argv[1:3] == ["-m", "sglang.launch_server"] and plan.argv[-2:] == ["--api-key", KEY]
    assert "the command line" in plan.listen.line
    shown = serve.render(plan) + json.dumps(serve.as_json(plan))
    assert KEY not in shown and "--api-key '<redacted>'" in shown


@pytest.mark.parametrize("given", [["--api-k", KEY], [f"--api-ke={KEY}"], ["--admin-api-k", KEY],
                                   [f"--ssl-keyfile-pass={KEY}"]])
def test_an_abbreviated_key_flag_is_redacted_too(index, given):
    """sglang's parser accepts unique prefixes (--api-k is --api-key): serve redacts by the flag's dest, so what it
    prints never carries the value, however the flag was spelled."""
    plan = _plan(index, extra=["--host", "0.0.0.0", *given], environ={"SGLANG_API_KEY": "other"})
    assert any(KEY in t for t in plan.argv)
    shown = serve.render(plan) + json.dumps(serve.as_json(plan))
    assert KEY not in shown and "<redacted>" in shown


def test_key_file_advice_writes_a_private_file(tmp_path):
    """The fix serve prints for an empty key file, run as printed (with the path moved under tmp): the file it writes
    holds a key and is readable by its owner only."""
    import stat
    import subprocess

    from scripts.host import exposure

    key = tmp_path / "etc" / "api_key"
    cmd = exposure.key_file_fix(str(key))
    subprocess.run(["sh", "-c", cmd], check=True)
    assert len(key.read_text().strip()) == 64 and stat.S_IMODE(key.stat().st_mode) == 0o600
    (tmp_path / "empty").write_text("")
    with pytest.raises(UserError, match=r"umask 077"):
        exposure.decide("0.0.0.0", {}, str(tmp_path / "empty"))


def test_loopback_with_a_key_uses_it(index):
    plan = _plan(index, environ={"SGLANG_API_KEY": KEY})
    assert plan.listen.line.startswith("listening on 127.0.0.1 only, with an API key from $SGLANG_API_KEY")
    assert plan.argv[1] == "-c"


def test_check_tells_the_doctor_where_serve_would_listen(monkeypatch):
    got = {}

    def fake_exec(path, argv, env):
        got.update(argv=argv)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execve", fake_exec)
    with pytest.raises(SystemExit):
        serve.main(["--check", "--host", "0.0.0.0"])
    assert got["argv"][got["argv"].index("--listen-host") + 1] == "0.0.0.0"


def test_a_draft_model_without_a_speculative_algorithm_is_refused(index):
    """serve --profile kimi-k25-tp8 --draft-model X would add a draft path sglang never loads (no algorithm): an
    error naming both fixes, whichever way the path came in; with the algorithm given it is served."""
    nospec = serve.load_profile(serve.resolve_profile("kimi-k25-tp8"))
    for kw in ({"draft_model": "x/draft"}, {"extra": ["--speculative-draft-model", "x/draft"]}):
        with pytest.raises(UserError) as e:
            serve.build_plan(nospec, environ={}, index=index, python="python3", **kw)
        msg = str(e.value)
        assert "profile kimi-k25-tp8 sets no --speculative-algorithm" in msg
        assert f"serve --profile {serve.DEFAULT_PROFILE} --draft-model x/draft" in msg
        assert "-- --speculative-algorithm EAGLE3" in msg
    plan = serve.build_plan(nospec, environ={}, index=index, python="python3", draft_model="x/draft",
                            extra=["--speculative-algorithm", "EAGLE3"])
    assert _opt(plan.argv, "--speculative-draft-model-path") == "x/draft"
    serve.build_plan(nospec, environ={}, index=None, python="python3")  # no draft model: fine
    with pytest.raises(UserError, match="sets no --speculative-algorithm"):  # without sglang's parser too
        serve.build_plan(nospec, environ={}, index=serve.FlagIndex(None), python="python3", draft_model="x/draft")


# ---------------------------------------------------------------------------------------------------------------
# drafters: what the SGLang that runs does with them, read from its source


def test_drafter_support_is_read_from_the_sglang_source(sglang_tree, tmp_path):
    """SGLang picks a draft class by its config.json's architectures[0] among the EntryClass of srt/models: the MLA
    drafter's Eagle3DeepseekV2ForCausalLM is registered by kimi_k25_eagle3.py, which names the checkpoint."""
    from scripts.host import drafters

    pkg = sglang_tree / "python" / "sglang"
    reg = drafters.entry_classes(pkg)
    assert reg["Eagle3DeepseekV2ForCausalLM"] == "srt/models/kimi_k25_eagle3.py"
    assert reg["LlamaForCausalLMEagle3"] == "srt/models/llama_eagle3.py"
    mla = drafters.claim("lightseekorg/kimi-k2.5-eagle3-mla", pkg, hub=tmp_path)
    assert mla.loads and "Eagle3DeepseekV2ForCausalLM (srt/models/kimi_k25_eagle3.py, built for this checkpoint)" \
        in mla.text and "refuse" not in mla.text
    llama = drafters.claim("lightseekorg/kimi-k2.5-eagle3", pkg, hub=tmp_path)
    assert llama.loads and "(srt/models/llama_eagle3.py)" in llama.text  # not "built for": that is the MLA one
    # a config.json in the HF cache is better evidence than the table; an unregistered one is called out
    snap = tmp_path / "models--x--draft" / "snapshots" / "r1"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text('{"architectures": ["Eagle3MiniMaxForCausalLM"]}')
    odd = drafters.claim("x/draft", pkg, hub=tmp_path)
    assert odd.loads is False and "expect sglang to refuse it" in odd.text and "HF cache" in odd.text
    # an SGLang without the MLA draft model (as releases before it had) is said to refuse the MLA drafter
    old = tmp_path / "old" / "sglang"
    (old / "srt" / "models").mkdir(parents=True)
    (old / "srt" / "models" / "llama_eagle3.py").write_text("class LlamaForCausalLMEagle3: ...\n"
                                                            "EntryClass = [LlamaForCausalLMEagle3]\n")
    assert drafters.claim("lightseekorg/kimi-k2.5-eagle3-mla", old, hub=tmp_path).loads is False


def test_serve_notes_the_mla_drafter_as_loaded(index):
    plan = _plan(index, draft_model="lightseekorg/kimi-k2.5-eagle3-mla")
    note = next(n for n in plan.notes if n.startswith("drafter lightseekorg/kimi-k2.5-eagle3-mla"))
    assert "SGLang loads it as Eagle3DeepseekV2ForCausalLM" in note and "refuse" not in note


def test_docker_readme_drafter_table_agrees_with_the_source(sglang_tree):
    from scripts.host import drafters

    rows = [ln for ln in (ROOT / "docker" / "README.md").read_text().splitlines() if ln.startswith("| `")]
    pkg = sglang_tree / "python" / "sglang"
    for repo, d in drafters.KNOWN.items():
        row = next(r for r in rows if r.startswith(f"| `{repo}`"))
        said = row.split("|")[2].strip()
        c = drafters.claim(repo, pkg, hub=ROOT / "no-hub")
        assert said.startswith("yes" if c.loads else "no"), row
        assert f"`{d.arch}`" in said, row


def test_default_drafter_is_chosen_by_the_evidence_and_kept_in_step(sglang_tree):
    """The profile's drafter is the one with the best published evidence at its own 3/1/4 (and SGLang loads it);
    its comment says why; make bench's variants default to the same drafter."""
    import tomllib

    from scripts.host import drafters

    prof = serve.load_profile(DEFAULT)
    drafter = prof.defaults["draft_model"]
    assert drafter == "lightseekorg/kimi-k2.5-eagle3"
    assert drafters.claim(drafter, sglang_tree / "python" / "sglang", hub=ROOT / "no-hub").loads
    text = " ".join(ln.lstrip("# ").strip() for ln in DEFAULT.read_text().splitlines())
    assert "GSM8K 3.20" in text and "make bench-sweep" in text and "AQ-MedAI/Kimi-K25-eagle3 (the previous" in text
    variants = tomllib.loads((ROOT / "bench" / "variants.toml").read_text())
    assert variants["defaults"]["draft_model"] == drafter


def test_dry_run_refuses_values_sglang_would_fail_on_after_the_load(tmp_path, sglang_tree):
    """mem-fraction-static 1.9, an unknown speculative algorithm and topk 0 pass sglang's parser (by type) and fail
    only after the ~10 min weight load: the dry run names each, where it is set (issue 23 item 9). The algorithm
    is judged by SGLang's own name resolution."""
    text = DEFAULT.read_text().replace("mem-fraction-static = 0.9", "mem-fraction-static = 1.9")
    text = text.replace('speculative-algorithm = "EAGLE3"', 'speculative-algorithm = "EAGLE9"')
    (tmp_path / "bad.toml").write_text(text)
    env = {**os.environ, "PYTHONPATH": str(sglang_tree / "python")}
    cp = subprocess.run([sys.executable, "-m", "scripts.host.serve", "--profile", str(tmp_path / "bad.toml"),
                         "--dry-run", "--", "--speculative-eagle-topk", "0"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 2, cp.stdout + cp.stderr
    err = cp.stderr
    assert f"mem-fraction-static in [args] of profile {tmp_path / 'bad.toml'}: 1.9 would fail" in err
    assert "a fraction of GPU memory between 0 and 1" in err
    assert "Unknown speculative algorithm name: EAGLE9 (SGLang's own names: " in err and "EAGLE3" in err
    assert "--speculative-eagle-topk after -- on the command line: 0 would fail" in err
    assert "Traceback" not in err and not cp.stdout
