"""Tiny generated models for test-serve: targets with EAGLE-3 and DFlash drafters SGLang loads with its own loaders.

Every target's greedy next token is a fixed permutation `chain` of the current token (chain.json), by a clear logit
margin: embeddings are random unit rows times sqrt(hidden), lm_head row j is 0.5 * the embedding row of chain^-1(j),
and the blocks add small random outputs (attention, MLP and MoE all compute without moving the argmax). Speculation
must not change a greedy output, so a served chain is the lossless check. Drafters: draft-pi proposes chain(token)
at every step (always accepted); draft-random has random weights and half the vocabulary as draft vocab (almost
never accepted); draft-mla (kimi) is draft-pi in Kimi's MLA drafter form (lightseekorg's); dflash-first is a
DFlashDraftModel (z-lab/Kimi-K2.5-DFlash's Qwen3 form) right at block position 1 only (accept length exactly 2);
dflash-random the same form, random. Pairs: `llama` (4 layers, 8 heads / 8 KV heads) and `kimi` (Kimi-K2.5's text
config scaled down: MLA, a dense first layer, 16 routed experts top-4 + 1 shared; bf16, not int4). Heads, KV heads
and experts divide by 8: each runs at TP 1, 2, 4 and 8. Seconds on a CPU.
"""

import json
from pathlib import Path

import torch

VOCAB = 2048
WIDTH = 512  # hidden size of every tiny model
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")  # ids 0..3, fixed points of the chain
WORDS = [*SPECIALS, *(f"w{i}" for i in range(len(SPECIALS), VOCAB))]
AUX_LAYERS = [0, 1, 2]  # the target layers whose hidden states the drafter's fc reads (fc is zero)
DFLASH = ("dflash-first", "dflash-random")
PAIRS = {"llama": ("target", "draft-pi", "draft-random", *DFLASH), "kimi": ("target", "draft-pi", "draft-mla", *DFLASH)}
DFLASH_MASK, DFLASH_LAYERS, GAIN = 3, [0, 1], 8192.0  # <pad> fills a block's positions 1..; see dflash_drafter
CHAIN_FILE = "chain.json"
# MLA per-head dims of DeepSeek-V3 / Kimi-K2.5 (SGLang's triton MLA decode kernel takes kv_lora + rope = 576)
QR, KVR, NOPE, ROPE, VD = 128, 512, 128, 64, 128
MLA = {"q_lora_rank": QR, "kv_lora_rank": KVR, "qk_nope_head_dim": NOPE, "qk_rope_head_dim": ROPE, "v_head_dim": VD}
HEADS, HEAD_DIM, INTER = 8, 64, 1408
ATTENTION = {"num_attention_heads": HEADS, "num_key_value_heads": HEADS, "head_dim": HEAD_DIM}
LLAMA_LAYER = {"max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
KIMI_CONFIG = Path(__file__).resolve().parents[2] / "fixtures" / "kimi-k25" / "config.json"


def write_tokenizer(d: Path, words: list[str] = WORDS, max_len: int = 4096) -> None:
    """A WordLevel tokenizer over `words` (the specials first: unk, bos, eos and pad), as HF files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    specials = zip(("unk_token", "bos_token", "eos_token", "pad_token"), (w for w in words if w.startswith("<")))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **dict(specials), "model_max_length": max_len}
    config["clean_up_tokenization_spaces"] = False
    (d / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")


def make_chain(g) -> tuple[list[int], object]:
    """(chain, chain^-1): one cycle over the non-special ids; the specials map to themselves."""
    n = len(SPECIALS)
    order = torch.randperm(VOCAB - n, generator=g) + n
    nxt = torch.arange(VOCAB)
    nxt[order] = torch.roll(order, -1)
    inv = torch.empty_like(nxt)
    inv[nxt] = torch.arange(VOCAB)
    return nxt.tolist(), inv


def _orthonormal_rows(g, rows: int, cols: int):  # rows <= cols
    return torch.linalg.qr(torch.randn(cols, rows, generator=g))[0].T.contiguous()


def _save(d: Path, weights: dict, config: dict) -> None:
    from safetensors.torch import save_file

    keep_fp32 = ("e_score_correction_bias",)  # as HF DeepSeek-V3 checkpoints store it
    out = {
        k: (t.to(torch.bfloat16) if t.is_floating_point() and not k.endswith(keep_fp32) else t).contiguous()
        for k, t in weights.items()
    }
    write_tokenizer(d)
    save_file(out, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(config, indent=1) + "\n")


def _common(extra: dict) -> dict:
    """Every tiny model's config keys, then `extra`."""
    ids = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}
    dtype = {"tie_word_embeddings": False, "torch_dtype": "bfloat16", "hidden_act": "silu"}
    return {"vocab_size": VOCAB, "hidden_size": WIDTH, **ids, **dtype, **extra}


def _readout(g, inv) -> tuple[object, dict]:
    """Unit embedding rows U, and the embedding / lm_head / final norm every target shares."""
    u = torch.randn(VOCAB, WIDTH, generator=g)
    u = u / u.norm(dim=1, keepdim=True)
    return u, {
        "model.embed_tokens.weight": u * WIDTH**0.5,
        "lm_head.weight": 0.5 * u[inv],
        "model.norm.weight": torch.ones(WIDTH),
    }


def llama_target(g, inv, out_std: float = 0.004) -> tuple[object, dict, dict]:
    u, w = _readout(g, inv)
    layers = 4
    for i in range(layers):
        p = f"model.layers.{i}."
        sq = (WIDTH, WIDTH)
        for name, shape, std in (
            ("self_attn.q_proj", sq, 0.02),
            ("self_attn.k_proj", sq, 0.02),
            ("self_attn.v_proj", sq, 0.02),
            ("self_attn.o_proj", sq, out_std),
            ("mlp.gate_proj", (INTER, WIDTH), 0.02),
            ("mlp.up_proj", (INTER, WIDTH), 0.02),
            ("mlp.down_proj", (WIDTH, INTER), out_std),
        ):
            w[p + name + ".weight"] = torch.randn(*shape, generator=g) * std
        w[p + "input_layernorm.weight"] = torch.ones(WIDTH)
        w[p + "post_attention_layernorm.weight"] = torch.ones(WIDTH)
    kind = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "mlp_bias": False}
    sizes = {"intermediate_size": INTER, "num_hidden_layers": layers, **ATTENTION, **LLAMA_LAYER}
    return u, w, _common({**kind, **sizes})


def kimi_target(g, inv, out_std: float = 0.02) -> tuple[object, dict, dict]:
    """Kimi-K2.5's text model (DeepseekV3ForCausalLM, model_type kimi_k2) at hidden 512, 3 layers."""
    u, w = _readout(g, inv)
    layers, experts, moe_inter, nh = 3, 16, 256, HEADS

    def rnd(*shape, std=0.02):
        return torch.randn(*shape, generator=g) * std

    for i in range(layers):
        p = f"model.layers.{i}."
        w.update(
            {
                p + "input_layernorm.weight": torch.ones(WIDTH),
                p + "post_attention_layernorm.weight": torch.ones(WIDTH),
                p + "self_attn.q_a_proj.weight": rnd(QR, WIDTH),
                p + "self_attn.q_a_layernorm.weight": torch.ones(QR),
                p + "self_attn.q_b_proj.weight": rnd(nh * (NOPE + ROPE), QR, std=0.1),
                p + "self_attn.kv_a_proj_with_mqa.weight": rnd(KVR + ROPE, WIDTH),
                p + "self_attn.kv_a_layernorm.weight": torch.ones(KVR),
                p + "self_attn.kv_b_proj.weight": rnd(nh * (NOPE + VD), KVR, std=0.1 * (64 / KVR) ** 0.5),
                p + "self_attn.o_proj.weight": rnd(WIDTH, nh * VD, std=out_std * 5 * (256 / (nh * VD)) ** 0.5),
            }
        )
        if i == 0:  # first_k_dense_replace = 1
            w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = rnd(INTER, WIDTH), rnd(INTER, WIDTH)
            w[p + "mlp.down_proj.weight"] = rnd(WIDTH, INTER, std=out_std)
            continue
        w[p + "mlp.gate.weight"] = rnd(experts, WIDTH)
        w[p + "mlp.gate.e_score_correction_bias"] = rnd(experts, std=0.01)
        for e in [*(f"experts.{j}" for j in range(experts)), "shared_experts"]:
            w[p + f"mlp.{e}.gate_proj.weight"] = rnd(moe_inter, WIDTH)
            w[p + f"mlp.{e}.up_proj.weight"] = rnd(moe_inter, WIDTH)
            w[p + f"mlp.{e}.down_proj.weight"] = rnd(WIDTH, moe_inter, std=out_std)
    kimi = json.loads(KIMI_CONFIG.read_text())["text_config"]  # its keys and routing, sizes scaled down, not int4
    del kimi["quantization_config"]
    sizes = dict(intermediate_size=INTER, moe_intermediate_size=moe_inter, n_routed_experts=experts)
    sizes.update(num_attention_heads=nh, num_key_value_heads=nh, num_experts_per_tok=4, num_hidden_layers=layers)
    return u, w, {**kimi, **_common({**sizes, **MLA})}


def _draft_config(extra: dict) -> dict:
    """A one-layer drafter's config keys, then `extra`."""
    sizes = {"num_hidden_layers": 1, "num_attention_heads": HEADS, "intermediate_size": INTER, **LLAMA_LAYER}
    return _common({**sizes, **extra})


LLAMA_EAGLE3 = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama"}  # both Llama-form drafters'
LLAMA_EAGLE3.update(num_key_value_heads=HEADS, head_dim=HEAD_DIM)


def _eagle_config(extra: dict) -> dict:
    """An EAGLE-3 drafter's config keys (its fc reads the AUX_LAYERS hidden states), then `extra`."""
    aux = {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": AUX_LAYERS}
    return _draft_config({"target_hidden_size": WIDTH, "draft_vocab_size": VOCAB, **extra, "eagle_config": aux})


def _pi_tail(u, inv, s_draft: float = 40.0, w_final: float = 0.01) -> dict:
    """fc = 0, the chain readout over the whole vocabulary (d2t = 0), a tiny final norm (with norm_output)."""
    return {
        "fc.weight": torch.zeros(WIDTH, len(AUX_LAYERS) * WIDTH),
        "norm.weight": torch.full((WIDTH,), w_final),
        "lm_head.weight": s_draft * u[inv],
        "d2t": torch.zeros(VOCAB, dtype=torch.int64),
        "t2d": torch.ones(VOCAB, dtype=torch.bool),
    }


def _dense_mlp(g, p: str) -> dict:
    return {
        p + "mlp.gate_proj.weight": torch.randn(INTER, WIDTH, generator=g) * 0.02,
        p + "mlp.up_proj.weight": torch.randn(INTER, WIDTH, generator=g) * 0.02,
        p + "mlp.down_proj.weight": torch.zeros(WIDTH, INTER),
        **{
            p + n + ".weight": torch.ones(WIDTH) for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")
        },
    }


def llama_pi_drafter(g, u, inv, beta: float = 4.0) -> tuple[dict, dict]:
    """LlamaForCausalLMEagle3 proposing chain(token): each position attends to itself (q_h = k_h = beta * P_h
    n(embed)), v = n(embed), o = I, no MLP output; fc = 0 (the target's hidden states play no part) and a tiny final
    norm with norm_output, so the hidden it feeds back carries ~1% of the new token's signal."""
    proj = torch.cat([_orthonormal_rows(g, HEAD_DIM, WIDTH) for _ in range(HEADS)])  # [H, H]
    zero = torch.zeros(WIDTH, WIDTH)
    qk = torch.cat([beta * proj, zero], 1)  # reads the embedding half of [embed, hidden]
    p = "midlayer."
    w = {
        **_pi_tail(u, inv),
        **_dense_mlp(g, p),
        p + "self_attn.q_proj.weight": qk,
        p + "self_attn.k_proj.weight": qk.clone(),
        p + "self_attn.v_proj.weight": torch.cat([torch.eye(WIDTH), zero], 1),
        p + "self_attn.o_proj.weight": torch.eye(WIDTH),
    }
    return w, _eagle_config({**LLAMA_EAGLE3, "norm_output": True})


def llama_random_drafter(g) -> tuple[dict, dict]:
    dv = VOCAB // 2
    p = "midlayer."
    w = {
        "fc.weight": torch.randn(WIDTH, len(AUX_LAYERS) * WIDTH, generator=g) * 0.02,
        "norm.weight": torch.ones(WIDTH),
        "lm_head.weight": torch.randn(dv, WIDTH, generator=g) * 0.02,
        "d2t": torch.zeros(dv, dtype=torch.int64),
        "t2d": torch.arange(VOCAB) < dv,
    }
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):  # q, k and v read [embed, hidden]
        cols = WIDTH if name == "o_proj" else 2 * WIDTH
        w[p + f"self_attn.{name}.weight"] = torch.randn(WIDTH, cols, generator=g) * 0.02
    w.update(_dense_mlp(g, p))
    w[p + "mlp.down_proj.weight"] = torch.randn(WIDTH, INTER, generator=g) * 0.02
    return w, _eagle_config({**LLAMA_EAGLE3, "draft_vocab_size": dv})


def mla_pi_drafter(g, u, inv, beta: float = 2.0) -> tuple[dict, dict]:
    """Eagle3DeepseekV2ForCausalLM (checkpoint names layers.0.*) proposing chain(token) through MLA: the kv latent
    is n(embed); q_a and every head's k_nope read one random 128-dim projection P of it (q_b / kv_b rotate it by
    an orthonormal R_h, scaled by beta), rope parts are zero; head h's v takes latent dims [64h, 64h+64) and o_proj
    puts them back, so attention on the token's own position returns n(embed)."""
    qr, kvr, nope, rope, vd = QR, KVR, NOPE, ROPE, VD
    proj = _orthonormal_rows(g, qr, WIDTH)  # P: [q_lora, H]
    q_b = torch.zeros(HEADS * (nope + rope), qr)
    kv_b = torch.zeros(HEADS * (nope + vd), kvr)
    o = torch.zeros(WIDTH, HEADS * vd)
    part = WIDTH // HEADS
    for h in range(HEADS):
        rot = _orthonormal_rows(g, nope, qr)  # R_h
        q_b[h * (nope + rope) : h * (nope + rope) + nope] = beta * rot
        kv_b[h * (nope + vd) : h * (nope + vd) + nope] = beta * rot @ proj
        kv_b[h * (nope + vd) + nope : h * (nope + vd) + nope + part, h * part : (h + 1) * part] = torch.eye(part)
        o[h * part : (h + 1) * part, h * vd : h * vd + part] = torch.eye(part)
    zero = torch.zeros(qr, WIDTH)
    p = "layers.0."
    w = {
        **_pi_tail(u, inv),
        **_dense_mlp(g, p),
        p + "self_attn.q_a_proj.weight": torch.cat([proj, zero], 1),
        p + "self_attn.q_a_layernorm.weight": torch.ones(qr),
        p + "self_attn.q_b_proj.weight": q_b,
        p + "self_attn.kv_a_proj_with_mqa.weight": torch.cat(
            [torch.cat([torch.eye(kvr), torch.zeros(kvr, WIDTH)], 1), torch.zeros(rope, 2 * WIDTH)]
        ),
        p + "self_attn.kv_a_layernorm.weight": torch.ones(kvr),
        p + "self_attn.kv_b_proj.weight": kv_b,
        p + "self_attn.o_proj.weight": o,
    }
    kind = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "deepseek_v3", "norm_output": True}
    return w, _eagle_config({**kind, "num_key_value_heads": HEADS, **MLA})


def dflash_drafter(g, u, target_layers: int, right: bool = True) -> tuple[dict, dict]:
    """A DFlash draft block is [anchor, mask ...]; each position's hidden goes through the target's head. right: q = 0,
    so every position attends evenly to the context and the block; the context's values are 0 (fc = 0) and so are
    the mask token's (v_proj projects its embedding out), so attention returns the anchor's embedding / (context +
    block), which o_proj (GAIN * I) lifts over the mask embedding in the residual (the MLP adds 0): every position
    proposes chain(anchor), right at position 1 only while the context is under GAIN / 4 tokens."""
    mask, p, eye = u[DFLASH_MASK], "layers.0.", torch.eye(WIDTH)

    def rnd(*shape):
        return torch.randn(*shape, generator=g) * 0.05

    proj = dict(q_proj=0 * eye, k_proj=0 * eye, v_proj=eye - torch.outer(mask, mask), o_proj=GAIN * eye)
    w = {f"{p}self_attn.{k}.weight": v if right else rnd(WIDTH, WIDTH) for k, v in proj.items()}
    w |= {
        n + ".weight": torch.ones(WIDTH)
        for n in ("norm", "hidden_norm", p + "input_layernorm", p + "post_attention_layernorm")
    }
    w |= {f"{p}self_attn.{n}_norm.weight": torch.ones(HEAD_DIM) for n in "qk"}
    w |= {f"{p}mlp.{n}_proj.weight": rnd(INTER, WIDTH) for n in ("gate", "up")}
    w[p + "mlp.down_proj.weight"] = rnd(WIDTH, INTER) * (not right)
    w["fc.weight"] = rnd(WIDTH, len(DFLASH_LAYERS) * WIDTH) * (not right)  # the target's hidden states in
    dflash = {"mask_token_id": DFLASH_MASK, "target_layer_ids": DFLASH_LAYERS}
    kind = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "dflash_config": dflash}
    return w, _draft_config({**kind, **ATTENTION, "num_target_layers": target_layers})


def write_pair(out: Path, pair: str, seed: int = 0) -> None:
    """out/<pair>/{target, draft-*, dflash-*}/ and out/<pair>/chain.json (pair: PAIRS)."""
    g = torch.Generator().manual_seed(seed)
    chain, inv = make_chain(g)
    base = Path(out) / pair
    u, tw, tcfg = (llama_target if pair == "llama" else kimi_target)(g, inv)
    _save(base / "target", tw, tcfg)
    drafters = {"draft-pi": llama_pi_drafter(g, u, inv)}
    if pair == "llama":
        drafters["draft-random"] = llama_random_drafter(g)
    else:
        drafters["draft-mla"] = mla_pi_drafter(g, u, inv)
    for name in DFLASH:
        drafters[name] = dflash_drafter(g, u, tcfg["num_hidden_layers"], right=name == "dflash-first")
    for name, (w, cfg) in drafters.items():
        _save(base / name, w, cfg)
    (base / CHAIN_FILE).write_text(json.dumps({"next": chain, "specials": len(SPECIALS)}) + "\n")


def load_chain(pair_dir: Path) -> list[int]:
    return json.loads((Path(pair_dir) / CHAIN_FILE).read_text())["next"]


def greedy_chain(chain: list[int], prompt: list[int], n: int) -> list[int]:
    """The n tokens a target built on `chain` generates greedily after `prompt`."""
    out, t = [], prompt[-1]
    for _ in range(n):
        t = chain[t]
        out.append(t)
    return out
