"""What `make bench` will do, every value resolved once from its command line and files: the scenarios
(bench/scenarios.toml), the variants (bench/variants.toml, a sweep's points, or the servers of --server-url), the A/B/A
order (drift weighs on every variant alike), the server sessions (adjacent runs of a variant share one server), each
server's launch and each run's client, what --resume leaves, what the box must have and what it all costs.
bench.py runs it; make report shows and checks it.
"""

import argparse
import dataclasses
import itertools
import json
import math
import re
import shlex
import string
from pathlib import Path

from ..box.docker import RESULTS_IN_IMAGE, container_name, docker_run, hf_cache_dir
from ..box.results import box_name, stamp
from ..lib import profiles
from ..lib.cli import parser, split
from ..lib.errors import UserError
from ..lib.repo import REPO_ROOT, revision
from ..lib.tomlfile import load_toml
from ..series.pin import load_pin
from . import sweep
from .report import Judging
from .servers import Launch

BENCH_DIR = REPO_ROOT / "bench"
ORDERS = ("aba", "blocked")
ASSUMED_LOAD_S = 600.0  # one Kimi-K2.5 TP8 server: weights from the page cache or NVMe, graphs, JIT
ASSUMED_STREAM_TOK_S = 50.0  # decode tok/s per stream (the seed box: 82 without speculation, 60 with EAGLE-3)
IN_IMAGE_REPO = "/opt/eagle-fast-verify"  # where a stock image sees this checkout (its serve)
# passed to bench_serving by name (PYTHONUNBUFFERED: its lines as printed, which bench reads as they come)
CLIENT_ENV = ("OPENAI_API_KEY", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "PYTHONUNBUFFERED")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
NAME_RULE = "letters, digits, '.', '_', '+' or '-'"

# bench_serving flag -> the scenario key that gives its value
SCENARIO_FLAGS = {
    "--dataset-name": "dataset_name",
    "--num-prompts": "num_prompts",
    "--random-input-len": "input_len",
    "--random-output-len": "output_len",
    "--random-range-ratio": "range_ratio",
    "--max-concurrency": "max_concurrency",
    "--seed": "seed",
    "--warmup-requests": "warmup_requests",
    "--request-rate": "request_rate",
}


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One workload; bench_serving judges its values (a bad one fails the first run, named)."""

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
        values = {**dataclasses.asdict(self), "warmup_requests": self.warmup_requests or self.max_concurrency}
        args = []
        for flag, key in SCENARIO_FLAGS.items():
            if key != "request_rate" or str(values[key]) != "inf":
                args += [flag, str(values[key])]
        args += ["--tokenize-prompt"] * self.tokenize_prompt + ["--flush-cache"] * self.flush_cache
        return args + list(self.extra_args)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("default")
        rate = "inf" if str(self.request_rate) == "inf" else self.request_rate
        return {**d, "extra_args": list(self.extra_args), "request_rate": rate}

    def seconds(self) -> float:
        """The estimate of one run: its waves of requests (and the warmup's) at ASSUMED_STREAM_TOK_S."""
        return (math.ceil(self.num_prompts / self.max_concurrency) + 1) * self.output_len / ASSUMED_STREAM_TOK_S


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    image: str = "patched"  # patched | stock | an image name
    profile: str = ""
    speculative: bool = False
    draft_model: str = ""  # "": [defaults] draft_model (a sweep point sets its own)
    env: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()  # SGLang arguments after serve's --
    description: str = ""
    default: bool = True
    url: str = ""  # a server someone else runs (--server-url)
    patchset: str = ""  # its declared patch set (--patchset)
    setting: tuple[tuple[str, object], ...] = ()  # a sweep point's drafter and settings

    def to_dict(self) -> dict:
        d = {**dataclasses.asdict(self), "env": dict(self.env), "args": list(self.args), "setting": dict(self.setting)}
        d.pop("default")
        return {k: v for k, v in d.items() if v not in ("", [], {}, None) or k == "speculative"}


@dataclasses.dataclass
class VariantSet:
    variants: list[Variant]
    defaults: dict
    path: Path


# ---------------------------------------------------------------------------------------------- the two files
def _keys(where: str, d: dict, allowed: set[str]) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")


def _entries(path: Path, kind: str, allowed: set[str]) -> tuple[list[dict], dict]:
    """The [[kind]] tables of a bench file, each with known keys and a name of its own, and the file's [defaults]."""
    d = load_toml(path, f"{kind}s file")
    _keys(str(path), d, {"defaults", kind})
    if not d.get(kind):
        raise UserError(f"{path} defines no [[{kind}]]")
    names = [str(e.get("name", "")) for e in d[kind]]
    for i, (entry, name) in enumerate(zip(d[kind], names)):
        _keys(f"{path} {kind} #{i + 1} ({name or '?'})", entry, allowed)
        if names.count(name) > 1:
            raise UserError(f"{path}: {kind} {name} is defined twice")
    return d[kind], d.get("defaults", {})


def _checked(where: str, entry: dict, ints: tuple[str, ...] = (), bools: tuple[str, ...] = ()) -> dict:
    if not NAME.match(str(entry.get("name", ""))):
        raise UserError(f"{where}: name must be {NAME_RULE}")
    for k in ints:
        if not isinstance(entry.get(k), int) or entry[k] < 1:
            raise UserError(f"{where}: {k} must be a positive integer, not {entry.get(k)!r}")
    for k in bools:
        if not isinstance(entry.get(k, True), bool):
            raise UserError(f"{where}: {k} must be true or false, not {entry[k]!r}")
    return entry


def load_scenarios(path: Path, names: str | None = None) -> list[Scenario]:
    fields = {f.name for f in dataclasses.fields(Scenario)}
    entries, defaults = _entries(path, "scenario", fields)
    _keys(f"{path} [defaults]", defaults, fields - {"name"})
    out = []
    for i, entry in enumerate(entries):
        where = f"{path} scenario #{i + 1} ({entry.get('name', '?')})"
        m = _checked(
            where,
            {**defaults, **entry},
            ints=("max_concurrency", "num_prompts", "input_len", "output_len"),
            bools=("tokenize_prompt", "flush_cache", "default"),
        )
        out.append(Scenario(**{**m, "extra_args": tuple(str(x) for x in m.get("extra_args", ()))}))
    return _pick(out, names, "scenario", path)


def load_variants(path: Path) -> VariantSet:
    fields = {f.name for f in dataclasses.fields(Variant)} - {"url", "patchset", "setting"}
    entries, defaults = _entries(path, "variant", fields)
    _keys(f"{path} [defaults]", defaults, {"model", "draft_model", "port"})
    out = []
    for i, v in enumerate(entries):
        where = f"{path} variant #{i + 1} ({v.get('name', '?')})"
        _checked(where, v, bools=("speculative", "default"))
        if not v.get("profile"):
            raise UserError(f"{where}: needs a profile (docker/profiles/NAME.yaml, or a path)")
        if not isinstance(v.get("env", {}), dict) or not isinstance(v.get("args", []), list):
            raise UserError(f'{where}: env is a table of NAME = "value", args a list of SGLang arguments')
        env = tuple((str(k), str(x)) for k, x in v.get("env", {}).items())
        out.append(Variant(**{**v, "env": env, "args": tuple(map(str, v.get("args", ())))}))
    return VariantSet(out, defaults, Path(path))


def _pick(items: list, names: str | None, what: str, path: Path) -> list:
    """Items named in a comma list (in that order), or those marked default."""
    if not names:
        marked = [i for i in items if i.default]
        if not marked:
            raise UserError(f"{path} marks no {what} as default; pick with --{what}s")
        return marked
    by_name, out = {i.name: i for i in items}, []
    for n in dict.fromkeys(n.strip() for n in names.split(",") if n.strip()):
        if n not in by_name:
            raise UserError(f"unknown {what} {n!r}; {path} has: {', '.join(by_name)}")
        out.append(by_name[n])
    if not out:
        raise UserError(f"--{what}s selected nothing")
    return out


def server_variants(specs: list[str], patchsets: list[str]) -> list[Variant]:
    """Variants for servers already running: --server-url [NAME=]URL, --patchset [NAME=]ID."""
    declared = dict(p.partition("=")[::2] for p in patchsets)
    out: list[Variant] = []
    for i, spec in enumerate(specs):
        name, sep, url = spec.partition("=")
        if not sep or "://" in name:
            name, url = ("server" if len(specs) == 1 else f"server{i + 1}"), spec
        if not NAME.match(name) or not re.match(r"^https?://[^/]+", url) or any(v.name == name for v in out):
            raise UserError(f"--server-url {spec}: give NAME=URL with a new name, e.g. a=http://127.0.0.1:30000")
        out.append(Variant(name, url=url.rstrip("/"), description="running server"))
    unknown = set(declared) - {v.name for v in out}
    if unknown:
        raise UserError(f"--patchset {', '.join(unknown)}: write NAME=ID with the NAME of a --server-url")
    return [dataclasses.replace(v, patchset=declared.get(v.name, "unknown")) for v in out]


# ----------------------------------------------------------------------------------------------- runs, sessions
@dataclasses.dataclass(frozen=True)
class Run:
    index: int  # 1-based position in the plan
    scenario: Scenario
    variant: Variant
    repeat: int
    letter: str  # the variant's A, B, C ... in selection order
    round: int
    args: tuple[str, ...] = ()  # bench_serving's arguments (the plan's client runs them)
    output: Path | None = None  # where bench_serving writes its record

    def label(self, total: int) -> str:
        return f"[{self.index}/{total}] {self.scenario.name} {self.variant.name} repeat {self.repeat} ({self.letter})"

    def key(self) -> tuple:
        return self.scenario.name, self.variant.name, self.repeat


def letter(i: int) -> str:
    out, n = "", i + 1
    while n:
        n, r = divmod(n - 1, 26)
        out = string.ascii_uppercase[r] + out
    return out


def make_plan(scenarios: list[Scenario], variants: list[Variant], repeats: int, order: str = "aba") -> list[Run]:
    """aba: odd rounds visit the variants forward, even rounds backward; blocked: every repeat of A, then of B."""
    if repeats < 1 or order not in ORDERS:
        raise UserError(f"repeats must be at least 1 and order one of {', '.join(ORDERS)}")
    seq = [(r, v) for r in range(repeats) for v in (variants if r % 2 == 0 else variants[::-1])]
    if order == "blocked":
        seq = [(r, v) for v in variants for r in range(repeats)]
    letters = {v.name: letter(i) for i, v in enumerate(variants)}
    runs: list[Run] = []
    for r, v in seq:
        runs += [Run(len(runs) + 1 + i, s, v, r + 1, letters[v.name], r + 1) for i, s in enumerate(scenarios)]
    return runs


def sessions(runs: list[Run]) -> list[list[Run]]:
    """Consecutive runs of one variant: one server each."""
    return [list(group) for _, group in itertools.groupby(runs, key=lambda r: r.variant.name)]


def held(runs: list[Run], results_dir: Path) -> tuple[list[Run], list[dict]]:
    """--resume: (the runs no results file under results_dir holds yet, renumbered; the records it holds). A run is
    held when a record has its scenario, variant and repeat with the same scenario and variant specs."""
    want = {r.key(): r for r in runs}
    records = []
    for f in sorted(results_dir.glob("*.jsonl")) if results_dir.is_dir() else []:
        for line in f.read_text(errors="replace").splitlines():
            e = json.loads(line).get("eagle", {}) if line.strip() else {}
            r = want.get((e.get("scenario"), e.get("variant"), e.get("repeat")))
            if r and e.get("scenario_spec") == r.scenario.to_dict() and e.get("variant_spec") == r.variant.to_dict():
                records.append(json.loads(line))
    done = {(x["eagle"]["scenario"], x["eagle"]["variant"], x["eagle"]["repeat"]) for x in records}
    left = [r for r in runs if r.key() not in done]
    return [dataclasses.replace(r, index=i) for i, r in enumerate(left, 1)], records


def concurrency_problems(scenarios: list[Scenario], caps: dict[str, int], variants: list[Variant]) -> list[str]:
    """Scenarios asking more concurrent requests than a launched server runs at once (caps: its max-running-requests,
    0 unset): the rest would queue, and the run would not measure that concurrency."""
    profile = {v.name: v.profile for v in variants}
    out = []
    for s in scenarios:
        below = sorted((cap, name) for name, cap in caps.items() if 0 < cap < s.max_concurrency)
        if below:
            cap, name = below[0]
            out.append(
                f"scenario {s.name}: max_concurrency {s.max_concurrency} is above max-running-requests {cap} "
                f"of {name} (profile {profile[name]}): {cap} would run at a time. Fix: max_concurrency <= {cap} "
                f'in [[scenario]] {s.name}, or make bench BENCH_ARGS="... -- --max-running-requests '
                f'{s.max_concurrency}"'
            )
    return out


# ------------------------------------------------------------------------------------------------------ the plan
@dataclasses.dataclass
class Plan:
    """Every value make bench needs, resolved from the command line and the files once: the runs to make (after
    --resume), each with its bench_serving arguments, their sessions, each variant's server, the client that runs
    them, what the box must have, the results file and what judges it. A plan of --report runs nothing: it reports
    the results file it names."""

    judging: Judging
    report: Path | None = None  # --report: the results file to rebuild the report of
    scenarios: list[Scenario] = dataclasses.field(default_factory=list)
    variants: list[Variant] = dataclasses.field(default_factory=list)
    runs: list[Run] = dataclasses.field(default_factory=list)
    sessions: list[list[Run]] = dataclasses.field(default_factory=list)
    earlier: list[dict] = dataclasses.field(default_factory=list)  # --resume: the records held already
    launches: dict[str, Launch] = dataclasses.field(default_factory=dict)
    client: list[str] = dataclasses.field(default_factory=list)  # bench_serving in the image, before a run's args
    images: list[str] = dataclasses.field(default_factory=list)  # to check: the servers' and the client's
    gpus: int = 0  # the widest tp-size of the launched servers (0: none launched)
    port: int | None = None  # the launched servers' (None: none launched)
    weights: list[str] = dataclasses.field(default_factory=list)
    model: str = ""
    repeats: int = 0
    seconds: float = 0.0  # the estimate: runs x their duration + loads x ASSUMED_LOAD_S
    results_dir: Path = BENCH_DIR / "results"
    stem: Path = BENCH_DIR / "results" / "bench"  # results_dir/<UTC stamp>_<git rev>_<box>, the results without .jsonl
    meta: dict = dataclasses.field(default_factory=dict)  # box, git revision, tokenizer: what every record says
    sample_interval: float = 1.0
    api_key_file: str | None = None
    dry_run: bool = False


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """(options, SGLang arguments after --)."""
    own, server_args = split(argv)
    ap = parser("scripts.bench.bench", allow_abbrev=False)
    add = ap.add_argument
    add("--scenarios", help="comma list of scenario names (default: those marked default)")
    add("--variants", help="comma list of variant names, in A, B, C order (default: those marked default)")
    add("--repeats", type=int, help="runs per scenario x variant (default 3, or the sweep file's)")
    add("--scenarios-file", type=Path, default=BENCH_DIR / "scenarios.toml")
    add("--variants-file", type=Path, default=BENCH_DIR / "variants.toml")
    add("--sweep", nargs="?", const=str(sweep.SWEEP_FILE), metavar="FILE", help="the drafter x settings sweep")
    add("--server-url", action="append", metavar="[NAME=]URL", help="bench a server that runs already")
    add("--patchset", action="append", default=[], metavar="NAME=ID", help="the patch set of a --server-url server")
    add("--image", help="the serving image: patched variants and the client (default: the pin's)")
    add("--model", help="the target model (default: [defaults] model)")
    add("--draft-model", help="the speculative variants' drafter (default: [defaults] draft_model)")
    add("--port", type=int, help="port of launched servers (default: [defaults] port)")
    add("--launch-timeout", type=float, default=3600, help="seconds to wait for a server to answer")
    add("--tokenizer", help="bench_serving's tokenizer (default: the model)")
    add("--bench-args", default="", help="more bench_serving arguments, one shell-quoted string")
    add("--api-key-file", metavar="FILE", help="the servers' API key (else $SGLANG_API_KEY, as serve reads it)")
    add("--sample-interval", type=float, default=1.0, help="seconds between the server's decode tok/s samples")
    add("--box", help="box name in file names and records (default: the GPUs' model and count)")
    add("--results-dir", type=Path, default=BENCH_DIR / "results")
    add("--resume", action="store_true", help="skip the runs a results file there holds already")
    add("--baseline", nargs="?", const="", metavar="FILE", help="compare (default bench/baselines/<box>.json)")
    add("--write-baseline", nargs="?", const="", metavar="FILE", help="write this run's medians as a baseline")
    add("--max-tok-s-drop", type=float, help="allowed tok/s drop in %% (default: the baseline's, else 5)")
    add("--max-accept-drop", type=float, help="allowed accept length drop (default: the baseline's, else 0.05)")
    add("--fail-on-eager", action="store_true", help="exit 1 when a verify forward ran off its CUDA graph")
    add("--report", metavar="RESULTS.jsonl", help="only rebuild the report of a results file (and compare)")
    add("--dry-run", action="store_true", help="print the plan, its checks and every command; run nothing")
    return ap.parse_args(own), server_args


def select(a: argparse.Namespace, server_args: list[str]) -> tuple[list[Variant], dict, str | None]:
    """(the variants: the sweep's points, the variants file's, or --server-url's; the variants file's [defaults];
    the order)."""
    if a.server_url and (a.variants or a.sweep or server_args):
        raise UserError("--server-url benches servers that run already: drop --variants, --sweep and -- ARGS")
    if a.server_url:
        return server_variants(a.server_url, a.patchset), {}, None
    if a.sweep and a.draft_model:
        raise UserError(
            "--draft-model sets the variants' drafter, but a sweep's drafters are its own (drafters = "
            "[...] in the sweep file): drop --draft-model"
        )
    vset = load_variants(a.variants_file)
    if not a.sweep:
        return _pick(vset.variants, a.variants, "variant", vset.path), vset.defaults, None
    sw = sweep.load(Path(a.sweep))
    a.scenarios, a.repeats = a.scenarios or sw.scenarios, a.repeats or sw.repeats
    return _pick(sweep.variants(sw, vset), a.variants, "variant", sw.path), vset.defaults, sw.order


def launch(v: Variant, image: str, serve: list[str], port: int, stem: Path, timeout: float) -> Launch:
    """A variant's server: the image's serve verb in a named detached container on the host's network, or (a stock
    image) this checkout's serve, mounted read-only; its output goes to a log beside the results."""
    name = container_name(f"bench-{v.name}")
    cmd, extra = ["serve"], [x for k, val in v.env for x in ("-e", f"{k}={val}")]
    if v.image == "stock":
        cmd = ["-m", "scripts.host.serve"]
        mount = ["-v", f"{REPO_ROOT}:{IN_IMAGE_REPO}:ro", "-e", f"PYTHONPATH={IN_IMAGE_REPO}"]
        extra += ["--entrypoint", "python3", *mount]
    argv = docker_run(
        image, [*cmd, *serve], hf_cache=hf_cache_dir(), network_host=True, detach=True, name=name, extra=extra
    )
    log = stem.with_name(f"{stem.name}.server-{v.name}.log")
    return Launch(v.name, f"http://127.0.0.1:{port}", image, tuple(argv), name, log=log, timeout=timeout)


def build(a: argparse.Namespace, server_args: list[str]) -> Plan:
    """The plan of these options, every value resolved: scenarios, variants, runs (--resume), each variant's server,
    each run's client, what the box must have; a UserError for what would not measure what it says."""
    judging = Judging(a.baseline, a.write_baseline, a.max_tok_s_drop, a.max_accept_drop, a.fail_on_eager)
    if a.report:
        return Plan(judging, report=Path(a.report), meta={"box": a.box})
    variants, defaults, order = select(a, server_args)
    scenarios = load_scenarios(a.scenarios_file, a.scenarios)
    runs = make_plan(scenarios, variants, a.repeats or 3, order or "aba")
    runs, earlier = held(runs, a.results_dir) if a.resume else (runs, [])
    box = a.box or box_name()
    rev, dirty = revision(short=True)
    stem = a.results_dir / f"{stamp()}_{rev}{'-dirty' * dirty}_{box}"
    pin = load_pin()
    images = {"patched": a.image or pin.serving_image, "stock": pin.upstream_image}
    model = a.model or defaults.get("model", "")
    port = int(a.port or defaults.get("port", 30000))
    launches, gpus, weights, caps = {}, 0, [], {}
    for v in variants:
        if v.url:
            launches[v.name] = Launch(v.name, v.url, patchset=v.patchset)
            continue
        rest = [*v.args, *server_args]
        served = profiles.settings(v.profile, rest)
        gpus = max(gpus, int(served.get("tp-size") or 1))
        caps[v.name] = int(served.get("max-running-requests") or 0)
        drafter = v.draft_model or a.draft_model or defaults.get("draft_model", "")
        serve = ["--profile", v.profile, "--model", model, "--port", str(port)]
        if v.speculative:
            serve += ["--draft-model", drafter]
        if rest:
            serve += ["--", *rest]
        launches[v.name] = launch(v, images.get(v.image, v.image), serve, port, stem, a.launch_timeout)
        weights += [model, drafter] if v.speculative else [model]
    too_many = concurrency_problems(scenarios, caps, variants)
    if too_many:
        raise UserError(
            f"{a.scenarios_file}: {len(too_many)} scenario(s) would not measure what they say:\n  "
            + "\n  ".join(too_many)
        )
    launched = bool(weights)
    tokenizer = a.tokenizer or (model if launched else None)
    if tokenizer and Path(tokenizer).exists():
        tokenizer = str(Path(tokenizer).resolve())
    client_image = a.image or pin.serving_image
    client = client_argv(client_image, tokenizer, a.results_dir)
    more = [*(["--tokenizer", tokenizer] if tokenizer else []), *shlex.split(a.bench_args)]
    runs = [with_client(r, launches[r.variant.name].url, stem, more) for r in runs]
    all_sessions = sessions(runs)
    return Plan(
        judging,
        scenarios=scenarios,
        variants=variants,
        runs=runs,
        sessions=all_sessions,
        earlier=earlier,
        launches=launches,
        client=client,
        images=[*(x.image for x in launches.values() if x.image), client_image],
        gpus=gpus,
        port=port if launched else None,
        weights=list(dict.fromkeys(weights)),
        model=model if launched else "",
        repeats=a.repeats or 3,
        seconds=sum(r.scenario.seconds() for r in runs) + ASSUMED_LOAD_S * len(all_sessions) * launched,
        results_dir=a.results_dir,
        stem=stem,
        meta={"box": box, "git_rev": rev + "-dirty" * dirty, "git_dirty": dirty, "tokenizer": tokenizer},
        sample_interval=a.sample_interval,
        api_key_file=a.api_key_file,
        dry_run=a.dry_run,
    )


def client_argv(image: str, tokenizer: str | None, results_dir: Path) -> list[str]:
    """bench_serving, up to a run's arguments: the image's bench-client verb on the host's network, writing into the
    results directory (its /results); a tokenizer on this machine mounted where it is."""
    local = ["-v", f"{tokenizer}:{tokenizer}:ro"] if tokenizer and Path(tokenizer).is_absolute() else []
    return docker_run(
        image,
        ["bench-client"],
        gpus=False,
        results=results_dir,
        hf_cache=hf_cache_dir(),
        network_host=True,
        extra=local,
        env_names=CLIENT_ENV,
    )


def with_client(r: Run, url: str, stem: Path, more: list[str]) -> Run:
    """The run with its bench_serving arguments. The client's /results is the results directory: its output goes
    to a file beside the results file, until the run's record is taken from it."""
    output = stem.with_name(f"{stem.name}.run{r.index}.json")
    tag = f"{r.scenario.name}/{r.variant.name}/r{r.repeat}"
    args = ["--backend", "sglang", "--base-url", url, *r.scenario.bench_args(), "--tag", tag, "--disable-tqdm"]
    args += ["--output-file", f"{RESULTS_IN_IMAGE}/{output.name}", *more]
    return dataclasses.replace(r, args=tuple(args), output=output)
