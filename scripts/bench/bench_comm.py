"""`make bench-comm`: what the communication of one EAGLE verify forward costs on this box, per setting.

  python -m scripts.bench.bench_comm [--variants default,pcie_defaults,LL,...] [--world N] ...
  python -m scripts.bench.bench_comm --plot RESULT.json     only the table and the PNG of a result file

Needs a machine with >= 2 GPUs (or --device cpu: gloo ranks, to test the harness); no model weights. For each NCCL
environment variant (your environment as is; the patched launcher's PCIe defaults, what it sets in a clean
environment, asked of the sglang this interpreter imports (skipped, and said, when it cannot be and the variant is
only in the default list); NCCL_PROTO=LL / LL128 / Simple; NCCL_P2P_DISABLE=1) it
spawns one process per GPU and measures, at Kimi-K2.5 shapes ([rows x 7168] bf16, rows = batch x 4 draft
tokens, plus prefill sizes):
  - NCCL all-reduce per call: one synchronised call, and a chain of 122 calls eager vs CUDA-graph-replayed;
  - a 61-layer verify-shaped forward (per-rank TP8 GEMMs, 2 all-reduces + add-RMSNorm per layer), eager vs
    graph-replayed, per all-reduce implementation;
and, in the first variant, where the patched SGLang and FlashInfer are importable, the paths the server runs,
through SGLang's own code (scripts/bench/sglang_comm.py, shared with `make test-gpu`): ranks brought up as the
model runner brings them up, PCIe IPC on (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 unless you set it), SGLang's own
custom all-reduce off; tp.all_reduce per route (PCIe IPC, FlashInfer allreduce-only, NCCL), SGLang's fused
all-reduce + residual + RMSNorm op vs tp.all_reduce + FlashInfer's fused add-RMSNorm, the verify-shaped forward
over the fused op and over tp.all_reduce, and a PDL-race stress of the fused op (its default and, as a control,
trigger_completion_at_end=False). The PCIe-IPC workspace autotunes as the server's does (minutes the first time on
a host, then cached; --no-autotune keeps FlashInfer's seed policy). Every reduction is checked against an fp32
reference on fresh random inputs. Also: peer-to-peer copy bandwidth of every GPU pair (the bandwidth floor).

Where it runs (scripts/host/route.py, the rule make test-gpu follows too; the first line says which and why): here
when this python's torch sees >= 2 CUDA GPUs and it imports the patched sglang and FlashInfer; otherwise in the
serving image (`docker run --rm --gpus all --ipc=host -v bench/results:/results IMAGE bench-comm --here ...`: the
torch, FlashInfer and NCCL the server runs), when the docker engine answers and has the image; otherwise here
without the SGLang rows when only those are missing; otherwise an error naming what each route lacks. --image
[IMAGE] forces the image (default eagle-fast-verify/sglang:<pinned tag>), --here forbids it. --device cpu and --plot
always run here.

Writes bench-comm_<box>_<gpu>x<n>_<UTC time>.json (raw records + meta + the exact command) to bench/results (in the
image: $EAGLE_RESULTS, the mounted /results), prints a table and recommends the fastest correct setting
(scripts/bench/comm_report.py). meta.nccl is the NCCL axis for comparing releases (the library torch loaded, the
NCCL torch was built against, the one the image build or patches/pin.toml [nccl] means to run), meta.image the
image it ran in (make image NCCL=<version> builds variants to compare).
--check chooses the route and stops there (make report's preflight): one JSON line {estimate_s, route}, or the
error a run would give.
Exit status: 0 every variant ran and every reduction was correct (with --check: it can run); 1 a variant failed or
a reduction was wrong;
2 a usage problem (fewer than 2 GPUs and no image to run in, no torch, an unknown variant, no patched SGLang for
pcie_defaults); in the image route, the container's status.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import socket
import sys
import tempfile
import time
from pathlib import Path

from ..host import route
from ..host.nccl import expected_nccl, nccl_report
from ..host.pcie import launcher_nccl_defaults
from ..lib import proc
from ..lib.cli import run
from ..lib.errors import UserError
from ..lib.progress import say
from ..lib.repo import revision
from ..series.sglang_pkg import probe
from .comm_report import plot, summarize, table
from ..lib.kimi import CHAIN, LAYERS

ESTIMATE_S = 900  # every variant on 8 GPUs, the PCIe-IPC autotune included: an assumption until a box run times it
VERIFY_ROWS = [1, 4, 8, 16, 32, 64]  # plain decode at batch 1; batch 1, 2, 4, 8, 16 x 4 draft tokens
PREFILL_ROWS = [512, 2048, 8192]
DEFAULT_VARIANTS = "default,pcie_defaults,LL,LL128,SIMPLE,p2p_off"
FIXED_VARIANTS = {
    "default": {},
    "LL": {"NCCL_PROTO": "LL"},
    "LL128": {"NCCL_PROTO": "LL128"},
    "SIMPLE": {"NCCL_PROTO": "Simple"},
    "p2p_off": {"NCCL_P2P_DISABLE": "1"},
}


def variants(names: list[str], given: bool = True, skipped: dict[str, str] | None = None) -> dict[str, dict]:
    """name -> the NCCL environment of each variant; pcie_defaults asked of the patched launcher (this interpreter's
    sglang). Without it, a pcie_defaults the user named is an error; one from the default list is skipped, and why
    goes into `skipped`."""
    out = {}
    for n in names:
        if n == "pcie_defaults":
            try:
                out[n] = launcher_nccl_defaults()
            except UserError as e:
                if given:
                    raise UserError(f"variant pcie_defaults: {e} (or drop pcie_defaults from --variants)") from e
                say(f"variant pcie_defaults skipped: {e}")
                (skipped if skipped is not None else {})[n] = str(e)
        elif n in FIXED_VARIANTS:
            out[n] = FIXED_VARIANTS[n]
        else:
            raise UserError(f"unknown variant {n!r}: choose from pcie_defaults, {', '.join(FIXED_VARIANTS)}")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_inventory() -> dict:
    res = proc.run(["nvidia-smi", "--query-gpu=index,name,pci.bus_id,driver_version,compute_cap",
                    "--format=csv,noheader"], timeout=30)
    rows = [dict(zip(("index", "name", "bus_id", "driver", "compute_cap"), [c.strip() for c in line.split(",")]))
            for line in res.stdout.strip().splitlines()] if res.ok else []
    return {"gpus": rows, "topo_m": proc.run(["nvidia-smi", "topo", "-m"], timeout=30).stdout}


def run_variant(name: str, env: dict, world: int, cfg: dict, timeout: float) -> dict:
    """Spawn `world` ranks with env applied on top of ours; return rank 0's JSON (or an error record)."""
    import torch.multiprocessing as mp

    from .comm_worker import worker

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        cfg = {**cfg, "variant": name, "port": free_port()}
        t0 = time.monotonic()
        ctx = mp.start_processes(worker, args=(world, cfg, str(out)), nprocs=world, join=False, start_method="spawn")
        try:
            while not ctx.join(timeout=5):
                if time.monotonic() - t0 > timeout:
                    for p in ctx.processes:
                        if p.is_alive():
                            p.kill()
                    return {"error": f"timed out after {timeout:.0f}s (hang?)", "records": []}
        except Exception as e:  # a rank died
            res = json.loads(out.read_text()) if out.is_file() else {"records": []}
            res.setdefault("error", str(e))
            return res
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        res = json.loads(out.read_text()) if out.is_file() else {"error": "rank 0 wrote no result", "records": []}
        res["seconds"] = time.monotonic() - t0
        return res


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="scripts.bench.bench_comm", description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--image", nargs="?", const="", default=None, metavar="IMAGE",
                       help="run inside the serving image (default eagle-fast-verify/sglang:<pinned tag>)")
    where.add_argument("--here", action="store_true", help="never use the image (the image's own entrypoint passes it)")
    ap.add_argument("--check", action="store_true", help="only choose the route (and check the results directory); "
                                                         "print {estimate_s, route} as JSON (make report)")
    ap.add_argument("--world", type=int, default=None, help="ranks (default: every visible GPU)")
    ap.add_argument("--variants", help=f"comma list (default {DEFAULT_VARIANTS})")
    ap.add_argument("--rows", default=",".join(map(str, VERIFY_ROWS)), help="verify row counts (batch x 4)")
    ap.add_argument("--prefill-rows", default=",".join(map(str, PREFILL_ROWS)))
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--chain", type=int, default=CHAIN)
    ap.add_argument("--iters", type=int, default=50, help="single-call timings per size")
    ap.add_argument("--reps", type=int, default=10, help="chain / forward repetitions (median)")
    ap.add_argument("--race-rows", default="4,8,16", help="row counts of the PDL race check")
    ap.add_argument("--race-trials", type=int, default=20)
    ap.add_argument("--no-flashinfer", action="store_true",
                    help="no FlashInfer at all: torch add-RMSNorm in the NCCL rows, no SGLang rows")
    ap.add_argument("--no-sglang", action="store_true", help="skip the SGLang rows (PCIe IPC, fused op)")
    ap.add_argument("--no-autotune", action="store_true",
                    help="SGLang rows: keep FlashInfer's PCIe-IPC seed policy (the server autotunes at startup)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: gloo ranks, no graphs, no FlashInfer (tests the harness itself)")
    ap.add_argument("--box", default=None, help="name of this box in the result file (default: GPU model)")
    ap.add_argument("--out", type=Path, default=None,
                    help="result JSON path (default under bench/results/; in the image under $EAGLE_RESULTS)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per variant before it counts as hung")
    ap.add_argument("--plot", type=Path, metavar="RESULT_JSON", help="only draw the PNG (and table) of a result file")
    a = ap.parse_args(argv)
    if a.image is not None and (a.device == "cpu" or a.plot):
        ap.error("--image runs the CUDA benchmark in the serving image; --device cpu and --plot run here")
    return a


def machine(a: argparse.Namespace, meta: dict) -> int:
    """The number of ranks (and the GPUs into meta); UserError when this machine cannot run the benchmark."""
    if a.device == "cpu":
        meta["gpu_name"] = "cpu"
        return a.world or 2
    try:
        import torch
    except ImportError as e:
        raise UserError(f"torch is not importable ({e}); run this where PyTorch with CUDA is installed") from e
    n = torch.cuda.device_count()
    if n < 2:
        raise UserError(f"bench-comm needs at least 2 GPUs; this machine shows {n} "
                        f"(check nvidia-smi and CUDA_VISIBLE_DEVICES)")
    world = a.world or n
    if world > n or world < 2:
        raise UserError(f"--world {world} is not possible with {n} visible GPUs")
    meta.update(gpu_inventory())
    meta["gpu_name"] = torch.cuda.get_device_name(0)
    meta["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    return world


def sglang_rows(a: argparse.Namespace) -> tuple[dict | None, str]:
    """ServerArgs overrides of the SGLang rows (on top of the shipped profile's, sglang_comm.PROFILE_SERVER_ARGS),
    or None and why they cannot run here."""
    if a.device == "cpu" or a.no_flashinfer or a.no_sglang:
        return None, "--device cpu" if a.device == "cpu" else "--no-flashinfer" if a.no_flashinfer else "--no-sglang"
    if getattr(a, "without_sglang", ""):
        return None, a.without_sglang
    missing = probe(modules=("sglang", "flashinfer"))["missing"]
    if missing:
        return None, (f"{' and '.join(missing)} not importable by {sys.executable}; run from the serving image "
                      f"(docker run --gpus all --ipc=host -v sglang-flashinfer:/root/.cache/flashinfer IMAGE "
                      f"bench-comm) or after make apply with "
                      f"PYTHONPATH=build/sglang/python")
    return {"flashinfer_allreduce_fusion_backend": "trtllm", "disable_custom_all_reduce": True,
            "disable_flashinfer_autotune": a.no_autotune}, ""


def measure(a: argparse.Namespace, vmap: dict, world: int, meta: dict) -> list[dict]:
    """Every variant in its own ranks (the first one also runs the SGLang rows); their records."""
    cfg = {"device": a.device, "rows": [int(x) for x in a.rows.split(",")],
           "prefill_rows": [int(x) for x in a.prefill_rows.split(",") if x], "layers": a.layers, "chain": a.chain,
           "iters": a.iters, "reps": a.reps, "race_rows": [int(x) for x in a.race_rows.split(",") if x],
           "race_trials": a.race_trials, "flashinfer": not a.no_flashinfer}
    records: list[dict] = []
    if a.device == "cuda":
        from .comm_worker import p2p_bandwidth

        say("measuring peer-to-peer copy bandwidth")
        records += p2p_bandwidth()
    t_all = time.monotonic()
    sglang_args, why_not = sglang_rows(a)
    meta["sglang_rows"] = {"server_args": sglang_args, "skipped": why_not}
    if why_not:
        say(f"SGLang rows skipped: {why_not}")
    for i, (name, env) in enumerate(vmap.items(), 1):
        first = i == 1 and sglang_args is not None
        steps = ["allreduce", "verify"] + (["sglang"] if first else [])
        impls = ["nccl"] + (["sglang_fused_op", "sglang_tp"] if first else [])
        say(f"[{i}/{len(vmap)}] variant {name} {env or '(environment as is)'}: {', '.join(steps)}")
        res = run_variant(name, env, world, {**cfg, "steps": steps, "verify_impls": impls,
                                             "sglang": sglang_args if first else None},
                          a.timeout + (600 if first and not a.no_autotune else 0))  # + the PCIe-IPC autotune
        for r in res.get("records", []):
            r["variant"] = name
        records += res.get("records", [])
        if res.get("error"):
            records.append({"kind": "variant_error", "variant": name, "error": res["error"][-2000:]})
            say(f"variant {name} failed: {res['error'].strip().splitlines()[-1] if res['error'].strip() else '?'}")
        if "meta" in res:
            meta.setdefault("per_variant", {})[name] = {**res["meta"], "seconds": res.get("seconds")}
        say(f"[{i}/{len(vmap)}] variant {name} done ({res.get('seconds', 0):.0f}s; "
            f"{time.monotonic() - t_all:.0f}s total)")
    return records


def nccl_axis() -> dict:
    """The NCCL this run used, one axis for comparing releases: the library torch loaded (ncclGetVersion, path), the
    NCCL torch was built against, the pip package, and the one meant to run (the image build's, else the pin's)."""
    rep = nccl_report()
    expected, source = expected_nccl()
    axis = {"loaded": rep.get("nccl"), "library": rep.get("nccl_lib"), "torch_build": rep.get("nccl_build"),
            "package": rep.get("dist"), "package_version": rep.get("dist_version"), "expected": expected or None,
            "expected_from": source, "error": rep.get("error")}
    if axis["loaded"]:
        say(f"NCCL {axis['loaded']} loaded by torch from {axis['library']}; expected {expected or '?'} ({source})"
            + ("" if axis["loaded"] == expected else " -- a different NCCL: the results say so in meta.nccl"))
    return axis


def pick_route(a: argparse.Namespace) -> route.Route:
    """Here or in the image (scripts/host/route.py), for a CUDA run."""
    if a.here:
        return route.Route("here", "bench-comm: running here (--here)")
    py = sys.executable
    info = {} if a.image is not None else route.probe_python(py)
    gpus = route.gpus_why(py, info) if a.image is None else "--image given"
    rows = "" if a.no_sglang or a.no_flashinfer else route.sglang_why(py, info)
    where = route.choose("bench-comm", route.describe(py, info), gpus or rows, a.image, partial="the SGLang rows",
                         partial_ok=not gpus)
    return where


def image_args(given: list[str], out: Path | None) -> list[str]:
    """bench-comm's arguments for the image: the route options left out, --out moved under the mounted /results."""
    args, i = [], 0
    while i < len(given):
        t = given[i]
        name = t.split("=", 1)[0]
        if name == "--image" and "=" not in t and i + 1 < len(given) and not given[i + 1].startswith("-"):
            i += 2
        elif name in ("--image", "--here") or (name == "--out" and "=" in t):
            i += 1
        elif name == "--out":
            i += 2
        else:
            args.append(t)
            i += 1
    return args + (["--out", f"{route.IN_IMAGE_RESULTS}/{out.name}"] if out else [])


def run_in_image(image: str, given: list[str], out: Path | None) -> int:
    results = out.parent if out else route.results_dir()
    results.mkdir(parents=True, exist_ok=True)
    cmd = route.docker_run(image, "bench-comm", image_args(given, out), results)
    say(f"running: {shlex.join(cmd)}")
    res = proc.run(cmd, timeout=None, capture=False)
    say(f"results: under {results} (written by the image's bench-comm)")
    return res.returncode if res.returncode is not None else 1


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.plot:
        result = json.loads(a.plot.read_text())
        result["summary"] = summarize(result)
        print(table(result["summary"]))
        plot(result, a.plot.with_suffix(".png"))
        say(f"plot: {a.plot.with_suffix('.png')}")
        return 0
    given = sys.argv[1:] if argv is None else argv
    ran = ""
    out_dir = a.out.parent if a.out else route.results_dir()  # before measuring: a missing mount fails now
    if a.device == "cuda":
        where = pick_route(a)
        say(where.message)
        if a.check:
            print(json.dumps({"estimate_s": ESTIMATE_S, "route": where.message}))
            return 0
        if where.where == "image":
            return run_in_image(where.image, given, a.out)
        a.without_sglang, ran = where.partial, where.message
    meta: dict = {"command": "python -m scripts.bench.bench_comm " + shlex.join(given),
                  "git_rev": revision(short=True)[0],
                  "utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ"),
                  "host": platform.node(), "python": platform.python_version(), "layers": a.layers,
                  "inherited_nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
                  "ran": ran or "here", "image": os.environ.get("EAGLE_IMAGE") or None}
    meta["world"] = world = machine(a, meta)
    meta["nccl"] = nccl_axis()
    if meta["inherited_nccl_env"]:
        say(f"note: your environment sets {meta['inherited_nccl_env']}; variant 'default' runs with it as is, "
            f"the other variants add their own settings on top")
    names = [v.strip() for v in (a.variants or DEFAULT_VARIANTS).split(",") if v.strip()]
    meta["variants_skipped"] = {}
    meta["variants"] = vmap = variants(names, a.variants is not None, meta["variants_skipped"])
    result = {"meta": meta, "records": measure(a, vmap, world, meta)}
    result["summary"] = summarize(result)
    box = a.box or meta["gpu_name"].replace("NVIDIA ", "").replace(" ", "-")
    out = a.out or out_dir / f"bench-comm_{box}_x{world}_{meta['utc']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result["summary"]))
    plot(result, out.with_suffix(".png"))
    say(f"results: {out} (+ .png)")
    errors = [r for r in result["records"] if r.get("kind") == "variant_error"]
    return 1 if errors or not result["summary"]["correctness"]["ok"] else 0


if __name__ == "__main__":
    run(main)
