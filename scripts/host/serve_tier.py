"""`make test-serve`: the patched SGLang server, EAGLE-3 and all, on generated tiny models, before any real weight.

  python -m scripts.host.serve_tier [--out FILE] [--world N] [--phases a,b,..] [--models DIR] [--port BASE]
                                    [--python PY] [--standins | --image [IMAGE] | --here] [--ready-timeout S]

Generates the tiny model pairs (scripts/host/tiny_models.py: a Llama pair and a DeepSeek-V3-shaped pair with
Kimi-K2.5's config keys, seconds), starts one server per phase through the project's `serve` verb with the tiny
profiles at tensor-parallel size N (default: every visible GPU), all at once, each on its own ports from BASE
(default 31000), then: one warm-up request each; the verify-graph and eager-verify servers timed side by side
(bs 1, alternating rounds, the others idle); each phase's workload (3 fixed prompts x 128 greedy tokens one after
another and all at once; a burst above the captured batch size for the cap phase); /server_info and /metrics read;
every server stopped (SIGINT to its process group, then SIGTERM, SIGKILL) and checked gone with its port free.
The checks (scripts/host/serve_checks.py) are the patches' promises: verify, draft decode and draft extend on
their graphs, the counters in /server_info and /metrics agreeing, the caps and the eager-verify warnings, accept
length 4 with a drafter that is always right, the graph at least 2x eager, and greedy output with speculation
identical to greedy output without it. The phases and routes: scripts/host/serve_plan.py.

Where it runs (scripts/host/route.py, the rule of make test-gpu; the first line says which and why): here, with PY
(default: this python), when its torch sees a CUDA GPU and it imports a patched sglang and sgl_kernel; otherwise
inside the serving image (`docker run --gpus all --ipc=host -v DIR:/results -v
sglang-flashinfer:/root/.cache/flashinfer IMAGE test-serve`), when the docker engine answers and has the image.
--image forces the image, --here forbids it.

The servers listen on 127.0.0.1 and get no API key ($SGLANG_API_KEY is not passed to them: they are this tier's
own). --standins is the lent-GPU route (a machine whose torch sgl-kernel cannot load on): the stand-ins, env and
flags serve_plan.LENT names, each value only where the environment has none; the result then says
"proxy: torch <v>, stand-ins <list>" and which stand-in ops the servers called. It always runs here.

The result document (world, passed, failed, every check, per phase the spec_* keys of /server_info's
internal_states[0] as SGLang returns them, the metric samples, timings, the commands, versions) goes to --out,
default bench/results/test-serve_<gpu>_x<N>_<UTC time>.json ($EAGLE_RESULTS in the image), the servers' logs with
machine paths masked next to it (.log). It is the first part of the box receipt (make report).

--check stops after the GPUs and the route (make report's preflight): one JSON line {estimate_s, route}.
Exit status: 0 every check passed (--check: it can run); 1 a check failed; 2 no GPU, no way to run, or a bad
option.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as _dt
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

from ..lib import proc
from ..lib.cli import run
from ..lib.errors import UserError
from ..lib.http import get_json, http_get, post_json
from ..lib.progress import say
from ..lib.repo import REPO_ROOT, revision
from ..series.sglang_pkg import patch_record
from . import route
from . import serve_checks as checks
from . import serve_plan as plan
from .tiny_models import greedy_chain, load_chain

SCHEMA = "eagle-test-serve/1"
NUMBERS = re.compile(r"\[\s*(-?[\d.]+(?:,\s*-?[\d.]+)*)\s*\]")
TIMED_TOKENS, TIMED_ROUNDS, BURST_TOKENS = 256, 3, 64
GENERATE = ("import sys; from pathlib import Path; from scripts.host.tiny_models import write_pair; "
            "[write_pair(Path(sys.argv[1]), p) for p in sys.argv[2:]]")
VERSIONS = ("import json, torch, triton, transformers; print(json.dumps({'torch': torch.__version__, "
            "'triton': triton.__version__, 'transformers': transformers.__version__}))")

ESTIMATE_S = 600  # every phase's server at once on the tiny models: load, capture, workloads (the H200 run)


class Server:
    """One phase's server: `serve` started in its own process group, its log, its URL."""

    def __init__(self, index: int, phase: plan.Phase, argv: list[str], env: dict, log: Path, port: int):
        self.index, self.phase, self.argv, self.env, self.log, self.port = index, phase, argv, env, log, port
        self.url = f"http://127.0.0.1:{port}"
        self.proc = None
        self.rec: dict = {"phase": phase.name, "pair": phase.pair, "drafter": phase.drafter, "port": port,
                          "ready_s": None}

    def start(self) -> None:
        with open(self.log, "wb") as out:
            self.proc = proc.spawn(self.argv, env=self.env, stdout=out, stderr=proc.STDOUT, cwd=REPO_ROOT,
                                   start_new_session=True)

    def ready(self) -> bool:
        return http_get(self.url + "/health", 5)[0] == 200 and http_get(self.url + "/model_info", 5)[0] == 200

    def generate(self, ids: list[int], n: int) -> tuple[list[int], dict, float]:
        t0 = time.monotonic()
        status, body = post_json(self.url + "/generate", {"input_ids": ids, "sampling_params": {
            "temperature": 0, "max_new_tokens": n, "ignore_eos": True}})
        if status != 200 or not isinstance(body, dict):
            raise RuntimeError(f"{self.phase.name}: /generate answered {status}: {str(body)[:300]}")
        meta = body.get("meta_info") or {}
        keep = {k: meta.get(k) for k in ("completion_tokens", "spec_accept_length", "spec_verify_ct")}
        return body.get("output_ids") or [], keep, time.monotonic() - t0

    def stop(self) -> dict:
        """SIGINT to the process group, then SIGTERM, then SIGKILL; whether anything is left and the port free."""
        if self.proc is None:
            return {"clean": True, "port_free": port_free(self.port), "signals": []}
        sent = []
        for sig, wait in ((signal.SIGINT, 30), (signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            if group_gone(self.proc.pid):
                break
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            sent.append(sig.name)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and not group_gone(self.proc.pid):
                self.proc.poll()
                time.sleep(0.5)
        self.proc.poll()
        return {"clean": group_gone(self.proc.pid) and "SIGKILL" not in sent, "port_free": port_free(self.port),
                "signals": sent, "exit": self.proc.returncode}


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# ---------------------------------------------------------------------------------------------------------------
# the steps


def wait_ready(servers: list[Server], timeout: float) -> None:
    """Until every server answers, has exited, or the timeout; a progress line every 30 s."""
    t0 = time.monotonic()
    note = t0 + 30
    waiting = list(servers)
    while waiting:
        for s in list(waiting):
            if s.ready():
                s.rec["ready_s"] = round(time.monotonic() - t0, 1)
                say(f"{s.phase.name} is up after {s.rec['ready_s']:.0f} s ({len(waiting) - 1} to go)")
                waiting.remove(s)
            elif s.proc.poll() is not None:
                s.rec["error"] = f"exited ({s.proc.returncode}) while starting; see its log"
                say(f"{s.phase.name} exited ({s.proc.returncode}) while starting")
                waiting.remove(s)
        if time.monotonic() - t0 > timeout:
            for s in waiting:
                s.rec["error"] = f"not ready within {timeout:.0f} s (raise --ready-timeout)"
            return
        if time.monotonic() > note:
            say(f"waiting for {', '.join(s.phase.name for s in waiting)} ({time.monotonic() - t0:.0f} s)")
            note += 30
        time.sleep(1)


def each(servers: list[Server], work) -> None:
    """work(server) for every server that is up, all at once; an exception becomes the phase's error."""
    up = [s for s in servers if s.rec["ready_s"] is not None and not s.rec.get("error")]
    with cf.ThreadPoolExecutor(max(1, len(up))) as ex:
        futures = {ex.submit(work, s): s for s in up}
        for f in cf.as_completed(futures):
            if f.exception() is not None:
                futures[f].rec["error"] = f"{type(f.exception()).__name__}: {f.exception()}"


def time_side_by_side(servers: dict[str, Server], prompt: list[int]) -> None:
    """bs-1 tok/s of the timed phases in alternating rounds (A B, B A, A B), nothing else running."""
    pair = [servers[n] for n in plan.TIMED if n in servers]
    if len(pair) != 2 or any(s.rec["ready_s"] is None or s.rec.get("error") for s in pair):
        return
    for r in range(TIMED_ROUNDS):
        for s in pair if r % 2 == 0 else pair[::-1]:
            _, meta, wall = s.generate(prompt, TIMED_TOKENS)
            s.rec.setdefault("timing", []).append(round((meta.get("completion_tokens") or 0) / wall, 1))
    say("timed: " + ", ".join(f"{s.phase.name} {s.rec['timing']} tok/s" for s in pair))


def workload(s: Server, prompts: list[list[int]]) -> None:
    """The greedy outputs one after another and all at once; the burst for the cap phase; then the snapshot."""
    seq = [s.generate(p, plan.MAX_NEW) for p in prompts]
    s.rec["meta"] = [m for _, m, _ in seq]
    with cf.ThreadPoolExecutor(len(prompts)) as ex:
        conc = list(ex.map(lambda p: s.generate(p, plan.MAX_NEW), prompts))
    s.rec["outputs"] = {"seq": [o for o, _, _ in seq], "conc": [o for o, _, _ in conc]}
    if "--max-running-requests" in s.phase.flags:
        with cf.ThreadPoolExecutor(plan.CAP_REQUESTS) as ex:
            burst = list(ex.map(lambda i: s.generate(prompts[i % len(prompts)], BURST_TOKENS),
                                range(plan.CAP_REQUESTS)))
        s.rec["burst"] = {"requests": plan.CAP_REQUESTS, "completed": sum(1 for o, _, _ in burst if o)}
    time.sleep(1.5)  # the scheduler posts its counters with the next step's metrics
    info = get_json(s.url + "/server_info", 30) or {}
    states = info.get("internal_states") or [{}]
    state = states[0] if isinstance(states[0], dict) else {}
    s.rec["spec"] = {k: v for k, v in state.items() if k.startswith("spec_") or k == "avg_spec_accept_length"}
    s.rec["max_running_requests"] = info.get("max_running_requests")
    status, body = http_get(s.url + "/metrics", 30)
    s.rec["metric"] = checks.metric_samples(body.decode("utf-8", "replace")) if status == 200 else []


# ---------------------------------------------------------------------------------------------------------------
# before and after


def gpus_and_world(a: argparse.Namespace) -> tuple[list[str], int]:
    names = route.gpu_names()
    if not names:
        raise UserError("no NVIDIA GPU visible here (nvidia-smi -L): make test-serve starts real servers. Run it on "
                        "the GPU box (docker run --gpus all --ipc=host -v \"$PWD/bench/results:/results\" -v "
                        f"sglang-flashinfer:/root/.cache/flashinfer {route.default_image()} test-serve); `make "
                        "test` is the CPU suite")
    world = a.world or len(names)
    if world > len(names):
        raise UserError(f"--world {world}, but {len(names)} GPU(s) are visible here: pass --world {len(names)}")
    return names, world


def why_not_here(a: argparse.Namespace) -> tuple[str, str]:
    """(what a.python has, '' when it can serve here, else why not): torch with a CUDA GPU, a patched sglang and,
    unless --standins, an sgl_kernel it can import."""
    info = route.probe_python(a.python)
    broken = info.get("failed") or info.get("torch_error")
    why = f"{a.python} cannot import torch ({broken})" if broken else \
        "" if info.get("gpus") else f"{a.python}'s torch {info.get('torch')} sees no CUDA GPU"
    why = why or route.sglang_why(a.python, info, flashinfer=False)
    if not why and not a.standins and not proc.run([a.python, "-c", "import sgl_kernel"], timeout=300).ok:
        why = (f"{a.python} cannot import sgl_kernel, so its servers cannot start (on a lent GPU machine whose torch "
               f"sgl-kernel does not load on, add --standins: the stand-in route, named as one in the result)")
    return route.describe(a.python, info), why


def check_ports(a: argparse.Namespace, phases: list[plan.Phase]) -> None:
    busy = [p for i in range(len(phases)) for p in plan.ports(i, a.port) if not port_free(p)]
    if busy:
        raise UserError(f"port(s) {', '.join(map(str, busy))} are in use: stop what listens there or pass "
                        f"--port BASE (phase i uses BASE + {plan.PORT_STRIDE} i and BASE + {plan.PORT_STRIDE} i + "
                        f"{plan.PORT_STRIDE // 2})")


def run_in_image(image: str, out: Path, a: argparse.Namespace) -> int:
    """The same verb inside the serving image (entrypoint test-serve), writing `out` through the /results mount."""
    args = ["--out", f"{route.IN_IMAGE_RESULTS}/{out.name}", "--port", str(a.port), "--ready-timeout",
            str(a.ready_timeout)] + (["--world", str(a.world)] if a.world else []) + (
            ["--phases", a.phases] if a.phases else [])
    cmd = route.docker_run(image, "test-serve", args, out.parent)
    say(f"running: {' '.join(cmd)}")
    res = proc.run(cmd, timeout=None, capture=False)
    if not out.is_file():
        raise UserError(f"test-serve in {image} wrote no result document at {out}: see its output above")
    return 0 if res.returncode == 0 and json.loads(out.read_text()).get("failed") == 0 else 1


def masker(models: Path, env: dict) -> list[tuple[str, str]]:
    """(machine path, placeholder) pairs for the log and the document, longest first."""
    pairs = [(str(models), "<models>"), (str(REPO_ROOT), "<repo>"), (sys.prefix, "<python>")]
    pairs += [(p, f"<pythonpath{i}>") for i, p in enumerate(env.get("PYTHONPATH", "").split(os.pathsep)) if p]
    pairs += [(str(Path.home()), "~"), (tempfile.gettempdir(), "<tmp>")]
    return sorted({(k, v) for k, v in pairs if len(k) > 1}, key=lambda kv: -len(kv[0]))


def compact(text: str) -> str:
    """json.dumps(indent=1) with every list of plain numbers on one line (the token ids)."""
    return NUMBERS.sub(lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)


def mask(text: str, pairs: list[tuple[str, str]]) -> str:
    for k, v in pairs:
        text = text.replace(k, v)
    return text


def standin_calls(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        parts = line.split()
        if len(parts) == 3:
            out[f"{parts[2]} ({parts[1]})"] = out.get(f"{parts[2]} ({parts[1]})", 0) + 1
    return out


def versions(python: str, env: dict) -> dict:
    res = proc.run([python, "-c", VERSIONS], env=env, timeout=300)
    v = json.loads(res.stdout.strip().splitlines()[-1]) if res.ok else {"error": res.why}
    v["sglang"] = patch_record(python).get("patchset")
    return v


def document(names, world, lent, servers, found, meta) -> dict:
    recs = {s.phase.name: s.rec for s in servers}
    doc = {"schema": SCHEMA, "world": world, "passed": sum(c.ok for c in found),
           "failed": sum(not c.ok for c in found), "gpus": names, "route": lent.name, **meta,
           "checks": [c.as_dict() for c in found],
           "phases": {n: {k: v for k, v in r.items() if k != "log"} for n, r in recs.items()}}
    if lent.standins:
        calls = sorted({c for r in recs.values() for c in r.get("standin_calls", {})})
        doc["proxy"] = (f"proxy: torch {meta['versions'].get('torch')}, stand-ins {', '.join(lent.standins)} "
                        f"(ops called: {', '.join(calls) or 'none'}); {names[0]} x{world} at TP{world}, not the box's "
                        f"SM120 GPUs, kernels or collectives")
    return doc


def run_tier(a, servers, prompts) -> None:
    t0 = time.monotonic()
    for s in servers:
        s.start()
    say(f"started {len(servers)} server(s); about 2 minutes until they answer on one H200 (warm caches)")
    wait_ready(servers, a.ready_timeout)
    each(servers, lambda s: s.generate(prompts[0], 8))
    try:
        time_side_by_side({s.phase.name: s for s in servers}, prompts[0])
    except Exception as e:  # noqa: BLE001 - recorded: the speed check then fails, naming it
        servers[0].rec.setdefault("notes", []).append(f"timing failed: {e}")
    each(servers, lambda s: workload(s, prompts))
    say(f"workloads done after {time.monotonic() - t0:.0f} s; stopping the servers")
    for s in servers:
        s.rec["stop"] = s.stop()


def parse(argv):
    ap = argparse.ArgumentParser(prog="scripts.host.serve_tier", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="result document (default bench/results/test-serve_<gpu>_x<N>_<t>.json)")
    ap.add_argument("--world", type=int, help="tensor-parallel size of every server (default: every visible GPU)")
    ap.add_argument("--phases", help=f"comma list (default all): {', '.join(plan.BY_NAME)}")
    ap.add_argument("--models", type=Path, help="where to write the tiny models (default: a temporary directory)")
    ap.add_argument("--port", type=int, default=31000, help="first HTTP port (default 31000)")
    ap.add_argument("--python", default=sys.executable, help="interpreter of serve and sglang (default: this one)")
    ap.add_argument("--standins", action="store_true", help="the lent-GPU route: stand-ins for what cannot load")
    ap.add_argument("--ready-timeout", type=float, default=600, help="seconds for the servers to answer (600)")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--image", nargs="?", const="", default=None, help="run inside the serving image (default "
                                                                         "eagle-fast-verify/sglang:<pinned tag>)")
    where.add_argument("--here", action="store_true", help="never fall back to the image")
    ap.add_argument("--check", action="store_true", help="only check the GPUs and choose the route; print "
                                                         "{estimate_s, route} as JSON (make report's preflight)")
    a = ap.parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)  # for the document
    if a.standins and a.image is not None:
        ap.error("--standins is the route of a machine without the image's kernels; it does not go with --image")
    if a.world is not None and a.world < 1:
        ap.error("--world must be at least 1")
    return a


def main(argv=None) -> int:
    a = parse(argv)
    phases = plan.select(a.phases)
    names, world = gpus_and_world(a)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H%MZ")
    out = a.out or route.results_dir() / f"test-serve_{route.gpu_slug(names)}_x{world}_{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    here, why = ("", "") if a.image is not None else (
        (f"{a.python} (the lent-GPU route, --standins)", "") if a.standins else why_not_here(a))
    where = route.choose("test-serve", here, why, a.image, a.here)
    say(where.message)
    if a.check:
        print(json.dumps({"estimate_s": ESTIMATE_S, "route": where.message}))
        return 0
    if where.where == "image":
        return run_in_image(where.image, out, a)
    check_ports(a, phases)
    lent = plan.LENT if a.standins else plan.BOX
    work = Path(tempfile.mkdtemp(prefix="eagle-test-serve-"))
    models = a.models or work / "models"
    pairs = sorted({p.pair for p in phases})
    gen_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    res = proc.run([a.python, "-c", GENERATE, str(models), *pairs], env=gen_env, timeout=600)
    if not res.ok:
        raise UserError(f"generating the tiny models failed ({res.why}): {a.python} needs torch, safetensors and "
                        f"tokenizers (the serving image has them)")
    say(f"tiny models ({', '.join(pairs)}) in {models}; {len(phases)} phase(s) at TP{world}, route {lent.name}")
    servers, kept = [], {}
    for i, p in enumerate(phases):
        env, k = plan.server_env(lent, dict(os.environ), work / f"standin-{p.name}.log")
        kept.update(k)
        servers.append(Server(i, p, plan.serve_argv(p, models, i, a.port, world, lent, a.python), env,
                              work / f"{p.name}.log", plan.ports(i, a.port)[0]))
    for k, v in kept.items():
        say(f"kept {k}={v} from the environment (the {lent.name} route's default not applied)")
    started = time.monotonic()
    crashed = ""
    try:
        run_tier(a, servers, plan.prompts())
    except Exception:  # noqa: BLE001 - the document still gets written, with what broke
        crashed = traceback.format_exc()
        say(f"the tier broke off: {crashed.strip().splitlines()[-1]}")
    finally:
        for s in servers:
            s.rec.setdefault("stop", s.stop())
    return finish(a, out, names, world, lent, servers, models, kept, started, stamp, work, crashed)


def finish(a, out, names, world, lent, servers, models, kept, started, stamp, work, crashed: str) -> int:
    pairs = masker(models, servers[0].env)
    chains = {}
    for s in servers:
        s.rec["log"] = s.log.read_text(errors="replace") if s.log.is_file() else ""
        s.rec["standin_calls"] = standin_calls(work / f"standin-{s.phase.name}.log")
        s.rec["command"] = mask(" ".join(s.argv), pairs)
        if s.phase.drafter is None:
            chain = load_chain(models / s.phase.pair)
            chains[s.phase.name] = [greedy_chain(chain, p, plan.MAX_NEW) for p in plan.prompts()]
    found = checks.evaluate({s.phase.name: s.rec for s in servers}, chains)
    if crashed:
        found.append(checks.Check("tier", "ran to the end", False, crashed[-3000:]))
    meta = {"command": " ".join(["python3", "-m", "scripts.host.serve_tier", *a.argv]),
            "revision": revision(short=True)[0], "started_at": stamp, "seconds": round(time.monotonic() - started),
            "versions": versions(a.python, servers[0].env), "route_env": dict(lent.env), "route_flags":
            list(lent.flags), "kept_env": kept, "prompts": [len(p) for p in plan.prompts()], "max_new": plan.MAX_NEW}
    doc = document(names, world, lent, servers, found, meta)
    out.write_text(mask(compact(json.dumps(doc, indent=1, default=str)), pairs) + "\n")
    log = "".join(f"===== {s.phase.name}: {s.rec['command']}\n{s.rec['log']}\n" for s in servers)
    out.with_suffix(".log").write_text(mask(log, pairs))
    for c in found:
        if not c.ok:
            say(f"FAILED {c.phase}: {c.name}: {c.detail}")
    say(f"{doc['passed']} passed, {doc['failed']} failed ({len(servers)} servers at TP{world}): {out}")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if doc["failed"] == 0 else 1


if __name__ == "__main__":
    run(main)
