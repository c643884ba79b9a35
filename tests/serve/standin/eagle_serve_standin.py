"""SGLang general plugin of the lent-GPU route of `make test-serve` (entry point group sglang.srt.plugins; SGLang
loads it in every server process, scripts/host/serve_plan.py puts this directory on the path).

That route runs the fused ops on their torch reference (SGLANG_FORCE_FUSED_OP_BACKEND=torch, SGLang's own switch),
because sgl-kernel cannot load there. The unquantized fused MoE's torch reference copies expert counts to the host
(moe_forward_native: tokens_per_expert.cpu()), which CUDA graph capture refuses, so this plugin keeps that one op on
the dispatch it has without the switch (forward_cuda: SGLang's Triton fused MoE). Nothing else changes; without
the forced backend the plugin does nothing.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)
KEEP_DISPATCH = ("UnquantizedFusedMoEMethod",)


def install() -> None:
    if not os.environ.get("SGLANG_FORCE_FUSED_OP_BACKEND"):
        return
    from sglang.kernels.fused_op import BaseFusedOp

    forward = BaseFusedOp.forward
    if getattr(forward, "eagle_keeps_dispatch", False):
        return

    def keep_dispatch(self, *args, backend=None, **kwargs):
        if backend is None and type(self).__name__ in KEEP_DISPATCH:
            if self._forward_method is None:
                self._forward_method = self._resolve_forward_method()
            return self._forward_method(*args, **kwargs)
        return forward(self, *args, backend=backend, **kwargs)

    keep_dispatch.eagle_keeps_dispatch = True
    BaseFusedOp.forward = keep_dispatch
    logger.warning("eagle_serve_standin: %s keep their normal dispatch under SGLANG_FORCE_FUSED_OP_BACKEND=%s",
                   ", ".join(KEEP_DISPATCH), os.environ["SGLANG_FORCE_FUSED_OP_BACKEND"])
