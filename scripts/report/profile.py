"""`make report`'s profile part: a few plain decode steps and a few speculative cycles captured by SGLang's own
profiler, reduced per forward to what the cost model refits from (spec_model.PROFILE_FIELDS; the plan's 1.9).

  python -m scripts.report.profile [--out FILE] [--image IMAGE] [--port N] [--steps K] [--profiles NOSPEC,SPEC]
        [--model M] [--draft-model D] [--launch-timeout S] [-- SGLANG_ARGS]
  python -m scripts.report.profile --server-url NOSPEC_URL --server-url SPEC_URL [--out FILE] [--steps K]

Each profile is served in turn in the serving image (scripts/bench/servers.py), or two servers run already on this
machine (--server-url: their traces are written where they run), warmed up, then POST /start_profile (K decode
iterations) and one greedy request; rank 0's chrome trace stays in FILE's stem/ with the server logs. A forward is the kernels of the graph
launches inside SGLang's `step[...]`, `draft`, `draft_extend` spans (eager: every kernel launched in them); the rest is
glue. It cannot tell: other ranks (a collective includes its wait), overlapping forwards, the profiler's own host cost.

Exit status: 0 written; 2 a usage problem, a server that did not start or answer, or a trace without a stage.
"""

import contextlib
import gzip
import json
import math
import os
import re
import statistics
from collections import defaultdict
from pathlib import Path

from ..bench import observe
from ..bench.servers import Launch, Server
from ..box.docker import RESULTS_IN_IMAGE, container_name, docker_run, hf_cache_dir
from ..lib.cli import parser, run, split
from ..lib.errors import UserError
from ..lib.http import get_json, post_json, use_api_key
from ..lib.progress import say
from ..series.pin import load_pin
from . import kernels
from .spec_model import PROFILE_STAGES, STAGES

PROFILES = ("kimi-k25-tp8", "kimi-k25-eagle3-tp8")
ESTIMATE_S = 2 * 600 + 120  # two Kimi-K2.5 loads and the captures (receipt_data.PARTS says the same)
PROMPT = (
    "Explain step by step how a CPU cache hierarchy works, with a worked example of a cache miss, then write a "
    "short Python class that simulates an LRU cache and test it."
)
SAMPLING = {"temperature": 0.0, "ignore_eos": True}
PROFILER = {"activities": ["CPU", "GPU"], "profile_by_stage": True, "with_stack": False, "record_shapes": False}
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
COMM = re.compile(r"nccl|pcie_ipc|all_?reduce|all_?gather|reduce_?scatter|cross_device_reduce|PtoP", re.I)
PER_CALL = {
    "nccl": lambda n: re.search(r"nccl.*allreduce", n, re.I),  # all-reduce kernels, one per call
    "pcie_ipc": lambda n: "pcie_ipc::" in n and not re.search(r"pcie_ipc::(all_gather|reduce_scatter)::", n),
}


def _stage(name: str) -> tuple[str | None, int]:
    if name in ("draft", "draft_extend"):
        return {"draft": "draft_decode"}.get(name, name), 1
    m = re.match(r"step\[(DECODE|VERIFY) bs=(\d+)", name)
    return ({"DECODE": "decode", "VERIFY": "target_verify"}[m[1]], int(m[2])) if m else (None, 0)


def _union(iv: list[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for a, b in sorted(iv):
        if b > end:
            total, end = total + b - max(a, end), b
    return total


def _stats(kern: list[dict]) -> dict:
    """forward (first start to last end), comm (union of collective kernels), busy (other), gaps, kernels; ms."""
    iv = [(k["ts"], k["ts"] + k.get("dur", 0.0)) for k in kern]
    comm = _union([x for x, k in zip(iv, kern) if COMM.search(k["name"])])
    span, busy = max(b for _, b in iv) - min(a for a, _ in iv), _union(iv)
    return {
        "forward_ms": span / 1000,
        "comm_ms": comm / 1000,
        "busy_ms": (busy - comm) / 1000,
        "gap_ms": (span - busy) / 1000,
        "kernels": sum(k.get("cat") == "kernel" for k in kern),
    }


def forwards(trace: dict, draft_tokens: int = 1) -> dict:
    """One chrome trace (rank 0) per forward: {"stages": {stage: [stats + t0 (us, the span's first GPU work)]},
    "calls": {backend: {rows: [us of each all-reduce kernel]}} (NCCL: graph forwards only), "gpu": a device name}."""
    ev = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    gpu, launches, spans = defaultdict(list), defaultdict(list), []
    for e in ev:
        corr, cat = e.get("args", {}).get("correlation"), e.get("cat")
        if cat in GPU_CATS:
            gpu[corr].append(e)
        elif cat in ("cuda_runtime", "cuda_driver") and corr is not None:
            launches[(e.get("pid"), e.get("tid"))].append(e)
        elif cat == "user_annotation":
            spans.append(e)
    steps = [s for s in spans if s["name"].startswith("step[")]
    within = lambda e, s: s["ts"] <= e["ts"] <= s["ts"] + s.get("dur", 0)  # noqa: E731
    out = {"stages": {s: [] for s in PROFILE_STAGES}, "calls": {b: defaultdict(list) for b in PER_CALL}}
    for span in spans:
        stage, bs = _stage(span["name"])
        if stage is None:
            continue
        where = (span.get("pid"), span.get("tid"))
        inside = [x for x in launches[where] if within(x, span)]
        graph = [x for x in inside if "GraphLaunch" in x["name"]]
        fwd = graph or [x for x in inside if any(within(x, s) for s in steps if (s.get("pid"), s.get("tid")) == where)]
        kern = [k for x in fwd for k in gpu[x["args"]["correlation"]]]
        if not kern:
            continue
        first = min(k["ts"] for x in inside for k in gpu[x["args"]["correlation"]])
        out["stages"][stage].append(_stats(kern) | {"t0": first} | kernels.summarize(kern))  # issue 39
        if stage in ("decode", "target_verify"):
            rows = bs * (draft_tokens if stage == "target_verify" else 1)
            for b, is_call in PER_CALL.items():
                out["calls"][b][rows] += [k["dur"] for k in kern if is_call(k["name"]) and (graph or b != "nccl")]
    starts = sorted(r["t0"] for r in out["stages"]["draft_decode"])  # issue 39: GPU-busy time per cycle
    out["cycle_busy_ms"] = kernels.busy_ms([k for ks in gpu.values() for k in ks], starts)
    out["gpu"] = (trace.get("deviceProperties") or [{}])[0].get("name", "unknown")  # the box's GPUs are one model
    return out


def profile(plain: dict, spec: dict, *, tp: int, steps: int, accept_length: float) -> dict:
    """The profile (spec_model.PROFILE_FIELDS) from the reduced traces without and with speculation; per stage the
    forward of median length (its fields together), cycle_ms the median between consecutive drafts' first GPU work."""
    recs = {"decode": plain["stages"]["decode"], **{s: spec["stages"][s] for s in STAGES}}
    if missing := [s for s, r in recs.items() if len(r) < 1 + (s == "draft_decode")]:
        raise UserError(
            f"the traces show no {', '.join(missing)} forward (draft_decode: two): each server must "
            "decode, with speculative steps >= 2; look at the server logs beside the traces"
        )
    med = {s: sorted(r, key=lambda x: x["forward_ms"])[(len(r) - 1) // 2] for s, r in recs.items()}
    starts = sorted(r["t0"] for r in spec["stages"]["draft_decode"])
    calls = {b: {} for b in PER_CALL}
    for b, d in ((b, d) for b in PER_CALL for d in (plain, spec)):
        calls[b] |= {str(rows): round(statistics.median(us), 2) for rows, us in sorted(d["calls"][b].items()) if us}
    cycle_ms = round(statistics.median(b - a for a, b in zip(starts, starts[1:])) / 1000, 4)
    stages = {
        s: {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items() if k != "t0"} for s, r in med.items()
    }
    return {
        "gpu": spec["gpu"],
        "tp": tp,
        "steps": steps,
        "accept_length": round(accept_length, 4),
        "cycle_ms": cycle_ms,
        "nccl_graph_us": calls["nccl"],
        "pcie_ipc_us": calls["pcie_ipc"],
        "cycle_busy_ms": spec.get("cycle_busy_ms"),  # the GPU-busy time of one cycle
        **stages,
    }


def read_trace(path: Path) -> dict:
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rt") as f:
            return json.load(f)
    except (OSError, ValueError, EOFError) as e:
        raise UserError(f"{path} is not a readable chrome trace ({e}); run the profile part again") from e


def _post(url: str, body: dict) -> None:
    if (got := post_json(url, body, timeout=900))[0] != 200:
        raise UserError(f"{url} answered {got[0] or 'nothing'}: {str(got[1])[:300]}")


def launch(a, name: str, prof: str, spec: bool, traces: Path) -> Launch:
    """The server of one profile: the serving image's serve in a detached container (traces mounted at /results, its
    log beside them), or the running server of --server-url."""
    log = traces / f"{name}.log"
    if a.server_url:
        return Launch(name, a.server_url[spec].rstrip("/"), log=log)
    args = ["serve", "--profile", prof, "--port", str(a.port), *(["--model", a.model] if a.model else [])]
    args += ["--draft-model", a.draft_model] if a.draft_model and spec else []
    args += ["--", *a.sglang_args] if a.sglang_args else []
    image, cname, cache = a.image or load_pin().serving_image, container_name(f"profile-{name}"), hf_cache_dir()
    argv = docker_run(image, args, hf_cache=cache, network_host=True, detach=True, name=cname, results=traces)
    url = f"http://127.0.0.1:{a.port}"
    return Launch(name, url, image, tuple(argv), cname, log=log, timeout=a.launch_timeout)


def capture(a, server: Server, traces: Path) -> tuple[Path, dict, float | None]:
    """Warm one server up, capture K decode iterations of one request: (rank 0's trace, /server_info, AL)."""
    name, url, log = server.name, server.url, server.log_path
    try:
        server.start()
        if not isinstance((info := get_json(url + "/server_info", 60) or {}).get("tp_size"), int):
            raise UserError(f"{name}: GET /server_info gave no tp_size; its log: {log}")
        _post(url + "/generate", {"text": PROMPT, "sampling_params": {**SAMPLING, "max_new_tokens": 32}})
        where = RESULTS_IN_IMAGE if server.argv else str(traces.resolve())
        _post(url + "/start_profile", {**PROFILER, "output_dir": where, "num_steps": a.steps, "profile_prefix": name})
        before = observe.snapshot(url)  # SGLang stops the profiler and writes the traces within this request:
        _post(url + "/generate", {"text": PROMPT, "sampling_params": {**SAMPLING, "max_new_tokens": 8 * a.steps + 200}})
        al = observe.accept_length(before, observe.snapshot(url))
    finally:
        server.stop()
    found = sorted(traces.glob(f"{name}-*-TP-0-DECODE.trace.json.gz"), key=lambda p: p.stat().st_mtime)[-1:]
    if not found:
        raise UserError(f"{name}: SGLang wrote no decode trace into {traces}; its log: {log}")
    kept = found[0].with_suffix("")  # as text: what leaves the box (share.py) is scrubbed of host names and paths
    kept.write_text(json.dumps(read_trace(found[0])))
    for f in set(traces.glob(f"{name}-*.trace.json*")) - {kept}:  # every rank's, the prefill's, an earlier run's
        with contextlib.suppress(OSError):
            f.unlink()
    return kept, info, al


def main(argv: list[str] | None = None) -> int:
    own, sglang_args = split(argv)
    ap = parser("scripts.report.profile", __doc__, allow_abbrev=False)
    add = ap.add_argument
    add("--out", type=Path, default=Path("profile.json")), add("--image"), add("--port", type=int, default=30000)
    add("--server-url", action="append", metavar="URL", help="twice: the running servers without, then with EAGLE-3")
    add("--steps", type=int, default=8, help="decode iterations captured per server (default 8)")
    add("--profiles", default=",".join(PROFILES), help="NOSPEC,SPEC serving profiles (names or .yaml files)")
    add("--model"), add("--draft-model"), add("--launch-timeout", type=float, default=3600.0)
    a = ap.parse_args(own)
    a.sglang_args = sglang_args
    profs = a.profiles.split(",")
    if len(profs) != 2 or a.steps < 2 or len(a.server_url or "ab") != 2:
        raise UserError(
            "give --profiles NOSPEC,SPEC (two serving profiles) or --server-url twice (the servers "
            "without and with speculation), and --steps 2 or more"
        )
    use_api_key(os.environ.get("SGLANG_API_KEY", ""), "$SGLANG_API_KEY")
    traces = a.out.parent / a.out.stem
    traces.mkdir(parents=True, exist_ok=True)
    say(f"profile: {profs[0]} then {profs[1]}, {a.steps} decode iterations each; about {ESTIMATE_S // 60} min")
    plain, plain_info, _ = capture(a, Server(launch(a, "nospec", profs[0], False, traces)), traces)
    spec, info, al = capture(a, Server(launch(a, "spec", profs[1], True, traces)), traces)
    if al is None:
        raise UserError(f"{profs[1]} exported no accept-length counters: its profile needs enable-metrics: true")
    prof = profile(
        forwards(read_trace(plain)),
        forwards(read_trace(spec), int(info["speculative_num_draft_tokens"])),
        tp=int(info["tp_size"]),
        steps=int(info["speculative_num_steps"]),
        accept_length=al,
    )
    # each server's startup all-reduce table (size -> backend, with the latencies it measured), as the report keeps it
    prof["allreduce_backends"] = {
        n: observe.internal_state(i).get("allreduce_backends") for n, i in (("nospec", plain_info), ("spec", info))
    }
    a.out.write_text(json.dumps(prof, indent=1) + "\n")
    say(f"wrote {a.out} (traces in {traces}): {json.dumps(prof)}")
    return 0


if __name__ == "__main__":
    run(main)
