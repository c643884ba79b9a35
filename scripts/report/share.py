"""What of a box receipt leaves the box: the tarball `make report` writes for an issue. It holds the receipt as the
recommendations and `make docs` read it, less what identifies the machine: of env/tools/ only the outputs about the
GPUs, their links and NUMA (SHARED_TOOLS; not nvidia-smi -q's serials, the kernel command line, df); in every text
file the receipt's path becomes its name, this checkout's <repo>, the home ~ and the host name <host>.
"""

import io
import platform
import re
import tarfile
from pathlib import Path

from ..host.facts import CAPTURE_FILES
from ..lib.repo import REPO_ROOT

SHARED_TOOLS = frozenset(
    CAPTURE_FILES[k]
    for k in ("smi-query", "topo-m", "topo-p2p-r", "topo-p2p-n", "uvm-hmm", "iommu-groups", "nccl", "patchset")
)
TOOLS_DIR = Path("env") / "tools"
HOST = "<host>"


def private_strings(d: Path) -> list[tuple[re.Pattern, str]]:
    """(pattern, replacement) for what names this machine, longest first."""
    paths = [(str(d.resolve()), d.name), (str(REPO_ROOT.resolve()), "<repo>"), (str(Path.home()), "~")]
    out = [
        (re.compile(re.escape(p) + r"(?![\w.-])"), new)
        for p, new in sorted(paths, key=lambda x: -len(x[0]))
        if len(p) > 1
    ]
    names = {n for n in (platform.node(), platform.node().split(".")[0]) if len(n) > 1}
    return out + [
        (re.compile(rf"(?<![\w.-]){re.escape(n)}(?![\w-])"), HOST) for n in sorted(names, key=len, reverse=True)
    ]


def shared(rel: Path) -> bool:
    """Does this file of the receipt directory go into the tarball?"""
    return rel.parent != TOOLS_DIR or rel.name in SHARED_TOOLS


def scrubbed(data: bytes, patterns: list[tuple[re.Pattern, str]]) -> bytes:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data  # a plot
    for pattern, new in patterns:
        text = pattern.sub(new, text)
    return text.encode("utf-8")


def pack(d: Path, tarball: Path) -> list[str]:
    """Write the shareable tarball of receipt directory d; returns the files left out (relative paths)."""
    patterns, left_out = private_strings(d), []
    with tarfile.open(tarball, "w:gz") as tar:
        for f in sorted(p for p in d.rglob("*") if p.is_file()):
            rel = f.relative_to(d)
            if not shared(rel):
                left_out.append(str(rel))
                continue
            data = scrubbed(f.read_bytes(), patterns)
            info = tar.gettarinfo(str(f), arcname=f"{d.name}/{rel}")
            info.size, info.uname, info.gname, info.uid, info.gid = len(data), "", "", 0, 0
            tar.addfile(info, io.BytesIO(data))
    return left_out
