"""The patch tests run on the tree under test. The fixtures below stand in the GPU for the PCIe-IPC and
speculative-cycle tests (tests/patches/_pcie.py says what each stand-in keeps)."""

import contextlib
from types import SimpleNamespace

import pytest
import torch

from _pcie import HIDDEN, REPO, SM120_FUSION_CAP, Workspace
from _sgl import DFLASH_BLOCK, published, sm120_args

GIB = 1 << 30
# Profile keys of the HTTP front end, not of how the model runs.
FRONT_END = {"host", "port", "tool_call_parser", "reasoning_parser", "trust_remote_code", "enable_metrics"}


@pytest.fixture(autouse=True, scope="session")
def _patched_tree(sglang_tree):
    return sglang_tree


@pytest.fixture
def no_gpu(monkeypatch, tmp_path):
    """set_free(bytes): what torch.cuda.mem_get_info answers. Stood in: FlashInfer's JIT size function (2 bytes x
    max_numel x 2 stages here) and its all-gather workspace class; no capture; FlashInfer's caches under tmp_path."""
    import flashinfer.comm as fi_comm
    import flashinfer.comm.pcie_ipc_ar as fi_ar

    free = {"bytes": 80 * GIB}
    monkeypatch.setenv("FLASHINFER_AUTOTUNE_DIR", str(tmp_path / "autotune"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["bytes"], 96 * GIB))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(
        fi_ar,
        "get_pcie_ipc_comm_module",
        lambda: SimpleNamespace(workspace_size=lambda world, numel, elem, blocks: 2 * numel * elem),
    )
    monkeypatch.setattr(fi_comm, "PcieIpcAllGatherWorkspace", Workspace, raising=False)
    Workspace.built = []
    return lambda n: free.__setitem__("bytes", n)


class Nccl:
    """NCCL's communicator (pynccl) stand-in: `calls` lists what would have been an NCCL call."""

    disabled = False

    def __init__(self):
        self.calls = []
        for op in ("all_gather", "broadcast", "all_reduce"):
            setattr(self, op, lambda *a, _op=op, **k: self.calls.append(_op))

    def change_state(self, enable=True):
        return contextlib.nullcontext()


@pytest.fixture
def tp8(monkeypatch, no_gpu):
    """SGLang's GroupCoordinator of TP8 on one PCIe node, NCCL stood in, no PCIe-IPC communicator (set pcie_ipc_comm)
    nor fusion workspace (fusion_workspace); the registered ops run their bodies, `routed` lists each one's route."""
    from sglang.srt.distributed import parallel_state as ps

    g = ps.GroupCoordinator.__new__(ps.GroupCoordinator)
    g.world_size, g.rank_in_group, g.unique_name, g.routed = 8, 0, "tp:test", []
    g.hpu_communicator = g.xpu_communicator = g.ca_comm = g.qr_comm = None
    g.pymscclpp_comm = g.torch_symm_mem_comm = g.pcie_ipc_comm = g._fi_workspace_hint = None
    g.pynccl_comm, g.device_group, g.cpu_group = Nccl(), None, None
    g.is_symmetric_memory_enabled = lambda: False
    g.debug_check_symmetric_mempool = lambda *a, **k: None
    monkeypatch.setitem(ps._groups, g.unique_name, lambda: g)

    def outplace(t, group_name, outplace_all_reduce_method):
        g.routed.append({"pynccl": "nccl"}.get(outplace_all_reduce_method, outplace_all_reduce_method))
        return g._all_reduce_out_place(t, outplace_all_reduce_method)

    monkeypatch.setattr(ps, "outplace_all_reduce", outplace)
    monkeypatch.setattr(
        ps, "inplace_all_reduce", lambda t, group_name: g.routed.append("nccl") or g._all_reduce_in_place(t)
    )
    monkeypatch.setattr(ps, "flashinfer_allreduce", lambda t, group_name: g.routed.append("flashinfer") or t)
    monkeypatch.setattr(
        ps, "reg_all_gather_into_tensor", lambda out, inp, group_name: g._all_gather_into_tensor(out, inp)
    )
    monkeypatch.setenv("SGLANG_RECORD_SPEC_COLLECTIVES", "1")
    return g


@pytest.fixture
def fusion_workspace(monkeypatch, tp8):
    """up(tokens): FlashInfer's fusion workspace for `tokens` rows (the fusion's cap) as BaseRunner pre-initializes
    it, in SGLang's own workspace manager with FlashInfer's real size check, stamped on tp8 as parallel_state does."""
    from flashinfer.comm.allreduce import TRTLLMAllReduceFusionWorkspace

    from sglang.srt.layers import flashinfer_comm_fusion as fcf

    def up(tokens=SM120_FUSION_CAP):
        ws = TRTLLMAllReduceFusionWorkspace.__new__(TRTLLMAllReduceFusionWorkspace)
        ws.metadata = {"max_token_num": tokens, "tp_size": 8, "hidden_dim": HIDDEN, "use_fp32_lamport": False}
        ws._destroyed = True  # nothing was allocated, nothing to free
        manager = fcf._get_workspace_manager(True)
        vars(manager).update(
            workspace=ws,
            world_size=8,
            rank=0,
            group=(None, None),
            max_token_num=tokens,
            hidden_dim=HIDDEN,
            dtype=torch.bfloat16,
            backend="trtllm",
            use_fp32_lamport=False,
            initialized=True,
        )
        manager._configure_workspace_size_check()
        monkeypatch.setattr(fcf, "_flashinfer_allreduce_unavailable", False)
        monkeypatch.setattr(fcf, "_flashinfer_comm", SimpleNamespace())
        tp8._fi_workspace_hint = "attn_tp"

    yield up
    vars(fcf._get_workspace_manager(True)).update(workspace=None, initialized=False)


@pytest.fixture
def collectives(monkeypatch):
    """SGLang's collective_stats, recording (SGLANG_RECORD_SPEC_COLLECTIVES=1), emptied before and after."""
    from sglang.srt.distributed import collective_stats

    monkeypatch.setenv("SGLANG_RECORD_SPEC_COLLECTIVES", "1")
    collective_stats.reset()
    yield collective_stats
    collective_stats.reset()


@pytest.fixture(scope="session")
def timing_starts(tmp_path_factory):
    """Per rank, per start: the all-reduce timing started four times on two CPU ranks (_gloo.py allreduce_timing)."""
    import _gloo

    return _gloo.run("allreduce_timing", timeout=400, cache_dir=str(tmp_path_factory.mktemp("autotune")))


@pytest.fixture(scope="session")
def kimi_sm120():
    """Kimi-K2.5 + EAGLE-3 chain (steps 3, topk 1, 4 draft tokens) at TP8 on a faked SM120 box, 96 GB, defaults."""
    return sm120_args()


@pytest.fixture
def kimi(kimi_sm120):
    """kimi_sm120 published as the scheduler publishes it."""
    with published(kimi_sm120):
        yield kimi_sm120


@pytest.fixture(scope="session")
def kimi_dflash():
    """Kimi-K2.5 + DFlash (block 8 from the draft's config, 48 running requests) at TP8 on a faked SM120, 96 GB."""
    return sm120_args(spec=False, **DFLASH_BLOCK)


@pytest.fixture
def profile(no_gpu):
    """The shipped serving profile (docker/profiles/kimi-k25-eagle3-tp8.yaml) resolved on a faked SM120 box, 96 GB,
    published."""
    import yaml

    args = yaml.safe_load((REPO / "docker" / "profiles" / "kimi-k25-eagle3-tp8.yaml").read_text())
    kw = {k.replace("-", "_"): v for k, v in args.items()}
    sa = sm120_args(**{k: v for k, v in kw.items() if k not in FRONT_END and not k.endswith("model_path")})
    with published(sa):
        yield sa
