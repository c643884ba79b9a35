"""test-serve's servers: a phase is one server, a tiny target (tiny_models.py) with or without an EAGLE-3 or DFlash
drafter, started from a tiny profile (docker/profiles/tiny/*.yaml) by SGLang's own popen_launch_server and stopped by
its terminate_and_kill_process_tree; the lent-GPU route."""

import contextlib
import dataclasses
import json
import os
import random
import time
from pathlib import Path

import yaml

from tiny_models import SPECIALS, VOCAB

HERE = Path(__file__).resolve().parent
PROFILES = HERE.parents[2] / "docker" / "profiles" / "tiny"
PROFILE_OF = {"draft": "eagle3.yaml", "dflash": "dflash.yaml"}  # a drafter's profile, by its name (tiny_models)
PROFILE = yaml.safe_load((PROFILES / "eagle3.yaml").read_text())
DRAFT_TOKENS = PROFILE["speculative-num-draft-tokens"]  # the accept length when every draft token is accepted
CAPTURED_MAX = max(PROFILE["cuda-graph-bs-decode"])
# The stages each algorithm's forwards are counted under (/server_info spec_cuda_graph and spec_collectives, /metrics
# sglang:cuda_graph_passes_total; patches/ spec-*); an eager forward's spec_collectives entry is "<stage>_eager".
STAGES = {"EAGLE3": ("target_verify", "draft_decode", "draft_extend"), "DFLASH": ("target_verify", "draft_block")}
CAP = 2 * CAPTURED_MAX  # llama-cap's and llama-dflash's --max-running-requests: above the largest captured batch
CAP_FLAGS, EAGER_FLAGS = ("--max-running-requests", str(CAP)), ("--disable-decode-cuda-graph",)  # a phase's flags
READY_S = 600
PORT_STRIDE = 10  # phase i: HTTP port BASE + 10 i, NCCL port BASE + 10 i + 5


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str
    pair: str  # tiny_models.PAIRS
    drafter: str | None = None  # None: no speculation
    flags: tuple[str, ...] = ()
    reference: str | None = None  # the phase whose greedy output this one must equal

    @property
    def profile(self) -> Path:
        return PROFILES / (PROFILE_OF[self.drafter.split("-")[0]] if self.drafter else "nospec.yaml")

    @property
    def stages(self) -> tuple[str, ...]:
        return STAGES[yaml.safe_load(self.profile.read_text())["speculative-algorithm"]]


PHASES = {
    p.name: p
    for p in (
        Phase("llama-nospec", "llama"),  # the reference: greedy output = the target's chain
        Phase("llama-graph", "llama", "draft-pi", reference="llama-nospec"),  # always accepted, on the graphs
        Phase("llama-reject", "llama", "draft-random", reference="llama-nospec"),  # almost never accepted
        Phase("llama-cap", "llama", "draft-pi", CAP_FLAGS, "llama-nospec"),
        Phase("llama-eager", "llama", "draft-pi", EAGER_FLAGS, "llama-nospec"),
        Phase("kimi-nospec", "kimi"),  # DeepSeek-V3-shaped with Kimi-K2.5's keys
        Phase("kimi-graph", "kimi", "draft-pi", reference="kimi-nospec"),  # Llama-form drafter
        Phase("kimi-mla", "kimi", "draft-mla", reference="kimi-nospec"),  # MLA-form drafter
        Phase("llama-dflash", "llama", "dflash-first", CAP_FLAGS, "llama-nospec"),
        Phase("llama-dflash-eager", "llama", "dflash-random", EAGER_FLAGS, "llama-nospec"),
        Phase("kimi-dflash", "kimi", "dflash-first", reference="kimi-nospec"),
        Phase("llama-client", "llama", "draft-pi"),  # the OpenAI client's (vs llama-nospec): its counters are its own
        Phase("llama-sampled", "llama", "draft-pi"),  # sampled requests, under the sync guard (plugin/)
        Phase("llama-dflash-sampled", "llama", "dflash-first"),  # sampled requests, with greedy ones in their batches
        Phase("bad-spec", "llama", "draft-pi"),  # bad requests and the fuzzer, which may take a server down
        Phase("bad-dflash", "llama", "dflash-first"),
        Phase("bad-nospec", "llama"),
    )
}
BAD_PHASES = [n for n in PHASES if n.startswith("bad-")]
GUARDED, GUARD_FILE = "llama-sampled", "sync-guard.jsonl"  # the server under the sync guard, its record beside its log

# The lent-GPU route (--standins; bench/device/run.sh's tiny bench reads it too): a machine whose torch sgl-kernel
# cannot load on. Import-only stand-ins (tests/gpu/standin), the fused ops on SGLang's torch reference except the
# MoE (plugin/), triton attention, pytorch sampling, FlashInfer only where SGLang imports it itself (the sampled
# verify: bench/device/prepare.sh builds its module ahead), the Python radix tree. Set only where unset.
LENT_ENV = {
    "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",
    "SGLANG_FORCE_FUSED_OP_BACKEND": "torch",
    "SGLANG_IS_FLASHINFER_AVAILABLE": "false",
    "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",
}
LENT_FLAGS = ("--attention-backend", "triton", "--sampling-backend", "pytorch", "--grammar-backend", "xgrammar")
LENT_PATHS = (HERE.parent / "standin", HERE / "plugin")


def prompts(seed: int = 1, lens: tuple[int, ...] = (12, 40, 100)) -> list[list[int]]:
    """Fixed token-id prompts of ordinary (non-special) ids."""
    rng = random.Random(seed)
    return [[rng.randrange(len(SPECIALS), VOCAB) for _ in range(n)] for n in lens]


def server_env(standins: bool) -> tuple[dict, dict]:
    """(the servers' environment, the route values the environment already had and kept)."""
    env = dict(os.environ, SGLANG_RECORD_SPEC_COLLECTIVES="1")
    kept = {k: env[k] for k in LENT_ENV if standins and k in env and env[k] != LENT_ENV[k]}
    paths = [str(HERE / "plugin")]
    if standins:
        env.update({k: v for k, v in LENT_ENV.items() if k not in env})
        paths = [str(p) for p in LENT_PATHS]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return env, kept


@dataclasses.dataclass
class Server:
    phase: Phase
    port: int
    args: list[str]
    model: str
    log: Path
    proc: object = None
    sink: object = None  # the log file popen_launch_server's threads write until stop()
    error: str = ""
    report: dict = dataclasses.field(default_factory=dict)  # what it reported, for the result document

    @classmethod
    def plan(cls, phase: Phase, index: int, base: int, world: int, models: Path, flags, work: Path) -> "Server":
        port, pair = base + PORT_STRIDE * index, models / phase.pair
        args = ["--config", str(phase.profile), "--tp-size", str(world), "--nccl-port", str(port + PORT_STRIDE // 2)]
        args += [*flags, *phase.flags]
        args += ["--speculative-draft-model-path", str(pair / phase.drafter)] if phase.drafter else []
        return cls(phase, port, args, str(pair / "target"), work / f"{phase.name}.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def command(self) -> list[str]:  # as popen_launch_server runs it
        host = ["--host", "127.0.0.1", "--port", str(self.port)]
        return ["sglang", "serve", "--model-path", self.model, *self.args, *host]

    def start(self, env: dict) -> None:
        """popen_launch_server, until /health_generate answers; a failure is kept as the server's error."""
        from sglang.test.test_utils import popen_launch_server

        t0 = time.monotonic()
        self.sink = log = open(self.log, "w")
        try:
            kw = dict(other_args=self.args, env=env, return_stdout_stderr=(log, log), device="cuda")
            self.proc = popen_launch_server(self.model, self.url, READY_S, **kw)
            self.report["ready_s"] = round(time.monotonic() - t0, 1)
        except Exception as e:  # noqa: BLE001 - its tests fail with it
            self.error = f"{self.phase.name} did not start: {e} (its log: {self.log})"

    def stop(self) -> dict:
        """terminate_and_kill_process_tree; whether a process of its tree is left and its port is free."""
        import psutil
        from sglang.srt.utils.network import is_port_available
        from sglang.test.test_utils import collect_process_tree_pids, terminate_and_kill_process_tree

        pids = collect_process_tree_pids(self.proc.pid) if self.proc else []
        if self.proc:
            terminate_and_kill_process_tree(self.proc, terminate_timeout=30)
            time.sleep(1)  # the log's writer threads end with the pipes
        if self.sink:
            self.sink.close()
        left = []
        for p in pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                left += [p] if psutil.Process(p).status() != psutil.STATUS_ZOMBIE else []
        return {"left": left, "port_free": is_port_available(self.port), "exit": getattr(self.proc, "returncode", None)}

    def call(self, method: str, path: str, body=None, timeout: float = 300):
        import requests

        assert not self.error, self.error
        data = body if isinstance(body, bytes) or body is None else json.dumps(body)
        headers = {"Content-Type": "application/json"}
        return requests.request(method, self.url + path, data=data, timeout=timeout, headers=headers)

    def generate(self, ids, max_new: int, **sampling) -> dict | list:
        sampling = {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True, **sampling}
        r = self.call("POST", "/generate", {"input_ids": ids, "sampling_params": sampling})
        assert r.status_code == 200, f"{self.phase.name}: /generate answered {r.status_code}: {r.text[:300]}"
        return r.json()

    def healthy(self) -> bool:
        with contextlib.suppress(Exception):
            return self.call("GET", "/health", timeout=30).status_code == 200
        return False

    def snapshot(self) -> None:
        """/server_info's speculative keys and /metrics' speculative graph counts into the report (contract 4)."""
        from scripts.bench import observe

        time.sleep(1.5)  # the scheduler posts its counters with the next step's metrics
        info = self.call("GET", "/server_info", timeout=60).json()
        state = observe.internal_state(info)
        spec = {k: v for k, v in state.items() if k.startswith("spec_") or k == "avg_spec_accept_length"}
        metric = observe.graph_counts_from_metrics(observe.parse_metrics(self.call("GET", "/metrics", timeout=60).text))
        self.report.update(spec=spec, max_running_requests=info.get("max_running_requests"), metric=metric)
