"""Helpers shared by the patch tests: faked GPU platforms and Kimi-K2.5-shaped server arguments.

Everything here drives real SGLang code from the tree under test; only the platform probes are faked, through
SGLang's own `runtime_context.override_platform`.
"""

import contextlib
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
KIMI_K25 = FIXTURES / "kimi-k25"  # config.json only: KimiK25ForConditionalGeneration, DeepSeek-V3 text model
KIMI_K25_EAGLE3 = FIXTURES / "kimi-k25-eagle3"  # config.json only: a Llama EAGLE-3 draft head for it
KIMI_K25_DFLASH = FIXTURES / "kimi-k25-dflash"  # config.json only: a DFlash block draft for it (block 8)
RTX_PRO_6000_MIB = 97887  # RTX PRO 6000 Blackwell (96 GB) as nvidia-smi reports it

EAGLE3_CHAIN = dict(
    speculative_algorithm="EAGLE3",
    speculative_draft_model_path=str(KIMI_K25_EAGLE3),
    speculative_num_steps=3,
    speculative_eagle_topk=1,
    speculative_num_draft_tokens=4,
)
DFLASH_BLOCK = dict(speculative_algorithm="DFLASH", speculative_draft_model_path=str(KIMI_K25_DFLASH))


def facts(major: int, **extra) -> dict:
    """Platform facts of a CUDA GPU with compute capability major.0 (9: H100/H200, 10: B200, 12: RTX PRO 6000)."""
    d = dict.fromkeys(("is_hip", "is_npu", "is_xpu", "is_musa", "is_mps", "is_sm110", "has_amx"), False)
    d.update(is_cuda=True, has_flashinfer=True, device_sm=major * 10, device_capability=(major, 0))
    d.update(is_sm90=major == 9, is_sm100=major == 10, is_sm100_or_sm110=major == 10, is_sm120=major == 12)
    d.update(is_blackwell=major >= 10, is_hopper_with_cuda_12_3=major == 9)
    return {**d, **extra}


@contextlib.contextmanager
def platform(major: int, **extra):
    from sglang.srt.runtime_context import override_platform

    with override_platform(**facts(major, **extra)):
        yield


def server_args(major: int = 12, tp: int = 8, nnodes: int = 1, spec: bool = True, **kw):
    """Resolved ServerArgs for Kimi-K2.5 (+ EAGLE-3 chain drafting if spec) on a faked platform."""
    from sglang.srt.server_args import ServerArgs

    args = dict(model_path=str(KIMI_K25), tp_size=tp, nnodes=nnodes, device="cuda")
    if nnodes > 1:
        args.update(node_rank=0, dist_init_addr="127.0.0.1:5000")
    if spec:
        args.update(EAGLE3_CHAIN)
    args.update(kw)
    with platform(major):
        sa = ServerArgs(**args)
        sa.resolve_once()
    return sa


def sm120_args(**kw):
    """server_args on a faked SM120 box with 96 GB GPUs (ServerArgs sizes its CUDA graph defaults from the GPU's
    memory; there is no GPU here)."""
    from unittest import mock

    from sglang.srt.arg_groups import memory_hook

    with mock.patch.object(memory_hook, "get_device_memory_capacity", lambda device=None: RTX_PRO_6000_MIB):
        return server_args(12, **kw)


@contextlib.contextmanager
def published(sa):
    """`sa` published as the scheduler publishes it (runtime_context), for code that reads the context."""
    from sglang.srt import runtime_context as rc

    with rc.use_context(rc.create_context(sa, role="scheduler")):
        yield sa


def resolved(sa, name: str):
    from sglang.srt.arg_groups.overrides import resolution_result

    return resolution_result(sa, name)


def bare(cls, **attrs):
    """An instance of an SGLang class made without its constructor (which needs a GPU), holding `attrs`."""
    obj = cls.__new__(cls)
    vars(obj).update(attrs)
    return obj
