"""scripts/host/serve.py and the serving profiles, through SGLang's own parser (the patched tree under test) and the
verb's entry points: main() for the dry run, a subprocess for what reaches SGLang, the fake docker for make serve."""

import json
import os
import shlex
import socket
import subprocess
from pathlib import Path

import pytest

import _fake_docker
from scripts.box.docker import PATCHSET_LABEL
from scripts.box.ranks import free_port
from scripts.host import drafters, serve
from scripts.lib.errors import UserError
from scripts.series.pin import load_pin

ROOT = Path(__file__).resolve().parents[2]
PROFILES = {p.stem: p for p in (ROOT / "docker" / "profiles").glob("*.yaml")}
SPEC = ("kimi-k25-eagle3-tp8", "kimi-k25-dflash-tp8")
KEY = "k3y-0f-the-0perator"
IMAGE = load_pin().serving_image


def snapshot(hub: Path, repo: str) -> None:
    snap = hub / f"models--{repo.replace('/', '--')}" / "snapshots" / "r1"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (snap / "model.safetensors").write_text("")


@pytest.fixture
def hf(tmp_path, monkeypatch) -> Path:
    """An HF hub cache of this test's own (HF_HUB_CACHE), holding a drafter that is not a known one."""
    snapshot(tmp_path / "hub", "x/own-drafter")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("SGLANG_API_KEY", raising=False)
    return tmp_path / "hub"


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

    paths = {"--model-path": _sgl.KIMI_K25, "--speculative-draft-model-path": _sgl.FIXTURES / "kimi-k25-dflash"}
    argv = ["--config", str(PROFILES["kimi-k25-dflash-tp8"]), *(str(x) for kv in paths.items() for x in kv)]
    sa = serve.parse_with_sglang([*argv, "--device", "cuda", *extra])
    with _sgl.platform(12):
        sa.resolve_once()
    backends = (_sgl.resolved(sa, "attention_backend"), _sgl.resolved(sa, "speculative_draft_attention_backend"))
    assert backends == ("triton", want)


def test_dry_run_is_sglangs_own_command_line_of_a_profile_found_by_name_or_path(capsys, sglang_tree, hf, tmp_path):
    own = ["--model", "/m", "--draft-model", "x/own-drafter", "--port", "31000"]
    doc = dry_run(capsys, *own, "--", "--context-length", "4096")
    assert (doc["port"], doc["tp"], doc["weights"]) == (31000, 8, ["/m", "x/own-drafter"])  # what make serve checks
    assert doc["argv"][1:5] == ["-m", "sglang.launch_server", "--config", str(PROFILES["kimi-k25-eagle3-tp8"])]
    sa = sglang_parse(doc["argv"])  # the command line wins over the file: SGLang's rule
    assert (sa.model_path, sa.speculative_draft_model_path, sa.port, sa.context_length) == ("/m", own[3], 31000, 4096)
    assert sa.tp_size == 8 and doc["listen"] == "listening on 127.0.0.1 only"
    with pytest.raises(UserError, match="kimi-k25-eagle3-tp8"):
        serve.main(["--dry-run", "--profile", "nope"])
    mine = tmp_path / "mine.yaml"
    mine.write_text("model-path: /m\nport: 31001\n")
    assert dry_run(capsys, "--profile", str(mine))["argv"][4] == str(mine)


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--", "--mem-fraction-static", "1.5"], "mem-fraction-static"),  # values SGLang would fail on after the load
        (["--", "--speculative-eagle-topk", "0"], "speculative-eagle-topk"),
        (["--", "--speculative-algorithm", "EAGLE9"], "EAGLE9"),
        (["--", "--speculative-num-stpes", "2"], "--speculative-num-steps"),
        (["--", "--tp-size", "eight"], "eight"),
        (["--", "--tp-size", "3"], "tp-size 3: must be 1, 2, 4 or 8"),
        (["--draft-modle", "x"], "--draft-model"),  # serve's own typos name the right option
        (["--prot", "1"], "--port"),
        (["--tp", "4"], "serve ... -- --tp 4"),
    ],
)
def test_a_bad_value_or_a_typo_is_refused_before_sglang_loads(capsys, sglang_tree, hf, argv, named):
    with pytest.raises(UserError) as e:
        dry_run(capsys, *argv)
    assert named in str(e.value)


def test_drafters_are_checked_against_their_algorithm_the_known_ones_and_the_hf_cache(capsys, sglang_tree, hf):
    with pytest.raises(UserError, match="--speculative-algorithm EAGLE3"):
        dry_run(capsys, "--profile", "kimi-k25-tp8", "--draft-model", "lightseekorg/kimi-k2.5-eagle3")
    with pytest.raises(UserError, match="drafts for DFLASH, not EAGLE3: add -- --speculative-algorithm DFLASH"):
        dry_run(capsys, "--draft-model", "z-lab/Kimi-K2.5-DFlash")
    argv = "--profile kimi-k25-tp8 --draft-model lightseekorg/kimi-k2.5-eagle3 -- --speculative-algorithm EAGLE3"
    assert sglang_parse(dry_run(capsys, *argv.split())["argv"]).speculative_algorithm == "EAGLE3"
    with pytest.raises(UserError) as e:
        dry_run(capsys, "--draft-model", "lightseekorg/kimi-k2.5-eagle")  # a typo, and not in the cache
    assert "lightseekorg/kimi-k2.5-eagle3?" in str(e.value) and str(hf) in str(e.value)
    own = dry_run(capsys, "--draft-model", "x/own-drafter")["notes"]
    assert any(n.startswith("drafter x/own-drafter: not one of the known") for n in own)
    known = dry_run(capsys, "--draft-model", "AQ-MedAI/Kimi-K25-eagle3")["notes"]
    assert any(n.startswith("drafter AQ-MedAI/Kimi-K25-eagle3") and str(hf) in n for n in known)
    with pytest.raises(UserError, match="no such directory") as e:  # a path: never told to hf download it
        dry_run(capsys, "--draft-model", "/data/my-drafter")
    assert "hf download" not in str(e.value)
    notes = "\n".join(dry_run(capsys, "--profile", "kimi-k25-dflash-tp8")["notes"])  # SERVE_ARGS="--profile ..."
    assert "drafter z-lab/Kimi-K2.5-DFlash (DFLASH): block drafting" in notes
    assert "(or before: hf download z-lab/Kimi-K2.5-DFlash)" in notes


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
    """The patched tree's sglang, but a stand-in sglang.launch_server that reports what reached it."""
    pkg = tmp_path / "fake" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__path__.append({str(ROOT / 'build' / 'sglang' / 'python' / 'sglang')!r})\n")
    (pkg / "launch_server.py").write_text(
        "import json, os, sys\nc = sys.argv[sys.argv.index('--config') + 1]\n"
        "print(json.dumps({'argv': sys.argv[1:], 'config': open(c).read(), 'env_key': os.environ.get("
        "'SGLANG_API_KEY'), 'cmdline': open('/proc/self/cmdline').read()}))\n"
    )
    return pkg.parent


def serve_verb(*args, docker: _fake_docker.FakeDocker | None = None, **env) -> subprocess.CompletedProcess:
    path = {"PATH": _fake_docker.path_with(docker.bindir)} if docker else {}
    return _fake_docker.verb("scripts.host.serve", *args, timeout=300, **path, **env)


def test_the_key_reaches_sglang_in_a_private_copy_read_once(sglang_tree, tmp_path, hf):
    env = {"PYTHONPATH": str(fake_sglang(tmp_path)), "SGLANG_API_KEY": KEY, "TMPDIR": str(tmp_path)}
    cp = serve_verb("--host", "0.0.0.0", **env)
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


def box(tmp_path: Path, labels=None) -> _fake_docker.FakeDocker:
    """make serve's box: docker with the serving image (this checkout's patch set), 8 idle GPUs."""
    return _fake_docker.install(tmp_path, (IMAGE,), pythonpath=(fake_sglang(tmp_path),), labels=labels, gpus=8)


def test_make_serve_checks_the_box_and_the_images_dry_run_then_runs_it(sglang_tree, tmp_path, hf, monkeypatch):
    """The docker run is printed, the image's own dry run resolves the command, the box is checked; then it runs,
    through the image's entrypoint to SGLang's launch_server with the profile as --config."""
    docker, port = box(tmp_path), str(free_port())
    snapshot(hf, "moonshotai/Kimi-K2.5")
    drafter, key = tmp_path / "my-drafter", tmp_path / "key"
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    key.write_text(KEY)
    monkeypatch.setenv("SGLANG_BASE", "auto")  # make exports it for apply
    monkeypatch.setenv("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "0")
    own = ["--image", IMAGE, "--draft-model", str(drafter), "--port", port]
    dry = serve_verb(*own, "--dry-run", "--host", "0.0.0.0", "--api-key-file", key, docker=docker)
    assert dry.returncode == 0, dry.stderr
    cmd = printed_command(dry.stdout)
    assert "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE" in cmd and "SGLANG_BASE" not in cmd
    assert cmd[cmd.index("--network") + 1] == "host" and f"{hf}:/root/.cache/huggingface/hub" in cmd
    assert f"{drafter}:{drafter}:ro" in cmd and f"{key}:{key}:ro" in cmd
    assert cmd[cmd.index("--name") + 1].startswith("eagle-serve-pid")
    assert f"--speculative-draft-model-path {drafter} --port {port} --host 0.0.0.0" in dry.stdout  # SGLang's command
    for ok in ("image", "GPUs: 8 x", "GPUs idle", f"port {port}: free", f"weights: moonshotai/Kimi-K2.5, {drafter}"):
        assert f"ok   {ok}" in dry.stdout, ok
    assert all("--dry-run" in run for run in docker.runs())
    real = serve_verb(*own, "--", "--tp-size", "2", docker=docker)
    assert real.returncode == 0, real.stderr
    run = docker.runs()[-1]
    assert printed_command(real.stdout) == ["docker", *run] and run[run.index(IMAGE) + 1] == "serve"
    reached = json.loads(real.stdout.splitlines()[-1])
    assert reached["argv"][:2] == ["--config", str(PROFILES["kimi-k25-eagle3-tp8"])]
    assert reached["argv"][-4:] == ["--port", port, "--tp-size", "2"]


def test_make_serve_refuses_before_it_starts_anything(sglang_tree, tmp_path, hf):
    """A stale image; a server holding the GPUs and the port, with the weights not there; a value SGLang fails on
    after the load: each named with its fix, and the only docker run is the image's own dry run."""
    stale = box(tmp_path / "stale", labels={PATCHSET_LABEL: "0000000stale"})
    cp = serve_verb("--image", IMAGE, docker=stale)
    assert cp.returncode == 2 and f"Fix: make image IMAGE={IMAGE}" in cp.stderr and not stale.runs(), cp.stderr
    docker = box(tmp_path)
    docker.busy("4242, sglang::scheduler_TP0, 88000 MiB")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        busy = serve_verb("--image", IMAGE, "--port", listener.getsockname()[1], docker=docker)
    late = serve_verb("--image", IMAGE, "--", "--mem-fraction-static", "1.5", docker=docker)
    weights = f"hf download moonshotai/Kimi-K2.5 --cache-dir {hf}"
    for cp, said in [(busy, ["FAIL GPUs idle: 4242", "FAIL port", weights]), (late, ["its dry run", "1.5: must be"])]:
        assert cp.returncode == 2 and all(s in cp.stderr for s in said) and "Traceback" not in cp.stderr, cp.stderr
    assert all("--dry-run" in run for run in docker.runs())


def test_a_key_file_this_user_cannot_reach_is_named_with_the_fix(tmp_path):
    """docker/README's recipe as a user who is not root: a key in a directory only root may enter."""
    secret = tmp_path / "sglang"
    secret.mkdir()
    (secret / "api_key").write_text(KEY)
    secret.chmod(0)
    root = ("setpriv", "--bounding-set=-dac_override,-dac_read_search") if os.getuid() == 0 else ()
    cp = serve_verb("--image", IMAGE, "--host", "0.0.0.0", "--api-key-file", secret / "api_key", prefix=root)
    secret.chmod(0o700)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    assert "docker, as root, could still mount it" in cp.stderr and f"sudo chown $USER {secret}" in cp.stderr
