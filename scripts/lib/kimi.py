"""Kimi-K2.5 (DeepSeek-V3 text model) shapes the benchmarks and the host probes use, defined once."""

HIDDEN = 7168  # hidden size: one all-reduce carries rows x HIDDEN bf16 values
LAYERS = 61
CHAIN = 2 * LAYERS  # all-reduces in one verify forward (two per layer)
# Per-rank GEMM shapes (K, N) of one layer at TP8: attention in (q_a + kv_a, replicated), q_b (8 heads x 192),
# o_proj (8 heads x 128 -> hidden): all-reduce #1; MoE gate_up (8 routed + 1 shared expert, 2 x 2048/8 each),
# down (9 x 256 -> hidden): all-reduce #2.
ATTN_GEMMS = ((HIDDEN, 2112), (1536, 1536), (1024, HIDDEN))
MOE_GEMMS = ((HIDDEN, 4608), (2304, HIDDEN))
