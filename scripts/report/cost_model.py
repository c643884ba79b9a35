"""`make docs`: regenerate the generated blocks of eagle-fast-verify.md and bench/results/cost-model.png.

  python -m scripts.report.cost_model [--write | --check] [--doc FILE] [--receipt R ...]

The blocks between `<!-- cost-model:NAME -->` markers come from bench/inputs/ (the box model, spec_model.py), the
H200 proxy's bench/results/bench-comm_H200_x2_*.json and box receipts (--receipt; default bench/receipts/*.tar.gz).
A box receipt's profile part (raw/profile.json, spec_model.PROFILE_FIELDS) refits the model. Every modelled forward
is checked against its physical floor and against the decode it contains.
Exit status: 0 printed, written or current; 1 --check found the document out of date; 2 an input or a receipt is
missing or damaged, or the model gives an impossible row.
"""

import functools
import json
import sys
from pathlib import Path

from ..comm.comm_report import record
from ..lib.cli import parser, run
from ..lib.errors import UserError
from ..lib.kimi import ATTN_GEMMS, LAYERS, MOE_GEMMS
from ..lib.progress import say
from ..lib.repo import REPO_ROOT
from ..lib.table import md_table, spread
from . import receipt_data as rd
from . import spec_model as sm

RESULTS, RECEIPTS = REPO_ROOT / "bench" / "results", REPO_ROOT / "bench" / "receipts"
DOC, C = REPO_ROOT / "eagle-fast-verify.md", "central"
UNKNOWN = {
    "a_seed_us": "the box's NCCL per call in a graph, us (sets B)",
    "eta": "achieved / spec bandwidth",
    "rho": "routing correlation of the verified tokens",
    "ipc_scale": "PCIe IPC per call / the docstring's",
    "kd_ms": "draft kernel chain per forward, ms",
    "glue_ms": "eager glue per cycle, ms",
}
EFFORT = {"S": 1, "S-M": 2, "M": 3, "M-L": 6, "L": 9}
ARM, GOAL_KEYS = {"dflash": "DFlash", "eagle": "EAGLE-3"}, ("stretch_tok_s", "block_tok_s")


def band(vals: dict, d: int = 1, pct: bool = False) -> str:
    """'central (low-high)' of {corner: value}."""
    f = (lambda x: f"{100 * x:.{d}f} %") if pct else (lambda x: f"{x:.{d}f}")
    lo, hi = f(min(vals.values())), f(max(vals.values()))
    return f(vals[C]) if lo == hi else f"{f(vals[C])} ({lo}-{hi})"


def err(got: float, lo: float, hi: float | None = None) -> str:
    hi = lo if hi is None else hi
    return "within" if lo < hi and lo <= got <= hi else f"{100 * (got / min(max(got, lo), hi) - 1):+.0f} %"


class Box:
    """The model at the three corners (a receipt's refit on top), and every model table."""

    def __init__(self, inp: dict, cyc: dict, over: dict | None = None, runs: list[dict] = ()):
        self.inp, self.cyc, self.over, self.runs = inp, cyc, over or {}, runs
        self.m = {c: sm.Model(inp, cyc, c, **self.over) for c in sm.CORNERS}
        self.seed = {
            c: sm.Model(inp, cyc, c, **self.over | {"head_rows": inp["drafter"]["seed_head_rows"]}) for c in sm.CORNERS
        }
        self.steps, self.al, self.goal = self.m[C].steps(), self.m[C].al(), rd.THRESHOLDS["goal_tok_s"]
        self.name, self.table = f"{self.steps}/1/{self.steps + 1}", self.rows()

    def each(self, fn, *args, seed: bool = False) -> dict:
        """fn(model, *args) at every corner (seed: the models with the seed's drafter head)."""
        return {c: fn(m, *args) for c, m in (self.seed if seed else self.m).items()}

    def at(self, **knobs) -> sm.Model:
        return sm.Model(self.inp, self.cyc, C, **(self.over | knobs))

    def backtest(self) -> str:
        s, v = self.inp["seed"], self.inp["seed"]["verify_eager_ms"]
        cyc = self.each(sm.Model.cycle_ms, self.steps, "nccl", v, seed=True)
        nccl = self.each(lambda m: v - m.gb(self.steps + 1) / m.eff, seed=True)
        share, be2 = {c: v / x for c, x in cyc.items()}, {c: x * s["decode_tok_s"] / 1000 for c, x in cyc.items()}
        n = sum(self.cyc["stages"]["target_verify"].values())
        peer_b = [1000 / p["nospec"] - n * p["ar_us"] / 1000 for p in self.inp["peer"] if "ar_us" in p]
        lo, hi = (a * s["decode_tok_s"] / s["eagle_tok_s"] for a in s["eagle_al"])
        plain, b = self.each(sm.Model.decode_tok_s, "nccl", seed=True), self.each(sm.Model.B, seed=True)
        decode, low, high = f"{s['decode_tok_s']:.0f}", min(peer_b), max(peer_b)
        rows = [
            ["Plain decode, tok/s", decode, "input (calibrates B)", band(plain), "0 % (by construction)"],
            ["B, ms", f"peers {low:.1f}-{high:.1f}", "cross-check (peers)", band(b, 2), err(self.m[C].B(), low, high)],
        ]
        run_ = next((r for r in self.runs if r["_file"] == self.inp["eager"]["proxy_run"]), None)
        if rec := run_ and record(run_, kind="verify_forward", impl="nccl", rows=4, mode="eager"):
            us = rec["us"] / (LAYERS * (len(ATTN_GEMMS) + len(MOE_GEMMS) + 4))  # per launch, the proxy's eager forward
            k = self.inp["kernels"]["per_forward"]
            role = f"input; cross-check: launch-bound, {us:.1f} us per launch (H200 proxy) x {k} kernels (estimated)"
            rows.append(["Eager verify (4 tokens), ms", f"~{v:.0f}", role, f"{k * us / 1e3:.1f}", err(k * us / 1e3, v)])
        nccl_ms, verify_share = s["verify_nccl_ms"], s["verify_share"]
        rows.append(f"... in NCCL kernels, ms | ~{nccl_ms:.0f} | prediction | {band(nccl)} | {err(nccl[C], nccl_ms)}")
        rows.append(
            f"Verify share of the cycle | {100 * verify_share:.0f} % | prediction | {band(share, 0, True)} | "
            f"{err(share[C], verify_share)}"
        )
        for name, tok, al in (
            *(("EAGLE-3", s["eagle_tok_s"], a) for a in s["eagle_al"]),
            ("AQ-MedAI drafter", s["aq_tok_s"], s["aq_al"]),
        ):
            got = {c: 1000 * al / x for c, x in cyc.items()}
            rows.append([f"{name} at AL {al}, tok/s", f"{tok:.0f}", "prediction", band(got), err(got[C], tok)])
        be, even = v * s["decode_tok_s"] / 1000, s["break_even"]
        rows.append(["Break-even AL, verify / decode", f"{even:.2f}", "from two inputs", f"{be:.2f}", err(be, even)])
        rows.append(
            f"Break-even AL, cycle / decode | {lo:.2f}-{hi:.2f} (AL x 82 / 60) | prediction | {band(be2, 2)} | "
            f"{err(be2[C], lo, hi)}"
        )
        return md_table("seed number | seed (box) | role | model: central (band) | error", rows)

    def physics(self) -> str:
        m, kib, rows = self.m[C], self.cyc["kib"]["target_verify"]["all_reduce"], []
        for w in (1, 4, 8):
            gb, fixed, shot = m.gb(w), m.non_routed(), m.oneshot_us(w)
            ipc, fwd = self.each(sm.Model.lat, "pcie_ipc", w * kib), self.each(sm.Model.forward_ms, w)
            nodes = self.each(lambda x, w=w: x.floor_ms(w) + x.node_floor_ms())
            rows.append(
                f"{w} | {fixed:.2f} + {gb - fixed:.2f} = {gb:.2f} | {gb / m.m['bandwidth_tb_s']:.2f} | "
                f"{shot:.1f} ({2 * shot / m.tp:.1f}) | {band(ipc)} | {m.floor_ms(w):.2f} | {band(fwd, 2)} | "
                f"{m.forward_ms(w) / m.floor_ms(w):.1f}x | {band(nodes, 2)}"
            )
        calls = self.cyc["stages"]["target_verify"]["all_reduce"]
        node_count = m.p["nodes"] or self.inp["kernels"]["per_forward"]
        node_us = band(self.each(sm.Model.node_us), 2)
        return md_table(
            "tokens | GB per GPU: non-routed + routed = total | bytes at 1.792 TB/s, ms | all-reduce egress "
            "floor per call, one-shot (two-shot), us | PCIe IPC per call, modelled, us | floor: bytes + "
            f"{calls} all-reduces at the one-shot floor, ms | modelled forward (PCIe IPC), ms | modelled / "
            f"floor | floor + node floor ({node_count} nodes x {node_us} us), ms",
            rows,
        )

    def rows(self) -> dict[str, list[dict]]:
        """The series' steps at the patched setting, and every chain setting: verify, cycle, tok/s per corner."""
        v, st, out = self.inp["seed"]["verify_eager_ms"], self.steps, {"series": [], "settings": []}
        for step in self.inp["step"]:
            seed, b = step["backend"] == "seed", "nccl" if step["backend"] == "seed" else step["backend"]
            cyc = self.each(sm.Model.cycle_ms, st, b, v if seed else None, seed=seed)
            verify = dict.fromkeys(sm.CORNERS, v) if seed else self.each(sm.Model.verify_ms, st + 1, b)
            tok = {c: 1000 * self.al / x for c, x in cyc.items()}
            decode, tok2 = self.each(sm.Model.decode_tok_s, b, seed=seed), {c: 2000 / x for c, x in cyc.items()}
            out["series"].append(dict(name=step["name"], cycle=cyc, tok2=tok2, verify=verify, decode=decode, tok=tok))
        for s in range(1, len(self.inp["acceptance"]["per_position"]) + 1):
            cyc = self.each(sm.Model.cycle_ms, s)
            need = [{c: g * x / 1000 for c, x in cyc.items()} for g in (self.goal, self.inp["goals"]["stretch_tok_s"])]
            verify = self.each(sm.Model.verify_ms, s + 1)
            tok, ratio = self.each(sm.Model.tok_s, s), self.each(sm.Model.cycle_ratio, s)
            out["settings"].append(
                dict(
                    name=f"{s}/1/{s + 1}", al=self.m[C].al(s), cycle=cyc, verify=verify, tok=tok, ratio=ratio, need=need
                )
            )
        return out

    def sensitivity(self) -> str:
        t0, c0, ipc = self.m[C].tok_s(), self.m[C].cycle_ms(), self.inp["per_call"]["pcie_ipc"]
        rows = [
            [UNKNOWN.get(k, k), f"{v[0]} -> {v[2]}", *(self.at(**{k: v[i]}).tok_s() for i in (0, 2))]
            for k, v in self.inp["band"].items()
        ]
        al = f"{self.al - 0.3:.2f} -> {self.al + 0.3:.2f}"
        rows.append(["accept length", al, *(self.at(al_delta=d).tok_s() for d in (-0.3, 0.3))])
        us1 = t0 - self.at(ipc_us=[[x, y * self.m[C].p["ipc_scale"] + 1] for x, y in ipc]).tok_s()
        stages = self.cyc["stages"].items()
        calls = sum(sum(v.values()) * (self.steps - 1 if k == "draft_decode" else 1) for k, v in stages)
        ranked = sorted(rows, key=lambda r: -abs(r[3] - r[2]))
        table = md_table(
            f"unknown | pessimistic -> optimistic | tok/s at {self.name} | span",
            [[a, b, f"{lo:.0f} - {hi:.0f}", f"{abs(hi - lo):.0f}"] for a, b, lo, hi in ranked],
        )
        return (
            f"{table}\n\nAt the central {t0:.0f} tok/s: every 1 ms of cycle is {t0 / c0:.1f} tok/s, every +0.1 AL "
            f"{0.1 * t0 / self.al:.1f} tok/s, every 1 us on each of the {calls} PCIe-IPC calls per cycle "
            f"{us1:.1f} tok/s."
        )

    def levers(self) -> str:
        m0, rows = self.m[C], []
        c0, t0, d0 = m0.cycle_ms(), m0.tok_s(), 1000 / m0.decode_ms()
        for lv in self.inp["lever"]:
            m = self.at(**lv["knobs"]) if "knobs" in lv else None
            dc, dt = (m.cycle_ms() - c0, m.tok_s() - t0) if m else (0.0, 0.0)
            cells = ["not modelled", "-"] if not m else [f"{dc:+.2f}", f"{m.tok_s():.0f} ({dt:+.0f}, {dt / t0:+.1%})"]
            if lv.get("guard"):
                cells = [f"0 (a sync: {dc:+.2f})", f"0 (protects {dt:+.0f}, {dt / t0:+.0%})"]
            plain = f"{1000 / m.decode_ms():.0f}" if m and abs(1000 / m.decode_ms() - d0) > 0.5 else "-"
            key = dt / EFFORT.get(lv["effort"], 1)  # gain per effort; the first, then the rejected, last
            if lv["series"] in ("rejected", "already in SGLang"):
                key = -1e9 + dt
            elif lv.get("first"):
                key = 1e9
            rows.append((key, lv, cells, plain))
        out = [
            [i + 1 if k > -1e8 else "x", lv["name"], lv["series"], *cells, plain, lv["effort"], lv["note"]]
            for i, (k, lv, cells, plain) in enumerate(sorted(rows, key=lambda r: -r[0]))
        ]
        for st in self.inp["stack"]:
            knobs = {k: v for lv in self.inp["lever"] if lv["id"] in st["levers"] for k, v in lv["knobs"].items()}
            m = self.at(**knobs)
            out.append(
                f"stack | {st['name']} | - | {m.cycle_ms() - c0:+.2f} | {m.tok_s():.0f} ({m.tok_s() - t0:+.0f}) | "
                f"{m.decode_tok_s():.0f} | - | AL for {self.goal:.0f}: {self.goal * m.cycle_ms() / 1e3:.2f}"
            )
        header = (
            f"# | lever | in the series? | ms per cycle | tok/s at {self.name}, AL {self.al:.2f} | plain decode tok/s"
        )
        return md_table(header + " | effort | note", out)

    def problems(self) -> list[str]:
        out = [
            f"{c}, {b}: {p}" for c, m in self.m.items() for b in ("pcie_ipc", "nccl", "nccl_xml") for p in m.problems(b)
        ]
        for lv in (lv for lv in self.inp["lever"] if "knobs" in lv):
            out += [f"lever {lv['id']}: {p}" for p in self.at(**lv["knobs"]).problems()]
        return out

    def goals(self) -> str:
        sets, g, plain = self.table["settings"], self.inp["goals"], self.each(sm.Model.decode_tok_s)
        d, best = next(r for r in sets if r["name"] == self.name), max(sets, key=lambda r: r["tok"][C])
        met = ", ".join(r["name"] for r in sets if r["ratio"][C] <= g["cycle_ratio"]) or "none"
        spec = f"{band(d['tok'], 0)} at {self.name}; the best setting, {best['name']}: {band(best['tok'], 0)}"
        al = (
            f"prior {d['al']:.2f}; {self.goal:.0f} needs {band(d['need'][0], 2)} ({best['name']}: "
            f"{band(best['need'][0], 2)}); {g['stretch_tok_s']:.0f} needs {band(d['need'][1], 2)}"
        )
        spec_verdict = "expected"
        if d["tok"][C] < self.goal:
            spec_verdict = "not at the prior AL (central); in the band's optimistic half, or with a higher AL"
        plain_verdict = "expected"
        if plain[C] < g["plain_tok_s"]:
            plain_verdict = f"not expected ({plain[C] / g['plain_tok_s'] - 1:+.0%} central)"
        ratios = "; ".join(f"{r['name']} {band(r['ratio'], 2)}" for r in sets)
        cycle = "met" if d["ratio"][C] <= g["cycle_ratio"] else "missed"
        rows = [
            [f">= {self.goal:.0f} tok/s with EAGLE-3", spec, al, spec_verdict],
            f">= {g['plain_tok_s']:.0f} tok/s without speculation | {band(plain, 0)} | plays no part | {plain_verdict}",
            f"spec cycle <= {g['cycle_ratio']}x the plain step | {ratios} | any (the ratio does not depend on it) | "
            f"{cycle} at {self.name} (central); met at {met}",
        ]
        stretch, dcyc, w = g["stretch_tok_s"], self.each(sm.Model.dflash_ms), self.inp["dflash"]["block"]
        code = {t["dflash_al"]: 1000 * t["dflash_al"] / dcyc[C] for t in self.inp["traffic"] if t.get("set") == "code"}
        need = band({c: stretch * x / 1e3 for c, x in dcyc.items()}, 2)
        verdict = "expected at the card's coding AL (central)" if min(code.values()) >= stretch else "not expected"
        said = ", ".join(f"{tok:.0f} at the card's AL {al}" for al, tok in code.items())
        rows.append(
            f">= {stretch:.0f} tok/s on coding prompts (stretch), with DFlash (block {w}) | DFlash: {said} | "
            f"{stretch:.0f} needs {need} with DFlash, {band(d['need'][1], 2)} with EAGLE-3 {self.name} | {verdict}; "
            "the box's AL on chat, code and agentic sets decides (bench/sweep-dflash.toml)"
        )
        return md_table("goal | model at the patched defaults | accept length | verdict", rows)

    def arms(self) -> dict[str, tuple]:
        """Per arm: (verify, draft, cycle) at each corner, and the tokens one cycle can accept."""
        w, s = self.inp["dflash"]["block"], self.steps
        dflash = (sm.Model.verify_ms, w), (sm.Model.block_ms,), (sm.Model.dflash_ms,)
        eagle = (sm.Model.verify_ms, s + 1), (sm.Model.draft_ms, s), (sm.Model.cycle_ms, s)
        return {a: (*(self.each(*f) for f in fs), n) for a, fs, n in (("dflash", dflash, w), ("eagle", eagle, s + 1))}

    def dflash(self) -> str:
        arms, d, targets = self.arms(), self.inp["dflash"], (self.goal, *map(self.inp["goals"].get, GOAL_KEYS))
        what = ("verify of the block's rows, ms", "draft, ms", "cycle: verify + draft + glue, ms")
        rows = [[x, *(band(a[i], 2) for a in arms.values())] for i, x in enumerate(what)]
        for al in (self.al, *d["al_rows"]):
            tok = [band({c: 1000 * al / x for c, x in a[2].items()}, 0) if al <= a[3] else "-" for a in arms.values()]
            rows.append([f"tok/s at AL {al:.2f}", *tok])
        rows += [
            [f"AL for {g:.0f} tok/s", *(band({c: g * x / 1e3 for c, x in a[2].items()}, 2) for a in arms.values())]
            for g in targets
        ]
        even = {c: self.al * x / arms["eagle"][2][c] for c, x in arms["dflash"][2].items()}
        rows.append([f"AL at which it matches EAGLE-3 {self.name} at AL {self.al:.2f}", band(even, 2), "-"])
        return md_table(f"per cycle at batch 1 | DFlash, block {d['block']} | EAGLE-3 {self.name}", rows)

    def drafters(self) -> str:
        cyc, rows = {a: v[2] for a, v in self.arms().items()}, []
        for t in self.inp["traffic"]:
            tok = {a: {c: 1000 * t[f"{a}_al"] / x for c, x in cyc[a].items()} for a in cyc if f"{a}_al" in t}
            fast = max(tok, key=lambda a: tok[a][C])
            gain = tok[fast][C] / min(x[C] for x in tok.values()) - 1
            said = f"{ARM[fast]} (+{gain:.0%})" if gain >= 0.05 else "a wash (within 5 %)"
            cells = [[t[f"{a}_al"], t[f"{a}_source"], band(tok[a], 0)] if a in tok else ["-"] * 3 for a in cyc]
            rows.append([t["name"], *cells[0], *cells[1], said if len(tok) > 1 else "-"])
        return md_table(
            f"traffic | DFlash AL | source | tok/s | EAGLE-3 {self.name} AL | source | tok/s | faster (central)", rows
        )

    def series(self) -> str:
        header = (
            f"step ({self.name}, batch 1) | verify ms | cycle ms | tok/s at AL 2.0 | tok/s at AL {self.al:.2f} | "
            "plain decode tok/s, same backend"
        )
        rows = [
            f"{r['name']} | {band(r['verify'])} | {band(r['cycle'], 2)} | {band(r['tok2'], 0)} | {band(r['tok'], 0)} | "
            f"{band(r['decode'], 0)}"
            for r in self.table["series"]
        ]
        return md_table(header, rows)

    def settings(self) -> str:
        header = (
            f"steps/topk/draft tokens | AL (prior) | verify ms | cycle ms | tok/s central (pessimistic-optimistic) "
            f"| cycle / plain step | AL for {self.goal:.0f} tok/s | AL for {self.inp['goals']['stretch_tok_s']:.0f} "
            "tok/s"
        )
        rows = [
            [
                r["name"],
                f"{r['al']:.2f}",
                band(r["verify"]),
                band(r["cycle"], 2),
                band(r["tok"], 0),
                band(r["ratio"], 2),
                *(band(x, 2) for x in r["need"]),
            ]
            for r in self.table["settings"]
        ]
        return md_table(header, rows)

    def peers(self) -> str:
        rows = []
        for p in self.inp["peer"]:
            cycle = f"{1000 * p['al'] / p['tok_s']:.1f}" if {"al", "tok_s"} <= set(p) else "-"
            step = f"{1000 / p['nospec']:.1f}" if "nospec" in p else "-"
            ratio = f"{p['al'] * p['nospec'] / p['tok_s']:.2f}" if {"al", "tok_s", "nospec"} <= set(p) else "-"
            spec = f"{p.get('tok_s', '-')} / {p.get('nospec', '-')}"
            rows.append([p["stack"], spec, p.get("al", "n/a"), cycle, step, ratio, p["window"], p["date"], p["source"]])
        return md_table(
            "peer stack (someone else's 8x RTX PRO 6000) | tok/s spec / none | AL | cycle ms (1000 AL / "
            "tok/s) | plain step ms | cycle / plain | window | date | source",
            rows,
        )

    def blocks(self) -> dict[str, str]:
        names = "backtest physics goals series settings sensitivity levers peers dflash drafters".split()
        return {name: getattr(self, name)() for name in names}


def load_runs(pattern: str = "bench-comm_H200_x2_*.json") -> list[dict]:
    runs = [json.loads(p.read_text()) | {"_file": p.name} for p in sorted(RESULTS.glob(pattern))]
    if not runs:
        raise UserError(f"no {pattern} under {RESULTS}: restore bench/results from git")
    return runs


def _term(run: dict, q: dict, side: int):
    """One term of a proxy row (bench/inputs/cost-model.toml [[proxy]]) in one run; side 0: through SGLang."""
    if "path" in q:
        return functools.reduce(lambda d, k: d[k], q["path"].split("."), run)
    m = {k: v.split("|")[side] if k == "impl" and "|" in v else v for k, v in q.items() if k not in ("field", "sum")}
    vals = [
        r[q["field"]] if "field" in q else r.get("us_per_call", r.get("us"))
        for r in run["records"]
        if all(r.get(k) == v for k, v in m.items())
    ]
    return sum(vals) if q.get("sum") else vals[0]


def h200_table(runs: list[dict], rows: list[dict]) -> str:
    """Each row through the patched SGLang (its run) and with FlashInfer called directly (the earlier runs): every
    ratio taken inside one run, median and range over the runs."""
    has = lambda r, pre: any(str(x.get("impl", "")).startswith(pre) for x in r["records"])  # noqa: E731
    groups = [[r for r in runs if has(r, "sglang_")], [r for r in runs if has(r, "fi_")]]

    def cell(q: dict, side: int) -> str:
        vals = []
        for r in groups[side]:
            try:
                v = _term(r, q["num"], side) / (_term(r, q["den"], side) if "den" in q else 1)
                vals.append((v - (_term(r, q["sub"], side) if "sub" in q else 0)) * q.get("scale", 1))
            except (TypeError, KeyError, IndexError, ZeroDivisionError):
                pass
        return spread(vals, 0 if q["unit"] == "" else 2, q["unit"], none="-")

    named = zip(("through SGLang", "FlashInfer directly"), groups)
    header = ["H200 x2 proxy (NVLink: not the box)", *(f"{w}: " + ", ".join(r["_file"] for r in g) for w, g in named)]
    return md_table(header, [[q["row"], cell(q, 0), cell(q, 1)] for q in rows])


def read_receipts(paths: list[Path]) -> list[dict]:
    """Each receipt as {"name", "data", "profile", "proxy"}. One that cannot be opened (a typo, a corrupt download)
    is a UserError with the fix; one whose contents are damaged or measure nothing is named and skipped."""
    out = []
    for path in paths:
        try:
            d, tmp = rd.open_receipt(path)
        except UserError as e:
            have = ", ".join(p.name for p in sorted(RECEIPTS.glob("*.tar.gz"))) or "none"
            raise UserError(
                f"{e}. Name a .tar.gz that make report wrote: make docs RECEIPT=<file> (bench/receipts has: {have})"
            ) from e
        why = ""
        try:
            data, prof = rd.load(d), d / "raw" / "profile.json"
            profile = json.loads(prof.read_text()) if prof.is_file() else None
            parts = data["receipt"].get("parts", {})
            if not profile and not any(r.get("ok") for p, r in parts.items() if rd.measures(p)):
                states = ", ".join(f"{p}: {r.get('status')}" for p, r in parts.items())
                why = f"no part measured anything ({states})"
            else:
                tp, want = (profile or {}).get("tp"), sm.load_cycle()["tp"]
                proxy = rd.proxy_reasons(rd.box_class(data))
                proxy += [f"its profile ran at TP{tp}, the model at TP{want}"] if tp and tp != want else []
                out.append({"name": Path(path).name, "data": data, "profile": profile, "proxy": proxy})
        except UserError as e:
            why = str(e)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            why = f"a damaged file in it ({type(e).__name__}: {e})"
        finally:
            if tmp is not None:
                tmp.cleanup()
        if why:
            say(f"skipping receipt {Path(path).name}: {why}")
    return out


def receipt_block(box: Box, r: dict) -> str:
    data, m = r["data"], box.m[C]
    recs = data["receipt"]["recommendations"]  # as the receipt stored them, with the thresholds of its day
    spec = next(x for x in recs if x["default"].startswith("EAGLE-3"))
    best = spec["measured"].get("speculative") if spec["verdict"] != "inconclusive" else None
    al = best["accept_length"] if best and best.get("accept_length") else m.al()
    env, n = data["receipt"].get("environment", {}), m.cyc["stages"]["target_verify"]["all_reduce"]
    head = ""
    if r["proxy"]:
        head = (
            f"**A proxy, not the box** ({'; '.join(r['proxy'])}): its numbers stand in for the box's, the verdicts "
            "on the box's defaults are inconclusive. "
        )
    head += (
        f"Receipt `{r['name']}` (box {env.get('box')}: {rd.describe_box(rd.box_class(data))}; "
        f"{data['receipt'].get('created')}, patch set {env.get('patchset')}): AL {al:.2f} "
        f"({'measured' if best else 'prior'})."
    )
    rows = []
    for label, us in (rd.per_call_latencies(data["bench_comm"]) if data.get("bench_comm") else {}).items():
        x = box.at(ipc_us=[[0.0, us], [1e6, us]])
        verify, tok = x.verify_ms(box.steps + 1), 1000 * al / x.cycle_ms()
        rows.append([label, f"{us:.1f}", f"{n * us / 1000:.2f}", f"{verify:.1f}", f"{tok:.0f}"])
    header = (
        f"path, {rd.VERIFY_ROWS_C1} rows (C1 verify), graph chain | per call (us) | {n} x (ms) | modelled verify (ms)"
    )
    out = [head, "", md_table(header + " | modelled tok/s", rows or [["(no bench-comm in it)", *"----"]])]
    if r["profile"]:
        out += profile_block(box, r["profile"], applied=not r["proxy"])
    if best:
        out += ["", f"Served (make bench, {spec['measured']['scenario']}): {spec['why']}."]
    verdicts = [[x["default"], x["verdict"], x["why"], x["setting"] or "-"] for x in recs]
    return "\n".join(out + ["", md_table("default of the series | verdict | measured | setting", verdicts)])


def profile_block(box: Box, p: dict, applied: bool) -> list[str]:
    """A receipt's profile beside the model before and after its refit."""
    old, s = sm.Model(box.inp, box.cyc), p["steps"]
    new, al, d = sm.Model(box.inp, box.cyc, **sm.refit(p, old)), p["accept_length"], p["decode"]
    q = [
        ("plain decode, ms", d["forward_ms"], old.decode_ms(), new.decode_ms()),
        ("verify, ms", p["target_verify"]["forward_ms"], old.verify_ms(s + 1), new.verify_ms(s + 1)),
        ("cycle, ms", p["cycle_ms"], old.cycle_ms(s), new.cycle_ms(s)),
        ("tok/s at its AL", 1000 * al / p["cycle_ms"], 1000 * al / old.cycle_ms(s), new.tok_s(s)),
    ]
    said = (
        f"Profile ({p['gpu']}, TP{p['tp']}, {s}/1/{s + 1}, AL {al:.2f}; B {new.B():.2f} ms = {d['busy_ms']:.2f} "
        f"kernel-busy + {d['gap_ms']:.2f} gaps over {d['kernels']} kernels; glue {new.p['glue_ms']:.2f} ms): "
    )
    said += "the model above is refitted from it." if applied else "shown, not applied (a proxy)."
    table = md_table(
        "quantity | measured | model before (seed-calibrated, central) | model refitted",
        [[a, *(f"{v:.2f}" for v in vs)] for a, *vs in q],
    )
    return ["", said, "", table]


def plot(box: Box, png: Path) -> str:
    """tok/s bands of the series' steps and the settings (the rows of those tables), the goal, the seed, a peer."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"not drawn: {sys.executable} has no matplotlib; run make docs PY=.venv/bin/python (make setup makes it)"
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    peer = box.inp["peer"][0]
    for ax, key, what in zip(axes, ("series", "settings"), ("the series' steps", "speculative settings")):
        rows = box.table[key]
        names = [r["name"] if len(r["name"]) <= 44 else r["name"][:42] + ".." for r in rows]
        lo, hi = [min(r["tok"].values()) for r in rows], [max(r["tok"].values()) for r in rows]
        ax.barh(names, [b - a for a, b in zip(lo, hi)], left=lo, color="tab:blue", alpha=0.4, label="model band")
        ax.plot([r["tok"][C] for r in rows], names, "o", color="tab:blue", label="model, central")
        for x, color, style, label in (
            (box.inp["seed"]["decode_tok_s"], "grey", ":", "seed, no speculation"),
            (peer["tok_s"], "green", "-.", f"best 30-s peer, AL {peer['al']} (other host)"),
            (box.goal, "red", "--", "goal with EAGLE-3"),
        ):
            ax.axvline(x, color=color, linestyle=style, label=label)
        ax.invert_yaxis()
        ax.set_xlim(left=0)
        ax.set(
            xlabel=f"tok/s at AL {box.al:.2f}" if key == "series" else "tok/s at each setting's AL prior",
            title=f"Model output, not a measurement: {what}",
        )
        ax.title.set_fontsize(9)
        ax.tick_params(axis="y", labelsize=7)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=5, fontsize=8)
    fig.suptitle("Kimi-K2.5 TP8 on 8x RTX PRO 6000 (PCIe only): the cost model of eagle-fast-verify.md", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return "drawn"


def block(doc: str, name: str) -> str | None:
    start, end = f"<!-- cost-model:{name} -->", f"<!-- /cost-model:{name} -->"
    return doc.split(start, 1)[1].split(end, 1)[0].strip("\n") if start in doc and end in doc else None


def splice(doc: str, blocks: dict[str, str], where: str = DOC.name) -> str:
    for name, body in blocks.items():
        start, end = f"<!-- cost-model:{name} -->", f"<!-- /cost-model:{name} -->"
        if block(doc, name) is None:
            raise UserError(f"{where} lacks the markers {start} ... {end}: add them where the block goes")
        head, rest = doc.split(start, 1)
        doc = f"{head}{start}\n{body}\n{end}{rest.split(end, 1)[1]}"
    return doc


def render(inp: dict, cyc: dict, runs: list[dict], receipts: list[dict]) -> tuple[dict[str, str], Box]:
    """The blocks, from the model refitted by the newest box receipt with a profile (a proxy's is not applied)."""
    fitted = next((r for r in reversed(receipts) if r["profile"] and not r["proxy"]), None)
    box = Box(inp, cyc, sm.refit(fitted["profile"], sm.Model(inp, cyc)) if fitted else {}, runs)
    if bad := box.problems():
        raise UserError(
            "the model gives an impossible row: " + "; ".join(bad[:4]) + ". Fix bench/inputs/"
            "cost-model.toml" + (f" or the profile of receipt {fitted['name']}" if fitted else "")
        )
    blocks = box.blocks()
    if fitted:
        blocks["backtest"] = f"Refitted from the profile of receipt `{fitted['name']}`.\n\n" + blocks["backtest"]
    return blocks | {
        "h200": h200_table(runs, inp["proxy"]),
        "box-measured": "\n\n".join(receipt_block(box, r) for r in receipts)
        or "No box receipt "
        "ingested yet: run `make report` on the box, then `make docs RECEIPT=<the .tar.gz>` (or commit "
        "it under bench/receipts/).",
    }, box


def main(argv=None) -> int:
    ap = parser("scripts.report.cost_model", __doc__)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="rewrite the document's generated blocks and the plot")
    g.add_argument("--check", action="store_true", help="exit 1 if the document is out of date")
    ap.add_argument("--doc", type=Path, default=DOC)
    receipt = "a box receipt (make report's directory or .tar.gz; default: bench/receipts/*.tar.gz)"
    ap.add_argument("--receipt", type=Path, action="append", metavar="R", help=receipt)
    a = ap.parse_args(argv)
    inp, cyc = sm.load()
    receipts = read_receipts(a.receipt if a.receipt is not None else sorted(RECEIPTS.glob("*.tar.gz")))
    blocks, box = render(inp, cyc, load_runs(), receipts)
    if not (a.write or a.check):
        print("\n\n".join(blocks.values()))
        return 0
    try:
        old = a.doc.read_text()
    except OSError as e:
        raise UserError(f"{a.doc}: {e.strerror}; name the plan with --doc or restore it from git") from e
    new = splice(old, blocks, a.doc.name)
    changed = [n for n in blocks if block(old, n) != block(new, n)]
    if a.check:
        if changed:
            print(f"{a.doc} is out of date with its inputs ({', '.join(changed)}): run make docs")
        return int(bool(changed))
    if changed:
        a.doc.write_text(new)
    png = RESULTS / "cost-model.png" if a.doc.resolve() == DOC.resolve() else a.doc.with_name("cost-model.png")
    wrote = f"rewrote {', '.join(changed)}" if changed else "up to date, nothing written"
    print(f"{a.doc}: {wrote}; plot {png.name}: {plot(box, png)}")
    return 0


if __name__ == "__main__":
    run(main)
