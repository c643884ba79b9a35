"""test-serve's parts that need no GPU (they run in make test): the tiny models and profiles, as SGLang reads them;
the bad-request list; the suite itself on a machine without a GPU: every server test skips with one reason, and
with --serve-out it refuses once, and its result (pytest's junitxml) says why."""

import json
import os
import subprocess
import sys

import pytest

import _servers as sv
import tiny_models as tm
from scripts.box.results import read_junit
from test_bad_requests import BAD

TOKEN_KEYS = ("input_ids", "prompt", "token_ids_logprob", "stop_token_ids", "sampling_params")  # of a bad request


def test_every_tiny_model_loads_in_sglangs_config_classes(tiny_models):
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

    for pair, dirs in tm.PAIRS.items():
        layers = ModelConfig(str(tiny_models / pair / "target")).hf_config.num_hidden_layers
        for name in dirs:
            mc = ModelConfig(str(tiny_models / pair / name), is_draft_model=name != "target")
            assert (mc.hf_config.vocab_size, mc.hf_config.hidden_size) == (tm.VOCAB, tm.WIDTH), (pair, name)
            mla = pair == "kimi" and name in ("target", "draft-mla")
            assert (mc.attention_arch == AttentionArch.MLA) == mla, (pair, name)
            if name in tm.DFLASH:  # what the DFLASH worker reads: the block's mask token, the target layers it reads
                d = parse_dflash_draft_config(draft_hf_config=mc.hf_config)
                layer_ids = d.resolve_target_layer_ids(target_num_layers=layers)
                assert (d.mask_token_id, layer_ids) == (tm.DFLASH_MASK, tm.DFLASH_LAYERS), (pair, name)


@pytest.mark.parametrize(
    "profile, kimi",
    [("eagle3.yaml", "kimi-k25-eagle3-tp8"), ("dflash.yaml", "kimi-k25-dflash-tp8"), ("nospec.yaml", "kimi-k25-tp8")],
)
def test_the_tiny_profiles_are_sglang_config_files_drafting_as_the_kimi_ones(profile, kimi):
    import argparse

    import yaml
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    argv = ConfigArgumentMerger(parser).merge_config_with_args(
        ["--model-path", "m", "--config", str(sv.PROFILES / profile)]
    )
    a = parser.parse_args(argv + ["--max-running-requests", "16"])  # the command line wins, as llama-cap's does
    assert a.max_running_requests == 16 and a.cuda_graph_bs_decode == [1, 2, 4, sv.CAPTURED_MAX]
    tiny, real = (
        {k: v for k, v in yaml.safe_load(p.read_text()).items() if k.startswith("speculative")}
        for p in (sv.PROFILES / profile, sv.PROFILES.parent / f"{kimi}.yaml")
    )
    real.pop("speculative-draft-model-path", None)  # the tiny one's comes from the phase
    assert tiny == real, "the tiny profile drafts as the Kimi profile does"


def test_the_bad_request_list_is_well_formed():
    def ids(body) -> list[int]:  # every token id a body names
        if isinstance(body, list):
            return [i for v in body for i in ids(v)]
        if not isinstance(body, dict):
            return [body] if type(body) is int else []
        named = [v for k, v in body.items() if k in TOKEN_KEYS]
        return [int(k) for k in body.get("logit_bias", {})] + [i for v in named for i in ids(v)]

    assert len({b[0] for b in BAD}) == len(BAD)
    assert {b[1] for b in BAD} == {"/generate", "/v1/completions", "/v1/chat/completions"}
    for name, _, body in BAD:
        if isinstance(body, bytes):  # not JSON, or not a JSON object
            with pytest.raises((ValueError, AttributeError)):
                json.loads(body).items()
            continue
        assert ("oov" in name or "prompt-id" in name) == any(not 0 <= i < tm.VOCAB for i in ids(body)), name
    assert sum("oov" not in b[0] and "prompt-id" not in b[0] for b in BAD) == 26  # malformed or out of range


def suite(*args) -> subprocess.CompletedProcess:
    """This directory's suite, run by a pytest that sees no GPU."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(sv.HERE), "--ignore", __file__]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([*cmd, *args], cwd=sv.HERE.parents[2], capture_output=True, text=True, env=env, timeout=600)


def test_without_a_gpu_the_server_tests_skip_with_one_reason():
    cp = suite()
    reasons = {ln.split(": ", 1)[1] for ln in cp.stdout.splitlines() if ln.startswith("SKIPPED")}
    assert cp.returncode == 0 and len(reasons) == 1 and "torch sees none here" in reasons.pop(), cp.stdout[-3000:]


def test_with_serve_out_it_refuses_once_and_the_result_says_why(tmp_path):
    cp = suite("--serve-out", str(tmp_path))
    doc = read_junit(next(tmp_path.glob("test-serve_nogpu_*.xml")))
    assert cp.returncode == 2 and doc["passed"] == doc["failed"] == 0, cp.stdout[-2000:]
    assert "torch sees none here" in doc["properties"]["refused"]
