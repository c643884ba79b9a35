"""`make report`: the box receipt - test-serve, doctor, test-gpu, bench-comm and bench in one resumable run, written to one
directory and one tarball that say whether the series pays off on this box and which defaults to keep.

  python -m scripts.bench.receipt [--dir DIR] [--parts test-serve,doctor,test-gpu,bench-comm,bench] [--image IMAGE]
        [--box NAME] [--redo PART,..] [--dry-run] [-- BENCH_ARGS]
  python -m scripts.bench.receipt --assemble DIR [--doctor F] [--test-gpu F] [--bench-comm F] [--bench F.jsonl ..]
        a receipt from results made separately (each verb run by hand, or the committed H200 proxy results)
  python -m scripts.bench.receipt --summarize DIR   derive the summary, plots, recommendations and tarball again
        (the recommendations with today's thresholds, stored with them)

The parts, in order, each one of the project's verbs run as its own process (they pick the host or the serving
image themselves; --image names the image for those that take it):
  test-serve  python -m scripts.host.serve_tier --out raw/test-serve.json    (the patched server on tiny models, at
              TP = the GPU count; when it fails the report stops there, with its failed checks, before any part
              that loads Kimi-K2.5)
  doctor      python -m scripts.host.doctor --json --record DIR/env/tools   -> raw/doctor.json, env/tools/
              (with NCCL's transport between the GPUs: P2P, or SHM / NET, an error finding; --image for its probe)
  test-gpu    python -m scripts.host.gpu_tier --out raw/test-gpu.json        (the patched collectives on the GPUs)
  bench-comm  python -m scripts.bench.bench_comm --out raw/bench-comm.json    (per-call latencies, NCCL variants)
  bench       python -m scripts.bench.bench --results-dir raw/bench --resume [BENCH_ARGS]   (stock vs patched A/B)
  bench-comm@IMAGE   bench-comm again from another image, per --nccl-image (e.g. `make image NCCL=2.30.7`'s tag):
              the NCCL-release axis
First every part to run is checked by its own verb (`--check`: the checks of a real run - route, engine, images,
GPUs, weights, bench_serving's client and every scenario - nothing started, and its time estimate); one that
cannot run stops the report with every problem and its fix, before anything runs or is written (--dry-run shows
the same checks and the plan, and writes nothing). A new part adds its verb to part_argv and check_argv.
Resumable: the doctor runs every time (a second); bench is done when its plan is (its --resume runs what
raw/bench lacks); test-serve when none of its checks failed; another part when it succeeded and its result is
there (--redo PART runs it again); a failed part is recorded and the next one still runs (but not after a failed
test-serve). Then: receipt.json (parts, environment, recommendations computed once, with the thresholds used,
scripts/bench/receipt_data.py), summary.md with plots, and, when a part measured something,
DIR.tar.gz - the file to attach to an issue, without the host name, paths and raw tool outputs that identify the
machine (scripts/bench/share.py); `make docs RECEIPT=DIR.tar.gz` puts its numbers into eagle-fast-verify.md. DIR
defaults to this box's newest unfinished receipt (bench/receipts/<box>_*), else bench/receipts/<box>_<UTC date>;
<box> is its GPUs' model and count unless --box names it.

Exit status: 0 every part done; 1 a part failed (the receipt says which and why) or none measured anything (no
tarball); 2 a part cannot run here (its check says why; nothing was run), or a usage problem.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shutil
import sys
import time
from pathlib import Path

from ..host import route
from ..lib import proc
from ..lib.cli import run
from ..lib.errors import UserError
from ..lib.progress import say
from ..lib.repo import REPO_ROOT, revision
from ..series.pin import load_pin, patchset_id, series_patches
from . import receipt_data as rd
from . import share
from .numbers import duration

RECEIPTS = REPO_ROOT / "bench" / "receipts"
DOCTOR_S = 5  # the doctor takes about a second; it runs every time (its findings are about the box now)


def part_argv(part: str, d: Path, a: argparse.Namespace) -> list[str]:
    """The part's command: one of the project's verbs, run as its own process. bench resumes what raw/bench holds."""
    py = [sys.executable, "-m"]
    if part.startswith("bench-comm@"):
        return py + ["scripts.bench.bench_comm", "--out", str(d / rd.alt_part_file(part.split("@", 1)[1])),
                     "--image", part.split("@", 1)[1]]
    image = ["--image", a.image] if a.image else []
    return {"test-serve": py + ["scripts.host.serve_tier", "--out", str(d / rd.RAW["test-serve"]), *image],
            "doctor": py + ["scripts.host.doctor", "--json", "--record", str(d / "env" / "tools"), *image],
            "test-gpu": py + ["scripts.host.gpu_tier", "--out", str(d / rd.RAW["test-gpu"]), *image],
            "bench-comm": py + ["scripts.bench.bench_comm", "--out", str(d / rd.RAW["bench-comm"]), *image],
            "bench": py + ["scripts.bench.bench", "--results-dir", str(d / rd.RAW["bench"]), "--box", a.box,
                           "--resume", *a.bench_args]}[part]


def check_argv(part: str, d: Path, a: argparse.Namespace) -> list[str] | None:
    """The part's own preflight (its verb's --check: the checks of a real run, nothing started, one JSON line with
    its estimate); None for the doctor, which has none. A new part adds its verb here and in part_argv."""
    if part == "doctor":
        return None
    argv = part_argv(part, d, a)
    return argv[:3] + ["--check"] + argv[3:]


def run_part(part: str, d: Path, a: argparse.Namespace) -> dict:
    """Run one part, its output streamed to the terminal and kept in logs/<part>.log."""
    argv = part_argv(part, d, a)
    (d / "logs").mkdir(parents=True, exist_ok=True)
    (d / "raw").mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    stdout_to = d / rd.RAW["doctor"] if part == "doctor" else None
    log_path = d / "logs" / f"{part.replace('@', '_at_').replace('/', '_').replace(':', '_')}.log"
    with open(log_path, "w") as log, open(stdout_to, "w") if stdout_to else open(log_path, "a") as out:
        p = proc.spawn(argv, cwd=REPO_ROOT, stdout=out if stdout_to else proc.PIPE, stderr=proc.PIPE if stdout_to
                       else proc.STDOUT, text=True, bufsize=1)
        stream = p.stderr if stdout_to else p.stdout
        for line in stream:
            sys.stderr.write(f"  {part}| {line}")
            log.write(line)
        rc = p.wait()
    seconds = round(time.monotonic() - t0, 1)
    wrote = stdout_to is not None and stdout_to.is_file() and stdout_to.stat().st_size > 0
    ok = rc == 0 or (part == "doctor" and rc == 1 and wrote)  # doctor: 1 = error findings, recorded
    if not ok and stdout_to and stdout_to.is_file() and not wrote:
        stdout_to.unlink()  # no file for a part that produced nothing
    status = "done" if rc == 0 else "done, with error findings" if ok else f"failed (exit {rc})"
    return {"command": argv, "status": status, "ok": ok, "seconds": seconds, "log": str(log_path.relative_to(d))}


def serve_failure(d: Path) -> str:
    """test-serve's failed checks from its result, else the last line of its log."""
    doc = _read_json(d / rd.RAW["test-serve"])
    if doc:
        bad = [f"{c['phase']}: {c['name']}" for c in doc.get("checks", []) if not c["ok"]]
        return f"{len(bad)} check(s) failed: " + "; ".join(bad[:5]) + (" ..." if len(bad) > 5 else "")
    log = (d / "logs" / "test-serve.log").read_text(errors="replace").strip().splitlines() if (
        d / "logs" / "test-serve.log").is_file() else []
    return log[-1] if log else "no result and no output"


def environment(d: Path, a: argparse.Namespace) -> dict:
    """What ran: host, git revision, patch set, pin, driver / GPUs / topology / NUMA and NCCL's transport between
    the GPUs (its all-reduce probe) from the doctor, NCCL from bench-comm, the image digest."""
    env: dict = {"git_rev": revision(short=True)[0], "box": a.box}
    try:
        pin = load_pin()
        env["pin"] = {"sglang": pin.version, "image": f"{pin.image_name}:{pin.image_tag}"
                      + (f"@{pin.image_digest}" if pin.image_digest else " (no digest pinned)")}
        env["patchset"] = patchset_id(series_patches(pin))
    except Exception as e:  # noqa: BLE001 - a receipt without the series still records the box
        env["pin"] = f"unreadable: {e}"
    doc = _read_json(d / rd.RAW["doctor"])
    if doc:
        env["doctor"] = {f["id"]: f["message"] for f in doc.get("findings", [])}
        env["nccl_transport"] = (doc.get("facts") or {}).get("nccl_transport")
    bc = _read_json(d / rd.RAW["bench-comm"])
    if bc:
        m = bc.get("meta", {})
        env["gpus"] = m.get("gpus") or m.get("gpu_name")
        env["nccl"] = m.get("nccl") or {"torch_build": {k: v.get("nccl_torch_build") or v.get("nccl_version")
                                                        for k, v in (m.get("per_variant") or {}).items()}}
        env["topo_m"] = m.get("topo_m")
    if a.image and proc.which("docker"):
        res = proc.run(["docker", "image", "inspect", "--format", "{{.Id}} {{json .RepoDigests}}", a.image])
        env["image"] = {"name": a.image, "digest": res.stdout.strip() if res.ok else f"unknown: {res.why}"}
    return env


def _read_json(f: Path) -> dict | None:
    try:
        return json.loads(f.read_text()) if f.is_file() and f.stat().st_size else None
    except ValueError:
        return None


def default_box() -> str:
    """This box's name when --box is not given: its GPUs (model x count, from nvidia-smi -L), never the host name
    (the receipt leaves the box)."""
    names = route.gpu_names()
    return f"{route.gpu_slug(names)}-x{len(names)}" if names else "nogpu"


def receipt_ok(d: Path, parts: list[str]) -> bool:
    """Every one of `parts` done in the receipt at d (the doctor counts when it ran)."""
    done = (_read_json(d / "receipt.json") or {}).get("parts", {})
    return all(done.get(p, {}).get("ok") for p in parts)


def default_dir(box: str, parts: list[str], receipts: Path = RECEIPTS) -> Path:
    """The newest receipt of this box that is not finished (a re-run after midnight resumes it), else a new one
    for today's UTC date."""
    mine = sorted((p for p in receipts.glob(f"{box}_*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    if mine and not receipt_ok(mine[-1], parts):
        return mine[-1]
    base = receipts / f"{box}_{_dt.datetime.now(_dt.timezone.utc):%Y%m%d}"
    n = 2
    while base.exists() and receipt_ok(base, parts):
        base, n = receipts / f"{box}_{_dt.datetime.now(_dt.timezone.utc):%Y%m%d}-{n}", n + 1
    return base


def part_done(part: str, d: Path, old: dict, check: dict) -> bool:
    """Done: the doctor never (it runs every time); bench when its plan has no run left (bench --check --resume
    says so); another part when the receipt recorded it ok and its result file is there."""
    if part == "doctor":
        return False
    if part == "bench":
        return check.get("runs_left") == 0
    f = d / (rd.alt_part_file(part.split("@", 1)[1]) if "@" in part else rd.RAW[part])
    if part == "test-serve":  # a run with a failed check is not done: the next report runs it again
        return (_read_json(f) or {}).get("failed") == 0
    return bool(old.get(part, {}).get("ok")) and f.is_file() and f.stat().st_size > 0


def preflight(parts: list[str], d: Path, a: argparse.Namespace, redo: set[str]) -> tuple[dict, list[str]]:
    """Every part's own check, before anything runs: ({part: its JSON}, [the problems, each with its fix])."""
    checks, problems = {}, []
    for part in parts:
        argv = check_argv(part, d, a)
        if argv is None:
            continue
        if part == "bench" and part in redo:
            argv = [x for x in argv if x != "--resume"]
        say(f"checking {part}: {argv[2]} --check")
        res = proc.run(argv, cwd=REPO_ROOT, timeout=900)
        try:
            checks[part] = json.loads(res.stdout.strip().splitlines()[-1]) if res.ok else {}
        except (ValueError, IndexError):
            checks[part] = {}
        if not res.ok:
            said = res.stderr[res.stderr.find("error: "):] if "error: " in res.stderr else res.output[-1500:]
            problems.append(f"{part}: {said.strip().removeprefix('error: ')}")
    return checks, problems


def plan(parts: list[str], d: Path, old: dict, checks: dict, redo: set[str]) -> list[tuple[str, float | None]]:
    """(part, the seconds it takes by its own estimate, or None: done, skipped) in order."""
    todo = [(p, (DOCTOR_S if p == "doctor" else float(checks.get(p, {}).get("estimate_s", 0)))
             if p in redo or not part_done(p, d, old, checks.get(p, {})) else None) for p in parts]
    eta = sum(s for _, s in todo if s is not None)
    bench = checks.get("bench", {})
    notes = {"bench": f"run, {bench['runs_left']} of {bench['runs']} runs left" if bench.get("runs_left") else "run",
             "doctor": "run, every time"}
    say(f"receipt {d}: " + ", ".join(f"{p} ({notes.get(p, 'run') if s is not None else 'have it, skipped'})"
                                     for p, s in todo) + f"; about {duration(eta)} to go")
    return todo


def collect(d: Path | None, a: argparse.Namespace) -> int:
    """Check every part, then run those not yet done, then write the receipt (and its tarball when a part
    measured something)."""
    parts = [p.strip() for p in a.parts.split(",") if p.strip()] + [f"bench-comm@{i}" for i in a.nccl_image or []]
    redo = {p.strip() for p in (a.redo or "").split(",") if p.strip()}
    for what, names in (("part", parts), ("--redo part", redo)):
        unknown = [p for p in names if p not in rd.PARTS and not p.startswith("bench-comm@")]
        if unknown:
            raise UserError(f"unknown {what}(s) {', '.join(sorted(unknown))}: choose from {', '.join(rd.PARTS)}")
    d = d or default_dir(a.box, parts)
    old = (_read_json(d / "receipt.json") or {}).get("parts", {})
    done = ", ".join(p for p, r in old.items() if r.get("ok"))
    say(f"receipt {d} ({f'resuming: {done} done' if old else 'new'}); checking that every part can run here first")
    checks, problems = preflight(parts, d, a, redo)
    if problems:
        msg = (f"make report cannot start: {len(problems)} part(s) cannot run here; nothing was run or written.\n  "
               + "\n  ".join(p.replace("\n", "\n    ") for p in problems))
        if a.dry_run:
            print(msg)
            return 2
        raise UserError(msg)
    todo = plan(parts, d, old, checks, redo)
    if a.dry_run:
        for p, s in todo:
            print(("run  " if s is not None else "skip ") + " ".join(part_argv(p, d, a)))
        return 0
    if "bench" in redo and (d / rd.RAW["bench"]).is_dir():
        (d / rd.RAW["bench"]).rename(d / "raw" / f"bench-redone-{int(time.time())}")  # kept, no longer read
    return run_parts(d, a, todo, old)


def run_parts(d: Path, a: argparse.Namespace, todo: list[tuple[str, float | None]], old: dict) -> int:
    """Run the parts to run in order (a failed one is recorded, the next still runs), then write the receipt."""
    d.mkdir(parents=True, exist_ok=True)
    results = dict(old)
    t_all, left = time.monotonic(), sum(s for _, s in todo if s is not None)
    for i, (part, seconds) in enumerate(todo, 1):
        if seconds is None:
            results[part] = {**results.get(part, {}), "status": "done (earlier run)", "ok": True}
            continue
        say(f"[{i}/{len(todo)}] {part}: about {duration(seconds)}; {duration(left)} left in all")
        results[part] = run_part(part, d, a)
        left -= seconds
        say(f"[{i}/{len(todo)}] {part}: {results[part]['status']} in {duration(results[part]['seconds'])} "
            f"({duration(time.monotonic() - t_all)} so far)")
        if part == "test-serve" and not results[part]["ok"]:
            why = serve_failure(d)
            say(f"stopping: test-serve failed ({why}), so nothing that loads Kimi-K2.5 runs; fix that first "
                f"(its result and log: {d / rd.RAW['test-serve']})")
            for later, _ in todo[i:]:
                results[later] = {"status": "not run: test-serve failed", "ok": False}
            break
    measured = [p for p, r in results.items() if rd.measures(p) and r.get("ok")]
    write(d, results, environment(d, a), tarball=bool(measured))
    return 0 if measured and all(r.get("ok") for r in results.values()) else 1


def write(d: Path, parts: dict, env: dict, tarball: bool = True) -> Path | None:
    """receipt.json (with the recommendations, computed once here), summary.md, plots, and (tarball: a part
    measured something) the tarball to attach."""
    data = rd.raw_parts(d)
    meta = {"schema": rd.SCHEMA, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "parts": parts, "environment": env, "thresholds": rd.THRESHOLDS,
            "recommendations": rd.recommendations(data)}
    (d / "receipt.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
    plots = rd.plots(data, d / "plots")
    (d / "summary.md").write_text(rd.summary_markdown(data | {"receipt": meta}, plots))
    if not tarball:
        statuses = ", ".join(f"{p}: {r.get('status')}" for p, r in parts.items())
        say(f"receipt: {d}/summary.md; no part measured anything ({statuses}), so there is no tarball to attach: "
            f"fix what failed and run make report again (it resumes)")
        return None
    tarball = d.with_name(d.name + ".tar.gz")
    left_out = share.pack(d, tarball)  # without what names the machine (scripts/bench/share.py)
    say(f"receipt: {d}/summary.md; attach {tarball} to an issue (make docs RECEIPT={tarball} ingests it); it leaves "
        f"out host name, paths and {len(left_out)} raw tool output(s) that stay in {d}")
    for r in meta["recommendations"]:
        say(f"  {r['verdict']:<12} {r['default']}: {r['why']}" + (f" -> {r['setting']}" if r["setting"] else ""))
    return tarball


def assemble(d: Path, a: argparse.Namespace) -> int:
    """A receipt from result files made separately."""
    given = {"doctor": a.doctor, "test-gpu": a.test_gpu, "bench-comm": a.bench_comm}
    if not any(given.values()) and not a.bench:
        raise UserError("--assemble needs at least one of --doctor, --test-gpu, --bench-comm, --bench")
    (d / "raw" / "bench").mkdir(parents=True, exist_ok=True)
    parts = {}
    for part, src in given.items():
        if src:
            if not Path(src).is_file():
                raise UserError(f"--{part} {src}: no such file")
            shutil.copyfile(src, d / rd.RAW[part])
            parts[part] = {"status": f"assembled from {Path(src).name}", "ok": True}
    for src in a.bench or []:
        if not Path(src).is_file():
            raise UserError(f"--bench {src}: no such file")
        shutil.copyfile(src, d / rd.RAW["bench"] / Path(src).name)
        parts["bench"] = {"status": "assembled from " + ", ".join(Path(s).name for s in a.bench), "ok": True}
    write(d, parts, environment(d, a))
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    bench_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(prog="scripts.bench.receipt", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, help="receipt directory (default bench/receipts/<box>_<UTC date>)")
    ap.add_argument("--parts", default=",".join(rd.PARTS), help="which parts, in order (default: all)")
    ap.add_argument("--redo", help="comma list of parts to run again although their results exist")
    ap.add_argument("--image", help="the serving image, for the parts that run from it (test-gpu, bench-comm)")
    ap.add_argument("--nccl-image", action="append", metavar="IMAGE",
                    help="run bench-comm from this image too (another NCCL release: make image NCCL=<version>)")
    ap.add_argument("--box", help="name of this box (default: its GPUs, model and count, e.g. RTX-PRO-6000-Blackwell-"
                                  "Server-Edition-x8; never the host name)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the commands; run nothing")
    ap.add_argument("--summarize", type=Path, metavar="DIR", help="only derive summary/plots/tarball again")
    ap.add_argument("--assemble", type=Path, metavar="DIR", help="a receipt from results made separately")
    ap.add_argument("--doctor", help="--assemble: doctor --json output")
    ap.add_argument("--test-gpu", help="--assemble: test-gpu result JSON")
    ap.add_argument("--bench-comm", help="--assemble: bench-comm result JSON")
    ap.add_argument("--bench", action="append", help="--assemble: make bench results JSONL (repeatable)")
    a = ap.parse_args(argv)
    a.bench_args = bench_args
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.summarize:
        d, _ = rd.open_receipt(a.summarize)
        old = json.loads((d / "receipt.json").read_text())
        write(d, old.get("parts", {}), old.get("environment", {}))
        return 0
    a.box = a.box or ("box" if a.assemble else default_box())
    if a.assemble:
        return assemble(a.assemble, a)
    return collect(a.dir, a)


if __name__ == "__main__":
    run(main)
