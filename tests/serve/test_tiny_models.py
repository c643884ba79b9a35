"""The tiny model pairs: SGLang reads them with its own config classes, transformers follows their chain."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from scripts.host import tiny_models as tm


def test_every_model_loads_in_sglangs_config_classes(sglang_tree, tiny_models):
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig

    for pair, dirs in tm.PAIRS.items():
        for name in dirs:
            mc = ModelConfig(str(tiny_models / pair / name), is_draft_model=name != "target")
            hf = mc.hf_config
            assert hf.vocab_size == tm.VOCAB and hf.hidden_size == tm.WIDTH, (pair, name)
            assert hf.num_attention_heads % 8 == 0 and getattr(hf, "num_key_value_heads", 8) % 8 == 0, (pair, name)
            mla = pair == "kimi" and name in ("target", "draft-mla")
            assert (mc.attention_arch == AttentionArch.MLA) == mla, (pair, name, mc.attention_arch)
    kimi = ModelConfig(str(tiny_models / "kimi" / "target")).hf_config
    from transformers import DeepseekV3Config

    assert isinstance(kimi, DeepseekV3Config) and kimi.architectures == ["DeepseekV3ForCausalLM"]  # kimi_k2 alias
    assert (kimi.kv_lora_rank, kimi.qk_rope_head_dim, kimi.qk_nope_head_dim, kimi.v_head_dim) == (512, 64, 128, 128)
    assert kimi.n_routed_experts % 8 == 0 and kimi.n_shared_experts == 1 and kimi.first_k_dense_replace == 1
    assert kimi.scoring_func == "sigmoid" and kimi.topk_method == "noaux_tc"
    fixture = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "kimi-k25" / "config.json")
                         .read_text())["text_config"]
    ours = json.loads((tiny_models / "kimi" / "target" / "config.json").read_text())
    missing = sorted(set(fixture) - set(ours) - {"quantization_config"})
    assert not missing, f"Kimi-K2.5 text_config keys the tiny target lacks: {missing}"


@pytest.mark.parametrize("pair", sorted(tm.PAIRS))
def test_each_target_greedily_follows_its_chain_with_a_clear_margin(tiny_models, tmp_path, pair):
    import torch
    from transformers import AutoModelForCausalLM

    src = tiny_models / pair / "target"
    if pair == "kimi":  # transformers knows the architecture, not Kimi's model_type name (SGLang maps it)
        shutil.copytree(src, tmp_path / "t")
        cfg = json.loads((tmp_path / "t" / "config.json").read_text())
        (tmp_path / "t" / "config.json").write_text(json.dumps({**cfg, "model_type": "deepseek_v3"}))
        src = tmp_path / "t"
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    chain = tm.load_chain(tiny_models / pair)
    prompt = [7, 900, 33, 1500, 2047, 4]
    ids, got, margins = torch.tensor([prompt]), [], []
    with torch.no_grad():
        for _ in range(6):
            top = model(ids).logits[0, -1].topk(2)
            got.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))
            ids = torch.cat([ids, top.indices[:1].view(1, 1)], 1)
    assert got == tm.greedy_chain(chain, prompt, 6)
    assert min(margins) > 3.0, margins


def test_the_chain_is_one_cycle_over_the_ordinary_ids_and_fixes_the_specials(tiny_models):
    chain = tm.load_chain(tiny_models / "llama")
    n = len(tm.SPECIALS)
    assert chain[:n] == list(range(n))
    seen, t = set(), n
    while t not in seen:
        seen.add(t)
        t = chain[t]
    assert seen == set(range(n, tm.VOCAB))


def test_the_tokenizer_is_local_and_decodes_every_id(tiny_models):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_models / "llama" / "target"))
    assert len(tok) == tm.VOCAB and tok.eos_token_id == 2
    assert tok.decode([5, tm.VOCAB - 1]) == f"w5 w{tm.VOCAB - 1}"


def test_an_unknown_pair_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown pair 'qwen'; known: llama, kimi"):
        tm.write_pair(tmp_path, "qwen")
