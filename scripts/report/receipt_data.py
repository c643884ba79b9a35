"""The box receipt as data: its parts (PARTS, the registry make report runs in order: a new part is one entry), reading
a receipt (a directory or its tarball), and its recommendations - one per default of the series, with the numbers it
read, the threshold it applied and a verdict (keep, change with the setting, inconclusive with what is missing),
computed once when the receipt is written. Used by make report (receipt.py) and make docs (cost_model.py).
"""

import dataclasses
import json
import re
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..bench.report import accept_by_set, load_results, summarize
from ..box.results import read_junit
from ..comm.comm_report import record, records
from ..host.checks import PCIE_IPC_OFF
from ..host.facts import parse_topo_m
from ..lib import profiles
from ..lib.errors import UserError
from ..lib.repo import SHIPPED_PROFILE

SCHEMA = "eagle-receipt/1"
VERIFY_ROWS_C1 = 4  # batch 1 x 4 draft tokens (the shipped profile's chain drafting 3/1/4)
COMM_S = 5 * 150 + 600  # bench-comm: its five variants and the PCIe-IPC autotune (its ESTIMATE_S)
THRESHOLDS = {
    "pcie_ipc_max_ratio": 0.90,  # PCIe IPC / the best other backend, per call at a size, for PCIe IPC to take it
    "fusion_max_ratio": 0.97,  # verify-shaped forward over the fused op / over tp.all_reduce
    "nccl_env_max_ratio": 0.97,  # an NCCL environment variant / NCCL as is, at 8 and 2048 rows
    "speculation_min_ratio": 1.02,  # best EAGLE-3 / best without speculation, median decode tok/s at C1
    "goal_tok_s": 170.0,  # the goal on the box: single-stream decode with EAGLE-3
    "goal_verify_ms": 8.0,
}
SGLANG_BACKENDS = {"sglang_tp_default": "pcie_ipc", "sglang_tp_flashinfer": "flashinfer", "sglang_tp_nccl": "nccl"}


def _verb(module: str, *args) -> list[str]:
    return [sys.executable, "-m", module, *map(str, args)]


def _image(a) -> list[str]:
    return ["--image", a.image] if a.image else []


def _port(a) -> list[str]:  # make report --port: every part that serves
    return ["--port", str(a.port)] if getattr(a, "port", None) else []


def _in_image(d: Path, a, verb: str, out: str, flag: str = "--out") -> list[str]:
    """The image's `verb` writing raw/`out` (the receipt's raw/ mounted at /results)."""
    return _verb("scripts.host.in_image", *_image(a), "--results", d / "raw", verb, flag, f"/results/{out}")


@dataclasses.dataclass(frozen=True)
class Part:
    """One part: its verb's command (receipt directory, make report's options), the file it leaves, its time."""

    name: str
    result: str
    command: Callable[[Path, object], list[str]]
    estimate_s: float  # bench: its plan's instead
    done: str = "ok"  # ok: recorded ok, its result there; clean: its result has no failed check; never: runs again
    measures: bool = True  # its result makes a receipt worth sharing
    stdout: bool = False  # its result is what it prints


def _test_serve(d: Path, a) -> list[str]:
    return _in_image(d, a, "test-serve", "test-serve.xml", "--serve-out")


def _bench(d: Path, a) -> list[str]:
    where = ["--results-dir", d / "raw/bench", "--box", a.box, "--resume"]
    return _verb("scripts.bench.bench", *where, *_image(a), *_port(a), *a.bench_args)


def _doctor(d: Path, a) -> list[str]:
    return _verb("scripts.host.doctor", "--json", "--record", d / "env" / "tools")


def _profile(d: Path, a) -> list[str]:  # read by make docs RECEIPT=
    return _verb("scripts.report.profile", "--out", d / "raw/profile.json", *_image(a), *_port(a))


PARTS = {
    p.name: p
    for p in (
        Part("test-serve", "raw/test-serve.xml", _test_serve, 900, "clean"),
        Part("doctor", "raw/doctor.json", _doctor, 5, "never", measures=False, stdout=True),
        Part("test-gpu", "raw/test-gpu.xml", lambda d, a: _in_image(d, a, "test-gpu", "test-gpu.xml"), 600),
        Part(
            "bench-comm", "raw/bench-comm.json", lambda d, a: _in_image(d, a, "bench-comm", "bench-comm.json"), COMM_S
        ),
        Part("bench", "raw/bench", _bench, 0),
        Part("profile", "raw/profile.json", _profile, 1320),
    )
}


def measures(part: str) -> bool:
    """Does this part measure something (a part this tooling does not know: no)?"""
    return part in PARTS and PARTS[part].measures


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
        raise UserError(
            f"{path} is not a readable receipt tarball ({e}); ask for it again or re-run make report"
        ) from e
    found = sorted(Path(tmp.name).glob("*/receipt.json")) + sorted(Path(tmp.name).glob("receipt.json"))
    if not found:
        tmp.cleanup()
        raise UserError(f"{path} holds no receipt.json: not a receipt made by make report")
    return found[0].parent, tmp


def _json(d: Path, rel: str, shape: dict | None = None) -> dict | None:
    """A JSON file of the receipt (None when absent or empty); a UserError naming it by its place in the receipt
    when it is not JSON or not the object its part writes (shape: key -> the type its value must have)."""
    f = d / rel
    if not (f.is_file() and f.stat().st_size):
        return None
    try:
        doc = json.loads(f.read_text())
    except ValueError as e:
        raise UserError(f"{rel} is not JSON ({e})") from e
    bad = [k for k, t in (shape or {}).items() if not isinstance(doc, dict) or not isinstance(doc.get(k), t)]
    if not isinstance(doc, dict) or bad:
        raise UserError(
            f"{rel} is not what its part writes ("
            + (f"{', '.join(bad)} missing or of the wrong type" if isinstance(doc, dict) else "not an object")
            + ")"
        )
    return doc


def load(d: Path) -> dict:
    """receipt.json plus the parsed raw parts; a damaged file is a UserError naming it within the receipt."""
    meta = _json(d, "receipt.json", {"parts": dict}) or {}
    if meta.get("schema") != SCHEMA:
        raise UserError(f"receipt.json has schema {meta.get('schema')!r}, this tooling reads {SCHEMA}")
    if "recommendations" not in meta or "thresholds" not in meta:
        raise UserError(
            f"receipt.json holds no recommendations: python -m scripts.report.receipt --summarize {d} "
            f"derives them from its raw parts"
        )
    return {"receipt": meta} | raw_parts(d)


def junit(d: Path, rel: str) -> dict | None:
    """A test tier's result (pytest's junitxml) of the receipt, read (None when absent or empty)."""
    f = d / rel
    return read_junit(f) if f.is_file() and f.stat().st_size else None


def raw_parts(d: Path) -> dict:
    """The parsed raw parts that exist: test_serve, doctor, test_gpu, bench_comm, bench, profile."""
    out = {
        "dir": d,
        "test_serve": junit(d, PARTS["test-serve"].result),
        "doctor": _json(d, PARTS["doctor"].result, {"findings": list}),
        "test_gpu": junit(d, PARTS["test-gpu"].result),
        "bench_comm": _json(d, PARTS["bench-comm"].result, {"records": list}),
        "profile": _json(d, PARTS["profile"].result),
    }
    bench = d / PARTS["bench"].result
    try:
        out["bench"] = [r for f in sorted(bench.glob("*.jsonl")) for r in load_results(f)] if bench.is_dir() else []
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
    return dict(default=name, verdict=verdict, why=why, measured=measured, threshold=threshold, setting=setting)


def startup_table(data: dict) -> dict | None:
    """The speculative server's startup all-reduce table (/server_info allreduce_backends, kept by the profile part)."""
    table = ((data.get("profile") or {}).get("allreduce_backends") or {}).get("spec")
    return table if isinstance(table, dict) else None


def backend_latencies(data: dict) -> dict[int, dict[str, float]]:
    """Per-call all-reduce latency (us, in CUDA graphs) per decode size and backend, as measured: bench-comm's SGLang
    rows (tp.all_reduce routed to PCIe IPC, FlashInfer, NCCL), then the served model's own startup timing, which wins
    where both measured a size (it ran in the server's graphs, on every rank)."""
    out: dict[int, dict[str, float]] = {}
    for impl, backend in SGLANG_BACKENDS.items():
        for r in records(data.get("bench_comm") or {"records": []}, kind="allreduce", impl=impl, mode="graph"):
            if backend != "pcie_ipc" or r.get("backend") == ["pcie_ipc"]:
                out.setdefault(r["rows"], {})[backend] = r["us_per_call"]
    for size in (startup_table(data) or {}).get("sizes") or []:
        if size.get("us"):
            out[int(size["rows"])] = {k: float(v) for k, v in size["us"].items()}
    return dict(sorted(out.items()))


def rec_pcie_ipc(data: dict) -> dict:
    name, th = "PCIe IPC all-reduce for plain TP reductions (patch distributed-*)", THRESHOLDS["pcie_ipc_max_ratio"]
    thr = f"PCIe IPC / the fastest other backend per call <= {th}, judged at {VERIFY_ROWS_C1} rows (C1 verify)"
    smoke, off = ((data.get("doctor") or {}).get("facts") or {}).get("pcie_ipc_smoke") or {}, PCIE_IPC_OFF
    if smoke.get("hung") or smoke.get("sum_ok") is False:
        what, detail = "hung" if smoke.get("hung") else "summed wrong", smoke.get("why") or smoke.get("phase")
        why = f"the doctor's PCIe-IPC smoke {what} ({detail or smoke.get('wrong')})"
        return _verdict(name, "change", why, {"smoke": smoke}, thr, off)
    ratios = {}
    for n, b in backend_latencies(data).items():
        others = [(v, k) for k, v in b.items() if k != "pcie_ipc"]
        if "pcie_ipc" in b and others:
            us, other = min(others, key=lambda x: x[0])
            ratios[n] = (round(b["pcie_ipc"] / us, 3), other)
    if VERIFY_ROWS_C1 not in ratios:
        why = f"no per-call latency of PCIe IPC and another backend at {VERIFY_ROWS_C1} rows (bench-comm's SGLang rows)"
        return _verdict(name, "inconclusive", why, {"ratio_by_rows": ratios}, thr)
    wins, (ratio, other) = [n for n, (r, _) in ratios.items() if r <= th], ratios[VERIFY_ROWS_C1]
    why = f"PCIe IPC / {other} = {ratio} at {VERIFY_ROWS_C1} rows; PCIe IPC wins at {wins or 'no size'} of {list(ratios)} rows"
    measured = {"ratio_by_rows": ratios, "wins_at": wins}
    if VERIFY_ROWS_C1 in wins:
        return _verdict(name, "keep", why, measured, thr)
    return _verdict(name, "change", why, measured, thr, off)


def rec_fusion(bc: dict | None) -> dict:
    th, world = THRESHOLDS["fusion_max_ratio"], (bc or {}).get("meta", {}).get("world")
    at = f"at TP{world}" if world else "at the TP measured (TP unknown: no bench-comm)"
    name = f"FlashInfer all-reduce + RMSNorm fusion {at} (patch flashinfer-allow-*; off at TP4/TP8)"
    thr = f"verify forward over the fused op / over tp.all_reduce <= {th} (8 rows, graph)"
    fused, plain = (_vf(bc, "sglang_fused_op", 8), _vf(bc, "sglang_tp", 8)) if bc else (None, None)
    if fused is None or plain is None:
        return _verdict(name, "inconclusive", "no verify-forward rows through SGLang in bench-comm", {}, thr)
    measured = {"fused_ms": round(fused, 3), "unfused_ms": round(plain, 3), "ratio": round(fused / plain, 3)}
    on, gain = world == 2, fused / plain <= th  # the series turns it on at TP2 only
    why = f"fused forward {fused:.2f} vs {plain:.2f} ms" + ("" if gain else ": no gain at this TP")
    setting = "" if gain == on else f"SGLANG_SM120_ALLREDUCE_FUSION={int(gain)}"
    return _verdict(name, "keep" if gain == on else "change", why, measured, thr, setting)


def rec_nccl_env(bc: dict | None) -> dict:
    """NCCL as is against bench-comm's NCCL environment variants (protocols, P2P off)."""
    name = "NCCL environment (as is, against NCCL_PROTO=LL/LL128/Simple and P2P off)"
    th = THRESHOLDS["nccl_env_max_ratio"]
    thr = f"a variant / as is, per call <= {th} at 8 and 2048 rows"
    variants = {r["variant"] for r in (bc or {}).get("records", []) if r.get("kind") == "allreduce"} - {"default"}
    table = {v: {} for v in variants}
    for v, n in ((v, n) for v in variants for n in (8, 2048)):
        if (x := _ar(bc, "nccl", n, v)) and (base := _ar(bc, "nccl", n)):
            table[v][n] = round(x / base, 3)
    measured = {"ratio_to_as_is": table}
    if not bc or not any(len(t) == 2 for t in table.values()):
        why = "bench-comm lacks NCCL as is or another variant at 8 and 2048 rows"
        return _verdict(name, "inconclusive", why, measured, thr)
    better = sorted((sum(t.values()), v) for v, t in table.items() if len(t) == 2 and max(t.values()) <= th)
    if not better:
        return _verdict(name, "keep", "no variant is faster at both widths", measured, thr)
    best = better[0][1]
    env = (bc.get("meta", {}).get("variants") or {}).get(best) or {}
    setting = " ".join(f"{k}={v}" for k, v in env.items()) or best
    return _verdict(name, "change", f"{best} is faster at both widths ({table[best]})", measured, thr, setting)


def bench_rows(recs: list[dict]) -> list[dict]:
    """Per (scenario, variant): median decode tok/s (min, max), accept length, eager verify forwards, n."""
    out = []
    for row in summarize(recs):
        tok, al = row.stats.get(row.main), row.stats.get("accept_length")
        patched = any(p not in ("unknown", "None", "none") for p in row.patchsets)
        which = {"scenario": row.scenario, "variant": row.variant, "n": row.n}
        tok_s = {"tok_s": tok and tok.median, "tok_s_min": tok and tok.min, "tok_s_max": tok and tok.max}
        out.append(which | tok_s | {"accept_length": al and al.median, "eager_verifies": row.eager, "patched": patched})
    return out


def rec_speculation(recs: list[dict]) -> list[dict]:
    """EAGLE-3 on or off, and which speculative variant (drafter, steps/topk/draft tokens) to ship."""
    th, goal = THRESHOLDS["speculation_min_ratio"], THRESHOLDS["goal_tok_s"]
    name = f"EAGLE-3 in the shipped profile ({SHIPPED_PROFILE})"
    conc = {
        r["eagle"].get("scenario"): (r["eagle"].get("scenario_spec") or {}).get("max_concurrency", 1e9) for r in recs
    }
    scenario = "C1" if "C1" in conc else min(conc, key=conc.get, default=None)
    thr = (
        f"best patched speculative / best non-speculative median decode tok/s at {scenario or 'C1'} >= {th} "
        f"(patched non-speculative when measured, else stock); goal {goal:.0f} tok/s"
    )
    if scenario is None:
        return [_verdict(name, "inconclusive", "no make bench results in the receipt", {}, thr)]
    spec = {r["eagle"].get("variant"): bool(r["eagle"].get("speculative_algorithm")) for r in recs}
    rows = [r for r in bench_rows(recs) if r["scenario"] == scenario and r["tok_s"]]
    on = [r for r in rows if r["patched"] and spec.get(r["variant"]) and not r["eager_verifies"]]
    off = [r for r in rows if not spec.get(r["variant"])]
    off = [r for r in off if r["patched"]] or off
    if not on or not off:
        missing = (("patched speculative run without eager verifies", on), ("non-speculative run", off))
        lacks = " and no ".join(what for what, have in missing if not have)
        return [_verdict(name, "inconclusive", f"make bench has no {lacks} at {scenario}", {"rows": rows}, thr)]
    b_on, b_off = max(on, key=lambda r: r["tok_s"]), max(off, key=lambda r: r["tok_s"])
    ratio, met = b_on["tok_s"] / b_off["tok_s"], b_on["tok_s"] >= goal
    al = f" (AL {b_on['accept_length']:.2f})" if b_on["accept_length"] else ""
    why = (
        f"{b_on['variant']} {b_on['tok_s']:.1f} tok/s{al} vs {b_off['variant']} {b_off['tok_s']:.1f} tok/s "
        f"({ratio:.2f}x); goal {goal:.0f} tok/s {'met' if met else 'not met'}"
    )
    measured = dict(scenario=scenario, speculative=b_on, non_speculative=b_off, ratio=round(ratio, 3), goal_met=met)
    keep, setting = ratio >= th, "" if ratio >= th else "serve --profile kimi-k25-tp8"
    ranked = sorted(on, key=lambda r: -r["tok_s"])
    fastest, shipped = ranked[0]["variant"], ranked[0]["variant"] == "patched-eagle3"
    settings = f"speculative settings and drafter (profile {SHIPPED_PROFILE})"
    fastest_why = f"fastest speculative variant at {scenario}: {fastest}"
    ranking = {"ranked": [(r["variant"], round(r["tok_s"], 1), r["accept_length"]) for r in ranked]}
    sets = {v: {s: round(x.median, 3) for s, x in by.items()} for v, by in accept_by_set(summarize(recs)).items()}
    if sets:  # the prompt sets' accept length: what the drafter choice rests on (bench/scenarios.toml C1-chat, C1-code)
        ranking["accept_length_by_set"] = sets
        fastest_why += "; accept length per prompt set: " + "; ".join(f"{v} {json.dumps(x)}" for v, x in sets.items())
    rule = "highest median decode tok/s among patched speculative variants with no eager verify"
    fastest_setting = "" if shipped else f"the settings of bench variant {fastest}"
    return [
        _verdict(name, "keep" if keep else "change", why, measured, thr, setting),
        _verdict(settings, "keep" if shipped else "change", fastest_why, ranking, rule, fastest_setting),
    ]


def box_class(data: dict) -> dict:
    """What the receipt was measured on: GPU model, count and link (the doctor's facts; else bench-comm's meta and
    its `nvidia-smi topo -m`, where NV# is an NVLink bond), and the TP the shipped profile serves."""
    facts = (data.get("doctor") or {}).get("facts") or {}
    meta, tg = (data.get("bench_comm") or {}).get("meta") or {}, (data.get("test_gpu") or {}).get("properties", {})
    names = [g.get("name") for g in facts.get("gpus", []) if isinstance(g, dict)] or list(tg.get("gpus") or [])
    link = {True: "PCIe only", False: "NVLink"}.get(facts.get("pcie_only"), "")
    if not link and meta.get("topo_m"):
        cells = parse_topo_m(re.sub(r"\x1b\[[0-9;]*m", "", meta["topo_m"]))["links"].values()
        link = "NVLink" if any(re.fullmatch(r"NV\d+", c) for c in cells) else "PCIe only" if cells else ""
    return {
        "gpu": (names[0] if names else None) or meta.get("gpu_name") or "GPU unknown",
        "count": len(names) or meta.get("world") or tg.get("world"),
        "link": link or "link unknown",
        "tp": int(profiles.settings(SHIPPED_PROFILE).get("tp-size") or 0) or 1,
    }


def describe_box(cls: dict) -> str:
    """'8x NVIDIA RTX PRO 6000 Blackwell Server Edition, PCIe only'."""
    return f"{cls['count'] or '?'}x {cls['gpu']}, {cls['link']}"


def proxy_reasons(cls: dict) -> list[str]:
    """Why the receipt is not from the box the series is for (PCIe only, at the profile's TP); [] when it is."""
    out = []
    if cls["count"] and cls["count"] != cls["tp"]:
        out.append(f"{cls['count']} GPU(s), the profile serves TP{cls['tp']}")
    if cls["link"] == "NVLink":
        out.append("its GPUs have NVLink, the series' PCIe defaults are for PCIe-only boxes")
    return out


def judged_on(rec: dict, cls: dict, reasons: list[str]) -> dict:
    """A verdict from another box class turns inconclusive, saying why (its numbers stay)."""
    if not reasons or rec["verdict"] == "inconclusive":
        return rec
    why = f"measured on {describe_box(cls)} ({'; '.join(reasons)}), not on the box: {rec['why']}"
    return {**rec, "verdict": "inconclusive", "setting": "", "why": why}


def recommendations(data: dict) -> list[dict]:
    bc, cls = data.get("bench_comm"), box_class(data)
    reasons, world = proxy_reasons(cls), (bc or {}).get("meta", {}).get("world")
    tp_reason = [f"measured at TP{world}, the profile serves TP{cls['tp']}"] if world and world != cls["tp"] else []
    return [
        judged_on(rec_pcie_ipc(data), cls, reasons),
        judged_on(rec_fusion(bc), cls, tp_reason),
        judged_on(rec_nccl_env(bc), cls, reasons),
        *rec_speculation(data.get("bench") or []),
    ]


def per_call_latencies(bc: dict, rows: int = VERIFY_ROWS_C1) -> dict[str, float]:
    """Measured per-call latency (us) of each reduction path at `rows`, for the cost model's box section."""
    paths = (
        ("NCCL, environment as is", "nccl", "default"),
        ("NCCL, NCCL_PROTO=LL", "nccl", "LL"),
        ("tp.all_reduce -> PCIe IPC (SGLang)", "sglang_tp_default", "default"),
        ("tp.all_reduce -> pynccl (SGLang)", "sglang_tp_nccl", "default"),
    )
    out = {label: us for label, impl, variant in paths if (us := _ar(bc, impl, rows, variant))}
    r = record(bc, kind="fused", impl="sglang_fused_op", rows=rows, mode="graph")
    return out | ({"fused all-reduce + RMSNorm op (SGLang)": r["us_per_call"]} if r else {})
