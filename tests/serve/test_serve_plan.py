"""make test-serve's phases: real serve commands (the serve verb, sglang's parser), resolved by SGLang itself."""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from scripts.host import serve, serve_checks, serve_plan as plan
from scripts.lib.errors import UserError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "patches"))
from _sgl import platform, resolved  # noqa: E402


def dry_run(argv: list[str]) -> dict:
    """serve's own --dry-run --json of the tier's command for a phase."""
    own = argv[3:]
    cut = own.index("--")
    out = io.StringIO()
    with redirect_stdout(out):
        assert serve.main(own[:cut] + ["--dry-run", "--json"] + own[cut:]) == 0
    return json.loads(out.getvalue())


@pytest.mark.parametrize("phase", plan.PHASES, ids=lambda p: p.name)
def test_every_phase_is_a_serve_command_sglangs_parser_accepts(sglang_tree, tiny_models, phase):
    argv = plan.serve_argv(phase, tiny_models, 3, 31000, 2, plan.LENT, sys.executable)
    assert argv[1:3] == ["-m", "scripts.host.serve"]
    d = dry_run(argv)
    sgl = d["argv"][3:]
    assert d["argv"][1:3] == ["-m", "sglang.launch_server"] and d["listen"]["loopback"]
    assert sgl[sgl.index("--model-path") + 1] == str(tiny_models / phase.pair / "target")
    assert sgl[sgl.index("--port") + 1] == "31030" and sgl[sgl.index("--nccl-port") + 1] == "31035"
    assert sgl[sgl.index("--tp-size") + 1] == "2" and "--tp-size 1" not in d["command"]
    assert all(f in d["command"] for f in (*plan.LENT.flags, *phase.flags))
    spec = "--speculative-algorithm" in sgl
    assert spec == (phase.drafter is not None)
    if spec:
        assert sgl[sgl.index("--speculative-draft-model-path") + 1] == str(tiny_models / phase.pair / phase.drafter)
        assert sgl[sgl.index("--speculative-num-draft-tokens") + 1] == str(serve_checks.DRAFT_TOKENS)


def resolve(phase: plan.Phase, models: Path, capfd):
    """The phase's sglang arguments resolved by SGLang on a faked H200, and what SGLang logged doing it."""
    from sglang.srt.server_args import prepare_server_args

    d = dry_run(plan.serve_argv(phase, models, 0, 31000, 1, plan.LENT, sys.executable))
    capfd.readouterr()
    with platform(9):
        sa = prepare_server_args(d["argv"][3:] + ["--device", "cuda"])
        sa.resolve_once()
    out = capfd.readouterr()
    return sa, out.out + out.err


def test_the_cap_phase_is_capped_by_sglang_with_the_text_the_check_expects(sglang_tree, tiny_models, capfd):
    sa, said = resolve(plan.BY_NAME["llama-cap"], tiny_models, capfd)
    assert resolved(sa, "max_running_requests") == plan.captured_max() == 8
    assert f"max_running_requests is capped from {plan.CAP_REQUESTS} to 8" in said
    sa, said = resolve(plan.BY_NAME["llama-graph"], tiny_models, capfd)
    assert resolved(sa, "max_running_requests") == 8 and "is capped" not in said


def test_the_eager_phase_is_announced_with_the_text_the_check_expects(sglang_tree, tiny_models, capfd):
    _, said = resolve(plan.BY_NAME["llama-eager"], tiny_models, capfd)
    assert serve_checks.EAGER_START in said
    _, said = resolve(plan.BY_NAME["llama-graph"], tiny_models, capfd)
    assert serve_checks.EAGER_START not in said


def test_phases_bring_their_reference_and_the_timed_pair():
    assert [p.name for p in plan.select("kimi-mla")] == ["kimi-nospec", "kimi-mla"]
    assert [p.name for p in plan.select("llama-eager")] == ["llama-nospec", "llama-graph", "llama-eager"]
    assert plan.select(None) == list(plan.PHASES)
    with pytest.raises(UserError, match="unknown phase.*llama-fast.*known: llama-nospec"):
        plan.select("llama-fast")


def test_the_route_sets_only_what_the_environment_lacks_and_gives_the_servers_no_api_key(tmp_path):
    environ = {"SGLANG_FORCE_FUSED_OP_BACKEND": "triton", "SGLANG_API_KEY": "k", "PYTHONPATH": "/x"}
    env, kept = plan.server_env(plan.LENT, environ, tmp_path / "s.log")
    assert env["SGLANG_FORCE_FUSED_OP_BACKEND"] == "triton" and kept == {"SGLANG_FORCE_FUSED_OP_BACKEND": "triton"}
    assert env["SGLANG_IS_FLASHINFER_AVAILABLE"] == "false" and "SGLANG_API_KEY" not in env
    assert env["PYTHONPATH"].split(":") == [str(plan.REPO_ROOT), *map(str, plan.LENT.paths), "/x"]
    assert env["EAGLE_STANDIN_LOG"] == str(tmp_path / "s.log")
    box, kept = plan.server_env(plan.BOX, {}, tmp_path / "s.log")
    assert not kept and "EAGLE_STANDIN_LOG" not in box and "SGLANG_FORCE_FUSED_OP_BACKEND" not in box
