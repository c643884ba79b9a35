"""`make bench`: A/B/A serving benchmarks (stock vs patched SGLang, speculation off vs EAGLE-3) at C1, C4, C16.

  python -m scripts.bench.bench [--variants A,B,..] [--scenarios C1,C4] [--repeats 3] [--draft-model PATH]
  python -m scripts.bench.bench --sweep [FILE]   the drafter x speculative-settings sweep (bench/sweep.toml;
        scripts/bench/sweep.py): one server per point, every point checked against SGLang's rules first
        [-- SGLANG_ARGS]   launch each variant of bench/variants.toml in turn (docker image or local
        scripts.host.serve) and bench it
  python -m scripts.bench.bench --server-url [NAME=]URL [--server-url NAME=URL ..] [--patchset [NAME=]ID]
        bench servers that are already running (patch set: as declared, else "unknown")
  python -m scripts.bench.bench --report RESULTS.jsonl   rebuild the .md/.png of a results file (and compare)
  python -m scripts.bench.bench --dry-run | --list       print the plan and commands / the scenarios and variants
  python -m scripts.bench.bench --check [--resume]       the real run's checks, nothing started: one JSON line
        {estimate_s, runs, runs_left} (make report's preflight); --resume skips the runs already in --results-dir
  any of them: [--baseline [FILE]] [--write-baseline [FILE]] (FILE defaults to bench/baselines/<box>.json)

Each run is SGLang's own client, `python -m sglang.benchmark.serving --backend sglang` (random-ids dataset, fixed
seed, --tokenize-prompt: works offline), whose JSONL record is kept unchanged. The harness adds an "eagle" object:
scenario, variant, repeat, A/B/A letter and position, the server's decode tok/s (sglang:gen_throughput from
/metrics, or last_gen_throughput from /server_info, sampled during the measured phase), the speculative CUDA-graph
counter deltas (per stage: graph / piecewise / eager forwards and fallback reasons; the target verify's graph hit
rate), the accept length from /metrics deltas, the server's patch set, git revision, box and timestamps. Results go
to bench/results/<UTC time>_<git rev>_<box>.jsonl (append-only), with a markdown table (.md) and a plot (.png) of the
same stem, and bench_serving's and the servers' output in .log files.

Before any server starts, every scenario's bench_serving command is judged by bench_serving itself (its own
argument parser and dataset code, run by the client interpreter; scripts/bench/client.py), so a bad value in
bench/scenarios.toml or --bench-args stops --dry-run and a real run alike, naming the key to fix. Then the plan is
printed with its cost (model loads, an estimate per run and in total) and the box is checked (scripts/bench/
preflight.py: docker engine, images, GPUs for the profiles' tp-size, weights in the HF cache, free disk): a real
run stops at the first gap with one message and writes nothing; --dry-run lists every check. A docker engine lost
during the plan stops the plan (the results so far are reported), instead of failing every later variant.

Order: the repeats go round the variants forward then backward (A B, B A, A B, ...: --order aba), so drift over the
session (up to ~7% on this box class) weighs on each variant alike; adjacent runs of a variant share one server.

Exit status: 0 fine; 1 a regression against --baseline (tok/s median more than --max-tok-s-drop % lower, accept
length more than --max-accept-drop lower), or a verify forward off its CUDA graph (eager or piecewise) with
--fail-on-eager; 2 a usage error, a
scenario bench_serving refuses, or a box that cannot run the plan (preflight; or the engine lost mid-plan);
4 some runs produced no result.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import re
import shlex
import socket
import sys
import tempfile
import time
from pathlib import Path

from ..lib.cli import run
from ..lib.errors import UserError
from ..lib.progress import say
from ..lib.repo import revision
from ..host.exposure import client_key
from ..lib.http import use_api_key
from ..series.sglang_pkg import package_or_tree
from . import config as cfg
from . import preflight
from . import report as rep
from . import sweep
from .client import Client, bench_serving_cmd, check_bench_args, resolve_client, run_bench_serving
from .launch import Server
from .numbers import duration, num
from .observe import Sampler, accept_length_from_metrics, internal_state, metrics_parser, take_snapshot, verify_delta

SCHEMA = "eagle-bench/1"
EXIT_REGRESSION, EXIT_RUNS_FAILED = 1, 4


@dataclasses.dataclass
class RunOptions:
    """How each bench_serving run goes (from the command line)."""

    client_model: str | None
    bench_args: list[str]
    sample_interval: float
    run_timeout: float
    verbose: bool
    order: str


@dataclasses.dataclass
class ReportOptions:
    """What to compare the results with and what to write besides them."""

    baseline: str | None  # "" for bench/baselines/<box>.json, None for no comparison
    write_baseline: str | None
    max_tok_s_drop: float | None
    max_accept_drop: float | None
    fail_on_eager: bool


def utcnow() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def iso(t: _dt.datetime) -> str:
    return t.isoformat(timespec="seconds")


def box_name(given: str | None) -> str:
    name = given or socket.gethostname().split(".")[0] or "box"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "box"


# -------------------------------------------------------------------------------------------------------------
# one run


def eta(durations: list[float], remaining: list[float], launch_s: list[float], remaining_launches: int,
        load_estimate: float) -> str:
    """Time left: the remaining runs at the mean measured duration (their estimates until one has run), plus the
    remaining launches at the mean measured launch (the estimate until one has happened)."""
    if not remaining:
        return "ETA 0s"
    s = sum(durations) / len(durations) * len(remaining) if durations else sum(remaining)
    s += (sum(launch_s) / len(launch_s) if launch_s else load_estimate) * remaining_launches
    return f"ETA {duration(s)}" + ("" if durations else " (estimated)")


def one_line(rec: dict) -> str:
    e = rec["eagle"]
    m = rep.run_metrics(rec)
    v = e.get("verify")
    parts = [f"decode {num(m['decode_tok_s'], small=True)} tok/s", f"output {num(m['output_tok_s'], small=True)} tok/s",
             f"TTFT {num(m['ttft_ms'], small=True)} ms", f"ITL {num(m['itl_ms'], 2)} ms",
             f"AL {num(m['accept_length'], 3)}"]
    if isinstance(v, dict):
        off = int(v.get("eager", 0)) + int(v.get("piecewise", 0))
        parts.append(f"verify {v['graph']} graph / {off} off-graph" + (" ⚠" if off else ""))
    return ", ".join(parts)


def do_run(r: cfg.Run, total: int, target: Server, patch: dict, client: Client, opts: RunOptions,
           meta: dict, tmpdir: Path, log_path: Path) -> tuple[dict | None, str]:
    """Run bench_serving once with the server observed around it. (record with "eagle", '') or (None, why)."""
    env = client.env
    out = tmpdir / f"run{r.index}.jsonl"
    tag = f"{r.scenario.name}/{r.variant.name}/r{r.repeat}"
    cmd = bench_serving_cmd(client.command(), target.url, r.scenario.bench_args(), out, tag, meta["tokenizer"],
                            opts.client_model, opts.bench_args)
    started = utcnow()
    t0 = time.monotonic()
    before = take_snapshot(target.url)
    sampler = Sampler(target.url, opts.sample_interval).start()
    try:
        rc, rec, tail = run_bench_serving(cmd, env, out, log_path, sampler.mark_start, sampler.mark_end,
                                          opts.run_timeout, echo=opts.verbose)
    finally:
        decode = sampler.stop()
    after = take_snapshot(target.url)
    if rc != 0 or rec is None:
        return None, f"bench_serving exit {rc}{'' if rec else ', no record'}; its last lines:\n" + "\n".join(
            "  | " + ln for ln in tail.splitlines()[-15:])
    if not rec.get("completed"):
        return None, "bench_serving completed no request (see " + str(log_path) + ")"
    info = after.server_info or before.server_info or {}
    rec["eagle"] = {
        "schema": SCHEMA,
        "scenario": r.scenario.name, "scenario_spec": r.scenario.to_dict(),
        "variant": r.variant.name, "variant_spec": r.variant.to_dict(),
        "letter": r.letter, "repeat": r.repeat, "round": r.round, "position": r.index, "plan_size": total,
        "order": opts.order,
        "server_url": target.url, "launched": target.kind != "server", "launch_s": target.launch_s,
        "speculative_algorithm": info.get("speculative_algorithm"),
        "patchset": patch.get("patchset", "unknown"), "patches": patch.get("patches"),
        "patchset_detail": patch.get("detail") or patch.get("image") or patch.get("sglang"),
        "git_rev": meta["git_rev"], "git_dirty": meta["git_dirty"], "box": meta["box"],
        "started_at": iso(started), "finished_at": iso(utcnow()), "wall_s": round(time.monotonic() - t0, 3),
        **decode,
        "verify": verify_delta(before, after),
        "accept_length_metrics": accept_length_from_metrics(before, after),
        "avg_spec_accept_length_after": internal_state(after.server_info).get("avg_spec_accept_length"),
        "failed_requests": max(0, r.scenario.num_prompts - int(rec.get("completed") or 0)),
        "bench_serving_cmd": cmd,
    }
    return rec, ""


# -------------------------------------------------------------------------------------------------------------
# reports


def _compare(checks: list | None, baseline_path: Path | None) -> int:
    """Say what the baseline comparison found; EXIT_REGRESSION when a metric regressed."""
    if checks is None:
        return 0
    for c in checks:
        if c.status in ("not run", "not measured"):
            say(f"note: {c.scenario} / {c.variant} {rep.LABELS[c.metric]}: {c.status} (in the baseline)")
    bad = [c for c in checks if c.status == "REGRESSION"]
    if not bad:
        say(f"no regression against {baseline_path} ({sum(c.status == 'ok' for c in checks)} checks)")
        return 0
    print(f"REGRESSION against {baseline_path} ({len(bad)}):", file=sys.stderr)
    for c in bad:
        print(f"  {c.line()}", file=sys.stderr)
    return EXIT_REGRESSION


def write_reports(records: list[dict], stem_path: Path, meta: dict, opts: ReportOptions) -> int:
    """The .md and .png next to the results; baseline comparison and writing. Returns the exit status."""
    rows = rep.summarize(records)
    baseline_path = default_path(opts.baseline, meta["box"]) if opts.baseline is not None else None
    baseline = rep.load_baseline(baseline_path) if baseline_path else None
    th = rep.thresholds(baseline, opts.max_tok_s_drop, opts.max_accept_drop)
    checks = rep.compare(rows, baseline, th) if baseline else None
    md = stem_path.with_suffix(".md")
    md.write_text(rep.markdown(rows, meta, checks, str(baseline_path) if baseline_path else None))
    png = stem_path.with_suffix(".png")
    if rep.plot(rows, png, title=f"{stem_path.name} · patch sets: " + ", ".join(
            sorted({p for r in rows for p in r.patchsets}))):
        say(f"report: {md} and {png}")
    else:
        say(f"report: {md} (no plot: matplotlib is not installed for {sys.executable})")
    for r in rows:
        if r.eager:
            say(f"⚠ {r.scenario} / {r.variant}: {r.eager} verify forward(s) off their CUDA graph: "
                + ", ".join(f"{k}: {n}" for k, n in sorted(r.eager_reasons.items())))
    if opts.write_baseline is not None:
        bp = default_path(opts.write_baseline, meta["box"])
        bp.parent.mkdir(parents=True, exist_ok=True)
        bp.write_text(json.dumps(rep.make_baseline(rows, meta, th), indent=1) + "\n")
        say(f"baseline written: {bp} ({len(rows)} scenario x variant entries)")
    status = _compare(checks, baseline_path)
    if opts.fail_on_eager and any(r.eager for r in rows):
        print("verify forwards off their CUDA graph found (--fail-on-eager)", file=sys.stderr)
        status = EXIT_REGRESSION
    return status


def default_path(given: str, box: str) -> Path:
    return Path(given) if given else cfg.BASELINES_DIR / f"{box}.json"


def report_only(path: Path, box: str | None, opts: ReportOptions) -> int:
    records = rep.load_results(path)
    if not records:
        raise UserError(f"{path} holds no runs")
    e0 = records[0]["eagle"]
    meta = {"stem": path.stem, "box": box or e0.get("box"), "git_rev": e0.get("git_rev"), "source": str(path),
            "runs": len(records), "started_at": e0.get("started_at"),
            "finished_at": records[-1]["eagle"].get("finished_at")}
    return write_reports(records, path.with_suffix(""), meta, opts)


# -------------------------------------------------------------------------------------------------------------
# main


def parse(argv: list[str] | None):
    argv = list(sys.argv[1:] if argv is None else argv)
    server_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, server_args = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(prog="scripts.bench.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_argument_group("what to run")
    g.add_argument("--scenarios", help="comma list of scenario names (default: those marked default)")
    g.add_argument("--variants", help="comma list of variant names, in A, B, C order (default: those marked default)")
    g.add_argument("--repeats", type=int, help="runs per scenario x variant (default 3; a sweep file's repeats)")
    g.add_argument("--order", choices=cfg.ORDERS,
                   help="aba: rounds go forward then backward over the variants (default); blocked: A's repeats "
                        "then B's")
    g.add_argument("--scenarios-file", type=Path, default=cfg.DEFAULT_SCENARIOS, help="default bench/scenarios.toml")
    g.add_argument("--variants-file", type=Path, default=cfg.DEFAULT_VARIANTS, help="default bench/variants.toml")
    g.add_argument("--sweep", nargs="?", const=str(sweep.SWEEP_FILE), metavar="FILE",
                   help="run the drafter and speculative-settings sweep of FILE (default bench/sweep.toml) "
                        "instead of the variants; --variants then picks among its points and references")
    g.add_argument("--server-url", action="append", default=[], metavar="[NAME=]URL",
                   help="bench a running server instead of launching variants (repeat for several)")
    g.add_argument("--patchset", action="append", default=[], metavar="[NAME=]ID",
                   help="patch set of a --server-url server (else recorded as unknown)")
    g = ap.add_argument_group("servers the harness launches")
    g.add_argument("--model", help="model path or id for {model} (default: [defaults] model)")
    g.add_argument("--draft-model", help="EAGLE-3 draft model for {draft_model}")
    g.add_argument("--hf-cache", help="host HF cache mounted into containers (default ~/.cache/huggingface)")
    g.add_argument("--port", type=int, help="port of launched servers (default: [defaults] port, 30000)")
    g.add_argument("--launch-timeout", type=float, default=3600, help="seconds to wait for a server (default 3600)")
    g = ap.add_argument_group("client")
    g.add_argument("--tokenizer", help="tokenizer for bench_serving (default: the model for launched servers; the "
                                       "server's /model_info otherwise)")
    g.add_argument("--client-model", help="--model for bench_serving (default: asked from /v1/models)")
    g.add_argument("--client-python", help="python that runs sglang.benchmark.serving (default: .venv, then this "
                                           "one, with build/sglang/python when it has no sglang, then the image)")
    g.add_argument("--client-image", nargs="?", const="", metavar="IMAGE",
                   help="run sglang.benchmark.serving from this image (default: the serving image) on the host's "
                        "network")
    g.add_argument("--bench-args", help="extra bench_serving arguments, one shell-quoted string")
    g.add_argument("--api-key-file", metavar="FILE",
                   help="file holding the servers' API key (else $SGLANG_API_KEY, as serve reads it); the harness "
                        "and bench_serving send it")
    g.add_argument("--sample-interval", type=float, default=1.0, help="seconds between server stats samples")
    g.add_argument("--run-timeout", type=float, default=3600, help="seconds one bench_serving may take")
    g = ap.add_argument_group("results")
    g.add_argument("--box", help="box name in file names and records (default: the host name)")
    g.add_argument("--results-dir", type=Path, default=cfg.RESULTS_DIR, help="default bench/results")
    g.add_argument("--baseline", nargs="?", const="", metavar="FILE",
                   help="compare with this baseline (FILE omitted: bench/baselines/<box>.json)")
    g.add_argument("--write-baseline", nargs="?", const="", metavar="FILE",
                   help="write the medians of this run as a baseline (FILE omitted: bench/baselines/<box>.json)")
    g.add_argument("--max-tok-s-drop", type=float, help="allowed tok/s drop in %% (default: baseline's, else 5)")
    g.add_argument("--max-accept-drop", type=float, help="allowed accept length drop (default: baseline's, else 0.05)")
    g.add_argument("--fail-on-eager", action="store_true",
                   help="exit 1 when any verify forward ran off its CUDA graph (eager or piecewise)")
    g.add_argument("--report", metavar="RESULTS.jsonl", help="only rebuild report (and compare) for a results file")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the commands; run nothing")
    ap.add_argument("--check", action="store_true",
                    help="run the real run's checks, start nothing, print {estimate_s, runs, runs_left} as JSON "
                         "(make report's preflight); exit 2 naming the first gap")
    ap.add_argument("--resume", action="store_true",
                    help="skip the runs of the plan that a results file under --results-dir already holds")
    ap.add_argument("--list", action="store_true", help="list scenarios and variants")
    ap.add_argument("--verbose", "-v", action="store_true", help="echo bench_serving's output")
    a = ap.parse_args(argv)
    if a.sample_interval <= 0:
        ap.error("--sample-interval must be positive")
    return a, server_args


def list_inputs(scenarios_file: Path, vset: cfg.VariantSet | None) -> None:
    print("scenarios (" + str(scenarios_file) + "):")
    for s in cfg.load_scenarios(scenarios_file, everything=True):
        print(f"  {s.name:10} C{s.max_concurrency:<4} {s.num_prompts:>4} prompts, in {s.input_len} / out "
              f"{s.output_len}  {'' if s.default else '(not default) '}{s.description}")
    if vset:
        print("variants (" + str(vset.path) + "):")
        for v in vset.variants:
            print(f"  {v.name:28} {v.launcher:7} {'spec' if v.speculative else 'nospec':6} "
                  f"{'' if v.default else '(not default) '}{v.description}")


def sweep_variants(a: argparse.Namespace, vset: cfg.VariantSet | None, server_args: list[str],
                   hf_cache: str) -> list[cfg.Variant]:
    """The sweep's points (and references) as variants, each checked against the serving SGLang's rules."""
    sw = sweep.load(Path(a.sweep))
    if a.server_url or vset is None:
        raise UserError("--sweep launches its servers from bench/variants.toml; drop --server-url")
    if a.draft_model:
        raise UserError(f"--draft-model sets the drafter of the variants, but a sweep's drafters are its own "
                        f"(drafters = [...] in {sw.path}); edit that list, or drop --sweep")
    pkg = package_or_tree()
    if not (pkg / "srt").is_dir():
        raise UserError(f"--sweep checks every point against SGLang's own rules, read from its source, and finds "
                        f"none at {pkg}: run make apply (build/sglang), or run from an environment with sglang")
    out = sweep.variants(sw, vset, sweep.Rules(pkg, Path(hf_cache) / "hub"), server_args)
    for k, given in (("scenarios", a.scenarios), ("repeats", a.repeats), ("order", a.order)):
        if given is None:
            setattr(a, k, getattr(sw, k))
            if getattr(sw, k) is not None:
                say(f"{k} {getattr(a, k)} from {sw.path} (pass --{k} to change)")
    say(f"sweep {sw.path}: {len(sw.points)} point(s) ({len(sw.reference)} reference variant(s) besides), checked "
        f"against SGLang at {pkg}")
    return cfg.pick_variants(cfg.VariantSet(out, vset.defaults, sw.path), a.variants)


def chosen_variants(a: argparse.Namespace, vset: cfg.VariantSet | None) -> list[cfg.Variant]:
    if a.server_url:
        if a.variants:
            raise UserError("--variants picks variants to launch; with --server-url, name the servers NAME=URL")
        return cfg.server_variants(a.server_url, a.patchset, vset)
    if a.patchset:
        raise UserError("--patchset is for --server-url servers; launched servers are inspected")
    return cfg.pick_variants(vset, a.variants)


def print_dry_run(plan: list[cfg.Run], sess: list, servers: dict[str, Server], results: Path, tokenizer: str | None,
                  opts: RunOptions) -> None:
    print(f"results would go to {results}; the server sessions and bench_serving commands:")
    for s in sess:
        print(f"  session {s[0].variant.name} ({s[0].letter}): {servers[s[0].variant.name].describe()}")
        for r in s:
            cmd = bench_serving_cmd(["PYTHON"], servers[r.variant.name].url, r.scenario.bench_args(),
                                    Path("OUT.jsonl"), f"{r.scenario.name}/{r.variant.name}/r{r.repeat}",
                                    tokenizer, opts.client_model, opts.bench_args)
            print(f"    {r.label(len(plan))}: {shlex.join(cmd[1:])}")


def check_scenarios(scenarios: list[cfg.Scenario], path: Path, client: Client, tokenizer: str | None,
                    opts: RunOptions) -> None:
    """Every scenario's bench_serving command, judged by bench_serving itself (its parser, its dataset code) before
    any server starts; a UserError naming the scenario key (or option) to fix."""
    cmds = {s.name: bench_serving_cmd(["PY"], "http://127.0.0.1:30000", s.bench_args(), Path("OUT.jsonl"), s.name,
                                      tokenizer, opts.client_model, opts.bench_args)[3:] for s in scenarios}
    refused = check_bench_args(client, cmds)
    downloads = {n: said for n, (_, said) in refused.items() if said.startswith("downloads ")}
    offline = preflight.hub_offline() if downloads else ""
    for n, said in downloads.items():
        del refused[n]
        if offline:
            refused[n] = ("", f"its dataset {said} when it runs, and this box cannot ({offline}): the run would "
                              f"fail after the servers loaded")
        else:
            say(f"note: scenario {n}: its dataset {said} when it runs (the Hub answers here)")
    if not refused:
        return
    lines = []
    for s in scenarios:
        if s.name not in refused:
            continue
        flag, said = refused[s.name]
        if s.name in downloads:
            lines.append(f"scenario {s.name}: {said}\n    Fix: download it where the Hub answers and pass it with "
                         f"extra_args = [\"--dataset-path\", \"FILE\"] in [[scenario]] {s.name}, or set dataset_name "
                         f"= \"random-ids\" (prompts made here)")
            continue
        key = cfg.SCENARIO_FLAGS.get(flag)
        if key:
            fix = f"set {key} in [[scenario]] {s.name} (or [defaults]) to a value bench_serving's {flag} takes"
        elif flag and flag in s.extra_args:
            fix = f"fix or remove {flag} in extra_args of [[scenario]] {s.name}"
        elif flag and flag in opts.bench_args:
            fix = f"fix or remove {flag} in --bench-args"
        else:
            fix = f"check [[scenario]] {s.name} and --bench-args against python -m sglang.benchmark.serving --help"
        lines.append(f"scenario {s.name}: bench_serving refuses it: {said}\n    Fix: {fix}")
    raise UserError(f"{path}: {len(lines)} scenario(s) would fail only after the servers loaded:\n  "
                    + "\n  ".join(lines))


@dataclasses.dataclass
class Session:
    """Progress of the whole plan: what ran, how long runs and launches took, what failed."""

    plan: list[cfg.Run]
    sessions: list[list[cfg.Run]]
    results: Path
    client_log: Path
    records: list[dict] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)
    durations: list[float] = dataclasses.field(default_factory=list)
    launch_s: list[float] = dataclasses.field(default_factory=list)
    run_estimates: dict[str, float] = dataclasses.field(default_factory=dict)  # scenario -> seconds
    load_estimate: float = preflight.ASSUMED_LOAD_S
    earlier: list[dict] = dataclasses.field(default_factory=list)  # --resume: the plan's records from before


def run_server_session(si: int, runs: list[cfg.Run], server: Server, st: Session, client: Client, opts: RunOptions,
                       meta: dict, tmp: Path, launch_timeout: float) -> None:
    """Start one server, run its consecutive runs (each record appended to the results as it ends), stop it."""
    total = len(st.plan)
    t0 = time.monotonic()
    try:
        try:
            server.start(launch_timeout)
        except preflight.InfraError:
            raise
        except UserError as e:
            st.failures += [f"{r.label(total)}: server did not start: {e}" for r in runs]
            say(f"{runs[0].variant.name}: {e}")
            return
        if server.kind != "server":
            st.launch_s.append(time.monotonic() - t0)
        patch = server.patch_info()
        say(f"{server.variant.name}: patch set {patch.get('patchset')}"
            + (f" ({len(patch['patches'])} patches)" if patch.get("patches") else "")
            + (f"; {patch['detail']}" if patch.get("detail") else ""))
        for r in runs:
            launches_left = sum(1 for x in st.sessions[si + 1:] if x[0].variant.launcher != "server")
            left = [st.run_estimates.get(x.scenario.name, 0.0) for x in st.plan[st.plan.index(r):]]
            say(f"{r.label(total)}... {eta(st.durations, left, st.launch_s, launches_left, st.load_estimate)}")
            t1 = time.monotonic()
            rec, why = do_run(r, total, server, patch, client, opts, meta, tmp, st.client_log)
            st.durations.append(time.monotonic() - t1)
            if rec is None:
                st.failures.append(f"{r.label(total)}: {why}")
                say(f"{r.label(total)} FAILED: {why}")
                continue
            with open(st.results, "a") as f:  # append-only, one line per run, written as each run ends
                f.write(json.dumps(rec) + "\n")
            st.records.append(rec)
            say(f"{r.label(total)} done in {duration(st.durations[-1])}: {one_line(rec)}")
            if rec["eagle"]["failed_requests"]:
                say(f"  ⚠ {rec['eagle']['failed_requests']} request(s) failed in this run")
    finally:
        server.stop()


def finish(st: Session, stem_path: Path, meta: dict, opts: ReportOptions) -> int:
    meta.update(runs=len(st.records), failed=len(st.failures), finished_at=iso(utcnow()))
    if not st.records:
        for f in st.failures:
            print(f"  {f}", file=sys.stderr)
        print(f"no run produced a result ({len(st.failures)} failed)", file=sys.stderr)
        return EXIT_RUNS_FAILED
    say(f"results: {st.results} ({len(st.records)} runs)")
    status = write_reports(st.earlier + st.records, stem_path, meta, opts)
    if st.failures:
        print(f"{len(st.failures)} run(s) produced no result:", file=sys.stderr)
        for f in st.failures:
            print(f"  {f}", file=sys.stderr)
        return status or EXIT_RUNS_FAILED
    return status


def options(a: argparse.Namespace) -> tuple[RunOptions, ReportOptions]:
    return (RunOptions(a.client_model, shlex.split(a.bench_args or ""), a.sample_interval, a.run_timeout, a.verbose,
                       a.order),
            ReportOptions(a.baseline, a.write_baseline, a.max_tok_s_drop, a.max_accept_drop, a.fail_on_eager))


def announce(lines: list[str], dry_run: bool) -> None:
    for line in lines:
        print(line) if dry_run else say(line)


def preflight_report(needs: dict, hf_cache: Path, results_dir: Path) -> None:
    """--dry-run: every check of a real run, passed or not (a real run stops at the first failure)."""
    print("preflight (a real run stops at the first failure):")
    for n in needs.values():
        if n.note:
            print(f"  note: {n.variant}: {n.note}")
    for c in preflight.checks(list(needs.values()), hf_cache, results_dir, stop_at_first=False):
        print(f"  {'ok ' if c.ok else 'FAIL'} {c.name}: {c.detail}" + ("" if c.ok else f" -- fix: {c.fix}"))


def run_plan(st: Session, servers: dict[str, Server], client: Client, opts: RunOptions, meta: dict,
             launch_timeout: float) -> str:
    """Every server session in turn; '' or why the whole plan stopped (the box failed, not a variant)."""
    with tempfile.TemporaryDirectory(prefix="eagle-bench-") as tmp:
        client.mounts.append(str(Path(tmp).resolve()))  # bench_serving's output file, also from the image
        for si, runs in enumerate(st.sessions):
            try:
                run_server_session(si, runs, servers[runs[0].variant.name], st, client, opts, meta, Path(tmp),
                                   launch_timeout)
            except preflight.InfraError as e:
                left = [r for s in st.sessions[si:] for r in s]
                st.failures += [f"{r.label(len(st.plan))}: not run (the plan stopped)" for r in left]
                return str(e)
    return ""


def resumed(plan: list[cfg.Run], results_dir: Path) -> tuple[list[cfg.Run], list[dict]]:
    """--resume: (the runs of the plan that no results file in results_dir holds yet, the records it holds). A run
    is held when a record has its scenario, variant and repeat with the same scenario and variant specs."""
    records = [rec for f in sorted(results_dir.glob("*.jsonl")) if results_dir.is_dir()
               for rec in rep.load_results(f)]
    keys = {(r.scenario.name, r.variant.name, r.repeat): r for r in plan}
    held = [rec for rec in records if (k := (rec["eagle"].get("scenario"), rec["eagle"].get("variant"),
                                             rec["eagle"].get("repeat"))) in keys
            and rec["eagle"].get("scenario_spec") == keys[k].scenario.to_dict()
            and rec["eagle"].get("variant_spec") == keys[k].variant.to_dict()]
    done = {(e["scenario"], e["variant"], e["repeat"]) for e in (rec["eagle"] for rec in held)}
    left = [dataclasses.replace(r, index=i) for i, r in enumerate(
        (r for r in plan if (r.scenario.name, r.variant.name, r.repeat) not in done), 1)]
    if held:
        say(f"resuming: {len(plan) - len(left)} of {len(plan)} run(s) already in {results_dir}, {len(left)} to go")
    return left, held


def setup_client(a: argparse.Namespace, vals: dict, tokenizer: str | None, launch_mode: bool) -> Client:
    """Where bench_serving runs (client.resolve_client), with what it needs from here: the tokenizer's path or the
    HF cache, the servers' API key. This python's own need (prometheus_client, for /metrics) goes in the same
    message as the client's."""
    try:
        metrics_parser()
        harness = ""
    except UserError as e:
        harness = str(e)
    try:
        client = resolve_client(a.client_python, a.client_image, vals["hf_cache"])
    except UserError as e:
        raise UserError(f"{e}" + (f"\nAnd this harness: {harness}" if harness else "")) from None
    if harness:
        raise UserError(harness)
    client.mounts += [tokenizer] if tokenizer and Path(tokenizer).exists() else []
    if launch_mode and not client.image and "HF_HOME" not in client.env and a.hf_cache:
        client.env["HF_HOME"] = vals["hf_cache"]  # the client's tokenizer from the cache the servers use
    announce([f"bench_serving runs from {client.note}"], a.dry_run)
    send_api_key(a.api_key_file, client.env, a.dry_run)
    return client


def send_api_key(key_file: str | None, client_env: dict[str, str], dry_run: bool) -> None:
    """The servers' API key from where serve reads it ($SGLANG_API_KEY or --api-key-file), sent by the harness's
    requests and by bench_serving (its $OPENAI_API_KEY, in its environment only: on no command line, in no log)."""
    key, source = client_key(dict(os.environ), key_file)
    use_api_key(key, source)
    if not key:
        return
    if client_env.get("OPENAI_API_KEY") not in (None, key):
        say(f"note: OPENAI_API_KEY is set here; bench_serving gets the servers' key from {source} instead")
    client_env["OPENAI_API_KEY"] = key
    announce([f"API key: from {source}, sent with every request (the harness's and bench_serving's)"], dry_run)


def main(argv: list[str] | None = None) -> int:
    a, server_args = parse(argv)
    _, report_opts = options(a)
    if a.report:
        return report_only(Path(a.report), a.box, report_opts)
    vset = cfg.load_variants(a.variants_file) if (a.variants_file.is_file() or not a.server_url) else None
    vals = cfg.placeholder_values(vset.defaults if vset else {}, {
        "model": a.model, "draft_model": a.draft_model, "hf_cache": a.hf_cache, "port": a.port,
        "tokenizer": a.tokenizer})
    variants = sweep_variants(a, vset, server_args, vals["hf_cache"]) if a.sweep else None
    a.repeats = 3 if a.repeats is None else a.repeats
    a.order = a.order or "aba"
    run_opts, _ = options(a)
    scenarios = cfg.load_scenarios(a.scenarios_file, a.scenarios)
    if a.list:
        list_inputs(a.scenarios_file, vset if variants is None else cfg.VariantSet(variants, {}, Path(a.sweep)))
        return 0
    variants = variants or chosen_variants(a, vset)
    plan = cfg.make_plan(scenarios, variants, a.repeats, a.order)
    box = box_name(a.box)
    rev, dirty = revision(short=True)
    started = utcnow()
    stem = f"{started:%Y%m%dT%H%M%SZ}_{rev}{'-dirty' if dirty else ''}_{box}"
    stem_path = a.results_dir / stem
    launch_mode = not a.server_url
    tokenizer = a.tokenizer or vals.get("tokenizer") or (vals.get("model") if launch_mode else "") or None
    if tokenizer and Path(tokenizer).exists():
        tokenizer = str(Path(tokenizer).resolve())  # a local tokenizer: the same path in the client's image
    meta = {"stem": stem, "box": box, "git_rev": rev + ("-dirty" if dirty else ""), "git_dirty": dirty,
            "source": str(stem_path.with_suffix(".jsonl")), "tokenizer": tokenizer, "started_at": iso(started)}
    plan, earlier = resumed(plan, a.results_dir) if a.resume else (plan, [])
    if not plan:
        if a.check:
            print(json.dumps({"estimate_s": 0, "runs": len(earlier), "runs_left": 0}))
        else:
            say(f"every run of the plan is already in {a.results_dir} (--resume): nothing to run")
        return 0
    st = Session(plan, cfg.sessions(plan), stem_path.with_suffix(".jsonl"),
                 stem_path.with_name(f"{stem}.bench_serving.log"), earlier=earlier)
    servers = {v.name: Server(v, vals, server_args if launch_mode else [],
                              stem_path.with_name(f"{stem}.server-{v.name}.log")) for v in variants}
    client = setup_client(a, vals, tokenizer, launch_mode)
    check_scenarios(scenarios, a.scenarios_file, client, tokenizer, run_opts)
    needs = {n: preflight.variant_needs(srv) for n, srv in servers.items() if srv.kind != "server"}
    too_many = preflight.concurrency_problems(scenarios, needs)
    if too_many:
        raise UserError(f"{a.scenarios_file}: {len(too_many)} scenario(s) would not measure what they say:\n  "
                        + "\n  ".join(too_many))
    if a.check:  # make report's preflight: the real run's checks, nothing started; what is left, and its cost
        preflight.checks(list(needs.values()), Path(vals["hf_cache"]), a.results_dir)
        print(json.dumps({"estimate_s": round(preflight.plan_seconds(plan, st.sessions, a.results_dir)),
                          "runs": len(plan) + len(st.earlier), "runs_left": len(plan)}))
        return 0
    announce(preflight.plan_lines(plan, st.sessions, needs, a.results_dir), a.dry_run)
    if a.dry_run:
        print_dry_run(plan, st.sessions, servers, st.results, tokenizer, run_opts)
        preflight_report(needs, Path(vals["hf_cache"]), a.results_dir)
        return 0
    preflight.checks(list(needs.values()), Path(vals["hf_cache"]), a.results_dir)
    st.run_estimates, st.load_estimate = preflight.estimates(plan, a.results_dir)
    if launch_mode and server_args:
        say(f"extra server arguments for every launched variant: {shlex.join(server_args)}")
    a.results_dir.mkdir(parents=True, exist_ok=True)
    say(f"results: {st.results}")
    stopped = run_plan(st, servers, client, run_opts, meta, a.launch_timeout)
    status = finish(st, stem_path, {**meta, "box": box}, report_opts)
    if stopped:
        raise preflight.InfraError(f"the plan stopped after {len(st.records)} run(s): {stopped}")
    return status


if __name__ == "__main__":
    run(main)
