"""NCCL facts: the releases known to misbehave on this box class, and how to ask an interpreter which NCCL its torch
loads (without a GPU: torch's own answer, else the pip package's metadata)."""

from __future__ import annotations

import importlib.metadata

KNOWN_BAD_NCCL = {
    "2.30.4": "hangs on the first all-reduce between RTX PRO 6000 pairs unless P2P is disabled "
              "(field report: local-inference-lab/rtx6kpro#15)",
}
NCCL_DISTS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12")

# Run with the interpreter under test (doctor --python): prints one JSON object.
NCCL_PROBE = r"""
import json
r = {}
try:
    import torch
    r["torch"] = torch.__version__
    v = torch.cuda.nccl.version()
    if isinstance(v, tuple):
        r["nccl"] = ".".join(map(str, v[:3]))
    else:
        v = int(v)
        r["nccl"] = "%d.%d.%d" % ((v // 10000, v // 100 % 100, v % 100) if v >= 10000 else (v // 1000, v // 100 % 10, v % 100))
except Exception as e:
    r["error"] = "%s: %s" % (type(e).__name__, e)
try:
    import importlib.metadata as md
    for d in ("nvidia-nccl-cu13", "nvidia-nccl-cu12"):
        try:
            r["dist"], r["dist_version"] = d, md.version(d)
            break
        except md.PackageNotFoundError:
            pass
except Exception:
    pass
print(json.dumps(r))
"""


def nccl_dist_version() -> tuple[str, str] | None:
    """(distribution, version) of the pip NCCL this interpreter's torch loads, from package metadata."""
    for dist in NCCL_DISTS:
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
