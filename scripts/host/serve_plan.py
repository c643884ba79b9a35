"""What `make test-serve` starts: its phases, the serve command of each, and the route (the box, or a lent GPU).

Every server is started through the project's own `serve` verb (python -m scripts.host.serve) with a tiny
profile (docker/profiles/tiny/), so profile checking, exposure and command assembly run as on the box; the phase
adds its sglang flags after `--`. Phases (the generated pairs of scripts/host/tiny_models.py):

  llama-nospec  no speculation: the reference (greedy = the target's chain)
  llama-graph   EAGLE-3, a drafter that is always accepted: verify and draft on their CUDA graphs, accept length
                = draft tokens, output = the reference
  llama-reject  EAGLE-3, a random drafter (almost never accepted): output = the reference
  llama-cap     --max-running-requests above the largest captured batch: capped at start, no eager verify
  llama-eager   --disable-decode-cuda-graph: announced at start, every verify eager and counted
  kimi-nospec   the DeepSeek-V3-shaped (Kimi-K2.5 keys, MLA, MoE) target: its reference
  kimi-graph    it with a Llama-form EAGLE-3 drafter (Kimi-K2.5's default drafter form)
  kimi-mla      it with an MLA-form drafter (Eagle3DeepseekV2ForCausalLM, lightseekorg/kimi-k2.5-eagle3-mla's form)

Not a phase: the post-capture cap (ModelRunner._cap_running_requests_to_verify_graphs, when the captured list
tops out below max_running_requests). It needs a capture filter that drops the largest size, i.e. two-batch
overlap (or gathered buffers at a width that is no multiple of attn_tp_size); at TP1 the request-pool clamp moves
max_running_requests along with the list, so no flag reaches it. tests/patches/test_verify_graph.py drives it.

Routes: BOX, the serving image or a host with the real sgl-kernel and FlashInfer (nothing added), and LENT, a lent
GPU machine whose torch sgl-kernel cannot load on: import-only stand-ins (tests/gpu/standin, tests/serve/standin),
the fused ops on SGLang's own torch reference (SGLANG_FORCE_FUSED_OP_BACKEND=torch) except the MoE, which stays on
its Triton path (the stand-in plugin), no FlashInfer (triton attention, pytorch sampling), no grammar backend and
the Python radix tree. What the route sets is set only where the environment has no value; what was kept is said.
"""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path

from ..lib.errors import UserError
from ..lib.repo import PROFILES_DIR, REPO_ROOT
from ..lib.tomlfile import load_toml
from .exposure import KEY_VAR
from .tiny_models import SPECIALS, VOCAB

PROFILES = PROFILES_DIR / "tiny"
EAGLE3_PROFILE, NOSPEC_PROFILE = PROFILES / "eagle3.toml", PROFILES / "nospec.toml"
SERVE_MODULE = "scripts.host.serve"
PROMPT_LENS = (12, 40, 100)
MAX_NEW = 128
CAP_REQUESTS = 16  # --max-running-requests of llama-cap: above the profile's largest captured batch size
PORT_STRIDE = 10  # phase i: HTTP port base + 10 i, NCCL port base + 10 i + 5


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str
    pair: str  # scripts/host/tiny_models.py PAIRS
    drafter: str | None  # a drafter directory of the pair, None: no speculation
    flags: tuple[str, ...] = ()
    reference: str | None = None  # the phase whose greedy output this one must equal

    @property
    def profile(self) -> Path:
        return EAGLE3_PROFILE if self.drafter else NOSPEC_PROFILE


PHASES = (
    Phase("llama-nospec", "llama", None),
    Phase("llama-graph", "llama", "draft-pi", reference="llama-nospec"),
    Phase("llama-reject", "llama", "draft-random", reference="llama-nospec"),
    Phase("llama-cap", "llama", "draft-pi", ("--max-running-requests", str(CAP_REQUESTS)), "llama-nospec"),
    Phase("llama-eager", "llama", "draft-pi", ("--disable-decode-cuda-graph",), "llama-nospec"),
    Phase("kimi-nospec", "kimi", None),
    Phase("kimi-graph", "kimi", "draft-pi", reference="kimi-nospec"),
    Phase("kimi-mla", "kimi", "draft-mla", reference="kimi-nospec"),
)
BY_NAME = {p.name: p for p in PHASES}
TIMED = ("llama-graph", "llama-eager")  # verify on the graph vs eager, timed side by side


@dataclasses.dataclass(frozen=True)
class Route:
    name: str
    env: tuple[tuple[str, str], ...] = ()
    flags: tuple[str, ...] = ()
    paths: tuple[Path, ...] = ()  # put on PYTHONPATH of every server
    standins: tuple[str, ...] = ()


BOX = Route("box")
LENT = Route(
    "lent-gpu",
    env=(("SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK", "1"), ("SGLANG_FORCE_FUSED_OP_BACKEND", "torch"),
         ("SGLANG_IS_FLASHINFER_AVAILABLE", "false"), ("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "python")),
    flags=("--attention-backend", "triton", "--sampling-backend", "pytorch", "--grammar-backend", "none"),
    paths=(REPO_ROOT / "tests" / "gpu" / "standin", REPO_ROOT / "tests" / "serve" / "standin"),
    standins=("sgl_kernel", "cutlass", "flash_mla"))


def select(names: str | None) -> list[Phase]:
    """The phases named in a comma list (in the order of PHASES), or all; a reference comes along."""
    if not names:
        return list(PHASES)
    want = {n.strip() for n in names.split(",") if n.strip()}
    unknown = sorted(want - set(BY_NAME))
    if unknown:
        raise UserError(f"unknown phase(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    want |= {BY_NAME[n].reference for n in want if BY_NAME[n].reference}
    if want & set(TIMED):
        want |= set(TIMED)
    return [p for p in PHASES if p.name in want]


def captured_max() -> int:
    """The largest decode batch size the tiny profiles capture (their cuda-graph-bs-decode)."""
    args = load_toml(EAGLE3_PROFILE, "profile")["args"]
    return max(args["cuda-graph-bs-decode"])


def ports(index: int, base: int) -> tuple[int, int]:
    return base + PORT_STRIDE * index, base + PORT_STRIDE * index + PORT_STRIDE // 2


def serve_argv(phase: Phase, models: Path, index: int, base_port: int, world: int, route: Route,
               python: str) -> list[str]:
    """`python -m scripts.host.serve --profile <tiny> --model .. [--draft-model ..] --port .. -- <sglang flags>`."""
    port, nccl = ports(index, base_port)
    pair = Path(models) / phase.pair
    argv = [python, "-m", SERVE_MODULE, "--profile", str(phase.profile), "--model", str(pair / "target"),
            "--port", str(port), "--python", python]
    if phase.drafter:
        argv += ["--draft-model", str(pair / phase.drafter)]
    return argv + ["--", "--tp-size", str(world), "--nccl-port", str(nccl), *route.flags, *phase.flags]


def server_env(route: Route, environ: dict[str, str], standin_log: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(environment of a server, route values the environment already had and kept). The project and the route's
    stand-ins go on PYTHONPATH; the servers listen on loopback and get no API key (they are the tier's own)."""
    env = {k: v for k, v in environ.items() if k != KEY_VAR}
    kept = {k: environ[k] for k, _ in route.env if k in environ and environ[k] != dict(route.env)[k]}
    env.update({k: v for k, v in route.env if k not in environ})
    if route.standins:
        env["EAGLE_STANDIN_LOG"] = str(standin_log)
    paths = [str(REPO_ROOT), *map(str, route.paths)] + [p for p in [environ.get("PYTHONPATH", "")] if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env, kept


def prompts(seed: int = 1) -> list[list[int]]:
    """The fixed token-id prompts every phase gets (non-special ids, PROMPT_LENS tokens)."""
    rng = random.Random(seed)
    return [[rng.randrange(len(SPECIALS), VOCAB) for _ in range(n)] for n in PROMPT_LENS]
