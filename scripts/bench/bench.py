"""`make bench`: A/B/A serving benchmarks (stock vs patched SGLang, speculation off vs EAGLE-3) at C1, C4, C16.

  python -m scripts.bench.bench [--variants A,B] [--scenarios C1] [--repeats 3] [--resume] [--dry-run] [-- SGLANG_ARGS]
  python -m scripts.bench.bench --sweep [FILE]          the drafter x speculative-settings sweep (bench/sweep.toml)
  python -m scripts.bench.bench --server-url [NAME=]URL  bench servers that run already
  python -m scripts.bench.bench --report RESULTS.jsonl   rebuild the .md/.png of a results file (and compare)

Each variant (bench/variants.toml) is served in turn by the serving image's `serve`, each run is SGLang's own
bench_serving (the image's `bench-client` verb). First the plan (plan.py: every value resolved once), its time and
the box's checks (--dry-run prints them with every command and stops). Results: bench/results/<UTC stamp>_<git
rev>_<box>.jsonl (bench_serving's record plus an "eagle" object: decode tok/s, CUDA-graph counter deltas, accept
length, patch set), with a .md table, a .png plot and the logs.

Exit status: 0 fine; 1 a regression against --baseline, or with --fail-on-eager a verify forward off its CUDA graph;
2 a usage error or a box that cannot run the plan; 4 some runs produced no result.
"""

import dataclasses
import json
import os
import shlex
import sys
import threading
import time
from pathlib import Path

from ..box import preflight
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


def main(argv: list[str] | None = None) -> int:
    p = pl.build(*pl.parse(argv))
    if p.report:
        return EXIT_REGRESSION if rep.rebuild(p.report, p.judging, p.meta["box"]) else 0
    if not p.runs:
        say(f"every run of the plan is already in {p.results_dir} (--resume): nothing to run")
        return 0
    checks = box_checks(p, stop_left=not p.dry_run)
    if p.dry_run:
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
    api_key(p.api_key_file)
    return run_plan(p)


# --------------------------------------------------------------------------------------------- checks, dry run
def box_checks(p: pl.Plan, stop_left: bool = True) -> list[preflight.Check]:
    """What the box must have for this plan (scripts/box/preflight.py), each with its fix; stop_left: remove the
    containers an earlier run left (a dry run only names them)."""
    stock = (load_pin().upstream_image,)
    out = preflight.docker_checks(p.images, patchset_id(), stock, stop_left) + [preflight.writable_check(p.results_dir)]
    if p.port is not None:
        out += preflight.gpu_checks(p.gpus) + [preflight.port_check(p.port), preflight.weights_check(p.weights)]
    return out


def print_plan(p: pl.Plan) -> None:
    held = f"; {len(p.earlier)} run(s) already in {p.results_dir}" if p.earlier else ""
    print(
        f"plan: {len(p.runs)} run(s) ({len(p.scenarios)} scenario(s) x {len(p.variants)} variant(s) x "
        f"{p.repeats} repeat(s)) in {len(p.sessions)} server session(s){held}"
    )
    loads = len(p.sessions) * (p.port is not None)
    print(
        f"  time: {len(p.runs)} run(s) ~{duration(sum(r.scenario.seconds() for r in p.runs))} + {loads} load(s) of "
        f"{p.model or 'the model'} x ~{duration(pl.ASSUMED_LOAD_S)} = ~{duration(p.seconds)} (assumed "
        f"{pl.ASSUMED_STREAM_TOK_S:g} tok/s per stream)"
    )
    print(f"  results: {p.stem.with_suffix('.jsonl')}")
    for runs in p.sessions:
        launch = p.launches[runs[0].variant.name]
        server = shlex.join(launch.argv) if launch.argv else f"running server {launch.url}"
        print(f"  session {launch.name} ({runs[0].letter}): {server}")
        for r in runs:
            print(f"    {r.label(len(p.runs))}: {shlex.join([*p.client, *r.args])}")


def api_key(key_file: str | None) -> None:
    """The servers' key from where serve reads it (--api-key-file, else $SGLANG_API_KEY): sent by the harness and
    by bench_serving ($OPENAI_API_KEY: in its environment, on no command line)."""
    key, source = os.environ.get("SGLANG_API_KEY", ""), "$SGLANG_API_KEY"
    if key_file:
        key, source = Path(key_file).read_text().strip(), f"the file {key_file}"
    use_api_key(key, source)
    if key:
        if os.environ.get("OPENAI_API_KEY") not in (None, key):
            say(f"note: OPENAI_API_KEY is set here; bench_serving gets the servers' key from {source} instead")
        os.environ["OPENAI_API_KEY"] = key
        say(f"API key: from {source}, sent with every request (the harness's and bench_serving's)")


# ------------------------------------------------------------------------------------------------------- the runs
@dataclasses.dataclass
class Progress:
    """The plan's progress: its records and failures, and what the ETA learns from."""

    total: int
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

    def failed(self, runs: list[pl.Run], why: str) -> None:
        self.failures += [f"{r.label(self.total)}: {why}" for r in runs]


def run_plan(p: pl.Plan) -> int:
    say(
        f"plan: {len(p.runs)} run(s) in {len(p.sessions)} session(s), ~{duration(p.seconds)}; results "
        f"{p.stem.with_suffix('.jsonl')}"
    )
    p.results_dir.mkdir(parents=True, exist_ok=True)
    meta = {"stem": p.stem.name, **p.meta, "started_at": iso()}
    progress, stopped = Progress(len(p.runs)), ""
    for si in range(len(p.sessions)):
        try:
            session(p, progress, p.sessions[si:])
        except InfraError as e:
            progress.failed([r for s in p.sessions[si:] for r in s], "not run (the plan stopped)")
            stopped = str(e)
            break
    status = finish(p, progress, meta)
    if stopped:
        raise InfraError(f"the plan stopped after {len(progress.records)} run(s): {stopped}")
    return status


def session(p: pl.Plan, progress: Progress, left: list[list[pl.Run]]) -> None:
    """The first of the sessions left: start its server, make its runs (each record appended to the results as it
    ends), stop the server."""
    server = Server(p.launches[left[0][0].variant.name])
    try:
        try:
            server.start()
            patch = server.patch_info()
        except InfraError:
            raise
        except UserError as e:
            progress.failed(left[0], f"server did not start: {e}")
            say(f"{server.name}: {e}")
            return
        progress.launches += [server.launch_s] if server.launch_s else []
        say(f"{server.name}: patch set {patch.get('patchset')}")
        loads = sum(1 for s in left[1:] if p.launches[s[0].variant.name].argv)
        for r in left[0]:
            if r.scenario.name in progress.bad_scenarios:
                progress.failed([r], f"not run: {progress.bad_scenarios[r.scenario.name]}")
                continue
            if lost := server.lost():  # the container stopped, or another server answers on its port
                progress.failed(left[0][left[0].index(r) :], f"not run: {lost}")
                break
            say(f"{r.label(len(p.runs))}... {progress.eta(p.runs[r.index - 1 :], loads)}")
            t0 = time.monotonic()
            rec, why, rc = one_run(p, r, server, patch)
            progress.durations.append((time.monotonic() - t0, r.scenario.seconds()))
            if rec is None:
                if rc == 2:  # bench_serving refused the scenario's arguments: its other runs would too
                    progress.bad_scenarios[r.scenario.name] = f"bench_serving refused scenario {r.scenario.name}"
                progress.failed([r], f"scenario {r.scenario.name}: {why}")
                say(f"{r.label(len(p.runs))} FAILED: scenario {r.scenario.name}: {why}")
                continue
            with open(p.stem.with_suffix(".jsonl"), "a") as f:
                f.write(json.dumps(rec) + "\n")
            progress.records.append(rec)
            say(f"{r.label(len(p.runs))} done in {duration(progress.durations[-1][0])}: {one_line(rec)}")
    finally:
        server.stop()


def one_run(p: pl.Plan, r: pl.Run, server: Server, patch: dict) -> tuple[dict | None, str, int]:
    """bench_serving once, the server observed around it: (its record with "eagle", '', 0) or (None, why, its exit
    code)."""
    t0, started = time.monotonic(), iso()
    before = observe.snapshot(server.url)
    sampler = observe.Sampler(server.url, p.sample_interval).start()
    try:
        rc, lines = run_client([*p.client, *r.args], p.stem.with_suffix(".bench_serving.log"), sampler)
    finally:
        decode = sampler.stop()
    after = observe.snapshot(server.url)
    written = r.output.read_text() if r.output.is_file() else ""
    r.output.unlink(missing_ok=True)
    rec = json.loads(written.splitlines()[-1]) if written.strip() else None
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
        **{k: p.meta[k] for k in ("git_rev", "git_dirty", "box")},
        "started_at": started,
        "finished_at": iso(),
        "wall_s": round(time.monotonic() - t0, 3),
        **decode,
        "verify": observe.graph_delta(before, after),
        "accept_length_metrics": observe.accept_length(before, after),
        "spec_collectives": observe.spec_collectives(after.server_info),
        "failed_requests": max(0, r.scenario.num_prompts - int(rec.get("completed") or 0)),
        "client_args": list(r.args),
    }
    return rec, "", 0


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
    if rc == -9:
        lines.append(f"(killed after {RUN_TIMEOUT_S:.0f} s)")
    return rc, lines


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


def finish(p: pl.Plan, progress: Progress, meta: dict) -> int:
    meta.update(runs=len(progress.records), failed=len(progress.failures), finished_at=iso())
    for f in progress.failures:
        print(f"  {f}", file=sys.stderr)
    if not progress.records:
        print(f"no run produced a result ({len(progress.failures)} failed)", file=sys.stderr)
        return EXIT_RUNS_FAILED
    say(f"results: {p.stem.with_suffix('.jsonl')} ({len(progress.records)} runs)")
    if rep.publish(p.earlier + progress.records, p.stem, meta, p.judging):
        return EXIT_REGRESSION
    return EXIT_RUNS_FAILED if progress.failures else 0


if __name__ == "__main__":
    run(main)
