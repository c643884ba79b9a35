"""The kernel cost of a forward, from the chrome trace SGLang's profiler writes (the profile part, the device run of
bench/device/kernels.sh): each kernel in a class by its name, per class the count and the GPU time, the kernels of
one layer, the graph nodes of the forward, what a small node costs, and the GPU-busy time inside a window.

A kernel's class is the first of CLASSES whose pattern its name matches (case-insensitive), else "other". The names
are those SGLang v0.5.23 launches on CUDA: sgl-kernel's and its JIT and Triton kernels, FlashInfer's, cuBLAS', NCCL's
and PyTorch's own (the lent-GPU route runs the fused ops on their torch reference: its norms are a pow, a mean and an
rsqrt among elementwise kernels that land in "other"). Graph nodes are every GPU event of the forward's graph
launches (kernels, copies, sets): CUPTI reports each kernel a replay runs, correlated with the cudaGraphLaunch.
"""

import re
import statistics
from collections import Counter

CLASSES = (  # the specific before the generic: a router's "topk" is routing, a sampler's top-k renorm is sampling
    ("all_reduce", r"nccl|pcie_ipc|all_?reduce|all_?gather|reduce_?scatter|cross_device_reduce|PtoP"),
    ("sampling", r"argmax|sampl|softcap|multinomial|VerifyTree|draft_topk|build_tree|top_?[kp]_?(renorm|mask)"),
    ("routing", r"router|moe_fused_gate|topk_gate|gate_topk|topk|sigmoid"),
    ("moe", r"moe|expert|marlin_moe|wna16"),
    ("rope_kv", r"rope|rotary|pos_enc|kvcache|kv_cache|kv_buffer|store_kv|set_mla|concat_mla"),
    ("norm", r"norm|pow_tensor_scalar|MeanOps|rsqrt"),
    ("attention", r"_fwd_(grouped_)?kernel|attn|attention|mla|flash|kv_indices|kv_splits|merge_state"),
    ("gemm", r"gemm|gemv|nvjet|cutlass|xmma|cublas|splitk|matmul|marlin|bmm"),
)
NAMES = (*(c for c, _ in CLASSES), "other")
FIELDS = ("nodes", "classes", "layers", "per_layer", "node_us")  # summarize(): each forward's, in the profile
SMALL = ("norm", "rope_kv", "routing", "sampling", "other")  # fixed-cost kernels: what a node costs
_PATTERNS = [(c, re.compile(p, re.I)) for c, p in CLASSES]


def classify(name: str) -> str:
    return next((c for c, p in _PATTERNS if p.search(name)), "other")


def _end(k: dict) -> float:
    return k["ts"] + k.get("dur", 0.0)


def per_layer(ordered: list[dict], classes: list[str], skip: int = 1) -> tuple[int, dict]:
    """(layers, {class: kernels of one layer, "total", "us": its time}): the attention kernel a forward runs most
    often (the earliest of a tie) marks each layer's start; a layer is the median of the spans between consecutive
    marks from the (skip + 1)-th on. skip 1 passes over DeepSeek's dense first layer; fewer than two spans give {}."""
    att = [k["name"] for k, c in zip(ordered, classes) if c == "attention"]
    if not att:
        return 0, {}
    seen = Counter(att)
    mark = max(seen, key=lambda n: (seen[n], -att.index(n)))
    at = [i for i, k in enumerate(ordered) if k["name"] == mark]
    spans = [Counter(classes[a:b]) for a, b in zip(at[skip:], at[skip + 1 :])]
    if not spans:
        return len(at), {}
    out = {c: statistics.median(s[c] for s in spans) for c in NAMES if any(s[c] for s in spans)}
    us = statistics.median(ordered[b]["ts"] - ordered[a]["ts"] for a, b in zip(at[skip:], at[skip + 1 :]))
    return len(at), out | {"total": statistics.median(sum(s.values()) for s in spans), "us": round(us, 2)}


def summarize(events: list[dict], skip: int = 1) -> dict:
    """One forward's GPU events (its graph launches' kernels, copies and sets): "nodes", "classes" {class: [count,
    us]}, "layers" and "per_layer" (per_layer()), "node_us" (median of a small kernel's duration plus the idle time
    before the next node)."""
    ordered = sorted(events, key=lambda k: k["ts"])
    classes = [classify(k["name"]) if k.get("cat", "kernel") == "kernel" else "other" for k in ordered]
    totals = {c: [0, 0.0] for c in NAMES}
    for k, c in zip(ordered, classes):
        totals[c][0] += 1
        totals[c][1] += k.get("dur", 0.0)
    small = [
        _end(k) - k["ts"] + max(0.0, n["ts"] - _end(k)) for k, n, c in zip(ordered, ordered[1:], classes) if c in SMALL
    ]
    layers, layer = per_layer(ordered, classes, skip)
    return {
        "nodes": len(ordered),
        "classes": {c: [n, round(us, 2)] for c, (n, us) in totals.items() if n},
        "layers": layers,
        "per_layer": layer,
        "node_us": round(statistics.median(small), 3) if small else None,
    }


def busy_ms(events: list[dict], starts: list[float]) -> float | None:
    """Median GPU-busy time (the union of the events' intervals) between consecutive starts (us), ms; None for
    fewer than two starts."""
    iv = sorted((k["ts"], _end(k)) for k in events)
    out = []
    for a, b in zip(starts, starts[1:]):
        total, end = 0.0, a
        for s, e in iv:
            s, e = max(s, end), min(e, b)
            if e > s:
                total, end = total + e - s, e
        out.append(total / 1000)
    return round(statistics.median(out), 4) if out else None
