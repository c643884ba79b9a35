"""`make bench` inputs: scenarios (bench/scenarios.toml), variants (bench/variants.toml) and the A/B/A run plan.

A scenario is one bench_serving workload (C1, C4, C16: concurrency, prompts, lengths, random dataset, fixed seed).
A variant is one server: how to launch it (docker image or the local scripts.serve), its env and extra args, and
whether it speculates. The plan visits the variants forward, then backward, round after round (A B, B A, A B ...),
so linear drift over the session weighs on every variant alike; adjacent runs of one variant share one server.
"""

from __future__ import annotations

import dataclasses
import math
import re
import string
import sys
from pathlib import Path

from ..host.engine import FLASHINFER_VOLUME
from ..lib.errors import UserError
from ..lib.repo import REPO_ROOT
from ..lib.tomlfile import load_toml
from ..series.pin import load_pin

BENCH_DIR = REPO_ROOT / "bench"
DEFAULT_SCENARIOS = BENCH_DIR / "scenarios.toml"
DEFAULT_VARIANTS = BENCH_DIR / "variants.toml"
RESULTS_DIR = BENCH_DIR / "results"
BASELINES_DIR = BENCH_DIR / "baselines"
LAUNCHERS = ("docker", "local", "server")
ORDERS = ("aba", "blocked")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def _check_keys(where: str, d: dict, allowed: set[str]) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")


def _pick(items: list, names: str | None, what: str, path: Path) -> list:
    """Items selected by a comma list of names (in the order given), or those marked default."""
    by_name = {i.name: i for i in items}
    if not names:
        chosen = [i for i in items if getattr(i, "default", True)]
        if not chosen:
            raise UserError(f"{path} marks no {what} as default; pick some with --{what}s")
        return chosen
    out = []
    for n in [n.strip() for n in names.split(",") if n.strip()]:
        if n not in by_name:
            raise UserError(f"unknown {what} {n!r}; {path} has: {', '.join(by_name)}")
        if by_name[n] not in out:
            out.append(by_name[n])
    if not out:
        raise UserError(f"--{what}s selected nothing")
    return out


# -------------------------------------------------------------------------------------------------------------
# scenarios


# bench_serving flag -> the scenario key that gives its value (to name the key when bench_serving refuses a value)
SCENARIO_FLAGS = {"--dataset-name": "dataset_name", "--num-prompts": "num_prompts", "--random-input-len": "input_len",
                  "--random-output-len": "output_len", "--random-range-ratio": "range_ratio",
                  "--max-concurrency": "max_concurrency", "--seed": "seed", "--warmup-requests": "warmup_requests",
                  "--request-rate": "request_rate"}


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One workload. Values bench_serving takes are kept as written and passed on as text: its own parser (and
    the dataset code it runs) judges them before any server starts (client.check_bench_args)."""

    name: str
    max_concurrency: int
    num_prompts: int
    input_len: int
    output_len: int
    dataset_name: str = "random-ids"
    range_ratio: float = 1.0
    seed: int = 1
    warmup_requests: int = 0  # 0: as many as max_concurrency
    request_rate: float | str = "inf"
    tokenize_prompt: bool = True
    flush_cache: bool = True
    extra_args: tuple[str, ...] = ()
    description: str = ""
    default: bool = True

    def bench_args(self) -> list[str]:
        """bench_serving arguments for this workload (everything but server, output file and tokenizer)."""
        values = {"dataset_name": self.dataset_name, "num_prompts": self.num_prompts, "input_len": self.input_len,
                  "output_len": self.output_len, "range_ratio": self.range_ratio,
                  "max_concurrency": self.max_concurrency, "seed": self.seed,
                  "warmup_requests": self.warmup_requests or self.max_concurrency, "request_rate": self.request_rate}
        a = []
        for flag, key in SCENARIO_FLAGS.items():
            if key == "request_rate" and str(values[key]) in ("inf", str(math.inf)):
                continue  # bench_serving's default: every request at time 0
            a += [flag, str(values[key])]
        if self.tokenize_prompt:
            a.append("--tokenize-prompt")
        if self.flush_cache:
            a.append("--flush-cache")
        return a + list(self.extra_args)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["request_rate"] = "inf" if str(self.request_rate) in ("inf", str(math.inf)) else self.request_rate
        d["extra_args"] = list(self.extra_args)
        d.pop("default")
        return d


_SCENARIO_KEYS = {f.name for f in dataclasses.fields(Scenario)}


def load_scenarios(path: Path = DEFAULT_SCENARIOS, names: str | None = None,
                   everything: bool = False) -> list[Scenario]:
    d = load_toml(path)
    _check_keys(str(path), d, {"defaults", "scenario"})
    defaults = d.get("defaults", {})
    _check_keys(f"{path} [defaults]", defaults, _SCENARIO_KEYS - {"name"})
    raw = d.get("scenario", [])
    if not raw:
        raise UserError(f"{path} defines no [[scenario]]")
    out: list[Scenario] = []
    for i, s in enumerate(raw):
        where = f"{path} scenario #{i + 1} ({s.get('name', '?')})"
        _check_keys(where, s, _SCENARIO_KEYS)
        merged = {**defaults, **s}
        for k in ("name", "max_concurrency", "num_prompts", "input_len", "output_len"):
            if k not in merged:
                raise UserError(f"{where}: missing {k}")
        if not _NAME.match(str(merged["name"])):
            raise UserError(f"{where}: name must be letters, digits, '.', '_', '+' or '-'")
        for k in ("max_concurrency", "num_prompts", "input_len", "output_len"):
            if not isinstance(merged[k], int) or merged[k] < 1:
                raise UserError(f"{where}: {k} must be a positive integer, not {merged[k]!r}")
        for k in ("tokenize_prompt", "flush_cache", "default"):
            if not isinstance(merged.get(k, True), bool):
                raise UserError(f"{where}: {k} must be true or false, not {merged[k]!r}")
        if not isinstance(merged.get("extra_args", []), list):
            raise UserError(f"{where}: extra_args must be a list of bench_serving arguments, e.g. [\"--flag\", \"1\"]")
        merged["extra_args"] = tuple(str(x) for x in merged.get("extra_args", ()))
        if any(s.name == merged["name"] for s in out):
            raise UserError(f"{path}: scenario {merged['name']} is defined twice")
        out.append(Scenario(**merged))
    return out if everything else _pick(out, names, "scenario", path)


# -------------------------------------------------------------------------------------------------------------
# variants


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    launcher: str  # docker | local | server
    speculative: bool | None = None
    image: str = ""
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    extra_args: tuple[str, ...] = ()
    docker_args: tuple[str, ...] = ()
    python: str = ""  # local launcher: the interpreter whose sglang runs (patch set read from there)
    url: str = ""  # server launcher: a server someone else runs
    patchset: str = ""  # declared patch set (server launcher); launched servers are inspected instead
    description: str = ""
    default: bool = True
    setting: tuple[tuple[str, object], ...] = ()  # a sweep point's drafter and settings (scripts/bench/sweep.py)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["env"] = dict(self.env)
        d["setting"] = dict(self.setting)
        for k in ("command", "extra_args", "docker_args"):
            d[k] = list(d[k])
        d.pop("default")
        return {k: v for k, v in d.items() if v not in ("", [], {}, None) or k == "speculative"}


_VARIANT_KEYS = {f.name for f in dataclasses.fields(Variant)} - {"setting"}
_DEFAULT_KEYS = {"model", "draft_model", "tokenizer", "hf_cache", "flashinfer_cache", "port", "patched_image",
                 "stock_image", "python"}


@dataclasses.dataclass
class VariantSet:
    variants: list[Variant]
    defaults: dict
    path: Path


def load_variants(path: Path = DEFAULT_VARIANTS) -> VariantSet:
    d = load_toml(path)
    _check_keys(str(path), d, {"defaults", "argsets", "variant"})
    defaults = dict(d.get("defaults", {}))
    _check_keys(f"{path} [defaults]", defaults, _DEFAULT_KEYS)
    argsets = d.get("argsets", {})
    for k, v in argsets.items():
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise UserError(f"{path} [argsets] {k} must be a list of strings")
    out: list[Variant] = []
    for i, v in enumerate(d.get("variant", [])):
        where = f"{path} variant #{i + 1} ({v.get('name', '?')})"
        _check_keys(where, v, _VARIANT_KEYS | {"args"})
        v = dict(v)
        if not _NAME.match(str(v.get("name", ""))):
            raise UserError(f"{where}: needs a name of letters, digits, '.', '_', '+' or '-'")
        if v.get("launcher") not in LAUNCHERS:
            raise UserError(f"{where}: launcher must be one of {', '.join(LAUNCHERS)}, not {v.get('launcher')!r}")
        # "args" names argsets spliced into command in order (shared sglang flags for stock and patched images)
        command = list(v.get("command", []))
        for name in v.pop("args", []):
            if name not in argsets:
                raise UserError(f"{where}: argset {name!r} is not in [argsets] ({', '.join(argsets) or 'none'})")
            command += argsets[name]
        v["command"] = tuple(command)
        if v["launcher"] == "docker" and not v.get("image"):
            raise UserError(f"{where}: a docker variant needs image = \"...\"")
        if v["launcher"] in ("docker", "local") and not command:
            raise UserError(f"{where}: needs command (or args) to start the server")
        if v["launcher"] == "server" and not v.get("url"):
            raise UserError(f"{where}: a server variant needs url = \"http://host:port\"")
        env = v.get("env", {})
        if not isinstance(env, dict):
            raise UserError(f"{where}: env must be a table of NAME = \"value\"")
        v["env"] = tuple((str(k), str(x)) for k, x in env.items())
        for k in ("extra_args", "docker_args"):
            v[k] = tuple(str(x) for x in v.get(k, ()))
        if any(o.name == v["name"] for o in out):
            raise UserError(f"{path}: variant {v['name']} is defined twice")
        out.append(Variant(**v))
    if not out:
        raise UserError(f"{path} defines no [[variant]]")
    return VariantSet(out, defaults, path)


def pick_variants(vs: VariantSet, names: str | None) -> list[Variant]:
    return _pick(vs.variants, names, "variant", vs.path)


def server_variants(specs: list[str], patchsets: list[str], known: VariantSet | None) -> list[Variant]:
    """Variants for servers that are already running: --server-url [NAME=]URL, --patchset [NAME=]ID."""
    out: list[Variant] = []
    for i, spec in enumerate(specs):
        name, sep, url = spec.partition("=")
        if not sep or "://" in name:
            name, url = ("server" if len(specs) == 1 else f"server{i + 1}"), spec
        if not _NAME.match(name):
            raise UserError(f"--server-url {spec}: the name {name!r} must be letters, digits, '.', '_', '+' or '-'")
        if not re.match(r"^https?://[^/]+", url):
            raise UserError(f"--server-url {spec}: give a URL like http://127.0.0.1:30000")
        if any(v.name == name for v in out):
            raise UserError(f"--server-url: the name {name} is used twice; use NAME=URL to tell them apart")
        base = next((v for v in (known.variants if known else []) if v.name == name), None)
        out.append(Variant(name=name, launcher="server", url=url.rstrip("/"),
                           speculative=base.speculative if base else None,
                           description=base.description if base else "running server"))
    declared: dict[str, str] = {}
    for p in patchsets:
        name, sep, pid = p.partition("=")
        if not sep:
            if len(out) != 1:
                raise UserError(f"--patchset {p}: with several servers write NAME=ID")
            name, pid = out[0].name, p
        if name not in {v.name for v in out}:
            raise UserError(f"--patchset {p}: no --server-url is named {name}")
        declared[name] = pid
    return [dataclasses.replace(v, patchset=declared.get(v.name, "unknown")) for v in out]


# -------------------------------------------------------------------------------------------------------------
# placeholders in commands: {port} {model} {draft_model} {hf_cache} {flashinfer_cache} {python} {repo}


def expand(text: str, values: dict[str, str], where: str) -> str:
    names = [f for _, f, _, _ in string.Formatter().parse(text) if f]
    for n in names:
        if n not in values:
            raise UserError(f"{where}: unknown placeholder {{{n}}} in {text!r}; known: "
                            + ", ".join("{" + k + "}" for k in sorted(values)))
        if values[n] in ("", None):
            hint = {"draft_model": "pass --draft-model PATH or set draft_model in [defaults]",
                    "model": "pass --model PATH or set model in [defaults]"}.get(n, f"set {n} in [defaults]")
            raise UserError(f"{where} needs {{{n}}}, which is empty: {hint}")
    return text.format(**values)


def placeholder_values(vs_defaults: dict, overrides: dict) -> dict[str, str]:
    """Values of the placeholders: built-in defaults ({patched_image} and {stock_image} from patches/pin.toml: the
    image `make image` builds and the upstream image it builds FROM), then [defaults], then the command line."""
    pin = load_pin()
    vals = {"port": "30000", "model": "", "draft_model": "", "hf_cache": "~/.cache/huggingface",
            "flashinfer_cache": FLASHINFER_VOLUME, "python": sys.executable, "repo": str(REPO_ROOT),
            "patched_image": pin.serving_image, "stock_image": pin.upstream_image, "tokenizer": ""}
    vals.update({k: str(v) for k, v in vs_defaults.items()})
    vals.update({k: str(v) for k, v in overrides.items() if v not in (None, "")})
    vals["hf_cache"] = str(Path(vals["hf_cache"]).expanduser())
    return vals


# -------------------------------------------------------------------------------------------------------------
# the plan


@dataclasses.dataclass(frozen=True)
class Run:
    index: int  # 1-based position in the whole session
    scenario: Scenario
    variant: Variant
    repeat: int  # 1-based, per scenario x variant
    letter: str  # the variant's A/B/C... in selection order
    round: int  # 1-based

    def label(self, total: int) -> str:
        return f"[{self.index}/{total}] {self.scenario.name} {self.variant.name} repeat {self.repeat} ({self.letter})"


def letter(i: int) -> str:
    """A, B, ..., Z, AA, AB, ...: the i-th variant's letter (0-based), never one an earlier variant has."""
    out, n = "", i + 1
    while n:
        n, r = divmod(n - 1, 26)
        out = string.ascii_uppercase[r] + out
    return out


def make_plan(scenarios: list[Scenario], variants: list[Variant], repeats: int, order: str = "aba") -> list[Run]:
    """aba: round r visits the variants forward when r is odd and backward when even (A B | B A | A B ...);
    blocked: every repeat of A, then of B (fewest server launches, no drift protection)."""
    if repeats < 1:
        raise UserError("--repeats must be at least 1")
    if order not in ORDERS:
        raise UserError(f"--order must be one of {', '.join(ORDERS)}")
    letters = {v.name: letter(i) for i, v in enumerate(variants)}
    seq: list[tuple[int, Variant]] = []
    if order == "blocked":
        seq = [(r, v) for v in variants for r in range(repeats)]
    else:
        for r in range(repeats):
            seq += [(r, v) for v in (variants if r % 2 == 0 else list(reversed(variants)))]
    runs: list[Run] = []
    for r, v in seq:
        for s in scenarios:
            runs.append(Run(len(runs) + 1, s, v, r + 1, letters[v.name], r + 1))
    return runs


def sessions(plan: list[Run]) -> list[list[Run]]:
    """Consecutive runs of one variant: one server launch each."""
    out: list[list[Run]] = []
    for run in plan:
        if out and out[-1][-1].variant.name == run.variant.name:
            out[-1].append(run)
        else:
            out.append([run])
    return out
