"""`make bench`: A/B/A serving benchmarks (stock vs patched SGLang, speculation off vs EAGLE-3) at C1, C4, C16.

  python -m scripts.bench.bench [--variants A,B] [--scenarios C1] [--repeats 3] [--resume] [--dry-run] [-- SGLANG_ARGS]
  python -m scripts.bench.bench --sweep [FILE]          the drafter x speculative-settings sweep (bench/sweep.toml)
  python -m scripts.bench.bench --server-url [NAME=]URL  bench servers that run already
  python -m scripts.bench.bench --report RESULTS.jsonl   rebuild the .md/.png of a results file (and compare)

Each variant (bench/variants.toml) is served in turn by the serving image's `serve`, each run is SGLang's own
bench_serving (the image's `bench-client` verb). First the plan (plan.py: every value resolved once), its time and
the box's checks (--dry-run prints them with every command and stops). Results: bench/results/<UTC stamp>_<git
rev>_<box>.jsonl
(bench_serving's record plus an "eagle" object: decode tok/s, CUDA-graph counter deltas, accept length, patch set),
with a .md table, a .png plot and the logs.

Exit status: 0 fine; 1 a regression against --baseline, or with --fail-on-eager a verify forward off its CUDA graph;
2 a usage error or a box that cannot run the plan; 4 some runs produced no result.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..box import preflight
from ..box.docker import RESULTS_IN_IMAGE, docker_run, hf_cache_dir
from ..box.results import iso
from ..lib import proc
from ..lib.cli import run
from ..lib.errors import UserError
from ..lib.http import use_api_key
from ..lib.progress import say
from ..lib.table import duration, num
from ..series.pin import load_pin, patchset_id
from . import observe
from . import plan as pl
from . import report as rep
from .servers import InfraError, Server

SCHEMA = "eagle-bench/1"
EXIT_REGRESSION, EXIT_RUNS_FAILED = 1, 4
MARK_START, MARK_END = "Starting main benchmark run", "Serving Benchmark Result"  # bench_serving's own lines
RUN_TIMEOUT_S = 3600.0  # one bench_serving run


# ------------------------------------------------------------------------------------------------------ client
def client_args(p: pl.Plan, r: pl.Run, url: str, out: str) -> list[str]:
    """bench_serving's arguments for one run."""
    tag = f"{r.scenario.name}/{r.variant.name}/r{r.repeat}"
    a = ["--backend", "sglang", "--base-url", url, *r.scenario.bench_args(), "--output-file", out, "--tag", tag]
    a.append("--disable-tqdm")
    if p.tokenizer:
        a += ["--tokenizer", p.tokenizer]
    return a + p.client_args


def client_cmd(p: pl.Plan, args: list[str], out_dir: Path) -> list[str]:
    """bench_serving in the serving image (its bench-client verb, on the host's network), results in out_dir."""
    env = ("OPENAI_API_KEY", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "PYTHONUNBUFFERED")  # its lines as printed
    cache = hf_cache_dir()
    return docker_run(
        p.client_image,
        ["bench-client", *args],
        gpus=False,
        results=out_dir,
        hf_cache=cache,
        network_host=True,
        env_names=env,
    )


def run_client(cmd: list[str], log_path: Path, sampler: observe.Sampler) -> tuple[int, list[str]]:
    """Run one bench_serving, its output to the log; (exit code, its last lines). The sampler's measured phase
    is what bench_serving's own lines bracket."""
    lines: list[str] = []
    with open(log_path, "a") as log:
        log.write(f"\n$ {shlex.join(cmd)}\n")
        log.flush()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        child = proc.spawn(cmd, env=env, stdout=proc.PIPE, stderr=proc.STDOUT, text=True, errors="replace", bufsize=1)
        timer = threading.Timer(RUN_TIMEOUT_S, child.kill)
        timer.start()
        try:
            for line in child.stdout:
                log.write(line)
                lines = (lines + [line.rstrip()])[-40:]
                if MARK_START in line:
                    sampler.mark_start()
                elif MARK_END in line:
                    sampler.mark_end()
        finally:
            rc = child.wait()
            timer.cancel()
    return rc, lines + [f"(killed after {RUN_TIMEOUT_S:.0f} s)"] * (rc == -9)


# ---------------------------------------------------------------------------------------------------- one run
@dataclasses.dataclass
class Session:
    """The whole plan's progress."""

    plan: pl.Plan
    meta: dict
    tmp: Path
    records: list[dict] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)
    durations: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # (measured, estimated)
    launches: list[float] = dataclasses.field(default_factory=list)
    bad_scenarios: dict[str, str] = dataclasses.field(default_factory=dict)

    def eta(self, left: list[pl.Run], loads_left: int) -> str:
        est = sum(r.scenario.seconds() for r in left)
        scale = sum(m for m, _ in self.durations) / sum(e for _, e in self.durations) if self.durations else 1.0
        load = sum(self.launches) / len(self.launches) if self.launches else pl.ASSUMED_LOAD_S
        return f"ETA {duration(est * scale + load * loads_left)}" + ("" if self.durations else " (estimated)")


def one_run(st: Session, r: pl.Run, server: Server, patch: dict) -> tuple[dict | None, str, int]:
    """bench_serving once, the server observed around it: (its record with "eagle", '', 0) or (None, why, its exit
    code)."""
    p, out = st.plan, st.tmp / f"run{r.index}.jsonl"
    args = client_args(p, r, server.url, f"{RESULTS_IN_IMAGE}/{out.name}")
    t0, started = time.monotonic(), iso()
    before = observe.snapshot(server.url)
    sampler = observe.Sampler(server.url, p.sample_interval).start()
    try:
        rc, lines = run_client(client_cmd(p, args, st.tmp), p.stem.with_suffix(".bench_serving.log"), sampler)
    finally:
        decode = sampler.stop()
    after = observe.snapshot(server.url)
    rec = json.loads(out.read_text().splitlines()[-1]) if out.is_file() and out.read_text().strip() else None
    out.unlink(missing_ok=True)
    if rc != 0 or not rec or not rec.get("completed"):
        last = "\n".join("  | " + x for x in lines[-15:])
        return None, f"bench_serving exit {rc}, no result; its last lines:\n{last}", rc
    rec["eagle"] = {
        "schema": SCHEMA,
        "scenario": r.scenario.name,
        "scenario_spec": r.scenario.to_dict(),
        "variant": r.variant.name,
        "variant_spec": r.variant.to_dict(),
        "letter": r.letter,
        "repeat": r.repeat,
        "round": r.round,
        "position": r.index,
        "plan_size": len(p.runs),
        "server_url": server.url,
        "launched": bool(server.argv),
        "launch_s": server.launch_s,
        "speculative_algorithm": (after.server_info or {}).get("speculative_algorithm"),
        **patch,
        "git_rev": p.meta["git_rev"],
        "git_dirty": p.meta["git_dirty"],
        "box": p.meta["box"],
        "started_at": started,
        "finished_at": iso(),
        "wall_s": round(time.monotonic() - t0, 3),
        **decode,
        "verify": observe.graph_delta(before, after),
        "accept_length_metrics": observe.accept_length(before, after),
        "spec_collectives": observe.spec_collectives(after.server_info),
        "failed_requests": max(0, r.scenario.num_prompts - int(rec.get("completed") or 0)),
        "client_args": args,
    }
    return rec, "", 0


def one_line(rec: dict) -> str:
    m, v = rep.run_metrics(rec), rec["eagle"].get("verify")
    parts = [
        f"decode {num(m['decode_tok_s'], small=True)} tok/s",
        f"output {num(m['output_tok_s'], small=True)} tok/s",
        f"TTFT {num(m['ttft_ms'], small=True)} ms",
        f"AL {num(m['accept_length'], 3)}",
    ]
    if isinstance(v, dict):
        off = v["eager"] + v["piecewise"]
        parts.append(f"verify {v['graph']} graph / {off} off-graph" + (" ⚠" if off else ""))
    return ", ".join(parts)


def session(st: Session, si: int, runs: list[pl.Run], server: Server) -> None:
    """One server: start it, its consecutive runs (each record appended as it ends), stop it."""
    p, total = st.plan, len(st.plan.runs)
    try:
        try:
            server.start(p.launch_timeout)
        except InfraError:
            raise
        except UserError as e:
            st.failures += [f"{r.label(total)}: server did not start: {e}" for r in runs]
            say(f"{server.name}: {e}")
            return
        st.launches += [server.launch_s] if server.launch_s else []
        patch = server.patch_info()
        say(f"{server.name}: patch set {patch.get('patchset')}")
        for r in runs:
            if r.scenario.name in st.bad_scenarios:
                st.failures.append(f"{r.label(total)}: not run: {st.bad_scenarios[r.scenario.name]}")
                continue
            if lost := server.lost():  # the container stopped, or another server answers on its port
                st.failures += [f"{x.label(total)}: not run: {lost}" for x in runs[runs.index(r) :]]
                break
            loads = sum(1 for s in p.sessions[si + 1 :] if p.launches[s[0].variant.name].argv)
            say(f"{r.label(total)}... {st.eta(p.runs[r.index - 1 :], loads)}")
            t0 = time.monotonic()
            rec, why, rc = one_run(st, r, server, patch)
            st.durations.append((time.monotonic() - t0, r.scenario.seconds()))
            if rec is None:
                if rc == 2:  # bench_serving refused the scenario's arguments: its other runs would too
                    st.bad_scenarios[r.scenario.name] = f"bench_serving refused scenario {r.scenario.name}"
                st.failures.append(f"{r.label(total)}: scenario {r.scenario.name}: {why}")
                say(f"{r.label(total)} FAILED: scenario {r.scenario.name}: {why}")
                continue
            with open(p.stem.with_suffix(".jsonl"), "a") as f:
                f.write(json.dumps(rec) + "\n")
            st.records.append(rec)
            say(f"{r.label(total)} done in {duration(st.durations[-1][0])}: {one_line(rec)}")
    finally:
        server.stop()


# --------------------------------------------------------------------------------------------- checks, dry run
def box_checks(p: pl.Plan, stop_left: bool = True) -> list[preflight.Check]:
    """What the box must have for this plan (scripts/box/preflight.py), each with its fix."""
    stock = (load_pin().upstream_image,)
    out = preflight.docker_checks(p.images, patchset_id(), stock, stop_left) + [preflight.writable_check(p.results_dir)]
    if p.port is not None:
        out += preflight.gpu_checks(p.gpus) + [preflight.port_check(p.port), preflight.weights_check(p.weights)]
    return out


def print_plan(p: pl.Plan) -> None:
    runs, ses = p.runs, p.sessions
    print(
        f"plan: {len(runs)} run(s) ({len(p.scenarios)} scenario(s) x {len(p.variants)} variant(s) x "
        f"{p.repeats} repeat(s)) in {len(ses)} server session(s)"
        + (f"; {len(p.earlier)} run(s) already in {p.results_dir}" if p.earlier else "")
    )
    loads = len(ses) * (p.port is not None)
    print(
        f"  time: {len(runs)} run(s) ~{duration(sum(r.scenario.seconds() for r in runs))} + {loads} load(s) of "
        f"{p.model or 'the model'} x ~{duration(pl.ASSUMED_LOAD_S)} = ~{duration(p.seconds)} (assumed "
        f"{pl.ASSUMED_STREAM_TOK_S:g} tok/s per stream)"
    )
    print(f"  results: {p.stem.with_suffix('.jsonl')}")
    out_dir = Path(tempfile.gettempdir()) / "eagle-bench-RUN"
    for s in ses:
        launch = p.launches[s[0].variant.name]
        print(f"  session {launch.name} ({s[0].letter}): {Server(launch, Path()).describe()}")
        for r in s:
            cmd = client_cmd(p, client_args(p, r, launch.url, f"{RESULTS_IN_IMAGE}/OUT.jsonl"), out_dir)
            print(f"    {r.label(len(runs))}: {shlex.join(cmd)}")


# -------------------------------------------------------------------------------------------------- reports
def finish(st: Session) -> int:
    st.meta.update(runs=len(st.records), failed=len(st.failures), finished_at=iso())
    for f in st.failures:
        print(f"  {f}", file=sys.stderr)
    if not st.records:
        print(f"no run produced a result ({len(st.failures)} failed)", file=sys.stderr)
        return EXIT_RUNS_FAILED
    say(f"results: {st.plan.stem.with_suffix('.jsonl')} ({len(st.records)} runs)")
    if rep.publish(st.plan.earlier + st.records, st.plan.stem, st.meta, st.plan.judging):
        return EXIT_REGRESSION
    return EXIT_RUNS_FAILED if st.failures else 0


def report_only(path: Path, a) -> int:
    records = rep.load_results(path)
    if not records:
        raise UserError(f"{path} holds no runs")
    e = records[0]["eagle"]
    meta = {
        "stem": path.stem,
        "box": a.box or e.get("box"),
        "git_rev": e.get("git_rev"),
        "runs": len(records),
        "started_at": e.get("started_at"),
        "finished_at": records[-1]["eagle"].get("finished_at"),
    }
    return EXIT_REGRESSION if rep.publish(records, path.with_suffix(""), meta, pl.judging(a, meta["box"])) else 0


def api_key(key_file: str | None) -> None:
    """The servers' key from where serve reads it (--api-key-file, else $SGLANG_API_KEY): sent by the harness and
    by bench_serving ($OPENAI_API_KEY: in its environment, on no command line)."""
    key, source = (
        (Path(key_file).read_text().strip(), f"the file {key_file}")
        if key_file
        else (os.environ.get("SGLANG_API_KEY", ""), "$SGLANG_API_KEY")
    )
    use_api_key(key, source)
    if key:
        if os.environ.get("OPENAI_API_KEY") not in (None, key):
            say(f"note: OPENAI_API_KEY is set here; bench_serving gets the servers' key from {source} instead")
        os.environ["OPENAI_API_KEY"] = key
        say(f"API key: from {source}, sent with every request (the harness's and bench_serving's)")


def main(argv: list[str] | None = None) -> int:
    a, server_args = pl.parse(list(sys.argv[1:] if argv is None else argv))
    if a.report:
        return report_only(Path(a.report), a)
    p = pl.build(a, server_args)
    if not p.runs:
        say(f"every run of the plan is already in {p.results_dir} (--resume): nothing to run")
        return 0
    checks = box_checks(p, stop_left=not a.dry_run)
    if a.dry_run:
        print_plan(p)
        print("checks (a real run stops when one fails):\n" + "\n".join("  " + c.line() for c in checks))
        if p.port is not None:
            print(
                "  not checked here: the servers' SGLang arguments; each server's serve refuses bad ones in its "
                'first seconds (make serve DRY_RUN=1 SERVE_ARGS="--profile P -- ARGS" checks them now)'
            )
        return 2 if any(not c.ok for c in checks) else 0
    failed = [c.line() for c in checks if not c.ok]
    if failed:
        raise UserError("make bench cannot start; nothing was started or written:\n  " + "\n  ".join(failed))
    api_key(a.api_key_file)
    return run_plan(p)


def run_plan(p: pl.Plan) -> int:
    say(
        f"plan: {len(p.runs)} run(s) in {len(p.sessions)} session(s), ~{duration(p.seconds)}; results "
        f"{p.stem.with_suffix('.jsonl')}"
    )
    p.results_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="eagle-bench-") as tmp:
        st = Session(p, {"stem": p.stem.name, **p.meta, "started_at": iso()}, Path(tmp))
        stopped = ""
        for si, runs in enumerate(p.sessions):
            name = runs[0].variant.name
            try:
                session(st, si, runs, Server(p.launches[name], p.stem.with_name(f"{p.stem.name}.server-{name}.log")))
            except InfraError as e:
                st.failures += [
                    f"{r.label(len(p.runs))}: not run (the plan stopped)" for s in p.sessions[si:] for r in s
                ]
                stopped = str(e)
                break
        status = finish(st)
    if stopped:
        raise InfraError(f"the plan stopped after {len(st.records)} run(s): {stopped}")
    return status


if __name__ == "__main__":
    run(main)
