"""bench/device/run.sh kernels: the kernels of a Kimi-K2.5 layer and its forward at real dimensions, before and after
the fusions the lent-GPU route can run (issue 39). On a lent GPU, from the repository root, in run.sh's environment
(the patched SGLang tree on PYTHONPATH, the route's stand-ins and LENT_ENV):

  python3 bench/device/kernels.py --out DIR [--budget S] [--only NAME,...] [--layers N]
  python3 bench/device/kernels.py --out DIR --dry-run      (no GPU: the models and every server's command line)

Servers, all started at once (each its own process group), measured one at a time once up:
  tiny-<variant>-{nospec,eagle3}  the Kimi-shaped tiny target of tests/gpu/serve/tiny_models.py, with its draft-pi
      drafter and the tiny profiles (test-serve's): greedy output equal to the target's chain token for token, and
      the kernels of a decode step and of a verify(4), by class (scripts/report/kernels.py).
  slice-<variant>  a Kimi-K2.5 slice at the per-rank TP8 shapes (slice_config), N layers (the first dense), random
      weights (--load-format dummy), the routed experts INT4 g32 through compressed-tensors as the checkpoint stores
      them (the Triton W4A16 MoE: the box runs Marlin, which needs sgl-kernel here), or bf16 (slice-bf16-*): decode
      at batch 1, 4 and 8 (the rows of a plain decode, verify(4) and verify(8)) timed and counted.
Variants (VARIANTS): lent = test-serve's route, every fused op on its torch reference; jit = one kernel per fused op
(SGLang's own JIT and Triton kernels, the norms by bench/device/kernels_plugin): the box's kernel set; fused, gemv,
shared = jit plus the switches the route can run (eagle-fast-verify.md section 1.10). Writes DIR/kernels.json (all of it, rewritten after each
server), DIR/kernels.md (the tables), DIR/kernels-traces.tgz (the decode traces and the server logs) and prints the
tables. Exit status: 0 every server measured; 1 some did not (the rest are kept); 2 a usage problem.
"""

import argparse
import contextlib
import copy
import json
import os
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests/gpu/serve")]

from scripts.report import kernels as kn  # noqa: E402
from scripts.bench import observe  # noqa: E402
from scripts.report import profile as pf  # noqa: E402
from scripts.report import spec_model as sm  # noqa: E402
from scripts.lib.errors import UserError  # noqa: E402
from scripts.lib.http import get_json, post_json  # noqa: E402

JIT = {"SGLANG_FORCE_FUSED_OP_BACKEND": None, "EAGLE_JIT_NORM": "1"}
SWIGLU, SHARED, GEMV = (
    {"SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED": "1"},
    ("--enforce-shared-experts-fusion",),
    ("--bf16-gemm-backend", "gemv"),
)
VARIANTS = {  # name: (environment changes (None: unset), SGLang flags, the servers it runs on)
    "lent": ({}, (), ("tiny", "slice")),
    "jit": (JIT, (), ("tiny", "slice", "slice-bf16")),
    # the MoE's SiLU in its up GEMM's epilogue (bf16 Triton MoE), the shared expert as a 385th routed expert, the
    # one-row bf16 GEMV kernel (tuned for SM120) in place of cuBLAS: together on the tiny pair (lossless?), apart on
    # the slice (what each saves)
    "fused": (JIT | SWIGLU, SHARED + GEMV, ("tiny",)),
    "gemv": (JIT, GEMV, ("slice",)),
    "shared": (JIT, SHARED, ("slice",)),
}
KIMI = ROOT / "tests/fixtures/kimi-k25/config.json"
PLUGIN = Path(__file__).resolve().parent / "kernels_plugin"
TINY = ROOT / "docker/profiles/tiny"
SLICE_FLAGS = (
    "--load-format",
    "dummy",
    "--skip-tokenizer-init",
    "--context-length",
    "4096",
    "--max-total-tokens",
    "32768",
    "--max-running-requests",
    "8",
    "--cuda-graph-bs-decode",
    "1",
    "4",
    "8",
    "--disable-prefill-cuda-graph",
    "--skip-server-warmup",
    "--moe-runner-backend",
    "triton",
)
BATCHES, NEW_TOKENS, STEPS = (1, 4, 8), 40, 6
BOX_TB_S = 1.792  # the box's GDDR7, bench/inputs/cost-model.toml [memory]


def slice_config(layers: int, tp: int = 8, int4: bool = True) -> dict:
    """Kimi-K2.5's text config at one rank's TP8 shapes: heads, expert and dense widths and the vocabulary over tp
    (what one rank computes; q_a/kv_a, the router and the 384 experts are whole on every rank), `layers` layers."""
    full = json.loads(KIMI.read_text())
    cfg = copy.deepcopy(full["text_config"])
    quant = cfg.pop("quantization_config", None) or full.get("quantization_config")
    split = ("num_attention_heads", "num_key_value_heads", "moe_intermediate_size", "intermediate_size", "vocab_size")
    cfg.update(
        {k: cfg[k] // tp for k in split},
        num_hidden_layers=layers,
        architectures=["DeepseekV3ForCausalLM"],
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
    )  # inside the rank's 20,480 rows
    return cfg | ({"quantization_config": quant} if int4 else {})


def layer_bytes(cfg: dict) -> dict:
    """Bytes one rank reads per MoE layer of `cfg` (bf16; routed experts per distinct expert, INT4 g32 if quantized):
    the terms of bench/inputs/cost-model.toml [memory] per layer."""
    h, q, kv, rope = cfg["hidden_size"], cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    heads, nope, v = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    e = cfg["moe_intermediate_size"]
    per_param = 0.5 + 2 / 32 if "quantization_config" in cfg else 2  # INT4 with a bf16 scale per 32
    return {
        "q_a_kv_a": 2 * h * (q + kv + rope),
        "attention": 2 * (q * heads * (nope + rope) + kv * heads * (nope + v) + heads * v * h),
        "router": 2 * h * cfg["n_routed_experts"],
        "shared_expert": 2 * 3 * h * e * cfg["n_shared_experts"],
        "routed_per_expert": per_param * 3 * h * e,
    }


def servers(models: Path, only: set[str] | None, port: int) -> list[dict]:
    from _servers import LENT_FLAGS

    out = []
    for v, (env, flags, kinds) in VARIANTS.items():
        for mode in ("nospec", "eagle3") if "tiny" in kinds else ():
            spec = ["--speculative-draft-model-path", str(models / "kimi/draft-pi")] if mode == "eagle3" else []
            out.append(
                {
                    "name": f"tiny-{v}-{mode}",
                    "env": env,
                    "args": [
                        "--model-path",
                        str(models / "kimi/target"),
                        "--config",
                        str(TINY / f"{mode}.yaml"),
                        *LENT_FLAGS,
                        *flags,
                        *spec,
                    ],
                }
            )
        for kind in (k for k in kinds if k.startswith("slice")):
            model = models / ("slice-bf16" if kind == "slice-bf16" else "slice-int4")
            out.append(
                {
                    "name": f"{kind}-{v}",
                    "env": env,
                    "args": ["--model-path", str(model), *SLICE_FLAGS, *LENT_FLAGS, *flags],
                }
            )
    out = [s for s in out if not only or s["name"] in only]
    for i, s in enumerate(out):
        s |= {"port": port + 10 * i, "url": f"http://127.0.0.1:{port + 10 * i}"}
        s["args"] += [
            "--tp-size",
            "1",
            "--mem-fraction-static",
            "0.7",
            "--host",
            "127.0.0.1",
            "--port",
            str(s["port"]),
            "--nccl-port",
            str(s["port"] + 5),
        ]
    return out


def write_models(models: Path, layers: int) -> None:
    from tiny_models import write_pair

    write_pair(models, "kimi")
    for kind in ("int4", "bf16"):
        d = models / f"slice-{kind}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(slice_config(layers, int4=kind == "int4"), indent=1) + "\n")


def start(s: dict, work: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLUGIN), os.environ.get("PYTHONPATH", "")]))
    for k, v in s["env"].items():
        env.pop(k, None) if v is None else env.__setitem__(k, v)
    s["log"] = work / f"{s['name']}.log"
    with open(s["log"], "w") as log:
        s["proc"] = subprocess.Popen(
            [sys.executable, "-m", "sglang.launch_server", *s["args"]],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    s["t0"] = time.monotonic()


def stop(*plan: dict, wait: float = 15.0) -> None:
    """SIGTERM to each server's process group, SIGKILL to what is left after `wait` s: only what this script started."""
    live = [s["proc"] for s in plan if s.get("proc") is not None and s["proc"].poll() is None]
    for p in live:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    end = time.monotonic() + wait
    for p in live:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(max(0.1, end - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)  # the group: a scheduler child outlives its parent
    for p in live:
        p.wait()


def capture(s: dict, traces: Path, tag: str, prompts: list[list[int]]) -> dict:
    """One profiled request batch: /start_profile (STEPS decode steps), /generate; the decode trace, reduced."""
    prefix = f"{s['name']}-{tag}"
    got = post_json(
        s["url"] + "/start_profile",
        {
            "output_dir": str(traces),
            "num_steps": STEPS,
            "activities": ["CPU", "GPU"],
            "profile_by_stage": True,
            "with_stack": False,
            "record_shapes": False,
            "profile_prefix": prefix,
        },
        timeout=30,
    )
    if got[0] != 200:
        raise RuntimeError(f"/start_profile answered {got[0]}: {str(got[1])[:200]}")
    out = generate(s, prompts)
    for _ in range(30):  # the trace is written as the profiler stops: wait until it reads whole
        time.sleep(0.5)
        with contextlib.suppress(UserError, IndexError):
            trace = pf.read_trace(sorted(traces.glob(f"{prefix}-*DECODE.trace.json.gz"))[-1])
            break
    else:
        raise RuntimeError(f"no readable decode trace {prefix}-*DECODE.trace.json.gz in {traces}")
    for f in traces.glob(f"{prefix}-*EXTEND*"):
        f.unlink()
    return {"outputs": out, **reduce(trace)}


def reduce(trace: dict) -> dict:
    """One capture's trace: its step spans, and per stage the forward of median length (scripts/report/kernels.py's
    summary with the profile part's times)."""
    spans = {
        e["name"].split(" toks")[0]
        for e in trace["traceEvents"]
        if e.get("cat") == "user_annotation" and e["name"].startswith("step[")
    }
    stages = {
        st: min(r, key=lambda x: abs(x["forward_ms"] - statistics.median(y["forward_ms"] for y in r)))
        for st, r in pf.forwards(trace, draft_tokens=4)["stages"].items()
        if r
    }
    return {
        "spans": sorted(spans),
        "stages": {st: {k: v for k, v in r.items() if k != "t0"} for st, r in stages.items()},
    }


def generate(s: dict, prompts: list[list[int]]) -> list[list[int]]:
    body = {
        "input_ids": prompts if len(prompts) > 1 else prompts[0],
        "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True},
    }
    got = post_json(s["url"] + "/generate", body, timeout=60)
    if got[0] != 200:
        raise RuntimeError(f"/generate answered {got[0]}: {str(got[1])[:200]}")
    return [r["output_ids"] for r in (got[1] if isinstance(got[1], list) else [got[1]])]


def measure(s: dict, models: Path, traces: Path) -> dict:
    from _servers import prompts
    from tiny_models import greedy_chain, load_chain

    asks = prompts()
    if s["name"].startswith("tiny-"):
        chain = load_chain(models / "kimi")
        got = generate(s, asks)
        bad = [i for i, (p, o) in enumerate(zip(asks, got)) if o != greedy_chain(chain, p, NEW_TOKENS)]
        al = observe.internal_state(get_json(s["url"] + "/server_info", 30)).get("avg_spec_accept_length")
        return {"greedy_equal": not bad, "differ": bad, "accept_length": al, "run": capture(s, traces, "bs1", asks[:1])}
    return {f"bs{b}": capture(s, traces, f"bs{b}", (asks * 4)[:b]) for b in BATCHES}


def read_bandwidth() -> tuple[str | None, float | None]:
    """(the GPU's name, its read bandwidth in TB/s: a 4 GiB bf16 sum, median of 5; the review measured 4.21 on an
    H200)."""
    import torch

    if not torch.cuda.is_available():
        return None, None
    x, ts = torch.ones(2 << 30, dtype=torch.bfloat16, device="cuda"), []
    for _ in range(6):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        x.sum()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    del x
    torch.cuda.empty_cache()
    return torch.cuda.get_device_name(0), round(4 * 2**30 / statistics.median(ts[1:]) / 1e9, 2)


def scaled(stage: dict, bw: float, layers: int) -> dict:
    """A slice decode's forward and layer scaled to the box: its GEMM and MoE time by bandwidth (this GPU's read
    bandwidth over the box's 1.792 TB/s x the model's central eta), the rest as measured (kernel floors, not bytes);
    61 layers = the slice's forward plus 61 - layers more of its median MoE layer."""
    inp, _ = sm.load()
    ratio = bw / (BOX_TB_S * inp["band"]["eta"][1])
    us = {c: v[1] for c, v in stage["classes"].items()}
    f = (us.get("gemm", 0) + us.get("moe", 0)) / max(sum(us.values()), 1e-9)
    grow = f * ratio + 1 - f
    layer = stage["per_layer"].get("us", 0.0)
    fwd = stage["forward_ms"] * grow + (61 - layers) * layer * grow / 1000
    return {
        "bytes_share": round(f, 3),
        "ratio": round(ratio, 3),
        "layer_us": round(layer * grow, 1),
        "forward_61_ms": round(fwd, 2),
    }


def tables(res: dict) -> str:
    """The markdown tables of kernels.json."""
    cls = [c for c in kn.NAMES if c != "all_reduce"]
    head = "| server | greedy = chain | AL | stage | forward ms | nodes | per layer | " + " | ".join(cls) + " |"
    rows = [head, "|" + " --- |" * (7 + len(cls))]
    for name, r in res["servers"].items():
        m = r.get("measured") or {}
        runs = {"bs1": m["run"]} if "run" in m else {k: v for k, v in m.items() if k.startswith("bs")}
        if not runs:
            why = r.get("error", "not measured")[:160].replace("|", "/")
            rows.append(f"| {name} | {why} |" + " |" * (5 + len(cls)))
        for tag, run in runs.items():
            for st, x in run["stages"].items():
                pl = x["per_layer"]
                rows.append(
                    f"| {name} | {m.get('greedy_equal', '-')} | {m.get('accept_length') or '-'} | {st} "
                    f"{tag} | {x['forward_ms']:.3f} | {x['nodes']} | {pl.get('total', 0):g} | "
                    + " | ".join(f"{pl.get(c, 0):g}" for c in cls)
                    + " |"
                )
    b = {k: layer_bytes(slice_config(res["layers"], int4=k == "int4")) for k in ("int4", "bf16")}
    out = [
        f"GPU {res['gpu']}, read bandwidth {res['bw_tb_s']} TB/s; slice {res['layers']} layers; one routed expert"
        f" per rank {b['int4']['routed_per_expert'] / 1e6:.2f} MB INT4 g32 (the checkpoint's), "
        f"{b['bf16']['routed_per_expert'] / 1e6:.2f} MB bf16 (slice-bf16-*)",
        "",
        *rows,
    ]
    for name, r in res["servers"].items():
        for tag, run in (r.get("measured") or {}).items():
            if name.startswith("slice") and (x := run["stages"].get("decode")) and res["bw_tb_s"]:
                sc = scaled(x, res["bw_tb_s"], res["layers"])
                out.append(
                    f"- {name} {tag}: layer {x['per_layer'].get('us', 0):.1f} us here, {sc['layer_us']} us on "
                    f"the box; B over 61 layers {sc['forward_61_ms']} ms (GEMM+MoE share {sc['bytes_share']}, "
                    f"scaled x{sc['ratio']}); nodes at 61 layers "
                    f"{x['nodes'] + (61 - res['layers']) * x['per_layer'].get('total', 0):.0f} + 124 "
                    "collectives "
                    "(2 all-reduces per layer, the embedding's, the logits' gather: TP8)"
                )
    return "\n".join(out) + "\n"


def run(plan: list[dict], res: dict, models: Path, traces: Path, out: Path, budget: float, say) -> None:
    """Measure each server as it comes up, one at a time: a tiny one at once (its kernel count does not mind the
    others starting), a slice once every server is up or has failed (its time does), or at `budget` - 25 s per slice
    left; stop each once measured. What is not up by then is stopped and named."""
    t0, pending, queue = time.monotonic(), list(plan), []
    slices_at = budget - 25 * sum(s["name"].startswith("slice") for s in plan) - 10
    while (pending or queue) and time.monotonic() - t0 < budget - 15:
        for s in list(pending):
            r = res["servers"][s["name"]]
            if s["proc"].poll() is not None:
                took = time.monotonic() - s["t0"]
                r["error"] = f"exited {s['proc'].returncode} after {took:.0f}s: see {s['log'].name}"
            elif get_json(s["url"] + "/server_info", 5) is not None:
                r["ready_s"] = round(time.monotonic() - s["t0"], 1)
                queue.append(s)
            else:
                continue
            pending.remove(s)
            say(f"{s['name']}: {r.get('error') or 'up'} ({len(plan) - len(pending)}/{len(plan)} done starting)")
        late = time.monotonic() - t0 > slices_at
        s = next((x for x in queue if x["name"].startswith("tiny") or not pending or late), None)
        if s is None:
            time.sleep(2)
            continue
        queue.remove(s)
        left = budget - time.monotonic() + t0
        say(f"measuring {s['name']} (~15 s; {len(queue) + len(pending)} to go, {left:.0f}s left)")
        try:
            res["servers"][s["name"]]["measured"] = measure(s, models, traces)
        except Exception as e:  # noqa: BLE001 - reported, the others go on
            res["servers"][s["name"]]["error"] = f"{type(e).__name__}: {e}"[:400]
        stop(s)
        (out / "kernels.json").write_text(json.dumps(res, indent=1) + "\n")
    for s in pending + queue:
        res["servers"][s["name"]].setdefault("error", f"not measured within the budget: see {s['log'].name}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="bench/device/kernels.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=float, default=430.0, help="seconds for all of it (default 430)")
    ap.add_argument("--only", help="comma-separated server names (default: all)")
    ap.add_argument("--layers", type=int, default=4, help="slice layers, the first dense (default 4)")
    ap.add_argument("--port", type=int, default=34000)
    ap.add_argument(
        "--work",
        type=Path,
        default=Path("/tmp/eagle-kernels"),
        help="models, traces, logs (not --out: the device tool brings back 8 files)",
    )
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    t0, work = time.monotonic(), a.work
    models, traces = work / "models", work / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    write_models(models, a.layers)
    plan = servers(models, set(a.only.split(",")) if a.only else None, a.port)
    if a.dry_run or not plan:
        print("\n".join(f"{s['name']}: {' '.join(s['args'])}  env {s['env']}" for s in plan) or "no such server")
        return 0 if plan else 2
    gpu, bw = read_bandwidth()
    res = {"gpu": gpu, "bw_tb_s": bw, "layers": a.layers, "servers": {s["name"]: {} for s in plan}}
    say = lambda m: print(f"[kernels {time.monotonic() - t0:5.0f}s] {m}", flush=True)  # noqa: E731
    say(f"{gpu}, read bandwidth {bw} TB/s; starting {len(plan)} servers at once")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the finally below stops them on every way out
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(1))
    try:
        for s in plan:
            start(s, work)
        run(plan, res, models, traces, a.out, a.budget - (time.monotonic() - t0), say)
    finally:
        stop(*plan)
        (a.out / "kernels.json").write_text(json.dumps(res, indent=1) + "\n")
        (a.out / "kernels.md").write_text(md := tables(res))
        print(md)
        with tarfile.open(a.out / "kernels-traces.tgz", "w:gz") as tgz:
            for f in sorted(traces.glob("*DECODE*")) + sorted(work.glob("*.log")):
                tgz.add(f, arcname=f"kernels/{f.name}")
    return 0 if all("measured" in r for r in res["servers"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
