"""Before `make bench` starts its first server: what the plan needs, whether this box has it, and what it costs.

Needs come from the launched variants' own command lines: the docker engine and each image (docker variants), and
for every `serve` command (scripts.host.serve, or the image's serve entrypoint) the GPUs of its profile's tp-size
(or a --tp-size after `--`) and the weights of its --model / --draft-model (or the profile's defaults). The checks
run in that order, with NCCL's transport between those GPUs after the GPU count (the doctor's nccl.transport
check: a short all-reduce in the serving image, or here when this python's torch sees the GPUs; SHM or NET fails),
then free disk under the results directory; a real run stops at the first failure with one message naming the
fix, before anything is written. The plan lists the model loads (one per server session) and
an estimate per run and in total, from earlier results under the results directory where they exist, else from
the stated assumptions.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import statistics
import urllib.error
import urllib.request
from pathlib import Path

from ..host.checks import nccl_transport
from ..host.engine import engine, image_id
from ..host.facts import Probe, build_facts
from ..lib import proc
from ..lib.errors import UserError
from ..lib.repo import PROFILES_DIR, SHIPPED_PROFILE
from ..lib.tomlfile import load_toml
from . import config as cfg
from .numbers import duration

MIN_FREE_GB = 2.0  # results, bench_serving and server logs of a whole session
# Assumptions where no earlier result says better (each printed with the plan as an assumption).
ASSUMED_LOAD_S = 600.0  # one Kimi-K2.5 TP8 server: weights from the page cache or NVMe, graphs, JIT (first: more)
ASSUMED_STREAM_TOK_S = 50.0  # decode tok/s per stream (seed box: 82 without speculation, 60 with EAGLE-3 at C1)
TP_FLAGS = ("--tp-size", "--tp", "--tensor-parallel-size")
MODEL_FLAGS = ("--model-path", "--model")
DRAFT_FLAGS = ("--speculative-draft-model-path", "--speculative-draft-model")


class InfraError(UserError):
    """The box cannot run the plan (engine, images, GPUs, weights, disk): nothing more is started."""


@dataclasses.dataclass
class Needs:
    """What one launched variant needs from the box."""

    variant: str
    image: str = ""
    gpus: int = 0  # 0: not known (not a serve command, or its profile is not readable here)
    weights: tuple[str, ...] = ()
    max_running: int = 0  # the server's max-running-requests (0: not set, SGLang picks)
    profile: str = ""
    note: str = ""


def _value(tokens: list[str], flags: tuple[str, ...]) -> str | None:
    """The last value given to any of `flags` (--flag v or --flag=v)."""
    found = None
    for i, t in enumerate(tokens):
        name, eq, v = t.partition("=")
        if name in flags:
            found = v if eq else (tokens[i + 1] if i + 1 < len(tokens) else None)
    return found


def _serve_tokens(argv: list[str]) -> list[str] | None:
    """The arguments of serve in a launch command line, None when it runs no serve."""
    for marker in ("scripts.host.serve", "serve"):
        if marker in argv:
            return argv[argv.index(marker) + 1:]
    return None


def variant_needs(server) -> Needs:
    """The needs of one launched server (a scripts.bench.launch.Server), read from its command line."""
    v = server.variant
    needs = Needs(v.name, image=cfg.expand(v.image, server.vals, v.name) if v.launcher == "docker" else "")
    tokens = _serve_tokens(server.argv)
    if tokens is None:
        needs.note = "not a serve command: GPUs and weights not checked"
        return needs
    own, extra = (tokens[:tokens.index("--")], tokens[tokens.index("--") + 1:]) if "--" in tokens else (tokens, [])
    name = _value(own, ("--profile",)) or SHIPPED_PROFILE
    path = Path(name) if name.endswith(".toml") else PROFILES_DIR / f"{name}.toml"
    try:
        prof = load_toml(path, "profile")
    except UserError as e:
        needs.note = f"{e}: GPUs and weights not checked"
        return needs
    args, defaults = prof.get("args", {}), prof.get("defaults", {})
    tp = _value(extra, TP_FLAGS) or args.get("tp-size") or args.get("tensor-parallel-size") or 1
    needs.gpus = int(tp)
    needs.profile = path.stem
    needs.max_running = int(_value(extra, ("--max-running-requests",)) or args.get("max-running-requests") or 0)
    model = _value(extra, MODEL_FLAGS) or _value(own, ("--model",)) or defaults.get("model")
    draft = None
    if "speculative-algorithm" in args or _value(extra, ("--speculative-algorithm",)):
        draft = _value(extra, DRAFT_FLAGS) or _value(own, ("--draft-model",)) or defaults.get("draft_model")
    needs.weights = tuple(w for w in (model, draft) if w)
    return needs


def concurrency_problems(scenarios: list[cfg.Scenario], needs: dict[str, Needs]) -> list[str]:
    """Scenarios that ask for more concurrent requests than a launched server runs at once (its profile's
    max-running-requests, or one given after --): the rest would queue, and the run would not measure that
    concurrency."""
    out = []
    for s in scenarios:
        low = sorted((n.max_running, n.variant, n.profile) for n in needs.values() if 0 < n.max_running <
                     s.max_concurrency)
        if low:
            cap, variant, profile = low[0]
            out.append(f"scenario {s.name}: max_concurrency {s.max_concurrency} is above max-running-requests "
                       f"{cap} of {variant} (profile {profile}): the server would run {cap} at a time and queue the "
                       f"rest. Fix: max_concurrency <= {cap} in [[scenario]] {s.name}, or raise the servers' limit "
                       f"(make bench BENCH_ARGS=\"... -- --max-running-requests {s.max_concurrency}\")")
    return out


# ---------------------------------------------------------------------------------------------------------------
# the checks


@dataclasses.dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


HUB_URL = "https://huggingface.co"


def hub_offline(timeout: float = 5.0) -> str:
    """'' when the Hugging Face Hub answers here; else why not ($HF_HUB_OFFLINE, or the request's failure)."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return f"HF_HUB_OFFLINE={os.environ['HF_HUB_OFFLINE']} is set"
    try:
        urllib.request.urlopen(urllib.request.Request(HUB_URL, method="HEAD"), timeout=timeout).close()
        return ""
    except urllib.error.HTTPError:
        return ""  # it answered
    except (urllib.error.URLError, OSError, ValueError) as e:
        return f"{HUB_URL} does not answer: {getattr(e, 'reason', e)}"


def gpu_count() -> tuple[int | None, str]:
    res = proc.run(["nvidia-smi", "-L"], timeout=30)
    if not res.ok:
        return None, res.why
    return sum(1 for ln in res.stdout.splitlines() if ln.startswith("GPU ")), ""


def weights_problem(repo: str, hf_cache: Path) -> str:
    """'' when `repo` (an HF repo id, or a local directory) is complete on disk; else what is missing."""
    local = Path(repo).expanduser()
    if repo.startswith(("/", ".", "~")) or local.is_dir():
        return "" if (local / "config.json").is_file() else f"{local} holds no config.json"
    snaps = hf_cache / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots"
    for snap in sorted(snaps.iterdir()) if snaps.is_dir() else []:
        if not (snap / "config.json").is_file():
            continue
        index = next(iter(sorted(snap.glob("*.safetensors.index.json"))), None)
        shards = set(json.loads(index.read_text()).get("weight_map", {}).values()) if index else set()
        missing = sorted(s for s in shards if not (snap / s).exists())
        if not missing and (shards or any(snap.glob("*.safetensors")) or any(snap.glob("*.bin"))):
            return ""
        if missing:
            return f"{len(missing)} of {len(shards)} weight shards missing in {snap} (e.g. {missing[0]})"
    return f"not in the HF cache ({snaps} has no complete snapshot)"


def _transport(needs: list[Needs], done: list[Check]) -> list[Check]:
    """NCCL's transport between the GPUs of the widest TP group, as the doctor checks it, measured in the serving
    image the variants run (the series' own first) when this python's torch cannot; after the GPU check (`done`)."""
    want = max((n.gpus for n in needs), default=0)
    if want < 2:
        return []
    if not all(c.ok for c in done if c.name == "GPUs"):
        return [Check("NCCL transport", True, "not measured: the GPUs are not there (see GPUs)")]
    images = sorted({n.image for n in needs if n.image}, key=lambda i: ("eagle-fast-verify" not in i, i))
    probe = Probe(image=images[0] if images else None, ranks=want)
    f = nccl_transport(build_facts(probe, tp=want, need_gb=0))[0]
    return [Check("NCCL transport", f.severity != "error", f.message, f.fix)]


def _weights(needs: list[Needs], hf_cache: Path) -> Check:
    repos = sorted({w for n in needs for w in n.weights})
    problems = [f"{r}: {why}" for r in repos if (why := weights_problem(r, hf_cache))]
    if problems:
        fix = "; ".join(f"hf download {r} --cache-dir {hf_cache / 'hub'}"
                        for r in repos if weights_problem(r, hf_cache))
        return Check("weights", False, "; ".join(problems) + " (each server would download them first)",
                     f"{fix} (hf: huggingface_hub's CLI, pip install huggingface_hub; or pass --hf-cache DIR where "
                     f"they are)")
    return Check("weights", True, f"{', '.join(repos) or 'none needed'} in {hf_cache}")


def _docker(needs: list[Needs]) -> list[Check]:
    images = sorted({n.image for n in needs if n.image})
    if not images:
        return []
    eng = engine()
    if not eng.ok:
        return [Check("docker engine", False, f"the docker engine {eng.why}", eng.fix)]
    out = [Check("docker engine", True, f"docker engine {eng.version}")]
    for image in images:
        ident, why = image_id(image)
        fix = "make image" if "eagle-fast-verify" in image else f"docker pull {image}"
        out.append(Check(f"image {image}", bool(ident), f"{image} ({ident[:19]})" if ident else why,
                         "" if ident else f"{fix}, or set the image in bench/variants.toml [defaults]"))
    return out


def _gpus(needs: list[Needs]) -> list[Check]:
    want = max((n.gpus for n in needs), default=0)
    if not want:
        return []
    have, why = gpu_count()
    names = sorted({n.variant for n in needs if n.gpus == want})
    users = ", ".join(names) if len(names) <= 4 else f"{len(names)} variants"
    if have is None:
        return [Check("GPUs", False, f"no NVIDIA GPU visible (nvidia-smi -L: {why}); {users} need {want}",
                      "run make bench on the GPU box (make doctor checks it)")]
    fix = "" if have >= want else "run on the 8-GPU box, or lower tp-size in the profile (serve -- --tp-size N)"
    return [Check("GPUs", have >= want, f"{have} GPU(s) here, {users} need {want} (tp-size)", fix)]


def _disk(results_dir: Path) -> Check:
    d = results_dir
    while not d.exists() and d != d.parent:
        d = d.parent
    free_gb = shutil.disk_usage(d).free / 1e9
    return Check("disk", free_gb >= MIN_FREE_GB, f"{free_gb:.1f} GB free at {d} (results and logs)",
                 "" if free_gb >= MIN_FREE_GB else f"free at least {MIN_FREE_GB:g} GB there or pass --results-dir")


def checks(needs: list[Needs], hf_cache: Path, results_dir: Path, stop_at_first: bool = True) -> list[Check]:
    """Engine, images, GPUs, NCCL transport, weights, disk, in that order; with stop_at_first an InfraError at the
    first failure."""
    out: list[Check] = []
    for step in (lambda: _docker(needs), lambda: _gpus(needs), lambda: _transport(needs, out),
                 lambda: [_weights(needs, hf_cache)] if any(n.weights for n in needs) else [],
                 lambda: [_disk(results_dir)]):
        for c in step():
            out.append(c)
            if not c.ok and stop_at_first:
                raise InfraError(f"make bench cannot start: {c.detail}. Fix: {c.fix}. Nothing was started and "
                                 f"nothing written (--dry-run lists every check)")
    return out


# ---------------------------------------------------------------------------------------------------------------
# the estimate


def history(results_dir: Path) -> tuple[dict[str, list[float]], list[float]]:
    """(scenario -> wall seconds of earlier runs, earlier launch seconds) from the results files there."""
    walls: dict[str, list[float]] = {}
    loads: list[float] = []
    for f in sorted(results_dir.glob("*.jsonl")) if results_dir.is_dir() else []:
        for line in f.read_text(errors="replace").splitlines():
            try:
                e = json.loads(line).get("eagle") or {}
            except (ValueError, AttributeError):
                continue
            if isinstance(e.get("wall_s"), (int, float)) and e.get("scenario"):
                walls.setdefault(e["scenario"], []).append(float(e["wall_s"]))
            if isinstance(e.get("launch_s"), (int, float)):
                loads.append(float(e["launch_s"]))
    return walls, loads


def run_estimate(s: cfg.Scenario, walls: dict[str, list[float]]) -> tuple[float, str]:
    """(seconds, where from) for one run of scenario s."""
    if walls.get(s.name):
        return statistics.median(walls[s.name]), f"median of {len(walls[s.name])} earlier run(s)"
    waves = math.ceil(s.num_prompts / s.max_concurrency) + 1  # + the warmup wave
    return waves * s.output_len / ASSUMED_STREAM_TOK_S, f"assumed {ASSUMED_STREAM_TOK_S:g} tok/s per stream"


def estimates(plan: list[cfg.Run], results_dir: Path) -> tuple[dict[str, float], float]:
    """(scenario -> seconds per run, seconds per load) the progress lines count down from until runs are timed."""
    walls, loads = history(results_dir)
    return ({r.scenario.name: run_estimate(r.scenario, walls)[0] for r in plan},
            statistics.median(loads) if loads else ASSUMED_LOAD_S)


def plan_seconds(plan: list[cfg.Run], sessions: list[list[cfg.Run]], results_dir: Path) -> float:
    """The plan's estimate: its model loads and its runs (from earlier results, else the assumptions)."""
    per_run, load_s = estimates(plan, results_dir)
    launched = [s for s in sessions if s[0].variant.launcher != "server"]
    return len(launched) * load_s + sum(per_run[r.scenario.name] for r in plan)


def plan_lines(plan: list[cfg.Run], sessions: list[list[cfg.Run]], needs: dict[str, Needs],
               results_dir: Path) -> list[str]:
    """The plan before it starts: loads per model, per-run estimates, the total."""
    walls, loads = history(results_dir)
    load_s = statistics.median(loads) if loads else ASSUMED_LOAD_S
    load_src = f"median of {len(loads)} earlier load(s)" if loads else "assumed"
    launched = [s for s in sessions if s[0].variant.launcher != "server"]
    by_model: dict[str, int] = {}
    for s in launched:
        n = needs.get(s[0].variant.name)
        model = n.weights[0] if n and n.weights else f"the {s[0].variant.name} server"
        by_model[model] = by_model.get(model, 0) + 1
    scen = list(dict.fromkeys(r.scenario.name for r in plan))
    per = {r.scenario.name: run_estimate(r.scenario, walls) for r in plan}
    total = plan_seconds(plan, sessions, results_dir)
    variants = list(dict.fromkeys(r.variant.name for r in plan))
    lines = [f"plan: {len(plan)} run(s) ({len(scen)} scenario(s) x {len(variants)} variant(s) x "
             f"{max(r.repeat for r in plan)} repeat(s)) in {len(sessions)} server session(s)"]
    if launched:
        lines.append("  model loads: " + ", ".join(f"{n} load(s) of {m}" for m, n in by_model.items())
                     + f", ~{duration(load_s)} each ({load_src})")
    sources = list(dict.fromkeys(per[s][1] for s in scen))
    lines.append("  per run: " + ", ".join(f"{s} ~{duration(per[s][0])}" + ("" if len(sources) == 1 else
                                                                          f" ({per[s][1]})") for s in scen)
                 + (f" ({sources[0]})" if len(sources) == 1 else ""))
    lines.append(f"  estimated total: ~{duration(total)}")
    return lines
