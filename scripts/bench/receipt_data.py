"""The box receipt as data: where each part's files live, reading a receipt (a directory or its tarball), and what
it says about every default of the series - used by `make report` (scripts/bench/receipt.py, which writes it) and
`make docs` (scripts/bench/cost_model.py, which puts the box's numbers next to the H200 proxy).

A receipt directory:
  receipt.json     schema, box, when, git revision, patch set, the parts (command, status, seconds, files), the
                   environment summary, the recommendations and the thresholds they used
  raw/             test-serve.json (+ .log), doctor.json, test-gpu.json, bench-comm.json (+ .png),
                   bench-comm@<image>.json (the same run from another image, e.g. one `make image NCCL=<version>`
                   built: the NCCL-release axis),
                   bench/*.jsonl (+ .md, .png, logs)
  env/             the tools' raw outputs (doctor --record: nvidia-smi -q, topo -m / -p2p, numactl -H, lscpu, ...)
  summary.md       what a person reads first: environment, parts, recommendations, tables, plots
  plots/           PNGs the summary shows
and <dir>.tar.gz, the same tree, which a user attaches to an issue.

Recommendations: one per default of the series, each with the measured numbers it read, the threshold it applied
(THRESHOLDS) and a verdict: keep, change (with the setting that does it) or inconclusive (with what is missing).
They are computed once, when the receipt is written, and stored in receipt.json with the THRESHOLDS of that day;
the summary and `make docs` read the stored ones, so a receipt's verdict does not move when THRESHOLDS does.
"""

from __future__ import annotations

import json
import re
import tarfile
import tempfile
from pathlib import Path

from ..host.facts import parse_topo_m
from ..lib.errors import UserError
from ..lib.repo import PROFILES_DIR, SHIPPED_PROFILE
from ..lib.tomlfile import load_toml
from .comm_report import finish_axes, record
from .report import load_results, summarize

SCHEMA = "eagle-receipt/1"
PARTS = ("test-serve", "doctor", "test-gpu", "bench-comm", "bench")
MEASURING = ("test-serve", "test-gpu", "bench-comm", "bench")  # parts whose result makes a receipt (not the doctor)
PROFILE = SHIPPED_PROFILE  # the shipped profile the recommendations are about
RAW = {"test-serve": "raw/test-serve.json", "doctor": "raw/doctor.json", "test-gpu": "raw/test-gpu.json",
       "bench-comm": "raw/bench-comm.json", "bench": "raw/bench"}
VERIFY_ROWS_C1 = 4  # batch 1 x 4 draft tokens (the shipped profile's chain drafting 3/1/4)
THRESHOLDS = {
    # PCIe IPC stays the default for plain reductions when it is at least this much faster than SGLang's NCCL
    # route at the C1 verify width, per call in a graph-replayed chain of 122
    "pcie_ipc_max_ratio": 0.90,
    # the fusion is worth enabling at this TP when the verify-shaped forward over the fused op is at least this
    # much faster than over tp.all_reduce (and keeping it off when it is not)
    "fusion_max_ratio": 0.97,
    # the launcher's PCIe NCCL defaults stay when they cost at most this much at verify and prefill widths
    "nccl_defaults_max_ratio": 1.03,
    # EAGLE-3 pays when its median decode tok/s at C1 beats speculation off by at least this factor
    "speculation_min_ratio": 1.02,
    # another NCCL release is worth a rebuild when its per-call latency (8 and 2048 rows, default variant) is at
    # least this much lower than the image's own
    "nccl_release_max_ratio": 0.97,
    # the goal on the box: single-stream decode with EAGLE-3 (>= 120 without speculation), verify <= 8 ms
    "goal_tok_s": 170.0,
    "goal_verify_ms": 8.0,
}


def measures(part: str) -> bool:
    """Does this part (bench-comm@IMAGE counts as bench-comm) measure something (MEASURING)?"""
    return part.split("@", 1)[0] in MEASURING


def open_receipt(path: Path) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """The receipt directory of `path` (a directory, or a .tar.gz unpacked to a temporary one the caller keeps)."""
    path = Path(path)
    if path.is_dir():
        if not (path / "receipt.json").is_file():
            raise UserError(f"{path} has no receipt.json: not a receipt directory (make report writes one)")
        return path, None
    if not path.is_file():
        raise UserError(f"receipt {path} does not exist")
    tmp = tempfile.TemporaryDirectory(prefix="receipt-")
    try:
        with tarfile.open(path, "r:gz") as tar:
            tar.extractall(tmp.name, filter="data")
    except (tarfile.TarError, OSError, EOFError) as e:
        tmp.cleanup()
        raise UserError(f"{path} is not a readable receipt tarball ({e}); ask for it again or re-run make report")
    found = sorted(Path(tmp.name).glob("*/receipt.json")) + sorted(Path(tmp.name).glob("receipt.json"))
    if not found:
        tmp.cleanup()
        raise UserError(f"{path} holds no receipt.json: not a receipt made by make report")
    return found[0].parent, tmp


def _json(d: Path, rel: str, shape: dict | None = None) -> dict | None:
    """A JSON file of the receipt (None when absent or empty); a UserError naming it by its place in the receipt
    when it is not JSON or not the object it should be (shape: key -> the type its value must have)."""
    f = d / rel
    if not (f.is_file() and f.stat().st_size):
        return None
    try:
        doc = json.loads(f.read_text())
    except ValueError as e:
        raise UserError(f"{rel} is not JSON ({e})") from e
    bad = [k for k, t in (shape or {}).items() if not isinstance(doc, dict) or not isinstance(doc.get(k), t)]
    if not isinstance(doc, dict) or bad:
        raise UserError(f"{rel} is not what its part writes (" + (f"{', '.join(bad)} missing or of the wrong type"
                                                               if isinstance(doc, dict) else "not an object") + ")")
    return doc


def load(d: Path) -> dict:
    """receipt.json plus the parsed raw parts: {"receipt", "test_serve", "doctor", "test_gpu", "bench_comm",
    "bench", ...}. A damaged file is a UserError that names it within the receipt."""
    meta = _json(d, "receipt.json", {"parts": dict})
    if meta is None:
        raise UserError("receipt.json is empty")
    if meta.get("schema") != SCHEMA:
        raise UserError(f"receipt.json has schema {meta.get('schema')!r}, this tooling reads {SCHEMA}")
    if "recommendations" not in meta or "thresholds" not in meta:
        raise UserError(f"receipt.json holds no recommendations: python -m scripts.bench.receipt --summarize {d} "
                        f"derives them from its raw parts")
    return {"receipt": meta} | raw_parts(d)


def raw_parts(d: Path) -> dict:
    """The parsed raw parts that exist: {"test_serve", "doctor", "test_gpu", "bench_comm", "bench_comm_alt",
    "bench"}; a damaged one is a UserError naming it within the receipt."""
    out = {"dir": d, "test_serve": _json(d, RAW["test-serve"], {"checks": list}),
           "doctor": _json(d, RAW["doctor"], {"findings": list}), "test_gpu": _json(d, RAW["test-gpu"]),
           "bench_comm": _json(d, RAW["bench-comm"], {"records": list})}
    out["bench_comm_alt"] = {f.stem.split("@", 1)[1]: _json(d, str(f.relative_to(d)), {"records": list})
                             for f in sorted((d / "raw").glob("bench-comm@*.json")) if f.stat().st_size}
    files = sorted((d / RAW["bench"]).glob("*.jsonl")) if (d / RAW["bench"]).is_dir() else []
    try:
        out["bench"] = [r for f in files for r in load_results(f)]
    except UserError as e:
        raise UserError(str(e).replace(str(d) + "/", "")) from e
    return out


def _ar(bc: dict, impl: str, rows: int, variant: str = "default") -> float | None:
    r = record(bc, kind="allreduce", impl=impl, rows=rows, mode="graph", variant=variant)
    return r["us_per_call"] if r else None


def _vf(bc: dict, impl: str, rows: int) -> float | None:
    r = record(bc, kind="verify_forward", impl=impl, rows=rows, mode="graph", variant="default")
    return r["us"] / 1e3 if r else None


def _verdict(name: str, verdict: str, why: str, measured: dict, threshold: str, setting: str = "") -> dict:
    return {"default": name, "verdict": verdict, "why": why, "measured": measured, "threshold": threshold,
            "setting": setting}


def rec_pcie_ipc(bc: dict | None) -> dict:
    name, th = "PCIe IPC all-reduce for plain TP reductions (patch distributed-*)", THRESHOLDS["pcie_ipc_max_ratio"]
    thr = f"PCIe IPC / NCCL per call at {VERIFY_ROWS_C1} rows <= {th}"
    if not bc:
        return _verdict(name, "inconclusive", "no bench-comm result in the receipt", {}, thr)
    routed = record(bc, kind="allreduce", impl="sglang_tp_default", rows=VERIFY_ROWS_C1, mode="graph")
    ipc, nccl = _ar(bc, "sglang_tp_default", VERIFY_ROWS_C1), _ar(bc, "sglang_tp_nccl", VERIFY_ROWS_C1)
    if routed is None or ipc is None or nccl is None:
        return _verdict(name, "inconclusive", "bench-comm ran without its SGLang rows", {}, thr)
    if routed.get("backend") != ["pcie_ipc"]:
        return _verdict(name, "inconclusive", f"PCIe IPC did not take the reductions (route {routed.get('backend')})",
                        {}, thr)
    per_rows = {n: round(a / b, 3) for n in (1, 4, 8, 16, 32, 64)
                if (a := _ar(bc, "sglang_tp_default", n)) and (b := _ar(bc, "sglang_tp_nccl", n))}
    measured = {"pcie_ipc_us": round(ipc, 2), "nccl_us": round(nccl, 2), "ratio_by_rows": per_rows}
    losing = [n for n, r in per_rows.items() if r >= 1.0]
    tail = f"; NCCL is as fast or faster from {min(losing)} rows" if losing else ""
    if ipc / nccl <= th:
        return _verdict(name, "keep", f"{ipc:.1f} vs {nccl:.1f} us per call ({ipc / nccl:.2f}x){tail}", measured, thr)
    return _verdict(name, "change", f"{ipc:.1f} vs {nccl:.1f} us per call ({ipc / nccl:.2f}x): not worth it here",
                    measured, thr, "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=0")


def rec_fusion(bc: dict | None) -> dict:
    th = THRESHOLDS["fusion_max_ratio"]
    world = (bc or {}).get("meta", {}).get("world")
    at = f"at TP{world}" if world else "at the TP measured (TP unknown: no bench-comm)"
    name = f"FlashInfer all-reduce + RMSNorm fusion {at} (patch flashinfer-allow-*; off at TP4/TP8)"
    thr = f"verify forward over the fused op / over tp.all_reduce <= {th} (8 rows, graph)"
    fused, plain = (_vf(bc, "sglang_fused_op", 8), _vf(bc, "sglang_tp", 8)) if bc else (None, None)
    if fused is None or plain is None:
        return _verdict(name, "inconclusive", "no verify-forward rows through SGLang in bench-comm", {}, thr)
    measured = {"fused_ms": round(fused, 3), "unfused_ms": round(plain, 3), "ratio": round(fused / plain, 3)}
    on_by_default = world == 2
    if fused / plain <= th:
        verdict = "keep" if on_by_default else "change"
        return _verdict(name, verdict, f"fused forward {fused:.2f} vs {plain:.2f} ms", measured, thr,
                        "" if on_by_default else "SGLANG_SM120_ALLREDUCE_FUSION=1")
    verdict = "change" if on_by_default else "keep"
    return _verdict(name, verdict, f"fused forward {fused:.2f} vs {plain:.2f} ms: no gain at this TP", measured, thr,
                    "SGLANG_SM120_ALLREDUCE_FUSION=0" if on_by_default else "")


def rec_nccl_defaults(bc: dict | None) -> dict:
    name, th = "NCCL defaults on PCIe-only boxes (patch launcher-*)", THRESHOLDS["nccl_defaults_max_ratio"]
    thr = f"pcie_defaults / default per call <= {th} at 8 and 2048 rows"
    if not bc:
        return _verdict(name, "inconclusive", "no bench-comm result in the receipt", {}, thr)
    ratios = {}
    for n in (8, 2048):
        a, b = _ar(bc, "nccl", n, "pcie_defaults"), _ar(bc, "nccl", n, "default")
        if a and b:
            ratios[n] = round(a / b, 3)
    variants = {v for r in bc["records"] if r.get("kind") == "allreduce" and (v := r.get("variant"))}
    best = {n: min(((v, x) for v in variants if (x := _ar(bc, "nccl", n, v))), key=lambda t: t[1], default=None)
            for n in (8, 2048)}
    measured = {"pcie_defaults_over_default": ratios,
                "fastest_variant": {n: (b[0], round(b[1], 1)) if b else None for n, b in best.items()}}
    if len(ratios) < 2:
        return _verdict(name, "inconclusive", "bench-comm lacks the default or pcie_defaults variant", measured, thr)
    if max(ratios.values()) <= th:
        return _verdict(name, "keep", f"pcie_defaults / default: {ratios[8]}x at 8 rows, {ratios[2048]}x at 2048",
                        measured, thr)
    return _verdict(name, "change", f"pcie_defaults / default: {ratios[8]}x at 8 rows, {ratios[2048]}x at 2048",
                    measured, thr, "SGLANG_PCIE_NCCL_DEFAULTS=0")


def alt_part_file(image: str) -> str:
    """raw/ file of bench-comm run from another image (the NCCL-release axis)."""
    return "raw/bench-comm@" + "".join(c if c.isalnum() or c in "._-" else "_" for c in image) + ".json"


def _nccl_of(bc: dict) -> str:
    """The NCCL a bench-comm run used: the loaded library (meta.nccl), else torch's build-time NCCL that runs
    recorded per variant (older runs as nccl_version)."""
    meta = bc.get("meta", {})
    n = meta.get("nccl")
    if isinstance(n, dict) and (n.get("loaded") or n.get("torch_build")):
        return n.get("loaded") or n["torch_build"]
    per = meta.get("per_variant", {}).get("default", {})
    return per.get("nccl_torch_build") or per.get("nccl_version") or "?"


def rec_nccl_release(bc: dict | None, alts: dict[str, dict]) -> dict:
    """The image's NCCL against the same bench-comm run from other images (other NCCL releases)."""
    th = THRESHOLDS["nccl_release_max_ratio"]
    name = "NCCL release the image runs (patches/pin.toml [nccl])"
    thr = f"another release's per-call latency / the image's <= {th} at 8 and 2048 rows (NCCL, default variant)"
    if not bc or not alts:
        how = "add another image (make image NCCL=<version>; make report REPORT_ARGS='--nccl-image <tag>')"
        why = f"one NCCL measured: {how}" if bc else f"no NCCL measured (no bench-comm in the receipt): {how}"
        return _verdict(name, "inconclusive", why, {"nccl": _nccl_of(bc) if bc else None}, thr)
    mine = {n: _ar(bc, "nccl", n) for n in (8, 2048)}
    table = {_nccl_of(bc): mine}
    better = []
    for image, alt in alts.items():
        theirs = {n: _ar(alt, "nccl", n) for n in (8, 2048)}
        table[f"{_nccl_of(alt)} ({image})"] = theirs
        if all(mine[n] and theirs[n] and theirs[n] / mine[n] <= th for n in mine):
            better.append((sum(theirs[n] / mine[n] for n in mine), image, _nccl_of(alt)))
    measured = {"us_per_call_by_release": table}
    if not better:
        return _verdict(name, "keep", f"NCCL {_nccl_of(bc)} is as fast as the others measured", measured, thr)
    _, image, version = min(better)
    return _verdict(name, "change", f"NCCL {version} ({image}) is faster at both widths", measured, thr,
                    f"make image NCCL={version} (and pin it in patches/pin.toml)")


def bench_rows(records: list[dict]) -> list[dict]:
    """Per (scenario, variant): median decode tok/s, accept length, eager verify forwards, n."""
    out = []
    for row in summarize(records):
        tok = row.stats.get(row.main)
        al = row.stats.get("accept_length")
        out.append({"scenario": row.scenario, "variant": row.variant, "n": row.n,
                    "tok_s": tok.median if tok else None, "tok_s_min": tok.min if tok else None,
                    "tok_s_max": tok.max if tok else None, "accept_length": al.median if al else None,
                    "eager_verifies": row.eager, "patched": any(p not in ("unknown", "None") for p in row.patchsets)})
    return out


def _speculative(records: list[dict]) -> dict[str, bool]:
    out = {}
    for r in records:
        e = r["eagle"]
        spec = e.get("speculative_algorithm") or (r.get("server_info") or {}).get("speculative_algorithm")
        out[e.get("variant", "?")] = bool(spec)
    return out


def _c1(records: list[dict]) -> str | None:
    """The single-stream scenario (C1), else the one with the lowest concurrency."""
    specs = {r["eagle"].get("scenario"): (r["eagle"].get("scenario_spec") or {}).get("max_concurrency", 1e9)
             for r in records}
    return "C1" if "C1" in specs else min(specs, key=specs.get) if specs else None


def rec_speculation(records: list[dict]) -> list[dict]:
    """EAGLE-3 on or off, and which speculative variant (drafter, steps/topk/draft tokens) to ship."""
    th, goal, scenario = THRESHOLDS["speculation_min_ratio"], THRESHOLDS["goal_tok_s"], _c1(records)
    name = f"EAGLE-3 in the shipped profile ({PROFILE})"
    thr = (f"best patched speculative / best non-speculative median decode tok/s at {scenario or 'C1'} >= {th} "
           f"(patched non-speculative when measured, else stock); goal {goal:.0f} tok/s")
    rows = [r for r in bench_rows(records) if r["scenario"] == scenario and r["tok_s"]]
    spec = _speculative(records)
    on = [r for r in rows if r["patched"] and spec.get(r["variant"]) and not r["eager_verifies"]]
    off = [r for r in rows if not spec.get(r["variant"])]
    off = [r for r in off if r["patched"]] or off
    if scenario is None:
        return [_verdict(name, "inconclusive", "no make bench results in the receipt", {}, thr)]
    if not on or not off:
        lacks = [what for what, have in (("a patched speculative run without eager verifies", on),
                                         ("a non-speculative run", off)) if not have]
        return [_verdict(name, "inconclusive", f"make bench has no {' and no '.join(lacks)} at {scenario}",
                         {"rows": rows}, thr)]
    best_on, best_off = max(on, key=lambda r: r["tok_s"]), max(off, key=lambda r: r["tok_s"])
    ratio = best_on["tok_s"] / best_off["tok_s"]
    measured = {"scenario": scenario, "speculative": best_on, "non_speculative": best_off, "ratio": round(ratio, 3),
                "goal_met": best_on["tok_s"] >= goal}
    al = best_on["accept_length"]
    why = (f"{best_on['variant']} {best_on['tok_s']:.1f} tok/s (AL {al:.2f}) vs " if al else
           f"{best_on['variant']} {best_on['tok_s']:.1f} tok/s vs ") + \
        (f"{best_off['variant']} {best_off['tok_s']:.1f} tok/s ({ratio:.2f}x); goal {goal:.0f} tok/s "
         f"{'met' if best_on['tok_s'] >= goal else 'not met'}")
    out = [_verdict(name, "keep" if ratio >= th else "change", why, measured, thr,
                    "" if ratio >= th else "serve --profile kimi-k25-tp8 (no speculation)")]
    ranked = sorted(on, key=lambda r: -r["tok_s"])
    shipped = ranked[0]["variant"] == "patched-eagle3"
    out.append(_verdict(f"speculative settings and drafter (profile {PROFILE})", "keep" if shipped else
                        "change", f"fastest speculative variant at {scenario}: {ranked[0]['variant']}",
                        {"ranked": [(r["variant"], round(r["tok_s"], 1), r["accept_length"]) for r in ranked]},
                        "highest median decode tok/s among patched speculative variants with no eager verify",
                        "" if shipped else f"the settings of bench variant {ranked[0]['variant']}"))
    return out


def profile_tp(profile: str = PROFILE) -> int:
    """The tensor-parallel size the shipped profile serves (its [args] tp-size)."""
    args = load_toml(PROFILES_DIR / f"{profile}.toml", "profile").get("args", {})
    return int(args.get("tp-size") or args.get("tensor-parallel-size") or 1)


def box_class(data: dict) -> dict:
    """What the receipt was measured on: GPU model, count and link (the doctor's facts, which apply the one
    PCIe-only rule; else bench-comm's meta and its `nvidia-smi topo -m`, where NV# is an NVLink bond), and the TP
    the shipped profile serves."""
    facts = (data.get("doctor") or {}).get("facts") or {}
    meta = (data.get("bench_comm") or {}).get("meta") or {}
    tg = data.get("test_gpu") or {}
    names = [g.get("name") for g in facts.get("gpus", []) if isinstance(g, dict)]
    names = names or list((tg.get("meta") or {}).get("gpus") or [])
    gpu = (names[0] if names else None) or meta.get("gpu_name")
    count = len(names) or meta.get("world") or tg.get("world")
    link = {True: "PCIe only", False: "NVLink"}.get(facts.get("pcie_only"), "")
    if not link and meta.get("topo_m"):
        cells = parse_topo_m(re.sub(r"\x1b\[[0-9;]*m", "", meta["topo_m"]))["links"].values()
        link = "NVLink" if any(re.fullmatch(r"NV\d+", c) for c in cells) else "PCIe only" if cells else ""
    return {"gpu": gpu or "GPU unknown", "count": count, "link": link or "link unknown", "tp": profile_tp()}


def describe_box(cls: dict) -> str:
    """'8x NVIDIA RTX PRO 6000 Blackwell Server Edition, PCIe only'."""
    return f"{cls['count'] or '?'}x {cls['gpu']}, {cls['link']}"


def proxy_reasons(cls: dict) -> list[str]:
    """Why the receipt is not from the box the series is for (a PCIe-only box serving at the profile's TP); []
    when it is (or cannot say)."""
    out = []
    if cls["count"] and cls["count"] != cls["tp"]:
        out.append(f"{cls['count']} GPU(s), the profile serves TP{cls['tp']}")
    if cls["link"] == "NVLink":
        out.append("its GPUs have NVLink, the series' PCIe defaults are for PCIe-only boxes")
    return out


def judged_on(rec: dict, cls: dict, reasons: list[str]) -> dict:
    """A verdict on a PCIe-only / TP default from another box class turns inconclusive, saying why."""
    if not reasons or rec["verdict"] == "inconclusive":
        return rec
    return {**rec, "verdict": "inconclusive", "setting": "",
            "why": f"measured on {describe_box(cls)} ({'; '.join(reasons)}), not on the box: {rec['why']}"}


def recommendations(data: dict) -> list[dict]:
    bc = data.get("bench_comm")
    cls = box_class(data)
    reasons = proxy_reasons(cls)
    world = (bc or {}).get("meta", {}).get("world")
    tp_reason = [f"measured at TP{world}, the profile serves TP{cls['tp']}"] if world and world != cls["tp"] else []
    return [judged_on(rec_pcie_ipc(bc), cls, reasons), judged_on(rec_fusion(bc), cls, tp_reason),
            judged_on(rec_nccl_defaults(bc), cls, reasons), rec_nccl_release(bc, data.get("bench_comm_alt") or {}),
            *rec_speculation(data.get("bench") or [])]


def per_call_latencies(bc: dict, rows: int = VERIFY_ROWS_C1) -> dict[str, float]:
    """Measured per-call latency (us) of each reduction path at `rows`, for the cost model's box section."""
    out = {}
    for label, impl, variant in (("NCCL, environment as is", "nccl", "default"),
                                 ("NCCL, the launcher's PCIe defaults", "nccl", "pcie_defaults"),
                                 ("NCCL, NCCL_PROTO=LL", "nccl", "LL"),
                                 ("tp.all_reduce -> PCIe IPC (SGLang)", "sglang_tp_default", "default"),
                                 ("tp.all_reduce -> pynccl (SGLang)", "sglang_tp_nccl", "default")):
        if (us := _ar(bc, impl, rows, variant)) is not None:
            out[label] = us
    r = record(bc, kind="fused", impl="sglang_fused_op", rows=rows, mode="graph")
    if r:
        out["fused all-reduce + RMSNorm op (SGLang)"] = r["us_per_call"]
    return out


# ----------------------------------------------------------------------------------------------------- summary
def _route_series(bc: dict) -> dict[str, list[tuple[int, float]]]:
    """Per-call latency (graph chain) against rows, per reduction path, for the plot and the table."""
    series: dict[str, list[tuple[int, float]]] = {}
    for r in bc.get("records", []):
        if r.get("kind") in ("allreduce", "fused") and r.get("mode") == "graph" and r.get("rows", 1e9) <= 256:
            label = r["impl"] if r["kind"] == "fused" or r["impl"] != "nccl" else f"nccl ({r['variant']})"
            series.setdefault(label, []).append((r["rows"], r["us_per_call"]))
    return {k: sorted(v) for k, v in series.items()}


def plots(data: dict, out: Path) -> list[str]:
    """PNGs under out/: per-call latency against rows, decode tok/s per variant; names relative to the receipt."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    out.mkdir(parents=True, exist_ok=True)
    made = []
    if data.get("bench_comm"):
        fig, ax = plt.subplots(figsize=(10, 5))
        for label, pts in _route_series(data["bench_comm"]).items():
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set(xscale="log", yscale="log", xlabel="rows (batch x draft tokens)", ylabel="us per call (graph chain)",
               title=f"Per-call reduction latency, {describe_box(box_class(data))}")
        finish_axes(ax, True)
        fig.tight_layout()
        fig.savefig(out / "per_call.png", dpi=110)
        plt.close(fig)
        made.append("plots/per_call.png")
    rows = bench_rows(data.get("bench") or [])
    if rows:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        labels = [f"{r['scenario']} {r['variant']}" for r in rows]
        ax.barh(labels, [r["tok_s"] or 0 for r in rows],
                xerr=[[max((r["tok_s"] or 0) - (r["tok_s_min"] or 0), 0) for r in rows],
                      [max((r["tok_s_max"] or 0) - (r["tok_s"] or 0), 0) for r in rows]])
        ax.axvline(THRESHOLDS["goal_tok_s"], color="red", linestyle="--", label="goal")
        ax.set(xlabel="decode tok/s (median, min-max)", title=f"Serving A/B (make bench), {describe_box(box_class(data))}")
        finish_axes(ax, True)
        fig.tight_layout()
        fig.savefig(out / "bench.png", dpi=110)
        plt.close(fig)
        made.append("plots/bench.png")
    return made


def _md_table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def summary_markdown(data: dict, plot_files: list[str]) -> str:
    meta = data["receipt"]
    env = meta.get("environment", {})
    cls = box_class(data)
    reasons = proxy_reasons(cls)
    lines = [f"# Box receipt: {env.get('box', '?')}", "", f"Measured on {describe_box(cls)}"
             + (f": a proxy, not the box ({'; '.join(reasons)})." if reasons else "."), "",
             f"Made {meta.get('created')} at git {env.get('git_rev')}, patch set {env.get('patchset')}, pin "
             f"{json.dumps(env.get('pin'))}.", "", "## Environment", ""]
    for k, v in (env.get("doctor") or {}).items():
        lines.append(f"- {k}: {v}")
    if env.get("nccl"):
        lines.append(f"- NCCL (bench-comm: loaded, expected, torch build): {env['nccl']}")
    if env.get("image"):
        lines.append(f"- image: {env['image']}")
    lines += ["", "## Parts", ""] + _md_table(["part", "status", "seconds", "command"], [
        [p, r.get("status"), r.get("seconds", "-"), "`" + " ".join(r["command"]) + "`" if r.get("command") else "-"]
        for p, r in meta.get("parts", {}).items()])
    lines += ["", "## Recommendations", "", "Thresholds: " + ", ".join(f"{k} = {v}" for k, v in
                                                                     meta["thresholds"].items()),
              ""] + _md_table(["default", "verdict", "why", "threshold", "setting"], [
        [r["default"], r["verdict"], r["why"], r["threshold"], r["setting"] or "-"]
        for r in meta.get("recommendations", [])])
    ts = data.get("test_serve")
    if ts:
        lines += ["", "## make test-serve", "", f"TP{ts.get('world')}: {ts.get('passed')} passed, {ts.get('failed')} "
                  f"failed" + (f" ({ts['proxy']})" if ts.get("proxy") else "")]
        lines += [f"- FAILED {c['phase']}: {c['name']}: {c['detail']}" for c in ts.get("checks", []) if not c["ok"]]
    tg = data.get("test_gpu")
    if tg:
        lines += ["", "## make test-gpu", "", f"world {tg.get('world')}: {tg.get('passed')} passed, "
                  f"{tg.get('failed')} failed, {tg.get('skipped')} skipped"]
    bc = data.get("bench_comm")
    if bc:
        series = _route_series(bc)
        all_rows = sorted({n for pts in series.values() for n, _ in pts})
        lines += ["", "## Per-call latency, graph-replayed chains (us)", ""] + _md_table(
            ["path"] + [str(n) for n in all_rows],
            [[label] + [f"{dict(pts)[n]:.1f}" if n in dict(pts) else "-" for n in all_rows]
             for label, pts in series.items()])
    rows = bench_rows(data.get("bench") or [])
    if rows:
        lines += ["", "## Serving (make bench)", ""] + _md_table(
            ["scenario", "variant", "n", "decode tok/s (median)", "min-max", "accept length", "eager verifies"],
            [[r["scenario"], r["variant"], r["n"], f"{r['tok_s']:.1f}" if r["tok_s"] else "-",
              f"{r['tok_s_min']:.1f}-{r['tok_s_max']:.1f}" if r["tok_s"] else "-",
              f"{r['accept_length']:.2f}" if r["accept_length"] else "-", r["eager_verifies"]] for r in rows])
    lines += [""] + [f"![{Path(p).stem}]({p})" for p in plot_files]
    return "\n".join(lines) + "\n"
