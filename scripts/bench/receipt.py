"""`make report`: the box receipt - doctor, test-gpu, bench-comm and bench in one resumable run, written to one
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
  bench       python -m scripts.bench.bench --results-dir raw/bench [BENCH_ARGS]   (stock vs patched serving A/B)
  bench-comm@IMAGE   bench-comm again from another image, per --nccl-image (e.g. `make image NCCL=2.30.7`'s tag):
              the NCCL-release axis
Resumable: a part whose result exists is skipped (--redo PART runs it again); a failed part is recorded and the
next one still runs. Then: receipt.json (parts, environment, recommendations computed once, with the thresholds
used, scripts/bench/receipt_data.py), summary.md with plots, and DIR.tar.gz - the file to attach to an issue; `make docs
RECEIPT=DIR.tar.gz` puts its numbers into eagle-fast-verify.md. DIR defaults to bench/receipts/<box>_<UTC date>.

Exit status: 0 every part done; 1 a part failed (the receipt says which and why); 2 a usage problem.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import shutil
import sys
import tarfile
import time
from pathlib import Path

from ..lib import proc
from ..lib.cli import run
from ..lib.errors import UserError
from ..lib.progress import say
from ..lib.repo import REPO_ROOT, revision
from ..series.patchfile import series_patches
from ..series.pin import load_pin
from ..series.record import patchset_id
from . import receipt_data as rd
from .numbers import duration

RECEIPTS = REPO_ROOT / "bench" / "receipts"
ESTIMATE_S = {"test-serve": 600, "doctor": 60, "test-gpu": 900, "bench-comm": 900,
              "bench": 4 * 3600}  # 8 GPUs; bench: 10 model loads


def part_argv(part: str, d: Path, a: argparse.Namespace) -> list[str]:
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
                           *a.bench_args]}[part]


def estimate(part: str) -> float:
    return ESTIMATE_S[part.split("@", 1)[0]]


def part_done(part: str, d: Path) -> bool:
    f = d / (rd.alt_part_file(part.split("@", 1)[1]) if "@" in part else rd.RAW[part])
    if part == "bench":
        return f.is_dir() and any(p.stat().st_size for p in f.glob("*.jsonl"))
    if part == "test-serve":  # a run with a failed check is not done: the next report runs it again
        return (_read_json(f) or {}).get("failed") == 0
    return f.is_file() and f.stat().st_size > 0


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
    ok = rc == 0 or (part == "doctor" and rc == 1 and part_done(part, d))  # doctor: 1 = error findings, recorded
    if not ok and stdout_to and stdout_to.is_file() and not stdout_to.stat().st_size:
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
    env: dict = {"host": platform.node(), "git_rev": revision(short=True)[0], "box": a.box}
    try:
        pin = load_pin()
        env["pin"] = {"sglang": pin.version, "image": f"{pin.image_name}:{pin.image_tag}@{pin.image_digest}"}
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


def plan(parts: list[str], d: Path, redo: set[str]) -> list[tuple[str, bool]]:
    todo = [(p, p in redo or not part_done(p, d)) for p in parts]
    eta = sum(estimate(p) for p, run_it in todo if run_it)
    say(f"receipt {d}: " + ", ".join(f"{p} ({'run' if r else 'have it, skipped'})" for p, r in todo) +
        f"; about {duration(eta)} to go")
    return todo


def collect(d: Path, a: argparse.Namespace) -> int:
    """Run the parts not yet done, then write the receipt."""
    parts = [p.strip() for p in a.parts.split(",") if p.strip()] + [f"bench-comm@{i}" for i in a.nccl_image or []]
    unknown = [p for p in parts if p not in rd.PARTS and not p.startswith("bench-comm@")]
    if unknown:
        raise UserError(f"unknown part(s) {', '.join(unknown)}: choose from {', '.join(rd.PARTS)}")
    d.mkdir(parents=True, exist_ok=True)
    old = _read_json(d / "receipt.json") or {}
    results = dict(old.get("parts", {}))
    todo = plan(parts, d, set(a.redo.split(",")) if a.redo else set())
    if a.dry_run:
        for p, run_it in todo:
            print(("run  " if run_it else "skip ") + " ".join(part_argv(p, d, a)))
        return 0
    t_all, left = time.monotonic(), sum(estimate(p) for p, r in todo if r)
    for i, (part, run_it) in enumerate(todo, 1):
        if not run_it:
            results.setdefault(part, {"status": "done (earlier run)", "ok": True})
            continue
        say(f"[{i}/{len(todo)}] {part}: about {duration(estimate(part))}; {duration(left)} left in all")
        results[part] = run_part(part, d, a)
        left -= estimate(part)
        say(f"[{i}/{len(todo)}] {part}: {results[part]['status']} in {duration(results[part]['seconds'])} "
            f"({duration(time.monotonic() - t_all)} so far)")
        if part == "test-serve" and not results[part]["ok"]:
            why = serve_failure(d)
            say(f"stopping: test-serve failed ({why}), so nothing that loads Kimi-K2.5 runs; fix that first "
                f"(its result and log: {d / rd.RAW['test-serve']})")
            for later, _ in todo[i:]:
                results[later] = {"status": "not run: test-serve failed", "ok": False}
            break
    write(d, results, environment(d, a))
    return 0 if all(r.get("ok") for r in results.values()) else 1


def write(d: Path, parts: dict, env: dict) -> Path:
    """receipt.json (with the recommendations, computed once here), summary.md, plots, tarball."""
    data = rd.raw_parts(d)
    meta = {"schema": rd.SCHEMA, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "parts": parts, "environment": env, "thresholds": rd.THRESHOLDS,
            "recommendations": rd.recommendations(data)}
    (d / "receipt.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
    plots = rd.plots(data, d / "plots")
    (d / "summary.md").write_text(rd.summary_markdown(data | {"receipt": meta}, plots))
    tarball = d.with_name(d.name + ".tar.gz")
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(d, arcname=d.name)
    say(f"receipt: {d}/summary.md; attach {tarball} to an issue (make docs RECEIPT={tarball} ingests it)")
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
    ap.add_argument("--box", default=platform.node(), help="name of this box (default: the host name)")
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
    if a.assemble:
        return assemble(a.assemble, a)
    d = a.dir or RECEIPTS / f"{a.box}_{_dt.datetime.now(_dt.timezone.utc):%Y%m%d}"
    return collect(d, a)


if __name__ == "__main__":
    run(main)
