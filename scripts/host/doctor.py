"""`make doctor` (the image's `doctor` verb): the serving box checked before a model loads.

  python -m scripts.host.doctor [--tp N] [--python PY] [--image IMAGE] [--probe-timeout S] [--json]
                                [--record DIR | --replay DIR]
  python -m scripts.host.doctor --list          the checks and the finding ids they report

Exit status: 0 no error finding, 1 at least one error finding, 2 a usage problem.
"""

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

from ..lib.cli import parser, run
from ..series.pin import load_pin, patchset_id
from .checks import Finding, listing, run_checks, table
from .facts import Probe, build_facts, load_capture, summary
from .nccl import expected_nccl

DEFAULT_NEED_GB = 700  # Kimi-K2.5 weights (~600 GB) + drafter + headroom: an estimate


def _pin() -> tuple[str | None, tuple[int, int] | None, str | None]:
    """(patch set of the series here, CUDA of the upstream image, the pinned image); None where unreadable."""
    try:
        pin = load_pin()
        return patchset_id(), pin.image_cuda, pin.serving_image
    except Exception:  # noqa: BLE001 - a doctor without the series still diagnoses the box
        return None, None, None


def diagnose(
    probe: Probe,
    *,
    tp: int = 8,
    need_gb: float = DEFAULT_NEED_GB,
    environ: dict | None = None,
    expected_patchset: str | None = None,
    **asked,
) -> tuple[list[Finding], dict]:
    """Every registered check over the facts of `probe`: (findings, the facts as plain data)."""
    env = dict(os.environ if environ is None else environ)
    facts = build_facts(
        probe,
        tp=tp,
        need_gb=need_gb,
        environ=env,
        image_cuda=_pin()[1],
        expected_patchset=env.get("EAGLE_PATCHSET") or expected_patchset,
        expected_nccl=expected_nccl(env),
        **asked,
    )
    return run_checks(facts), summary(facts)


def main(argv=None) -> int:
    ap = parser("scripts.host.doctor", __doc__)
    ap.add_argument("--list", action="store_true", help="list the checks and exit")
    ap.add_argument("--tp", type=int, default=8, help="tensor-parallel size to check for (default 8)")
    ap.add_argument("--need-gb", type=float, default=DEFAULT_NEED_GB, help="disk the model needs (default 700)")
    ap.add_argument("--python", default=sys.executable, help="interpreter whose torch, NCCL and sglang to check")
    ap.add_argument(
        "--image", help="where the GPU probes run when --python's torch sees under 2 GPUs (default: the pinned image)"
    )
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds each tool may take (default 30)")
    ap.add_argument(
        "--probe-timeout",
        type=float,
        help="seconds before a GPU probe counts as hung (default: 120, "
        "600 for the PCIe-IPC smoke with its JIT, 60 for bandwidth)",
    )
    ap.add_argument("--json", action="store_true", help="one JSON object: findings, facts, errors")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--record", type=Path, metavar="DIR", help="also write every output read to DIR")
    src.add_argument("--replay", type=Path, metavar="DIR", help="diagnose the outputs recorded in DIR")
    a = ap.parse_args(argv)
    if a.list:
        print(listing())
        return 0
    patchset, _, pinned_image = _pin()
    image = None if os.environ.get("EAGLE_IMAGE") else a.image or pinned_image  # in the image: no docker
    recorded = load_capture(a.replay) if a.replay else None
    probe = Probe(recorded, python=a.python, timeout=a.timeout, image=image, ranks=a.tp, probe_timeout=a.probe_timeout)
    findings, facts = diagnose(probe, tp=a.tp, need_gb=a.need_gb, expected_patchset=patchset)
    if a.record:
        print(f"recorded {len(probe.record(a.record))} outputs in {a.record}", file=sys.stderr)
    errors = sum(f.severity == "error" for f in findings)
    if a.json:
        doc = {"findings": [dataclasses.asdict(f) for f in findings], "facts": facts, "errors": errors}
        print(json.dumps(doc, indent=1, default=str))
    else:
        print(table(findings, shutil.get_terminal_size((110, 20)).columns))
    return 1 if errors else 0


if __name__ == "__main__":
    run(main)
