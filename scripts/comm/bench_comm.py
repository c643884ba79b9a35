"""`make bench-comm` (the image's bench-comm verb): what the communication of one EAGLE verify forward costs here.

  python -m scripts.comm.bench_comm [--variants default,LL,...] [--world N] [--dry-run] ...

make bench-comm runs it in the serving image (in_image.py). Per NCCL environment variant, one process per GPU (SGLang's
init_distributed_environment) at Kimi-K2.5 shapes: NCCL all-reduce per call (a 122-call chain, eager and in a CUDA
graph), a 61-layer verify-shaped forward, and in the first variant SGLang's own tp.all_reduce per backend and the
fused all-reduce + RMSNorm; every reduction checked against fp32. Writes bench-comm_<box>_<UTC stamp>.json.

Exit status: 0 every variant ran and every reduction was correct; 1 a variant failed or a reduction was wrong; 2 a
usage problem (fewer than 2 GPUs, no patched SGLang here, an unknown variant, no /results mount in the image).
"""

import argparse
import importlib.util
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from ..box import ranks
from ..box.results import box_name, result_file, results_dir, stamp, write_json
from ..host.nccl import expected_nccl, nccl_report
from ..lib import proc
from ..lib.cli import parser, run
from ..lib.errors import UserError
from ..lib.kimi import CHAIN, LAYERS
from ..lib.progress import say
from ..lib.repo import revision
from ..lib.table import duration
from .comm_report import plot, summarize, table

ESTIMATE_S = 150  # per variant on 8 GPUs (the first: + 600 s PCIe-IPC autotune); an assumption until timed
VERIFY_ROWS = [1, 4, 8, 16, 32, 64]  # plain decode at batch 1; batch 1, 2, 4, 8, 16 x 4 draft tokens
PREFILL_ROWS = [512, 2048, 8192]
VARIANTS = {
    "default": {},
    "LL": {"NCCL_PROTO": "LL"},
    "LL128": {"NCCL_PROTO": "LL128"},
    "SIMPLE": {"NCCL_PROTO": "Simple"},
    "p2p_off": {"NCCL_P2P_DISABLE": "1"},
}


def variants(names: list[str]) -> dict[str, dict]:
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise UserError(f"unknown variant {unknown[0]!r}: choose from {', '.join(VARIANTS)}")
    return {n: VARIANTS[n] for n in names}


def run_variant(name: str, env: dict, world: int, cfg: dict, timeout: float) -> dict:
    """`world` ranks (scripts/box/ranks.py) with the variant's environment on top of ours: rank 0's records, and
    the error when a rank failed or the group hung."""
    from .comm_worker import worker

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        got = ranks.run(worker, world, timeout, {**cfg, "variant": name, "out": str(out)}, env=env)
        res = json.loads(out.read_text()) if out.is_file() else {"records": []}
    if not got.ok:
        return {**res, "error": got.explain()[-4000:], "seconds": got.seconds}
    return {**res, "seconds": got.seconds}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = parser("scripts.comm.bench_comm", __doc__, allow_abbrev=False)
    ap.add_argument("--dry-run", action="store_true", help="print what would run; run and write nothing")
    ap.add_argument("--world", type=int, help="ranks (default: every visible GPU)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list (default {','.join(VARIANTS)})")
    ap.add_argument("--rows", default=",".join(map(str, VERIFY_ROWS)), help="verify row counts (batch x 4)")
    ap.add_argument("--prefill-rows", default=",".join(map(str, PREFILL_ROWS)))
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--chain", type=int, default=CHAIN)
    ap.add_argument("--reps", type=int, default=10, help="chain / forward repetitions (median)")
    ap.add_argument("--no-flashinfer", action="store_true", help="torch add-RMSNorm, no SGLang rows")
    ap.add_argument("--no-sglang", action="store_true", help="skip the SGLang rows (PCIe IPC, fused op)")
    ap.add_argument("--no-autotune", action="store_true", help="SGLang rows: FlashInfer's PCIe-IPC seed policy")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: gloo ranks (tests the harness)")
    ap.add_argument("--box", help="the box in the file name (default: the GPUs' model and count)")
    ap.add_argument("--out", type=Path, help="result JSON (default: RESULTS_DIR/bench-comm_<box>_<UTC stamp>.json)")
    ap.add_argument(
        "--results-dir", type=Path, help="where results go (default: /results in the image, else bench/results)"
    )
    ap.add_argument("--timeout", type=float, default=300, help="seconds per variant before it counts as hung")
    return ap.parse_args(argv)


def machine(a: argparse.Namespace, meta: dict) -> int:
    """The number of ranks (and the GPUs into meta); UserError when this machine cannot run the benchmark."""
    if importlib.util.find_spec("sglang") is None:
        raise UserError(
            f"bench-comm brings its ranks up through SGLang, which {sys.executable} does not import: "
            f"run make bench-comm (the serving image), or PYTHONPATH=build/sglang/python"
        )
    if a.device == "cpu":
        meta["gpu_name"] = "cpu"
        return a.world or 2
    import torch

    n = torch.cuda.device_count()
    world = a.world or n
    if n < 2 or not 2 <= world <= n:
        raise UserError(
            f"bench-comm needs at least 2 GPUs and --world at most the {n} visible here (nvidia-smi, "
            f"CUDA_VISIBLE_DEVICES)"
        )
    meta["topo_m"] = proc.run(["nvidia-smi", "topo", "-m"], timeout=30).stdout
    meta["gpus"] = [torch.cuda.get_device_name(i) for i in range(n)]
    meta["gpu_name"] = meta["gpus"][0]
    meta["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    return world


def measure(a: argparse.Namespace, vmap: dict, world: int, meta: dict) -> list[dict]:
    """Every variant in its own ranks (the first one also runs the SGLang rows); their records."""
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    cfg = {k: getattr(a, k) for k in ("device", "layers", "chain", "reps")}
    cfg |= {"rows": ints(a.rows), "prefill_rows": ints(a.prefill_rows), "flashinfer": not a.no_flashinfer}
    skips = {"--device cpu": a.device == "cpu", "--no-flashinfer": a.no_flashinfer, "--no-sglang": a.no_sglang}
    skips["flashinfer does not import"] = importlib.util.find_spec("flashinfer") is None
    why_not = next((why for why, skip in skips.items() if skip), "")
    fusion = {"flashinfer_allreduce_fusion_backend": "trtllm", "disable_custom_all_reduce": True}
    sglang_args = None if why_not else fusion | {"disable_flashinfer_autotune": a.no_autotune}
    meta["sglang_rows"] = {"server_args": sglang_args, "skipped": why_not}
    records, t_all = [], time.monotonic()
    if a.device == "cuda":
        from .comm_worker import p2p_bandwidth

        records += p2p_bandwidth()
    for i, (name, env) in enumerate(vmap.items(), 1):
        first = i == 1 and sglang_args is not None
        say(f"[{i}/{len(vmap)}] variant {name} {env or '(environment as is)'}" + (", with the SGLang rows" * first))
        steps, impls = ["allreduce", "verify"] + ["sglang"] * first, ["nccl"] + ["sglang_fused_op", "sglang_tp"] * first
        timeout = a.timeout + (600 if first and not a.no_autotune else 0)  # + the PCIe-IPC autotune
        cfg_i = {**cfg, "steps": steps, "verify_impls": impls, "sglang": sglang_args if first else None}
        res = run_variant(name, env, world, cfg_i, timeout)
        records += [{**r, "variant": name} for r in res.get("records", [])]
        if res.get("error"):
            records.append({"kind": "variant_error", "variant": name, "error": res["error"][-2000:]})
            say(f"variant {name} failed: {(res['error'].strip().splitlines() or ['?'])[-1]}")
        meta.setdefault("per_variant", {})[name] = {**res.get("meta", {}), "seconds": res.get("seconds")}
        took = f"{res.get('seconds', 0):.0f}s; {time.monotonic() - t_all:.0f}s total"
        say(f"[{i}/{len(vmap)}] variant {name} done ({took})")
    return records


def nccl_axis() -> dict:
    """The NCCL this run used: the library torch loaded, torch's build, the pip package, the one meant to run."""
    rep = nccl_report()
    expected, source = expected_nccl()
    return dict(
        loaded=rep.get("nccl"),
        library=rep.get("nccl_lib"),
        torch_build=rep.get("nccl_build"),
        package=rep.get("dist"),
        package_version=rep.get("dist_version"),
        expected=expected or None,
        expected_from=source,
        error=rep.get("error"),
    )


def main(argv=None) -> int:
    a = parse_args(argv)
    given = list(sys.argv[1:] if argv is None else argv)
    vmap = variants([v.strip() for v in a.variants.split(",") if v.strip()])
    if a.dry_run:
        print(
            f"bench-comm here: variants {', '.join(f'{k} {v or {}}' for k, v in vmap.items())}; ranks: "
            f"{a.world or 'every visible GPU'}; about {duration(ESTIMATE_S * len(vmap) + 600)}"
        )
        return 0
    a.results_dir = a.results_dir or results_dir()  # in the image: the /results mount, which must exist
    meta: dict = {
        "command": "python -m scripts.comm.bench_comm " + shlex.join(given),
        "git_rev": revision(short=True)[0],
        "utc": stamp(),
        "python": sys.version.split()[0],
        "layers": a.layers,
        "variants": vmap,
        "inherited_nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
        "image": os.environ.get("EAGLE_IMAGE") or None,
    }
    meta["world"] = world = machine(a, meta)
    meta["nccl"] = nccl_axis()
    result = {"meta": meta, "records": measure(a, vmap, world, meta)}
    result["summary"] = summarize(result)
    box = a.box or box_name(meta.get("gpus") or [meta["gpu_name"]] * world)
    out = write_json(a.out or result_file("bench-comm", ".json", box, a.results_dir), result)
    print(table(result["summary"]))
    plot(result, out.with_suffix(".png"))
    say(f"results: {out} (+ .png)")
    errors = [r for r in result["records"] if r.get("kind") == "variant_error"]
    return 1 if errors or not result["summary"]["correctness"]["ok"] else 0


if __name__ == "__main__":
    run(main)
