"""SGLang's PCIe-IPC communicator and TP group coordinator as the patch tests build them (no GPU here): the real
classes made without their constructors (which need CUDA devices and process groups), FlashInfer's PCIe-IPC
workspaces (GPU only) stood in by `Workspace`, which keeps their contract with SGLang. conftest.py installs them."""

from pathlib import Path
from types import SimpleNamespace

import torch

from _sgl import bare, resolved

REPO = Path(__file__).resolve().parents[2]
HIDDEN = 7168  # Kimi-K2.5 / DeepSeek-V3
KIMI_VOCAB_SHARD = 163840 // 8  # the logits' vocab shard at TP8
SM120_FUSION_CAP = 256  # SGLANG_SM120_ALLREDUCE_FUSION_MAX_TOKENS default: sizes the FlashInfer fusion workspace


class Workspace:
    """FlashInfer's PcieIpcAllReduceWorkspace and PcieIpcAllGatherWorkspace as far as SGLang sees them: built with
    the max_numel SGLang asks for, admitting 2-D tensors of its dtype up to that size; `built` lists every build."""

    built: list = []

    def __init__(self, group=None, max_numel=0, dtype=torch.bfloat16, **kw):
        self.group, self.max_numel, self.dtype, self.kw = group, max_numel, dtype, kw
        self.tuned, self.destroyed = [], False
        Workspace.built.append(self)

    def supports(self, t):
        return t.dtype is self.dtype and t.dim() == 2 and 0 < t.numel() <= self.max_numel

    def tune(self, hiddens, **kw):
        self.tuned.append(list(hiddens))
        return {(h, b): "config" for h in hiddens for b in self.kw.get("tune_batches", ())}

    def rebind_stream(self):
        pass

    def all_reduce(self, t):
        return t

    def all_gather(self, inp, out):  # as if every rank sent what this one did
        out.copy_(inp.repeat(out.shape[0] // inp.shape[0], 1))

    def destroy(self):
        self.destroyed = True


def nvml(monkeypatch, **kw):
    """FakeNvml (tests/_fake_nvml.py), also where SGLang's custom_all_reduce_utils imports pynvml (CUDA builds)."""
    import pynvml

    from _fake_nvml import FakeNvml
    from sglang.srt.distributed.device_communicators import custom_all_reduce_utils

    monkeypatch.setattr(custom_all_reduce_utils, "pynvml", pynvml, raising=False)
    return FakeNvml(monkeypatch, **kw)


def on_pci_buses(monkeypatch):
    """CUDA device i sits on PCI bus BUS[i] of FakeNvml's box (the meta device on BUS[0])."""
    from _fake_nvml import BUS

    def properties(d):
        return SimpleNamespace(pci_domain_id=0, pci_bus_id=int(BUS[d.index or 0].split(":")[1], 16), pci_device_id=0)

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)


def communicator(world=8, **attrs):
    """SGLang's PcieIpcCommunicator of a TP group on one PCIe node, as its constructor leaves it on a CUDA device."""
    from sglang.srt.distributed.device_communicators.pcie_ipc_ar import PcieIpcCommunicator

    return bare(
        PcieIpcCommunicator,
        **{
            "disabled": False,
            "max_numel": 0,
            "_workspace": None,
            "_bound_stream": None,
            "_cpu_group": None,
            "_max_rows": None,
            "_group": None,
            "_device": torch.device("meta"),
            "_world_size": world,
            "_workspace_cls": Workspace,
            "_build_failed": False,
            **attrs,
        },
    )


def prepared(max_rows, **kw):
    """A communicator prepared as BaseRunner._pre_initialize_pcie_ipc_workspace prepares it (kw: prepare's)."""
    comm = communicator(_tune=lambda hidden: None)
    comm.prepare(hidden=HIDDEN, max_rows=max_rows, **kw)
    return comm


def rows(n, dtype=torch.bfloat16, width=HIDDEN):
    """A reduction's input: meta, so that GroupCoordinator takes its GPU path."""
    return torch.empty((n, width), dtype=dtype, device="meta")


def route(tp, n, dtype=torch.bfloat16) -> str:
    """The collective GroupCoordinator.all_reduce dispatches an n-row reduction to."""
    tp.routed.clear()
    tp.all_reduce(rows(n, dtype))
    (taken,) = tp.routed
    return taken


def server_info(monkeypatch, tp) -> dict:
    """allreduce_backends of GET /server_info (as JSON) in a process whose TP group is `tp`, from the controller that
    answers it (SchedulerInternalStateController)."""
    import json

    from sglang.srt import runtime_context
    from sglang.srt.managers.scheduler_components.internal_state import SchedulerInternalStateController

    monkeypatch.setattr(runtime_context, "get_parallel", lambda: SimpleNamespace(tp_group=tp))
    state = {}
    SchedulerInternalStateController(SimpleNamespace(), record_step_time=False)._add_allreduce_backends(state)
    return json.loads(json.dumps(state))["allreduce_backends"]


def widest_decode_rows(sa, pool: int | None = None, spec=None) -> int:
    """BaseRunner._widest_decode_rows (what the PCIe-IPC workspaces are prepared with) for a target whose request pool
    holds the server's running requests per DP worker, or `pool`."""
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.runner.base_runner import BaseRunner
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    size = pool or resolved(sa, "max_running_requests") // get_parallel().attn_dp_size
    mr = bare(
        ModelRunner,
        spec_algorithm=spec or SpeculativeAlgorithm.EAGLE3,
        is_draft_worker=False,
        server_args=sa,
        req_to_token_pool=SimpleNamespace(size=size),
    )
    return BaseRunner._widest_decode_rows(SimpleNamespace(model_runner=mr))
