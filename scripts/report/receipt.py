"""`make report`: the box receipt - test-serve, doctor, test-gpu, bench-comm and bench in one resumable run, in one
directory and one tarball that say whether the series pays off on this box and which defaults to keep.

  python -m scripts.report.receipt [--dir DIR] [--parts a,b] [--redo PART,..] [--image IMAGE] [--box NAME]
        [--port N] [--dry-run] [-- BENCH_ARGS]
  python -m scripts.report.receipt --summarize DIR   derive summary, plots, recommendations and tarball again (a
        receipt directory, or results put under DIR/raw/ by hand with a receipt.json naming the parts)

The parts (receipt_data.py PARTS) run in order, each its own verb, after one preflight of what they need; --dry-run
prints the plan and checks and writes nothing. receipt.json keeps the parts' state after each part, so a re-run
(after Ctrl-C, a failed part, a result cut short: that part's failure) resumes this box's newest unfinished receipt,
keeping what is done. --port moves the parts that serve (bench, profile). DIR:
bench/receipts/<box>_<UTC date>, its .tar.gz what leaves the box (share.py); more: bench/receipts/README.md.

Exit status: 0 every part done; 1 a part failed (the receipt says which) or none measured anything; 2 a check failed
(nothing run or written) or a usage problem.
"""

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from ..bench import plan as pl
from ..bench import report as rep
from ..box import preflight
from ..box.docker import PATCHSET_LABEL, image_info
from ..box.results import box_name, iso, stamp
from ..comm import comm_report
from ..lib import proc
from ..lib.cli import parser, run, split
from ..lib.errors import UserError
from ..lib.progress import say
from ..lib.repo import REPO_ROOT, revision
from ..lib.table import duration, md_table
from ..series.pin import load_pin, patchset_id
from . import receipt_data as rd
from . import share

RECEIPTS = REPO_ROOT / "bench" / "receipts"


def selected(a: argparse.Namespace) -> list[rd.Part]:
    names = [p.strip() for p in a.parts.split(",") if p.strip()]
    for what, given in (("part", names), ("--redo part", a.redo)):
        unknown = sorted(set(given) - set(rd.PARTS))
        if unknown:
            raise UserError(f"unknown {what}(s) {', '.join(unknown)}: choose from {', '.join(rd.PARTS)}")
    return [rd.PARTS[n] for n in names]


def _read(f: Path) -> dict:
    try:
        return json.loads(f.read_text()) if f.is_file() and f.stat().st_size else {}
    except ValueError:
        return {}


def default_dir(box: str, parts: list[str], receipts: Path = RECEIPTS) -> Path:
    """This box's newest unfinished receipt (a re-run after midnight resumes it), else a new one for today."""

    def finished(d: Path) -> bool:
        done = _read(d / "receipt.json").get("parts", {})
        return all(done.get(p, {}).get("ok") for p in parts)

    mine = sorted((p for p in receipts.glob(f"{box}_*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    if mine and not finished(mine[-1]):
        return mine[-1]
    day, n = f"{box}_{stamp()[:8]}", 1
    while (receipts / (day + f"-{n}" * (n > 1))).exists() and finished(receipts / (day + f"-{n}" * (n > 1))):
        n += 1
    return receipts / (day + f"-{n}" * (n > 1))


def done(part: rd.Part, d: Path, old: dict) -> bool:
    if part.done == "clean":
        tier = rd.junit(d, part.result)
        return bool(tier) and tier["failed"] == 0 and tier["passed"] > 0
    return part.done == "ok" and bool(old.get(part.name, {}).get("ok")) and (d / part.result).exists()


def bench_plan(d: Path, a: argparse.Namespace, redo: bool) -> pl.Plan:
    """bench's plan as its part will run it (what raw/bench lacks), with make report's BENCH_ARGS."""
    image = ["--image", a.image] if a.image else []
    port = ["--port", str(a.port)] if a.port else []
    args, server_args = pl.parse(
        ["--results-dir", str(d / rd.PARTS["bench"].result), "--resume", *image, *port, *a.bench_args]
    )
    args.resume = not redo
    return pl.build(args, server_args)


def checks(todo: list[rd.Part], d: Path, a: argparse.Namespace, bp: pl.Plan | None) -> list[preflight.Check]:
    """What the parts to run need from the box, each with its fix."""
    gpu_parts = [p for p in todo if p.name != "doctor"]
    pin = load_pin()
    images = [a.image or pin.serving_image] * bool(gpu_parts) + (bp.images if bp else [])
    out = preflight.docker_checks(images, patchset_id(), (pin.upstream_image,), not a.dry_run)
    out.append(preflight.writable_check(d))
    if gpu_parts:
        out += preflight.gpu_checks(max(bp.gpus if bp else 0, 2))
    ports = {bp.port if bp else None} | {a.port or 30000 for p in todo if p.name == "profile"}  # the parts that serve
    out += [preflight.port_check(port) for port in sorted(ports - {None})]
    return out + ([preflight.weights_check(bp.weights)] if bp and bp.weights else [])


def collect(a: argparse.Namespace) -> int:
    """Plan and check every part to run, then run them, then write the receipt."""
    parts = selected(a)
    d = a.dir or default_dir(a.box, [p.name for p in parts])
    old = _read(d / "receipt.json").get("parts", {})
    todo = [p for p in parts if p.name in a.redo or not done(p, d, old)]
    bp = bench_plan(d, a, "bench" in a.redo) if any(p.name == "bench" for p in todo) else None
    seconds = {p.name: bp.seconds if p.name == "bench" and bp else p.estimate_s for p in todo}
    have = ", ".join(p for p, r in old.items() if r.get("ok"))
    print(f"receipt {d} ({f'resuming: {have} done' if old else 'new'})")
    rows = []
    for p in parts:
        plan = ["run", f"~{duration(seconds[p.name])}"] if p in todo else ["have it, skipped", ""]
        rows.append([p.name, *plan, f"`{' '.join(p.command(d, a))}`"])
    print(md_table("part |  | time | command", rows, "llrl"))
    if bp:
        held = f", {len(bp.earlier)} already in {d / rd.PARTS['bench'].result}" if bp.earlier else ""
        print(f"bench: {len(bp.runs)} run(s) in {len(bp.sessions)} server session(s) to go{held}")
    print(f"total: ~{duration(sum(seconds.values()))}")
    found = checks(todo, d, a, bp) if todo else []
    print("checks:\n" + "\n".join("  " + c.line() for c in found))
    failed = [c for c in found if not c.ok]
    if failed:
        lines = "\n  ".join(c.line() for c in failed)
        msg = f"make report cannot start: {len(failed)} check(s) failed; nothing was run or written:\n  {lines}"
        if a.dry_run:
            print(msg)
            return 2
        raise UserError(msg)
    if a.dry_run or not todo:
        return 0
    if "bench" in a.redo and (d / rd.PARTS["bench"].result).is_dir():
        (d / rd.PARTS["bench"].result).rename(d / "raw" / f"bench-redone-{int(time.time())}")  # kept, not read
    return run_parts(d, a, parts, todo, old, seconds)


def run_part(part: rd.Part, d: Path, a: argparse.Namespace) -> dict:
    """One part, its output streamed to the terminal and kept in logs/<part>.log (the doctor's JSON: its result); a
    result that does not read (cut short) is that part's failure, moved aside to <result>.bad so a re-run redoes it."""
    argv = part.command(d, a)
    for sub in ("logs", "raw"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    log_path, out = d / "logs" / f"{part.name}.log", None
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        out = open(d / part.result, "w") if part.stdout else None
        try:
            err = proc.PIPE if out else proc.STDOUT
            p = proc.spawn(argv, cwd=REPO_ROOT, stdout=out or proc.PIPE, stderr=err, text=True, bufsize=1)
            try:
                for line in p.stderr if out else p.stdout:
                    sys.stderr.write(f"  {part.name}| {line}")
                    log.write(line)
                rc = p.wait()
            except KeyboardInterrupt:  # this process alone was signalled: the part stops what it started, too
                p.send_signal(signal.SIGTERM)
                p.wait()
                raise
        finally:
            if out:
                out.close()
    wrote = (d / part.result).exists() and (not part.stdout or (d / part.result).stat().st_size > 0)
    ok = rc == 0 or (part.name == "doctor" and rc == 1 and wrote)  # doctor: 1 = error findings, recorded
    if part.stdout and not wrote:
        (d / part.result).unlink(missing_ok=True)
    status = "done" if rc == 0 else "done, with error findings" if ok else f"failed (exit {rc})"
    try:
        rd.raw_parts(d)
    except UserError as e:
        if (d / part.result).is_file():
            (d / part.result).rename(d / f"{part.result}.bad")
        ok, status = False, f"failed: {e}"
    seconds = round(time.monotonic() - t0, 1)
    return {"command": argv, "status": status, "ok": ok, "seconds": seconds, "log": str(log_path.relative_to(d))}


def run_parts(d: Path, a, parts: list[rd.Part], todo: list[rd.Part], old: dict, seconds: dict) -> int:
    """The parts to run in order (a failed one is recorded and the next still runs; not after test-serve)."""
    results, t_all, left = dict(old), time.monotonic(), sum(seconds.values())
    for i, part in enumerate(parts, 1):
        if part not in todo:
            results[part.name] = {**results.get(part.name, {}), "status": "done (earlier run)", "ok": True}
            continue
        say(f"[{i}/{len(parts)}] {part.name}: about {duration(seconds[part.name])}; {duration(left)} left in all")
        results[part.name] = run_part(part, d, a)
        (d / "receipt.json").write_text(json.dumps({"schema": rd.SCHEMA, "parts": results}, indent=1) + "\n")
        left -= seconds[part.name]
        got = results[part.name]
        so_far = duration(time.monotonic() - t_all)
        say(f"[{i}/{len(parts)}] {part.name}: {got['status']} in {duration(got['seconds'])} ({so_far} so far)")
        if part.name == "test-serve" and not got["ok"]:
            bad = [c["name"] for c in (rd.junit(d, part.result) or {}).get("cases", []) if c["outcome"] == "failed"]
            why = "; ".join(bad[:5]) or "see " + got["log"]
            say(f"stopping: test-serve failed ({why}), so nothing that loads Kimi-K2.5 runs; fix that first")
            results |= {p.name: {"status": "not run: test-serve failed", "ok": False} for p in parts[i:]}
            break
    measured = [p for p, r in results.items() if rd.measures(p) and r.get("ok")]
    write(d, results, environment(d, a), tarball=bool(measured))
    return 0 if measured and all(r.get("ok") for r in results.values()) else 1


def environment(d: Path, a: argparse.Namespace) -> dict:
    """What ran: git revision, box, pin, patch set, the doctor's findings and NCCL transport, bench-comm's GPUs, NCCL
    and topology, the image's digest."""
    pin = load_pin()
    image = a.image or pin.serving_image
    digest = f"@{pin.image_digest}" if pin.image_digest else " (no digest pinned)"
    env: dict = {"git_rev": revision(short=True)[0], "box": a.box, "patchset": patchset_id()}
    env["pin"] = {"sglang": pin.version, "image": f"{pin.image_name}:{pin.image_tag}{digest}"}
    doc = _read(d / rd.PARTS["doctor"].result)
    if doc:
        env["doctor"] = {f["id"]: f["message"] for f in doc.get("findings", [])}
        env["nccl_transport"] = (doc.get("facts") or {}).get("nccl_transport")
    m = _read(d / rd.PARTS["bench-comm"].result).get("meta")
    if m:
        env |= {"gpus": m.get("gpus") or m.get("gpu_name"), "nccl": m.get("nccl"), "topo_m": m.get("topo_m")}
    info = image_info(image) or {"Labels": {}}
    env["image"] = {"name": image, "id": info.get("Id", "unknown"), "digests": info.get("RepoDigests")}
    env["image"]["patchset"] = info["Labels"].get(PATCHSET_LABEL)
    return env


def plots(data: dict, out: Path) -> list[str]:
    """The plots of the rows the summary's tables print: bench-comm's and make bench's own."""
    out.mkdir(parents=True, exist_ok=True)
    bc, rows = data.get("bench_comm"), rep.summarize(data.get("bench") or [])
    made = ["bench-comm.png"] * bool(
        bc and comm_report.plot({**bc, "summary": comm_report.summarize(bc)}, out / "bench-comm.png")
    )
    made += ["bench.png"] * bool(rows and rep.plot(rows, out / "bench.png", rd.describe_box(rd.box_class(data))))
    return [f"plots/{m}" for m in made]


def summary_markdown(data: dict, plot_files: list[str]) -> str:
    meta, cls = data["receipt"], rd.box_class(data)
    env, reasons = meta.get("environment", {}), rd.proxy_reasons(cls)
    where = f"Measured on {rd.describe_box(cls)}" + (
        f": a proxy, not the box ({'; '.join(reasons)})." if reasons else "."
    )
    made = (
        f"Made {meta.get('created')} at git {env.get('git_rev')}, patch set {env.get('patchset')}, pin "
        f"{json.dumps(env.get('pin'))}."
    )
    out = [f"# Box receipt: {env.get('box', '?')}", "", where, "", made, "", "## Environment", ""]
    out += [f"- {k}: {v}" for k, v in (env.get("doctor") or {}).items()]
    out += [f"- {k}: {env[k]}" for k in ("nccl", "image") if env.get(k)]
    parts = [
        [p, r.get("status"), r.get("seconds", "-"), f"`{' '.join(r['command'])}`" if r.get("command") else "-"]
        for p, r in meta.get("parts", {}).items()
    ]
    recs = [
        [r["default"], r["verdict"], r["why"], r["threshold"], r["setting"] or "-"]
        for r in meta.get("recommendations", [])
    ]
    thresholds = "Thresholds: " + ", ".join(f"{k} = {v}" for k, v in meta["thresholds"].items())
    out += ["", "## Parts", "", md_table("part | status | seconds | command", parts), ""]
    out += ["## Recommendations", "", thresholds, "", md_table("default | verdict | why | threshold | setting", recs)]
    out += tiers_markdown(data) + measured_markdown(data)
    return "\n".join(out + [""] + [f"![{Path(p).stem}]({p})" for p in plot_files]) + "\n"


def tiers_markdown(data: dict) -> list[str]:
    """make test-serve's and make test-gpu's counts, with what failed."""
    out, ts, tg = [], data.get("test_serve"), data.get("test_gpu")
    if ts:
        props = ts["properties"]
        said = f"TP{props.get('world')}: {ts['passed']} passed, {ts['failed']} failed"
        out += ["", "## make test-serve", "", said + (f" ({props['proxy']})" if props.get("proxy") else "")]
        out += [f"- FAILED {c['name']}: {c['message'][:300]}" for c in ts["cases"] if c["outcome"] == "failed"]
        out += [f"- {props['refused']}"] * bool(props.get("refused"))
    if tg:
        counts = f"{tg['passed']} passed, {tg['failed']} failed, {tg['skipped']} skipped"
        out += ["", "## make test-gpu", "", f"world {tg['properties'].get('world')}: {counts}"]
    return out


def measured_markdown(data: dict) -> list[str]:
    """bench-comm's table, the startup all-reduce table, the doctor's PCIe probes, make bench's medians."""
    out, bc, table = [], data.get("bench_comm"), rd.startup_table(data)
    if bc:
        out += ["", "## make bench-comm", comm_report.table(comm_report.summarize(bc))]
    if table:
        sizes = [
            [x["rows"], ", ".join(f"{k} {v}" for k, v in (x.get("us") or {}).items()), x["backend"], x.get("why", "")]
            for x in table.get("sizes") or []
        ]
        title = (
            f"## All-reduce backend per decode size, chosen at start ({table.get('source')}, margin "
            f"{table.get('margin')}x)"
        )
        out += ["", title, "", md_table("rows | us per backend | backend | why", sizes) or table.get("why", "")]
    facts = (data.get("doctor") or {}).get("facts") or {}
    if facts.get("pcie_ipc_smoke") or facts.get("peer_bandwidth"):
        smoke, bw = facts.get("pcie_ipc_smoke") or {}, facts.get("peer_bandwidth") or {}
        said = (
            f"PCIe-IPC smoke: {json.dumps(smoke)}; peer writes: lowest {bw.get('min_gbps')} GB/s per flow "
            f"({bw.get('why') or 'measured'})."
        )
        out += ["", "## The doctor's PCIe probes", "", said]
    rows = []
    for r in rd.bench_rows(data.get("bench") or []):
        tok = f"{r['tok_s']:.1f}" if r["tok_s"] else "-"
        spread = f"{r['tok_s_min']:.1f}-{r['tok_s_max']:.1f}" if r["tok_s"] else "-"
        al = f"{r['accept_length']:.2f}" if r["accept_length"] else "-"
        rows.append([r["scenario"], r["variant"], r["n"], tok, spread, al, r["eager_verifies"]])
    if rows:
        header = "scenario | variant | n | decode tok/s (median) | min-max | accept length | eager verifies"
        out += ["", "## Serving (make bench)", "", md_table(header, rows, "llrrrrr")]
    return out


def write(d: Path, parts: dict, env: dict, tarball: bool = True) -> None:
    """receipt.json (the recommendations, computed once here), summary.md, plots, and (a part measured something)
    the tarball to attach."""
    data = rd.raw_parts(d)
    meta = {"schema": rd.SCHEMA, "created": iso(), "parts": parts, "environment": env, "thresholds": rd.THRESHOLDS}
    meta["recommendations"] = rd.recommendations(data)
    (d / "receipt.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
    (d / "summary.md").write_text(summary_markdown(data | {"receipt": meta}, plots(data, d / "plots")))
    if not tarball:
        say(
            f"receipt: {d}/summary.md; no part measured anything ("
            + ", ".join(f"{p}: {r.get('status')}" for p, r in parts.items())
            + "), so there is nothing to attach: "
            "fix what failed and run make report again (it resumes)"
        )
        return
    tar = d.with_name(d.name + ".tar.gz")
    left_out = share.pack(d, tar)
    say(
        f"receipt: {d}/summary.md; attach {tar} to an issue (make docs RECEIPT={tar} ingests it); it leaves out "
        f"host name, paths and {len(left_out)} raw tool output(s) that stay in {d}"
    )
    for r in meta["recommendations"]:
        say(f"  {r['verdict']:<12} {r['default']}: {r['why']}" + (f" -> {r['setting']}" if r["setting"] else ""))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    own, bench_args = split(argv)
    ap = parser("scripts.report.receipt", __doc__, allow_abbrev=False)
    ap.add_argument("--dir", type=Path, help="receipt directory (default bench/receipts/<box>_<UTC date>)")
    ap.add_argument("--parts", default=",".join(rd.PARTS), help="which parts, in order (default: all)")
    ap.add_argument("--redo", default="", help="comma list of parts to run again although they are done")
    ap.add_argument("--image", help="the serving image (default: the pin's)")
    ap.add_argument("--box", help="this box's name (default: its GPUs' model and count; never the host name)")
    ap.add_argument("--port", type=int, help="the port of the parts that serve: bench and profile (default 30000)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the checks; run and write nothing")
    ap.add_argument("--summarize", type=Path, metavar="DIR", help="only derive summary, plots and tarball again")
    a = ap.parse_args(own)
    a.bench_args, a.redo = bench_args, {p.strip() for p in a.redo.split(",") if p.strip()}
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.summarize:
        d, _ = rd.open_receipt(a.summarize)
        old = json.loads((d / "receipt.json").read_text())
        write(d, old.get("parts", {}), old.get("environment", {}))
        return 0
    a.box = a.box or box_name()
    return collect(a)


if __name__ == "__main__":
    run(main)
