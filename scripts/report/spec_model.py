"""The box's cost model of a speculative cycle (Model) and its refit from a receipt's profile (refit).

Model: one chain cycle of s steps at batch 1, ms, at one corner of each [band] unknown of bench/inputs/cost-model.toml,
collectives from bench/inputs/collectives_kimi_tp8.toml; its formulas are printed in eagle-fast-verify.md section 1.
"""

import math
from pathlib import Path

from ..lib.errors import UserError
from ..lib.kimi import HIDDEN
from ..lib.repo import REPO_ROOT
from ..lib.tomlfile import load_toml

INPUTS = REPO_ROOT / "bench" / "inputs" / "cost-model.toml"
COLLECTIVES = REPO_ROOT / "bench" / "inputs" / "collectives_kimi_tp8.toml"
STAGES = ("target_verify", "draft_decode", "draft_extend")
OPS = ("all_reduce", "all_gather", "broadcast")
CORNERS = ("pessimistic", "central", "optimistic")
BYTES = {"bfloat16": 2, "float32": 4, "int32": 4}
KNOBS = {
    "draft_scale": 1.0,
    "head_rows": None,
    "fp8_linears": False,
    "shard_qa": False,
    "extra_gb": 0.0,
    "gap_ms": 0.0,
    "overlap": 0.0,
    "payload_scale": 1.0,
    "embed_ar": 1,
    "sync_ms": 0.0,
    "rs_ag": False,
    "draft_tp1": False,
    "steps": None,
    "al_delta": 0.0,
    "al_scale": 1.0,
    "B_ms": None,
    "draft_fwd_ms": None,
    "ipc_us": None,
    "al": None,  # the last six: measured (refit)
    "nodes": None,
    "node_us": None,
}


def load_cycle(path: Path = COLLECTIVES, mode: str = "greedy") -> dict:
    """{"tp", "steps", "stages": {stage: {op: calls per forward}}, "kib": {stage: {op: KiB per rank and row}},
    "logits_kib": the target's logits shard per row}."""
    raw, where = load_toml(Path(path), "collectives table"), Path(path).name
    cyc, counts = raw.get("cycle", {}), raw.get("per_forward", {}).get(mode, {})
    if not (isinstance(cyc.get("tp"), int) and isinstance(cyc.get("steps"), int) and cyc["steps"] >= 2):
        raise UserError(f"{where}: needs [cycle] tp = <int> and steps = <int >= 2> (the cycle it counts)")
    out = {"tp": cyc["tp"], "steps": cyc["steps"], "stages": {}, "kib": {}}
    for st in STAGES:
        n = cyc["steps"] - 1 if st == "draft_decode" else 1
        bad = [
            f"{op} = {c!r}"
            for op, c in counts.get(st, {}).items()
            if op not in OPS or not isinstance(c, int) or c < 0 or c % n
        ]
        if st not in counts or bad:
            what = "is missing"
            if bad:
                what = f"has {', '.join(bad)}: ops are {', '.join(OPS)}, whole counts, a multiple of its {n} forward(s)"
            raise UserError(f"{where}: [per_forward.{mode}] {st} = {{ op = count, ... }} {what}")
        out["stages"][st] = {op: c // n for op, c in counts[st].items()}
        sites = [s for s in raw.get("stages", {}).get(st, []) if s.get("when", "always") in ("always", mode)]
        out["kib"][st] = {s["op"]: BYTES[s["dtype"]] * math.prod(s["shape"][1:] or s["shape"]) / 1024 for s in sites}
    out["logits_kib"] = max(
        BYTES[s["dtype"]] * math.prod(s["shape"][1:]) / 1024
        for s in raw["stages"]["target_verify"]
        if s["op"] == "all_gather"
    )
    return out


def load(inputs: Path = INPUTS, collectives: Path = COLLECTIVES) -> tuple[dict, dict]:
    return load_toml(Path(inputs), "cost-model inputs"), load_cycle(collectives)


class Model:
    """The box at one corner of the band, with knobs (levers) and measured values (refit) on top."""

    def __init__(self, inp: dict, cyc: dict, corner: str = "central", **over):
        if bad := set(over) - set(KNOBS) - set(inp["band"]):
            raise UserError(f"unknown model knob(s) {sorted(bad)} in bench/inputs/cost-model.toml: known {[*KNOBS]}")
        self.inp, self.cyc, self.m, self.tp = inp, cyc, inp["memory"], cyc["tp"]
        self.corner = CORNERS.index(corner)
        self.p = KNOBS | {k: v[self.corner] for k, v in inp["band"].items()} | over
        self.eff = self.m["bandwidth_tb_s"] * self.p["eta"]  # GB per ms achieved
        self.head_rows = self.p["head_rows"] or cyc["kib"]["draft_decode"]["all_gather"] * 512 * self.tp  # bf16 shard

    def non_routed(self, knobs: bool = True) -> float:
        gb = dict(self.m["non_routed_gb"])
        if knobs and self.p["shard_qa"]:
            gb["q_a_kv_a"] /= self.tp
        if knobs and self.p["fp8_linears"]:
            gb |= {k: gb[k] / 2 for k in self.m["fp8_parts"]}
        return sum(gb.values()) + (self.p["extra_gb"] if knobs else 0.0)

    def gb(self, w: int) -> float:
        k, e = self.m["experts_per_token"], self.m["experts"]
        return self.non_routed() + self.m["routed_gb_per_expert"] * (k + self.p["rho"] * (e - e * (1 - k / e) ** w - k))

    def oneshot_us(self, rows: float) -> float:
        """Egress floor of a one-shot all-reduce: every rank pushes its payload to tp - 1 peers over its link."""
        return (self.tp - 1) * rows * self.cyc["kib"]["target_verify"]["all_reduce"] * 1.024 / self.m["egress_gb_s"]

    def floor_ms(self, w: int) -> float:
        calls = self.cyc["stages"]["target_verify"]["all_reduce"]
        return self.gb(w) / self.m["bandwidth_tb_s"] + calls * self.oneshot_us(w) / 1000

    def node_us(self) -> float:
        return self.p["node_us"] or self.inp["kernels"]["node_us"][self.corner]

    def node_floor_ms(self) -> float:
        """One target forward's graph nodes at the fixed cost of a node ([kernels]; a box profile's when refitted)."""
        return (self.p["nodes"] or self.inp["kernels"]["per_forward"]) * self.node_us() / 1000

    def lat(self, backend: str, kib: float) -> float:
        """Per-call us of one collective moving `kib` KiB per rank."""
        if backend in ("nccl", "nccl_xml"):
            return self.p["a_seed_us"] if backend == "nccl" else self.inp["per_call"]["nccl_xml_us"]
        pts = sorted(self.p["ipc_us"] or self.inp["per_call"]["pcie_ipc"])
        j = max(0, min(len(pts) - 2, sum(x <= kib for x, _ in pts) - 1))
        (x0, y0), (x1, y1) = pts[j], pts[j + 1]
        us = y0 if kib <= x0 else y0 + (y1 - y0) * (kib - x0) / (x1 - x0)
        return us * (1.0 if self.p["ipc_us"] else self.p["ipc_scale"])

    def comm_ms(self, stage: str, rows: int, backend: str) -> float:
        """The collectives of one forward of `stage` ("decode": plain decode) with `rows` rows on `backend`."""
        st, p = "target_verify" if stage == "decode" else stage, self.p
        calls, kib = self.cyc["stages"][st], self.cyc["kib"][st]
        a = rows * kib["all_reduce"] * p["payload_scale"]
        per_call = self.lat(backend, a)
        if p["rs_ag"] and st == "target_verify":  # a reduce-scatter and an all-gather of half the bytes each
            per_call = 2 * self.lat(backend, a / 2)
        us = (calls["all_reduce"] - 1 + p["embed_ar"]) * per_call
        if stage == "decode":
            g = self.cyc["logits_kib"]
        elif st == "target_verify":
            g = rows * kib.get("all_gather", 0)
        else:
            g = self.head_rows / self.tp / 512  # the draft's logits: one row at bs 1
        us += calls.get("all_gather", 0) * self.lat(backend, g)
        us += calls.get("broadcast", 0) * self.lat(backend, kib.get("broadcast", 0))
        if st == "target_verify" and p["shard_qa"]:  # one q_a/kv_a all-gather per layer
            us += (calls["all_reduce"] - 1) // 2 * self.lat(backend, rows * self.m["qa_gather_kib"])
        return us / 1000

    def B(self) -> float:
        n = sum(self.cyc["stages"]["target_verify"].values())
        b = self.p["B_ms"]
        if b is None:
            b = 1000 / self.inp["seed"]["decode_tok_s"] - n * self.p["a_seed_us"] / 1000
        return b - (self.non_routed(False) - self.non_routed()) / self.eff - self.p["gap_ms"]

    def decode_ms(self, backend: str = "pcie_ipc") -> float:
        return self.B() + self.comm_ms("decode", 1, backend)

    def decode_tok_s(self, backend: str = "pcie_ipc") -> float:
        """Plain decode (no speculation) at batch 1."""
        return 1000 / self.decode_ms(backend)

    def forward_ms(self, w: int, backend: str = "pcie_ipc") -> float:
        """A w-token target forward: the decode for one token, a verify for more."""
        return self.verify_ms(w, backend) if w > 1 else self.decode_ms(backend)

    def verify_ms(self, w: int, backend: str = "pcie_ipc") -> float:
        comm = self.comm_ms("target_verify", w, backend) * (1 - self.p["overlap"])
        return self.B() + (self.gb(w) - self.gb(1)) / self.eff + comm

    def draft_ms(self, s: int, backend: str = "pcie_ipc") -> float:
        """s draft forwards (s - 1 decodes + 1 extend) with the extend's fc, and their collectives."""
        p, d = self.p, self.inp["drafter"]
        comm = 0.0
        if not p["draft_tp1"]:
            comm = (s - 1) * self.comm_ms("draft_decode", 1, backend) + self.comm_ms("draft_extend", s + 1, backend)
        if p["draft_fwd_ms"] is not None:
            return s * p["draft_fwd_ms"] + comm
        gb = (d["layer_gb"] + self.head_rows * HIDDEN * 2 / self.tp / 1e9) * p["draft_scale"]
        fwd = gb * (self.tp if p["draft_tp1"] else 1) / self.eff + p["kd_ms"]
        return s * fwd + d["fc_gb"] * p["draft_scale"] / self.eff + comm

    def steps(self) -> int:
        return self.p["steps"] or self.cyc["steps"]

    def cycle_ms(self, steps: int | None = None, backend: str = "pcie_ipc", verify_ms: float | None = None) -> float:
        """One cycle; verify_ms replaces the modelled verify (the seed's eager one)."""
        s = steps or self.steps()
        verify = self.verify_ms(s + 1, backend) if verify_ms is None else verify_ms
        return verify + self.draft_ms(s, backend) + self.p["glue_ms"] + self.p["sync_ms"]

    def block_ms(self, backend: str = "pcie_ipc") -> float:
        """One block-draft forward ([dflash]): its layers, its fc over the verified rows' target features and the
        target's lm_head shard read once, its kernel chain, its all-reduces at the block's rows, its argmax gather."""
        d, kib = self.inp["dflash"], self.cyc["kib"]["target_verify"]["all_reduce"]
        us = d["all_reduce"] * self.lat(backend, d["block"] * kib) + d["all_gather"] * self.lat(backend, 1 / 64)
        gb = d["layers_gb"] + d["fc_gb"] + self.m["non_routed_gb"]["lm_head"]
        return gb / self.eff + d["kernel_chains"] * self.p["kd_ms"] + us / 1000

    def dflash_ms(self, backend: str = "pcie_ipc") -> float:
        """One DFlash cycle at batch 1: the verify of the block's rows, one block draft, the glue."""
        verify = self.verify_ms(self.inp["dflash"]["block"], backend)
        return verify + self.block_ms(backend) + self.p["glue_ms"] + self.p["sync_ms"]

    def al(self, steps: int | None = None) -> float:
        s, p = steps or self.steps(), self.p
        base = 1 + sum(self.inp["acceptance"]["per_position"][:s])
        if p["al"] is not None and s == self.steps():
            base = p["al"]
        return base * p["al_scale"] + p["al_delta"]

    def tok_s(self, steps: int | None = None, backend: str = "pcie_ipc") -> float:
        return 1000 * self.al(steps) / self.cycle_ms(steps, backend)

    def cycle_ratio(self, steps: int | None = None) -> float:
        """One speculative cycle over one plain decode step."""
        return self.cycle_ms(steps) / self.decode_ms()

    def problems(self, backend: str = "pcie_ipc", widths=range(1, 9)) -> list[str]:
        """Modelled forwards below their physical floor, or a verify faster than the decode it contains."""
        out, dec = [], self.decode_ms(backend)
        for w in widths:
            got = dec if w == 1 else self.verify_ms(w, backend)
            if got < self.floor_ms(w):
                out.append(f"{w}-token forward {got:.2f} ms < its floor {self.floor_ms(w):.2f} ms")
            if got < dec:
                out.append(f"{w}-token verify {got:.2f} ms < the 1-token decode {dec:.2f} ms it contains")
        return out


# A receipt's profile part (raw/profile.json), which refit() reads. Per stage, the median over the captured steps
# of: the GPU time from its first kernel's start to its last kernel's end, the time in collective kernels, the
# kernel-busy time outside them, the gaps, the kernel count. decode: one plain decode step; draft_decode: one
# replay of the draft graph (its steps - 1 forwards together, as the collectives table counts them).
PROFILE_STAGES = ("decode", *STAGES)
PROFILE_FIELDS = {
    "gpu": str,
    "tp": int,
    "steps": int,
    "accept_length": float,
    "cycle_ms": float,
    "nccl_graph_us": dict,
    "pcie_ipc_us": dict,
    **{s: dict for s in PROFILE_STAGES},
}
STAGE_FIELDS = ("forward_ms", "comm_ms", "busy_ms", "gap_ms", "kernels")


def refit(profile: dict, model: Model | None = None) -> dict:
    """Model knobs from a receipt's profile: B, the mean draft forward, the glue E, PCIe IPC per call by rows, the
    box's in-graph NCCL per call, the AL, the achieved bandwidth from the verify's extra over the decode. A
    UserError names what is missing."""
    bad = [k for k, t in PROFILE_FIELDS.items() if not isinstance(profile.get(k), (t, int) if t is float else t)]
    bad += [
        f"{s}.{f}"
        for s in PROFILE_STAGES
        if isinstance(profile.get(s), dict)
        for f in STAGE_FIELDS
        if not isinstance(profile[s].get(f), (int, float))
    ]
    if bad:
        raise UserError(f"the receipt's profile lacks {', '.join(bad)}: re-run make report's profile part")
    model, s = model or Model(*load()), profile["steps"]
    out = {st: profile[st]["forward_ms"] - profile[st]["comm_ms"] for st in PROFILE_STAGES}
    knobs = {
        "B_ms": out["decode"],
        "draft_fwd_ms": (out["draft_decode"] + out["draft_extend"]) / s,
        "glue_ms": max(0.0, profile["cycle_ms"] - sum(profile[st]["forward_ms"] for st in STAGES)),
        "al": profile["accept_length"],
        "steps": s,
        "ipc_scale": 1.0,
        "a_seed_us": float(profile["nccl_graph_us"].get("1", model.p["a_seed_us"])),
    }
    if out["target_verify"] > out["decode"]:
        extra_ms = (model.gb(s + 1) - model.gb(1)) / model.m["bandwidth_tb_s"]
        knobs["eta"] = extra_ms / (out["target_verify"] - out["decode"])
    if (d := profile["decode"]).get("nodes") and d.get("node_us"):  # the kernel cost (scripts/report/kernels.py)
        knobs |= {"nodes": d["nodes"], "node_us": d["node_us"]}
    kib = model.cyc["kib"]["target_verify"]["all_reduce"]
    ipc = sorted([int(r) * kib, float(us)] for r, us in profile["pcie_ipc_us"].items())
    return knobs | ({"ipc_us": ipc} if len(ipc) >= 2 else {})
