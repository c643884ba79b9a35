"""`make bench`: A/B/A serving benchmarks (stock vs patched SGLang, speculation off vs EAGLE-3) at C1, C4, C16.

  python -m scripts.bench [--variants A,B,..] [--scenarios C1,C4] [--repeats 3] [--draft-model PATH] [-- SGLANG_ARGS]
        launch each variant of bench/variants.toml in turn (docker image or local scripts.serve) and bench it
  python -m scripts.bench --server-url [NAME=]URL [--server-url NAME=URL ..] [--patchset [NAME=]ID]
        bench servers that are already running (patch set: as declared, else "unknown")
  python -m scripts.bench --report RESULTS.jsonl        rebuild the .md/.png of a results file (and compare)
  python -m scripts.bench --dry-run | --list            print the plan and commands / the scenarios and variants
  any of them: [--baseline [FILE]] [--write-baseline [FILE]] (FILE defaults to bench/baselines/<box>.json)

Each run is SGLang's own client, `python -m sglang.benchmark.serving --backend sglang` (random-ids dataset, fixed
seed, --tokenize-prompt: works offline), whose JSONL record is kept unchanged. The harness adds an "eagle" object:
scenario, variant, repeat, A/B/A letter and position, the server's decode tok/s (sglang:gen_throughput from
/metrics, or last_gen_throughput from /server_info, sampled during the measured phase), the verify-graph counter
deltas (graph/eager forwards and eager reasons), the accept length from /metrics deltas, the server's patch set,
git revision, box and timestamps. Results go to bench/results/<UTC time>_<git rev>_<box>.jsonl (append-only), with a
markdown table (.md) and a plot (.png) of the same stem, and bench_serving's and the servers' output in .log files.

Order: the repeats go round the variants forward then backward (A B, B A, A B, ...: --order aba), so drift over the
session (up to ~7% on this box class) weighs on each variant alike; adjacent runs of a variant share one server.

Exit status: 0 fine; 1 a regression against --baseline (tok/s median more than --max-tok-s-drop % lower, accept
length more than --max-accept-drop lower), or an eager verify forward with --fail-on-eager; 2 a usage error;
4 some runs produced no result.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .lib import bench_config as cfg
from .lib import bench_report as rep
from .lib.bench_client import bench_serving_cmd, resolve_client, run_bench_serving
from .lib.bench_server import (
    Launched,
    Sampler,
    accept_length_from_metrics,
    fmt_s,
    http_get,
    internal_state,
    patchset_of_image,
    patchset_of_python,
    port_open,
    take_snapshot,
    verify_delta,
)
from .lib.cli import run
from .lib.errors import UserError
from .lib.pin import REPO_ROOT
from .lib.progress import say

SCHEMA = "eagle-bench/1"
EXIT_REGRESSION, EXIT_RUNS_FAILED = 1, 4


def utcnow() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def iso(t: _dt.datetime) -> str:
    return t.isoformat(timespec="seconds")


def box_name(given: str | None) -> str:
    name = given or socket.gethostname().split(".")[0] or "box"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "box"


def git_info() -> tuple[str, bool]:
    """(short revision, dirty) of this repository; read-only (no index refresh)."""
    try:
        rev = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short=7", "HEAD"], capture_output=True,
                             text=True, timeout=30)
        if rev.returncode != 0:
            return "nogit", False
        st = subprocess.run(["git", "--no-optional-locks", "-C", str(REPO_ROOT), "status", "--porcelain",
                             "--untracked-files=no"], capture_output=True, text=True, timeout=60)
        return rev.stdout.strip(), bool(st.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        return "nogit", False


# -------------------------------------------------------------------------------------------------------------
# servers


class Target:
    """Where one session's runs go: a server this harness launches, or one already running."""

    def __init__(self, variant: cfg.Variant, vals: dict[str, str], server_args: list[str], log_path: Path):
        self.variant, self.vals, self.server_args, self.log_path = variant, vals, server_args, log_path
        self.launches = 0
        self.launched: Launched | None = None
        self.url = variant.url if variant.launcher == "server" else f"http://127.0.0.1:{vals['port']}"
        self.argv, self.env = self._argv()

    def _argv(self) -> tuple[list[str], dict[str, str]]:
        v, vals, where = self.variant, self.vals, f"variant {self.variant.name}"
        if v.launcher == "server":
            return [], {}
        env = {k: cfg.expand(x, vals, where) for k, x in v.env}
        command = [cfg.expand(x, vals, where) for x in v.command + v.extra_args] + self.server_args
        if v.launcher == "local":
            return command, env
        self.container = f"eagle-bench-{v.name}-{os.getpid()}-{self.launches + 1}"
        argv = ["docker", "run", "-d", "--rm", "--name", self.container, "--gpus", "all", "--ipc=host",
                "--network", "host", "-v", f"{vals['hf_cache']}:/root/.cache/huggingface"]
        for k, x in env.items():
            argv += ["-e", f"{k}={x}"]
        argv += [cfg.expand(x, vals, where) for x in v.docker_args]
        return argv + [cfg.expand(v.image, vals, where)] + command, {}

    def describe(self) -> str:
        if self.variant.launcher == "server":
            return f"{self.variant.name}: running server {self.url}"
        env = " ".join(f"{k}={shlex.quote(x)}" for k, x in self.env.items())
        return f"{self.variant.name}: {env + ' ' if env else ''}{shlex.join(self.argv)}"

    def start(self, timeout: float) -> None:
        if self.variant.launcher == "server":
            if http_get(self.url + "/v1/models", 10)[0] != 200:
                raise UserError(f"{self.variant.name}: no SGLang server answers at {self.url} (GET /v1/models)")
            return
        port = self.url.rsplit(":", 1)[1]
        if port_open("127.0.0.1", int(port)):
            raise UserError(f"port {port} is already in use: a server runs there. Stop it, pass --port N, "
                            f"or benchmark it as it is with --server-url {self.url}")
        self.argv, self.env = self._argv()
        self.launches += 1
        say(f"launching {self.describe()}")
        self.launched = Launched(self.variant.name, self.argv, self.env, self.log_path, self.url,
                                 self.variant.launcher, getattr(self, "container", ""), cwd=REPO_ROOT)
        self.launched.start()
        self.launched.wait_ready(timeout)

    def stop(self) -> None:
        if self.launched is not None:
            say(f"stopping {self.variant.name}")
            self.launched.stop()
            self.launched = None

    def patch_info(self) -> dict:
        v = self.variant
        if v.launcher == "server":
            return {"patchset": v.patchset or "unknown", "detail": "declared with --patchset" if
                    v.patchset not in ("", "unknown") else "a running server: pass --patchset NAME=ID to record it"}
        if v.launcher == "docker":
            return patchset_of_image(cfg.expand(v.image, self.vals, v.name))
        return patchset_of_python(cfg.expand(v.python or "{python}", self.vals, v.name))


# -------------------------------------------------------------------------------------------------------------
# one run


def eta(durations: list[float], remaining_runs: int, launch_s: list[float], remaining_launches: int) -> str:
    if not durations:
        return "ETA ?"
    s = sum(durations) / len(durations) * remaining_runs
    if launch_s:
        s += sum(launch_s) / len(launch_s) * remaining_launches
    return f"ETA {fmt_s(s)}"


def one_line(rec: dict) -> str:
    e = rec["eagle"]
    m = rep.run_metrics(rec)
    v = e.get("verify")
    parts = [f"decode {rep._fmt(m['decode_tok_s'])} tok/s", f"output {rep._fmt(m['output_tok_s'])} tok/s",
             f"TTFT {rep._fmt(m['ttft_ms'])} ms", f"ITL {rep._fmt(m['itl_ms'], 2)} ms",
             f"AL {rep._fmt(m['accept_length'], 3)}"]
    if isinstance(v, dict):
        parts.append(f"verify {v['graph']} graph / {v['eager']} eager" + (" ⚠" if v["eager"] else ""))
    return ", ".join(parts)


def do_run(r: cfg.Run, total: int, target: Target, patch: dict, client: tuple[str, dict, str], a, meta: dict,
           tmpdir: Path, log_path: Path) -> tuple[dict | None, str]:
    """Run bench_serving once with the server observed around it. (record with "eagle", '') or (None, why)."""
    py, env, _ = client
    out = tmpdir / f"run{r.index}.jsonl"
    tag = f"{r.scenario.name}/{r.variant.name}/r{r.repeat}"
    cmd = bench_serving_cmd(py, target.url, r.scenario.bench_args(), out, tag, meta["tokenizer"], a.client_model,
                            shlex.split(a.bench_args or ""))
    started = utcnow()
    t0 = time.monotonic()
    before = take_snapshot(target.url)
    sampler = Sampler(target.url, a.sample_interval).start()
    try:
        rc, rec, tail = run_bench_serving(cmd, env, out, log_path, sampler.mark_start, sampler.mark_end,
                                          a.run_timeout, echo=a.verbose)
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
        "order": a.order,
        "server_url": target.url, "launched": target.launched is not None,
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


def write_reports(records: list[dict], stem_path: Path, meta: dict, a) -> int:
    """The .md and .png next to the results; baseline comparison and writing. Returns the exit status."""
    rows = rep.summarize(records)
    baseline_path = default_path(a.baseline, meta["box"]) if a.baseline is not None else None
    baseline = rep.load_baseline(baseline_path) if baseline_path else None
    th = rep.thresholds(baseline, a.max_tok_s_drop, a.max_accept_drop)
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
            say(f"⚠ {r.scenario} / {r.variant}: {r.eager} eager verify forward(s): "
                + ", ".join(f"{k}: {n}" for k, n in sorted(r.eager_reasons.items())))
    if a.write_baseline is not None:
        bp = default_path(a.write_baseline, meta["box"])
        bp.parent.mkdir(parents=True, exist_ok=True)
        bp.write_text(json.dumps(rep.make_baseline(rows, meta, th), indent=1) + "\n")
        say(f"baseline written: {bp} ({len(rows)} scenario x variant entries)")
    status = 0
    if checks is not None:
        bad = [c for c in checks if c.status == "REGRESSION"]
        for c in checks:
            if c.status in ("not run", "not measured"):
                say(f"note: {c.scenario} / {c.variant} {rep.LABELS[c.metric]}: {c.status} (in the baseline)")
        if bad:
            print(f"REGRESSION against {baseline_path} ({len(bad)}):", file=sys.stderr)
            for c in bad:
                print(f"  {c.line()}", file=sys.stderr)
            status = EXIT_REGRESSION
        else:
            say(f"no regression against {baseline_path} ({sum(c.status == 'ok' for c in checks)} checks)")
    if a.fail_on_eager and any(r.eager for r in rows):
        print("eager verify forwards found (--fail-on-eager)", file=sys.stderr)
        status = EXIT_REGRESSION
    return status


def default_path(given: str, box: str) -> Path:
    return Path(given) if given else cfg.BASELINES_DIR / f"{box}.json"


def report_only(a) -> int:
    path = Path(a.report)
    records = rep.load_results(path)
    if not records:
        raise UserError(f"{path} holds no runs")
    e0 = records[0]["eagle"]
    meta = {"stem": path.stem, "box": e0.get("box"), "git_rev": e0.get("git_rev"), "source": str(path),
            "runs": len(records), "started_at": e0.get("started_at"),
            "finished_at": records[-1]["eagle"].get("finished_at")}
    a.box = a.box or meta["box"]
    meta["box"] = a.box
    return write_reports(records, path.with_suffix(""), meta, a)


# -------------------------------------------------------------------------------------------------------------
# main


def parse(argv: list[str] | None):
    argv = list(sys.argv[1:] if argv is None else argv)
    server_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, server_args = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(prog="scripts.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_argument_group("what to run")
    g.add_argument("--scenarios", help="comma list of scenario names (default: those marked default)")
    g.add_argument("--variants", help="comma list of variant names, in A, B, C order (default: those marked default)")
    g.add_argument("--repeats", type=int, default=3, help="runs per scenario x variant (default 3)")
    g.add_argument("--order", choices=cfg.ORDERS, default="aba",
                   help="aba: rounds go forward then backward over the variants (default); blocked: A's repeats "
                        "then B's")
    g.add_argument("--scenarios-file", type=Path, default=cfg.DEFAULT_SCENARIOS, help="default bench/scenarios.toml")
    g.add_argument("--variants-file", type=Path, default=cfg.DEFAULT_VARIANTS, help="default bench/variants.toml")
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
    g.add_argument("--client-python", help="python that runs sglang.benchmark.serving (default: this one, then "
                                           ".venv, with build/sglang/python when it has no sglang)")
    g.add_argument("--bench-args", help="extra bench_serving arguments, one shell-quoted string")
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
    g.add_argument("--fail-on-eager", action="store_true", help="exit 1 when any verify forward ran eagerly")
    g.add_argument("--report", metavar="RESULTS.jsonl", help="only rebuild report (and compare) for a results file")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the commands; run nothing")
    ap.add_argument("--list", action="store_true", help="list scenarios and variants")
    ap.add_argument("--verbose", "-v", action="store_true", help="echo bench_serving's output")
    a = ap.parse_args(argv)
    if a.sample_interval <= 0:
        ap.error("--sample-interval must be positive")
    return a, server_args


def main(argv: list[str] | None = None) -> int:
    a, server_args = parse(argv)
    if a.report:
        return report_only(a)
    scenarios = cfg.load_scenarios(a.scenarios_file, a.scenarios)
    vset = cfg.load_variants(a.variants_file) if (a.variants_file.is_file() or not a.server_url) else None
    if a.list:
        print("scenarios (" + str(a.scenarios_file) + "):")
        for s in cfg.load_scenarios(a.scenarios_file, everything=True):
            print(f"  {s.name:10} C{s.max_concurrency:<4} {s.num_prompts:>4} prompts, in {s.input_len} / out "
                  f"{s.output_len}  {'' if s.default else '(not default) '}{s.description}")
        if vset:
            print("variants (" + str(vset.path) + "):")
            for v in vset.variants:
                print(f"  {v.name:28} {v.launcher:7} {'spec' if v.speculative else 'nospec':6} "
                      f"{'' if v.default else '(not default) '}{v.description}")
        return 0
    if a.server_url:
        if a.variants:
            raise UserError("--variants picks variants to launch; with --server-url, name the servers NAME=URL")
        variants = cfg.server_variants(a.server_url, a.patchset, vset)
    else:
        if a.patchset:
            raise UserError("--patchset is for --server-url servers; launched servers are inspected")
        variants = cfg.pick_variants(vset, a.variants)
    plan = cfg.make_plan(scenarios, variants, a.repeats, a.order)
    vals = cfg.placeholder_values(vset.defaults if vset else {}, {
        "model": a.model, "draft_model": a.draft_model, "hf_cache": a.hf_cache, "port": a.port,
        "tokenizer": a.tokenizer})
    box = box_name(a.box)
    rev, dirty = git_info()
    started = utcnow()
    stem = f"{started:%Y%m%dT%H%M%SZ}_{rev}{'-dirty' if dirty else ''}_{box}"
    stem_path = a.results_dir / stem
    results = stem_path.with_suffix(".jsonl")
    launch_mode = not a.server_url
    tokenizer = a.tokenizer or vals.get("tokenizer") or (vals.get("model") if launch_mode else "") or None
    meta = {"stem": stem, "box": box, "git_rev": rev + ("-dirty" if dirty else ""), "git_dirty": dirty,
            "source": str(results), "tokenizer": tokenizer, "started_at": iso(started)}
    a.box = box
    sess = cfg.sessions(plan)
    targets = {v.name: Target(v, vals, server_args if launch_mode else [],
                              stem_path.with_name(f"{stem}.server-{v.name}.log")) for v in variants}
    if a.dry_run:
        print(f"plan: {len(plan)} runs in {len(sess)} server session(s); results would go to {results}")
        for s in sess:
            print(f"  session {s[0].variant.name} ({s[0].letter}): {targets[s[0].variant.name].describe()}")
            for r in s:
                cmd = bench_serving_cmd("PYTHON", targets[r.variant.name].url, r.scenario.bench_args(),
                                        Path("OUT.jsonl"), f"{r.scenario.name}/{r.variant.name}/r{r.repeat}",
                                        tokenizer, a.client_model, shlex.split(a.bench_args or ""))
                print(f"    {r.label(len(plan))}: {shlex.join(cmd[1:])}")
        return 0
    if launch_mode and server_args:
        say(f"extra server arguments for every launched variant: {shlex.join(server_args)}")
    a.results_dir.mkdir(parents=True, exist_ok=True)
    client = resolve_client(a.client_python)
    if launch_mode and "HF_HOME" not in client[1] and a.hf_cache:
        client[1]["HF_HOME"] = vals["hf_cache"]  # the client's tokenizer from the cache the servers use
    say(f"bench_serving runs from {client[2]}")
    say(f"{len(plan)} runs ({len(scenarios)} scenarios x {len(variants)} variants x {a.repeats} repeats, "
        f"order {a.order}) in {len(sess)} server session(s); results: {results}")
    client_log = stem_path.with_name(f"{stem}.bench_serving.log")
    records: list[dict] = []
    failures: list[str] = []
    durations: list[float] = []
    launch_s: list[float] = []
    with tempfile.TemporaryDirectory(prefix="eagle-bench-") as tmp:
        for si, s in enumerate(sess):
            target = targets[s[0].variant.name]
            t0 = time.monotonic()
            try:
                try:
                    target.start(a.launch_timeout)
                except UserError as e:
                    for r in s:
                        failures.append(f"{r.label(len(plan))}: server did not start: {e}")
                    say(f"{s[0].variant.name}: {e}")
                    continue
                if target.variant.launcher != "server":
                    launch_s.append(time.monotonic() - t0)
                patch = target.patch_info()
                say(f"{target.variant.name}: patch set {patch.get('patchset')}"
                    + (f" ({len(patch['patches'])} patches)" if patch.get("patches") else "")
                    + (f"; {patch['detail']}" if patch.get("detail") else ""))
                for r in s:
                    left = len(plan) - r.index + 1
                    launches_left = sum(1 for x in sess[si + 1:] if x[0].variant.launcher != "server")
                    say(f"{r.label(len(plan))}... {eta(durations, left, launch_s, launches_left)}")
                    t1 = time.monotonic()
                    rec, why = do_run(r, len(plan), target, patch, client, a, meta, Path(tmp), client_log)
                    durations.append(time.monotonic() - t1)
                    if rec is None:
                        failures.append(f"{r.label(len(plan))}: {why}")
                        say(f"{r.label(len(plan))} FAILED: {why}")
                        continue
                    with open(results, "a") as f:  # append-only, one line per run, written as each run ends
                        f.write(json.dumps(rec) + "\n")
                    records.append(rec)
                    say(f"{r.label(len(plan))} done in {fmt_s(durations[-1])}: {one_line(rec)}")
                    if rec["eagle"]["failed_requests"]:
                        say(f"  ⚠ {rec['eagle']['failed_requests']} request(s) failed in this run")
            finally:
                target.stop()
    meta.update(runs=len(records), failed=len(failures), finished_at=iso(utcnow()))
    if not records:
        for f in failures:
            print(f"  {f}", file=sys.stderr)
        print(f"no run produced a result ({len(failures)} failed)", file=sys.stderr)
        return EXIT_RUNS_FAILED
    say(f"results: {results} ({len(records)} runs)")
    status = write_reports(records, stem_path, meta, a)
    if failures:
        print(f"{len(failures)} run(s) produced no result:", file=sys.stderr)
        for f in failures:
            print(f"  {f}", file=sys.stderr)
        return status or EXIT_RUNS_FAILED
    return status


if __name__ == "__main__":
    run(main)
