"""Import-only stand-in for sgl-kernel (eagle_importonly.py says why and how). test-gpu calls no op of it; for the
tiny servers of test-serve's lent-GPU route three are answered by SGLang's own kernels of the same contract:
moe_align_block_size, moe_sum_reduce, and utils.is_arch_support_pdl() -> False (vouching for no PDL path)."""

from eagle_importonly import stand_in

STANDIN = True
__version__ = "0.0.0+standin"


def moe_align_block_size(
    topk_ids,
    num_experts,
    block_size,
    sorted_token_ids,
    experts_ids,
    num_tokens_post_pad,
    cumsum_buffer,
    pad_sorted_token_ids=False,
    ignore_invalid_expert=False,
):
    """sgl_kernel's "+1 offset" bucket alignment, by SGLang's JIT kernel of the same contract."""
    if ignore_invalid_expert:
        raise NotImplementedError(
            "sgl_kernel.moe_align_block_size(ignore_invalid_expert=True) has no SGLang "
            "kernel to stand in for it (tests/gpu/standin); run with the real sgl-kernel"
        )
    from sglang.kernels.ops.moe.moe_align import moe_align_block_size as align

    buffers = (sorted_token_ids, experts_ids, num_tokens_post_pad, cumsum_buffer)
    align(topk_ids, num_experts, block_size, *buffers, pad_sorted_token_ids)


def moe_sum_reduce(input, output, routed_scaling_factor=1.0):
    """output = routed_scaling_factor * input.sum(dim=1), by SGLang's Triton kernel of the same contract."""
    from sglang.kernels.ops.moe.fused_moe_triton_kernels import moe_sum_reduce_triton

    moe_sum_reduce_triton(input, output, float(routed_scaling_factor))


stand_in(
    __name__,
    {
        "moe_align_block_size": moe_align_block_size,
        "moe_sum_reduce": moe_sum_reduce,
        "is_arch_support_pdl": lambda: False,
    },
)
