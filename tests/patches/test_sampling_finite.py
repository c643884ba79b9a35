"""A request's sampling values never make the sampler's probabilities non-finite: a logit_bias near the float32
maximum over a temperature below 1 overflows to inf, a row whose every token is -inf softmaxes to NaN, and
torch.multinomial then fails (on a GPU a device assert that takes the server down, every batched request with it);
one greedy request in the batch sends the sampled ones there. The real Sampler on CPU over SamplingBatchInfo's real
logit_bias step, and the verify's softmax."""

from types import SimpleNamespace

import pytest
import torch

from _sgl import published, server_args

VOCAB = 64
F32_MAX = 3.4028234663852886e38


@pytest.fixture(scope="module")
def sampler():
    from sglang.srt import runtime_context as rc

    sa = server_args(12, tp=1, spec=False, sampling_backend="pytorch")
    with published(sa), rc.get_parallel().override(tp_group=SimpleNamespace(device_group=None)):
        from sglang.srt.layers.sampler import create_sampler

        yield create_sampler()


def batch(rows: list[dict]):
    """SamplingBatchInfo for rows of sampling values (temperature, top_k, top_p, bias {token: value})."""
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    n = len(rows)
    bias = torch.zeros(n, VOCAB)
    for i, r in enumerate(rows):
        for token, value in r.get("bias", {}).items():
            bias[i, token] = value
    top_ks = torch.tensor([r.get("top_k", 1 << 30) for r in rows], dtype=torch.int32)
    top_ps = torch.tensor([r.get("top_p", 1.0) for r in rows])
    return SamplingBatchInfo(
        temperatures=torch.tensor([[r.get("temperature", 1.0)] for r in rows]),
        top_ps=top_ps,
        top_ks=top_ks,
        min_ps=torch.zeros(n),
        is_all_greedy=False,
        is_any_greedy=any(r.get("top_k") == 1 for r in rows),
        need_top_p_sampling=bool((top_ps < 1).any()),
        need_top_k_sampling=bool((top_ks != 1 << 30).any()),
        need_min_p_sampling=False,
        vocab_size=VOCAB,
        logit_bias=bias,
        device="cpu",
    )


def sample(sampler, rows: list[dict], seed: int = 0) -> list[int]:
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    torch.manual_seed(seed)
    logits = torch.randn(len(rows), VOCAB)
    info = batch(rows)
    info.apply_logits_bias(logits)  # as the model runner does before sampling
    out = LogitsProcessorOutput(next_token_logits=logits)
    ids = sampler(out, info, False, [0] * len(rows), [None] * len(rows), torch.zeros(len(rows), dtype=torch.long))
    return ids.tolist()


GREEDY = {"temperature": 1.0, "top_k": 1}  # what SamplingParams makes of temperature 0


@pytest.mark.parametrize(
    "rows, want",
    [
        ([GREEDY, {"temperature": 0.5, "bias": {7: F32_MAX}}], {1: 7}),
        ([GREEDY, {"temperature": 1e-5, "top_p": 0.9, "bias": {9: 3.5e33}}], {1: 9}),
        ([{"temperature": 0.99, "top_k": 20, "bias": {3: 3.4e38, 4: 3.4e38}}], {0: {3, 4}}),
        ([GREEDY, {"temperature": 0.5, "bias": {t: -F32_MAX for t in range(VOCAB)}}], {}),
    ],
    ids=["max-bias-over-half", "big-bias-over-1e-5", "two-max-biases", "every-token-banned"],
)
def test_a_batch_with_an_overflowing_row_samples_every_row(sampler, rows, want):
    """Each row gets a token of the vocabulary (unpatched: "probability tensor contains either inf, nan or element <
    0"); a token biased to the float32 maximum is the one sampled."""
    ids = sample(sampler, rows)
    assert len(ids) == len(rows) and all(0 <= t < VOCAB for t in ids), ids
    for row, token in want.items():
        assert ids[row] in (token if isinstance(token, set) else {token}), ids


@pytest.mark.parametrize("verify", ["softmax", "dflash"])
def test_the_verify_softmax_of_an_overflowing_row_is_finite(verify):
    """The speculative verify's probabilities divide by the temperature the same way: EAGLE's softmax, and the
    target probabilities of DFLASH's block verify (on an H200 it returned the last id for every verified token)."""
    from sglang.kernels.ops.sampling import softmax
    from sglang.srt.speculative.dflash_utils import build_speculative_verify_target_probs

    logits = torch.randn(3, VOCAB)
    logits[0, 5] = F32_MAX
    logits[1] = float("-inf")
    temperatures = [0.5, 0.5, 1.0]
    if verify == "softmax":
        probs = softmax(logits, torch.tensor([[t] for t in temperatures]))
    else:
        info = batch([{"temperature": t} for t in temperatures])
        probs = build_speculative_verify_target_probs(
            next_token_logits=logits, sampling_info=info, draft_token_num=1, bs=3, use_sparse_topk=False
        ).view(3, -1)
    assert torch.isfinite(probs).all() and probs[0].argmax() == 5, probs
    assert torch.allclose(probs.sum(-1), torch.ones(3)), probs.sum(-1)


@pytest.mark.unchanged
def test_an_ordinary_batch_samples_from_its_own_support(sampler):
    """Without an overflow nothing changes: the greedy row takes the argmax, a top-k row one of its k best."""
    rows = [GREEDY, {"temperature": 1.3, "top_k": 5, "bias": {2: -100.0}}]
    for seed in range(5):
        torch.manual_seed(seed)
        logits = torch.randn(2, VOCAB)
        ids = sample(sampler, rows, seed=seed)
        assert ids[0] == int(logits[0].argmax()) and ids[1] in logits[1].topk(5).indices.tolist(), (seed, ids)
